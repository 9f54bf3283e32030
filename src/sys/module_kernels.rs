//! The C signatures of the kernels graphsafe loads from its own fatbins
//! (`cuda-src/testing/graph_safety.cu`, `cuda-src/mla/reference.cu`), each as a safe constructor
//! of [`KernelArgs`]: it checks every span against what its kernel touches for the sizes given
//! and holds the one `unsafe` for that kernel, as [`super::glue`] does for the linked kernels.
//!
//! The arguments name their kernel (its fatbin and its name), and `driver::KernelLaunch` pairs
//! them only with that kernel, so the parameters a kernel receives are always the ones built for
//! its signature. Loading the kernels, sizing their workspaces and the graph-aware entry points
//! are the ops' (`ops::testing`, `ops::mla::reference`), which admit their memory to an
//! `OpTarget` and launch through the `Launch` its commit returns.

use super::{DeviceSpan, Fatbin};
use crate::error::{Error, Result};

/// One kernel parameter, by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Param {
    /// A device address (a `T*` parameter).
    Ptr(u64),
    /// An `int`.
    I32(i32),
    /// A `float`.
    F32(f32),
}

/// The most parameters a [`KernelArgs`] carries (the kernels here take at most 15).
pub(crate) const MAX_PARAMS: usize = 16;

/// The arguments of one launch of one kernel of graphsafe's fatbins: grid, block and parameters,
/// made only by the constructors in this module, each for its kernel's C signature and from
/// spans checked against what that kernel touches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelArgs {
    image: Fatbin,
    kernel: &'static str,
    grid: [u32; 3],
    block: [u32; 3],
    params: [Param; MAX_PARAMS],
    count: usize,
}

impl KernelArgs {
    /// # Safety
    /// `params` match the parameters of `kernel` (in `image`) in number, order and C type, and
    /// every device address among them is valid for what the kernel does with it over `grid` and
    /// `block` (the [`DeviceSpan`] invariant).
    unsafe fn new(image: Option<Fatbin>, kernel: &'static str, grid: [u32; 3], block: [u32; 3], params: &[Param]) -> Result<KernelArgs> {
        let image = image.ok_or_else(|| Error::ArchUnsupported { op: "fatbin kernel", need: "a build with its fatbin".into(), have: "none".into() })?;
        if params.len() > MAX_PARAMS {
            return Err(Error::invalid("kernel parameters", format!("at most {MAX_PARAMS}"), params.len()));
        }
        let mut all = [Param::I32(0); MAX_PARAMS];
        all[..params.len()].copy_from_slice(params);
        Ok(KernelArgs { image, kernel, grid, block, params: all, count: params.len() })
    }

    /// The fatbin of the kernel the arguments are for.
    pub(crate) fn image(&self) -> Fatbin {
        self.image
    }

    /// The kernel's (extern "C") name.
    pub(crate) fn kernel(&self) -> &'static str {
        self.kernel
    }

    /// (grid, block).
    pub(crate) fn dims(&self) -> ([u32; 3], [u32; 3]) {
        (self.grid, self.block)
    }

    /// The parameters, in order, and how many there are.
    pub(crate) fn into_params(self) -> ([Param; MAX_PARAMS], usize) {
        (self.params, self.count)
    }
}

/// Rows of `y` per CTA of `gs_splitk_gemv` (its block size).
pub(crate) const SPLITK_ROWS: u32 = 128;

/// The grid and block of a split-K GEMV: one CTA per block of rows and K chunk.
pub(crate) fn split_k_dims(m: u32, splits: u32) -> ([u32; 3], [u32; 3]) {
    ([m.div_ceil(SPLITK_ROWS), splits, 1], [SPLITK_ROWS, 1, 1])
}

/// One `gs_splitk_gemv(a, x, y, partials, counters, m, k, splits)`: `y[m] = A[m, k] · x[k]` (f32),
/// K cut into `splits` chunks; each CTA adds its chunk's partial sums to `partials` (`splits · m`
/// f32) and counts itself done in `counters` (one u32 per block of [`SPLITK_ROWS`] rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitKGemv {
    pub a: DeviceSpan,
    pub x: DeviceSpan,
    pub y: DeviceSpan,
    pub partials: DeviceSpan,
    pub counters: DeviceSpan,
    pub m: u32,
    pub k: u32,
    pub splits: u32,
}

/// The arguments of `gs_splitk_gemv` for `g`, after checking the sizes and every span.
pub(crate) fn split_k_gemv(g: &SplitKGemv) -> Result<KernelArgs> {
    let (m, k, splits) = (g.m as u64, g.k as u64, g.splits as u64);
    if g.m == 0 || g.k == 0 || m > i32::MAX as u64 || k > i32::MAX as u64 || splits == 0 || splits > k.min(65_535) {
        return Err(Error::invalid("split-K shape", "m, k in 1..=i32::MAX and splits in 1..=min(k, 65535)", format!("m {m}, k {k}, splits {splits}")));
    }
    // At most 2^31 · 2^31 · 4 bytes: no product below overflows 64 bits.
    let p = [
        Param::Ptr(g.a.require("a", 4 * m * k, 4)?),
        Param::Ptr(g.x.require("x", 4 * k, 4)?),
        Param::Ptr(g.y.require("y", 4 * m, 4)?),
        Param::Ptr(g.partials.require("workspace partials", 4 * splits * m, 4)?),
        Param::Ptr(g.counters.require("workspace counters", 4 * m.div_ceil(SPLITK_ROWS as u64), 4)?),
        Param::I32(g.m as i32),
        Param::I32(g.k as i32),
        Param::I32(g.splits as i32),
    ];
    let (grid, block) = split_k_dims(g.m, g.splits);
    // SAFETY: the parameters are the kernel's, in order and of its C types (pointers to f32 / u32
    // arrays, then three ints); each span holds what the grid of `split_k_dims` reads and writes
    // for these sizes (checked above); the spans' invariant covers their lifetime.
    unsafe { KernelArgs::new(Fatbin::TESTING_GRAPH_SAFETY, "gs_splitk_gemv", grid, block, &p) }
}

/// The arguments of `gs_empty()` (no parameters, touches no memory) as one CTA of 32 threads.
pub(crate) fn empty() -> Result<KernelArgs> {
    // SAFETY: the kernel takes no parameters and touches no memory.
    unsafe { KernelArgs::new(Fatbin::TESTING_GRAPH_SAFETY, "gs_empty", [1, 1, 1], [32, 1, 1], &[]) }
}

/// One run of `gs_mla_reference`: q contiguous `[batch, heads, 512 | 64]`, the paged KV cache
/// (`[pages, page_size, 576]` 16-bit), the device lengths and page table, an f32 scratch
/// `[batch, heads, max_seq_len]`, f32 outputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MlaReference {
    /// 0: bf16, 1: fp16.
    pub dtype: i32,
    pub batch: u32,
    pub num_heads: u32,
    pub max_seq_len: u32,
    pub page_size: u32,
    pub page_table_stride: u32,
    pub sm_scale: f32,
    pub q_nope: DeviceSpan,
    pub q_pe: DeviceSpan,
    pub kv: DeviceSpan,
    pub seq_lens: DeviceSpan,
    pub page_table: DeviceSpan,
    pub scratch: DeviceSpan,
    pub out: DeviceSpan,
    pub lse: DeviceSpan,
}

/// The arguments of `gs_mla_reference` for `r`: one CTA per (head, request), after checking every
/// buffer against what the kernel touches. The kernel clamps the device lengths to
/// `0..=max_seq_len` and page indices into the cache, so their values cannot take it outside
/// these buffers.
pub(crate) fn mla_reference(r: &MlaReference) -> Result<KernelArgs> {
    let count = |what: &str, v: u32, max: u32| if v == 0 || v > max { Err(Error::invalid(what, format!("1..={max}"), v)) } else { Ok(v as u64) };
    let (b, h) = (count("batch", r.batch, 65_535)?, count("num_heads", r.num_heads, 1024)?);
    let (s, page) = (count("max_seq_len", r.max_seq_len, i32::MAX as u32)?, count("page_size", r.page_size, 1 << 20)?);
    let stride = r.page_table_stride as u64;
    if s.div_ceil(page) > stride || stride > i32::MAX as u64 {
        return Err(Error::invalid("page_table_stride", format!("{}..2^31 (the pages of max_seq_len)", s.div_ceil(page)), stride));
    }
    if r.dtype != 0 && r.dtype != 1 {
        return Err(Error::invalid("dtype", "0 (bf16) or 1 (fp16)", r.dtype));
    }
    let too_big = || Error::invalid("mla reference", "sizes whose byte counts fit in 64 bits", format!("batch {b}, heads {h}, max_seq_len {s}"));
    let bytes = |parts: &[u64]| parts.iter().try_fold(1u64, |a, &p| a.checked_mul(p)).ok_or_else(too_big);
    let page_bytes = bytes(&[page, 576, 2])?;
    let pages = r.kv.len() / page_bytes;
    if pages == 0 || pages * page > i32::MAX as u64 {
        return Err(Error::invalid("kv", format!("1 to 2^31 tokens of {page_bytes} bytes per page"), format!("{} bytes", r.kv.len())));
    }
    let p = [
        Param::Ptr(r.q_nope.require("q_nope", bytes(&[b, h, 512, 2])?, 2)?),
        Param::Ptr(r.q_pe.require("q_pe", bytes(&[b, h, 64, 2])?, 2)?),
        Param::Ptr(r.kv.require("kv", pages * page_bytes, 2)?),
        Param::Ptr(r.seq_lens.require("seq_lens", 4 * b, 4)?),
        Param::Ptr(r.page_table.require("page_table", bytes(&[b, stride, 4])?, 4)?),
        Param::I32(stride as i32),
        Param::I32(page as i32),
        Param::I32(h as i32),
        Param::I32(r.dtype),
        Param::F32(r.sm_scale),
        Param::Ptr(r.scratch.require("scratch", bytes(&[b, h, s, 4])?, 4)?),
        Param::I32(s as i32),
        Param::Ptr(r.out.require("out", bytes(&[b, h, 512, 4])?, 4)?),
        Param::Ptr(r.lse.require("lse", bytes(&[b, h, 4])?, 4)?),
        Param::I32(pages as i32),
    ];
    // SAFETY: the parameters are gs_mla_reference's, in order and of its C types; each buffer
    // holds what the grid (one CTA of 256 threads per head and request) reads or writes for these
    // sizes (checked above), with device lengths and page indices clamped by the kernel; the
    // spans' invariant covers their lifetime.
    unsafe { KernelArgs::new(Fatbin::MLA_REFERENCE, "gs_mla_reference", [h as u32, b as u32, 1], [256, 1, 1], &p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_their_kernel_and_cover_what_it_touches() {
        // A build without the testing fatbin has no arguments to build.
        let Some(testing) = Fatbin::TESTING_GRAPH_SAFETY else { return };
        let e = empty().unwrap();
        assert!(e.image().same(testing) && e.kernel() == "gs_empty");
        assert_eq!(e.into_params().1, 0);
        let span = |ptr: u64, len: u64| DeviceSpan::vouched(ptr, len);
        let (m, k, splits) = (256u64, 64u64, 4u64);
        let g = SplitKGemv {
            a: span(0x10000, 4 * m * k),
            x: span(0x80000, 4 * k),
            y: span(0x90000, 4 * m),
            partials: span(0xa0000, 4 * splits * m),
            counters: span(0xb0000, 4 * 2),
            m: m as u32,
            k: k as u32,
            splits: splits as u32,
        };
        let s = split_k_gemv(&g).unwrap();
        assert!(s.image().same(testing) && s.kernel() == "gs_splitk_gemv");
        assert_eq!(s.dims(), ([2, 4, 1], [SPLITK_ROWS, 1, 1]));
        assert_eq!(s.into_params().1, 8);
        if let Some(mla) = Fatbin::MLA_REFERENCE {
            assert!(!s.image().same(mla), "two fatbins told apart");
        }
        let short = SplitKGemv { y: span(0x90000, 4 * m - 4), ..g };
        assert!(split_k_gemv(&short).is_err(), "a y one element short");
        let counters = SplitKGemv { counters: span(0xb0000, 4), ..g };
        assert!(split_k_gemv(&counters).is_err(), "one counter for two row blocks");
    }
}

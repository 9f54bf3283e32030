//! The C signatures of the kernels graphsafe loads from its own fatbins
//! (`cuda-src/testing/graph_safety.cu`, `cuda-src/mla/reference.cu`), each as a safe constructor
//! of a [`KernelLaunch`]: it checks every span against what its kernel touches for the sizes given
//! and holds the one `unsafe` for that kernel, as `sys::glue` does for the linked kernels.
//!
//! Nothing here knows what the kernels are for: loading them, sizing their workspaces and the
//! graph-aware entry points are the ops' (`ops::testing`, `ops::mla::reference`), which admit
//! their memory to an `OpTarget` and launch what is built here.

use super::{Dim3, Function, KernelLaunch, LaunchConfig, Param};
use crate::error::{Error, Result};
use crate::sys::DeviceSpan;

/// Rows of `y` per CTA of `gs_splitk_gemv` (its block size).
pub(crate) const SPLITK_ROWS: u32 = 128;

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

/// The grid of a split-K GEMV: one CTA per block of rows and K chunk.
pub(crate) fn split_k_config(m: u32, splits: u32) -> LaunchConfig {
    LaunchConfig { grid: Dim3::new(m.div_ceil(SPLITK_ROWS), splits, 1), block: Dim3::x(SPLITK_ROWS), shared_mem_bytes: 0, cluster: None }
}

/// The launch of `f` (`gs_splitk_gemv`) for `g`, after checking the sizes and every span.
pub(crate) fn split_k_gemv<'f>(f: &'f Function, g: &SplitKGemv) -> Result<KernelLaunch<'f>> {
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
    // SAFETY: the parameters are the kernel's, in order and of its C types (pointers to f32 / u32
    // arrays, then three ints); each span holds what the grid of `split_k_config` reads and
    // writes for these sizes (checked above); the spans' invariant covers their lifetime.
    unsafe { KernelLaunch::new(f, split_k_config(g.m, g.splits), &p) }
}

/// The launch of `f` (`gs_empty()`: no parameters, touches no memory) as one CTA of 32 threads.
pub(crate) fn empty(f: &Function) -> Result<KernelLaunch<'_>> {
    // SAFETY: the kernel takes no parameters and touches no memory.
    unsafe { KernelLaunch::new(f, LaunchConfig::linear(1, 32), &[]) }
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

/// The launch of `f` (`gs_mla_reference`) for `r`: one CTA per (head, request), after checking
/// every buffer against what the kernel touches. The kernel clamps the device lengths to
/// `0..=max_seq_len` and page indices into the cache, so their values cannot take it outside
/// these buffers.
pub(crate) fn mla_reference<'f>(f: &'f Function, r: &MlaReference) -> Result<KernelLaunch<'f>> {
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
    let cfg = LaunchConfig { grid: Dim3::new(h as u32, b as u32, 1), block: Dim3::x(256), shared_mem_bytes: 0, cluster: None };
    // SAFETY: the parameters are gs_mla_reference's, in order and of its C types; each buffer
    // holds what the grid reads or writes for these sizes (checked above), with device lengths
    // and page indices clamped by the kernel; the spans' invariant covers their lifetime.
    unsafe { KernelLaunch::new(f, cfg, &p) }
}

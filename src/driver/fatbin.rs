//! graphsafe's own fatbin kernels that exist for testing (`cuda-src/testing/graph_safety.cu`,
//! `cuda-src/mla/reference.cu`): loading them, their C signatures, and typed launches that check
//! every buffer against what the kernel touches (the raw launch, `Function::launch`, stays here).
//!
//! The safe, graph-aware entry points (`split_k_gemv`, `…_captured`, `GpuReference::run`) are in
//! `ops::testing` and `ops::mla::reference`; they admit their memory to a `Target` and launch the
//! [`KernelLaunch`]es made here.

use super::{Context, DevicePtr, Dim3, Function, KernelLaunch, LaunchConfig, Module, Param, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use crate::sys::DeviceSpan;
use std::sync::Arc;

/// Rows per CTA of the split-K kernel.
pub const SPLITK_ROWS: u32 = 128;

/// Alignment of the split-K kernel's counters after its partial sums (the workspace's granule).
const COUNTERS_ALIGN: u64 = 256;

/// Shape of one split-K GEMV: `y[m] = A[m, k] · x[k]`, K cut into `splits` chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitKShape {
    /// Rows of A.
    pub m: u32,
    /// Columns of A.
    pub k: u32,
    /// K chunks (CTAs per row block).
    pub splits: u32,
}

impl SplitKShape {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.m == 0 || self.k == 0 || self.m > i32::MAX as u32 || self.k > i32::MAX as u32 {
            return Err(Error::invalid("shape", "m and k in 1..=i32::MAX", format!("{self:?}")));
        }
        if self.splits == 0 || self.splits > self.k || self.splits > 65_535 {
            return Err(Error::invalid("splits", format!("1..=min(k, 65535) = {}", self.k.min(65_535)), self.splits));
        }
        Ok(())
    }

    fn row_blocks(&self) -> u32 {
        self.m.div_ceil(SPLITK_ROWS)
    }

    /// The shape's sizes do not fit in 64 bits (only possible for a shape [`SplitKShape::validate`]
    /// refuses: its fields are any `u32`).
    fn too_big(&self) -> Error {
        Error::invalid("shape", "sizes whose byte counts fit in 64 bits", format!("{self:?}"))
    }

    fn counters_offset(&self) -> Result<u64> {
        (self.splits as u64)
            .checked_mul(self.m as u64)
            .and_then(|n| n.checked_mul(4))
            .and_then(|b| b.checked_next_multiple_of(COUNTERS_ALIGN))
            .ok_or_else(|| self.too_big())
    }

    /// Where the counters lie in the workspace: (byte offset, bytes).
    pub(crate) fn counters_range(&self) -> Result<(u64, u64)> {
        Ok((self.counters_offset()?, self.row_blocks() as u64 * 4))
    }

    /// Workspace bytes: `splits * m` fp32 partials, then one u32 counter per row block.
    /// `InvalidArgument` for a shape whose size does not fit in 64 bits.
    pub fn workspace_bytes(&self) -> Result<u64> {
        self.counters_offset()?.checked_add(self.row_blocks() as u64 * 4).ok_or_else(|| self.too_big())
    }

    /// Refuses buffers of fewer bytes than the shape reads or writes.
    pub(crate) fn check_buffers(&self, a: u64, x: u64, y: u64) -> Result<()> {
        let need = |what: &str, have: u64, n: Option<u64>| {
            let bytes = n.and_then(|n| n.checked_mul(4)).ok_or_else(|| self.too_big())?;
            if have < bytes {
                Err(Error::invalid(what, format!("at least {bytes} bytes ({} f32)", bytes / 4), have))
            } else {
                Ok(())
            }
        };
        need("a", a, (self.m as u64).checked_mul(self.k as u64))?;
        need("x", x, Some(self.k as u64))?;
        need("y", y, Some(self.m as u64))
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig { grid: Dim3::new(self.row_blocks(), self.splits, 1), block: Dim3::x(SPLITK_ROWS), shared_mem_bytes: 0, cluster: None }
    }
}

/// The graph-safety test kernels, loaded into one context.
#[derive(Clone, Debug)]
pub struct TestKernels {
    split_k: Function,
    empty: Function,
}

impl TestKernels {
    /// Loads the kernels for `ctx`'s device; `ArchUnsupported` when this build has none for it.
    pub fn load(ctx: &Arc<Context>) -> Result<TestKernels> {
        let (major, minor) = ctx.device().compute_capability()?;
        crate::arch::target_for(crate::arch::Op::Kernels, (major, minor))?;
        let have = format!("sm_{major}{minor}");
        let unsupported = || Error::ArchUnsupported {
            op: "testing kernels",
            need: crate::arch::need(crate::arch::Op::Kernels),
            have: have.clone(),
        };
        let image = crate::sys::modules::TESTING_GRAPH_SAFETY.ok_or_else(unsupported)?;
        // SAFETY: a fatbin build.rs embedded whole (crate::sys::modules).
        let module = match unsafe { Module::load(ctx, image) } {
            Err(Error::Driver { code, .. }) if code == c::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU.0 => return Err(unsupported()),
            other => other?,
        };
        Ok(TestKernels { split_k: module.function("gs_splitk_gemv")?, empty: module.function("gs_empty")? })
    }

    /// `gs_splitk_gemv(a, x, y, partials, counters, m, k, splits)` over checked spans: `a` holds
    /// `m·k` f32, `x` `k`, `y` `m`, and `ws` the shape's workspace (partials, then counters).
    pub(crate) fn split_k_launch(&self, a: DeviceSpan, x: DeviceSpan, y: DeviceSpan, shape: SplitKShape, ws: DeviceSpan) -> Result<KernelLaunch<'_>> {
        shape.validate()?;
        shape.check_buffers(a.len(), x.len(), y.len())?;
        let (m, k) = (shape.m as u64, shape.k as u64);
        let (a, x, y) = (a.require("a", 4 * m * k, 4)?, x.require("x", 4 * k, 4)?, y.require("y", 4 * m, 4)?);
        let partials = ws.require("workspace", shape.workspace_bytes()?, 4)?;
        // SAFETY: the parameters are the kernel's, in order and of its C types (pointers to f32 /
        // u32 arrays, then three ints); a, x, y and the workspace hold what the grid of `config()`
        // reads and writes (checked above); the spans' invariant covers their lifetime.
        unsafe { self.split_k_raw(a, x, y, shape, partials) }
    }

    /// [`TestKernels::split_k_launch`] on addresses nobody checked.
    ///
    /// # Safety
    /// As [`KernelLaunch::new`]: every address holds what the shape reads or writes.
    unsafe fn split_k_raw(&self, a: DevicePtr, x: DevicePtr, y: DevicePtr, shape: SplitKShape, ws: DevicePtr) -> Result<KernelLaunch<'_>> {
        let counters = ws + shape.counters_offset()?;
        let params = [
            Param::Ptr(a),
            Param::Ptr(x),
            Param::Ptr(y),
            Param::Ptr(ws),
            Param::Ptr(counters),
            Param::I32(shape.m as i32),
            Param::I32(shape.k as i32),
            Param::I32(shape.splits as i32),
        ];
        // SAFETY: the caller's contract.
        unsafe { KernelLaunch::new(&self.split_k, shape.config(), &params) }
    }

    /// The split-K GEMV on raw addresses: the unguarded path graphsafe exists to replace, kept
    /// for the test that proves the guarded one can fail.
    ///
    /// # Safety
    /// All addresses must be valid for the shape for as long as the launch (or any graph that
    /// captured it) can run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn split_k_gemv_raw(&self, a: DevicePtr, x: DevicePtr, y: DevicePtr, shape: SplitKShape, ws: DevicePtr, stream: c::CUstream, ctx: &Arc<Context>) -> Result<()> {
        shape.validate()?;
        // SAFETY: the caller's contract covers the stream and every address.
        unsafe {
            let s = Stream::unlisted(ctx, stream);
            self.split_k_raw(a, x, y, shape, ws)?.enqueue(&s)
        }
    }

    /// `gs_empty()`: one CTA of 32 threads, no parameters.
    pub(crate) fn empty_launch(&self) -> Result<KernelLaunch<'_>> {
        // SAFETY: the kernel takes no parameters and touches no memory.
        unsafe { KernelLaunch::new(&self.empty, LaunchConfig::linear(1, 32), &[]) }
    }

    /// The raw empty kernel, for benchmarks comparing against direct driver calls.
    pub fn empty_function(&self) -> &Function {
        &self.empty
    }
}

/// `gs_mla_reference` (`cuda-src/mla/reference.cu`), loaded into one context.
#[derive(Clone, Debug)]
pub(crate) struct MlaReferenceKernel(Function);

/// One run of the reference: q contiguous `[batch, heads, 512 | 64]`, the paged KV cache, the
/// device lengths and page table, an f32 scratch `[batch, heads, max_seq_len]`, f32 outputs.
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

impl MlaReferenceKernel {
    /// Loads it (every arch of the build has it).
    pub(crate) fn load(ctx: &Arc<Context>) -> Result<MlaReferenceKernel> {
        let image = crate::sys::modules::MLA_REFERENCE
            .ok_or_else(|| Error::ArchUnsupported { op: "mla reference", need: "a build with any GPU arch".into(), have: "none".into() })?;
        // SAFETY: a fatbin build.rs embedded whole (crate::sys::modules).
        Ok(MlaReferenceKernel(unsafe { Module::load(ctx, image) }?.function("gs_mla_reference")?))
    }

    /// The launch for `r`: one CTA per (head, request), after checking every buffer against what
    /// the kernel touches. The kernel clamps the device lengths to `0..=max_seq_len` and page
    /// indices into the cache, so their values cannot take it outside these buffers.
    pub(crate) fn launch(&self, r: &MlaReference) -> Result<KernelLaunch<'_>> {
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
        unsafe { KernelLaunch::new(&self.0, cfg, &p) }
    }
}

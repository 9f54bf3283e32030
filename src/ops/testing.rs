//! Kernels that exist to prove graph safety on real memory (`cuda-src/testing/graph_safety.cu`),
//! used by the GPU tests, `graphsafe demo` and the overhead benchmark.
//!
//! [`TestKernels::split_k_gemv`] computes `y = A·x` with K split across CTAs; the partial sums and
//! a completion counter per row block live in the workspace, and the counter must be zero at
//! launch (the kernel resets it when done). It is the shape of kernel that hangs or corrupts when
//! its workspace is dirty or has moved under a captured graph.

use crate::driver::{Context, DeviceBuffer, DevicePtr, Function, LaunchConfig, Module, Stream};
use crate::error::{Error, Result};
use crate::graph::target::Target;
use crate::graph::{Capture, Captured, CapturedBuffer};
use crate::ops::tensor::DeviceMemory;
use crate::sys::cuda as c;
use crate::workspace::{Workspace, WORKSPACE_ALIGN};
use std::ffi::c_void;
use std::sync::Arc;

/// Rows per CTA of the split-K kernel.
pub const SPLITK_ROWS: u32 = 128;

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
    fn validate(&self) -> Result<()> {
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

    fn counters_offset(&self) -> u64 {
        (self.splits as u64 * self.m as u64 * 4).next_multiple_of(WORKSPACE_ALIGN)
    }

    /// Workspace bytes: `splits * m` fp32 partials, then one u32 counter per row block.
    pub fn workspace_bytes(&self) -> u64 {
        self.counters_offset() + self.row_blocks() as u64 * 4
    }

    fn check_buffers(&self, a: usize, x: usize, y: usize) -> Result<()> {
        let need = |what: &str, have: usize, n: u64| {
            if (have as u64) < n * 4 {
                Err(Error::invalid(what, format!("at least {} bytes ({n} f32)", n * 4), have))
            } else {
                Ok(())
            }
        };
        need("a", a, self.m as u64 * self.k as u64)?;
        need("x", x, self.k as u64)?;
        need("y", y, self.m as u64)
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: crate::driver::Dim3::new(self.row_blocks(), self.splits, 1),
            block: crate::driver::Dim3::x(SPLITK_ROWS),
            shared_mem_bytes: 0,
            cluster: None,
        }
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
        let module = match Module::load(ctx, image) {
            Err(Error::Driver { code, .. }) if code == c::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU.0 => return Err(unsupported()),
            other => other?,
        };
        Ok(TestKernels { split_k: module.function("gs_splitk_gemv")?, empty: module.function("gs_empty")? })
    }

    /// Eager split-K GEMV; grows `ws` if needed (before launching, on `stream`).
    pub fn split_k_gemv(
        &self,
        a: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        shape: SplitKShape,
        ws: &mut Workspace,
        stream: &Stream,
    ) -> Result<()> {
        self.split_k_on(&a, &x, &y, shape, Target::eager(stream, Some(ws))?)
    }

    /// Captured split-K GEMV: never grows; `WorkspaceTooSmall` (nothing captured) when the bound
    /// workspace is smaller than the shape needs; every view must belong to `cap`.
    pub fn split_k_gemv_captured<'id>(
        &self,
        a: &CapturedBuffer<'id>,
        x: &CapturedBuffer<'id>,
        y: &CapturedBuffer<'id>,
        shape: SplitKShape,
        ws: &Captured<'id>,
        cap: &Capture<'_, 'id>,
    ) -> Result<()> {
        self.split_k_on(a, x, y, shape, Target::captured(cap.site(), Some(ws.view()))?)
    }

    fn split_k_on<M: DeviceMemory>(&self, a: &M, x: &M, y: &M, shape: SplitKShape, mut target: Target<'_>) -> Result<()> {
        shape.validate()?;
        shape.check_buffers(a.len(), x.len(), y.len())?;
        target.admit("a", a)?;
        target.admit("x", x)?;
        target.admit("y", y)?;
        let (w, _) = target.workspace(shape.workspace_bytes())?;
        target.commit();
        // SAFETY: buffers checked above and borrowed for the call (eager) or kept by the capture;
        // the workspace holds the shape's bytes, and the stream orders the launch after its
        // zero-fill.
        unsafe { self.launch_split_k(a.device_ptr(), x.device_ptr(), y.device_ptr(), shape, w, |f, cfg, p| target.launch(f, cfg, p)) }
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
            let s = Stream::adopt(ctx, stream)?;
            self.launch_split_k(a, x, y, shape, ws, |f, cfg, p| f.launch(cfg, &s, p))
        }
    }

    unsafe fn launch_split_k(
        &self,
        a: DevicePtr,
        x: DevicePtr,
        y: DevicePtr,
        shape: SplitKShape,
        ws: DevicePtr,
        launch: impl FnOnce(&Function, &LaunchConfig, &mut [*mut c_void]) -> Result<()>,
    ) -> Result<()> {
        let mut partials = ws;
        let mut counters = ws + shape.counters_offset();
        let (mut a, mut x, mut y) = (a, x, y);
        let (mut m, mut k, mut splits) = (shape.m as i32, shape.k as i32, shape.splits as i32);
        let mut params: [*mut c_void; 8] = [
            (&mut a as *mut DevicePtr).cast(),
            (&mut x as *mut DevicePtr).cast(),
            (&mut y as *mut DevicePtr).cast(),
            (&mut partials as *mut DevicePtr).cast(),
            (&mut counters as *mut DevicePtr).cast(),
            (&mut m as *mut i32).cast(),
            (&mut k as *mut i32).cast(),
            (&mut splits as *mut i32).cast(),
        ];
        launch(&self.split_k, &shape.config(), &mut params)
    }

    /// Launches the empty kernel (1 CTA of 32 threads) on `stream`.
    pub fn empty(&self, stream: &Stream) -> Result<()> {
        // The overhead bench's eager path: the cheap check only (an atomic load), as for replays.
        stream.ensure_no_open_capture()?;
        // SAFETY: the kernel takes no parameters.
        unsafe { self.empty.launch(&LaunchConfig::linear(1, 32), stream, &mut []) }
    }

    /// Captures the empty kernel.
    pub fn empty_captured(&self, cap: &Capture<'_, '_>) -> Result<()> {
        // SAFETY: the kernel takes no parameters.
        unsafe { cap.launch(&self.empty, &LaunchConfig::linear(1, 32), &mut []) }
    }

    /// The raw empty kernel, for benchmarks comparing against direct driver calls.
    pub fn empty_function(&self) -> &Function {
        &self.empty
    }
}

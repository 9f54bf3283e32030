//! Kernels that exist to prove graph safety on real memory (`cuda-src/testing/graph_safety.cu`),
//! used by the GPU tests, `graphsafe demo` and the overhead benchmark.
//!
//! [`TestKernels::split_k_gemv`] computes `y = A·x` with K split across CTAs; the partial sums and
//! a completion counter per row block live in the workspace, and the counter must be zero at
//! launch: the op zeroes the counters before every launch (a memset node when captured), since
//! a workspace shared with other shapes or ops holds their bytes there (the kernel also resets
//! them when done). It is the shape of kernel that hangs or corrupts when its workspace is dirty
//! or has moved under a captured graph (the unguarded [`TestKernels::split_k_gemv_raw`] shows it).
//!
//! The kernels, their loading and their typed launches live in the driver layer (as does
//! [`TestKernels::split_k_gemv_raw`], the deliberately unguarded path); the guarded entry points
//! below admit every buffer to a target first.

pub use crate::driver::fatbin::{SplitKShape, TestKernels, SPLITK_ROWS};

use crate::driver::{DeviceBuffer, Stream};
use crate::error::Result;
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{mem_range, refuse_overlap, DeviceMemory};
use crate::workspace::Workspace;

impl TestKernels {
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
        self.split_k_on(&a, &x, &y, shape, OpTarget::eager(stream, Some(ws))?)
    }

    /// Captured split-K GEMV: never grows; `WorkspaceTooSmall` (nothing captured) when the bound
    /// workspace is smaller than the shape needs; every view must belong to `cap`.
    pub fn split_k_gemv_captured<'id>(
        &self,
        a: &CapturedBuffer<'id>,
        x: &CapturedBuffer<'id>,
        y: &CapturedBuffer<'id>,
        shape: SplitKShape,
        ws: &CapturedWorkspace<'id>,
        cap: &Capture<'_, 'id>,
    ) -> Result<()> {
        self.split_k_on(a, x, y, shape, OpTarget::captured(cap.site(), Some(ws.view()))?)
    }

    fn split_k_on<M: DeviceMemory>(&self, a: &M, x: &M, y: &M, shape: SplitKShape, mut target: OpTarget<'_>) -> Result<()> {
        shape.validate()?;
        shape.check_buffers(a.len() as u64, x.len() as u64, y.len() as u64)?;
        // Other CTAs still read a and x while one writes its rows of y.
        let y_range = mem_range(y, 4 * shape.m as u64);
        refuse_overlap(("y", y_range), ("a", mem_range(a, 4 * shape.m as u64 * shape.k as u64)))?;
        refuse_overlap(("y", y_range), ("x", mem_range(x, 4 * shape.k as u64)))?;
        let (a, x, y) = (target.admit("a", a)?, target.admit("x", x)?, target.admit("y", y)?);
        let w = target.workspace(shape.workspace_bytes()?)?;
        let launch = self.split_k_launch(a, x, y, shape, w)?;
        target.check_launch(&launch)?;
        target.commit()?;
        // The counters must be zero at launch. The kernel resets them when it finishes, but a
        // workspace shared with other shapes or ops (what the planner sizes) holds their bytes
        // there: a split-K kernel zeroes its semaphores per launch (invariant 3), a memset node in
        // a graph. (tests/standin_failures.rs, split_k_shapes_sharing_one_workspace…)
        let (offset, bytes) = shape.counters_range()?;
        target.zero(w, offset, bytes)?;
        target.launch(launch)
    }

    /// Launches the empty kernel (1 CTA of 32 threads) on `stream`.
    pub fn empty(&self, stream: &Stream) -> Result<()> {
        // The overhead bench's eager path: the check replays run (an atomic load, and a driver
        // query only on a stream whose handle other code holds), not every eager API's.
        stream.ensure_replayable()?;
        self.empty_launch()?.enqueue(stream)
    }

    /// Captures the empty kernel.
    pub fn empty_captured(&self, cap: &Capture<'_, '_>) -> Result<()> {
        OpTarget::captured(cap.site(), None)?.launch(self.empty_launch()?)
    }
}

//! Kernels that exist to prove graph safety on real memory (`cuda-src/testing/graph_safety.cu`),
//! used by the GPU tests, `graphsafe demo` and the overhead benchmark.
//!
//! [`TestKernels::split_k_gemv`] computes `y = A·x` with K split across CTAs; the partial sums and
//! a completion counter per row block live in the workspace, and the counter must be zero at
//! launch: the op zeroes the counters before every launch (a memset node when captured), since
//! a workspace shared with other shapes or ops holds their bytes there (the kernel also resets
//! them when done). It is the shape of kernel that hangs or corrupts when its workspace is dirty
//! or has moved under a captured graph (the tests launch it unguarded, through
//! [`Function::launch`] with [`TestKernels::split_k_function`], to show it).
//!
//! The kernels' C signatures are checked launch arguments of the FFI layer
//! (`sys::module_kernels`); what is here admits every buffer to an `OpTarget` first and launches
//! through the `Launch` its commit returns.

use crate::driver::{Context, DeviceBuffer, Dim3, Function, KernelLaunch, LaunchConfig, Module, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedBuffer, CapturedWorkspace};
use crate::ops::tensor::{mem_range, refuse_overlap, DeviceMemory};
use crate::sys::module_kernels::{self, SplitKGemv};
use crate::sys::{cuda as c, Fatbin};
use crate::workspace::Workspace;
use std::sync::Arc;

/// Rows per CTA of the split-K kernel.
pub const SPLITK_ROWS: u32 = module_kernels::SPLITK_ROWS;

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

    /// Where the counters lie in the workspace: (byte offset, bytes); the partial sums start at 0.
    pub fn counters_range(&self) -> Result<(u64, u64)> {
        Ok((self.counters_offset()?, self.row_blocks() as u64 * 4))
    }

    /// Workspace bytes: `splits * m` fp32 partials, then one u32 counter per row block.
    /// `InvalidArgument` for a shape whose size does not fit in 64 bits.
    pub fn workspace_bytes(&self) -> Result<u64> {
        self.counters_offset()?.checked_add(self.row_blocks() as u64 * 4).ok_or_else(|| self.too_big())
    }

    /// The kernel's grid and block for this shape.
    pub fn launch_config(&self) -> LaunchConfig {
        let (grid, block) = module_kernels::split_k_dims(self.m, self.splits);
        LaunchConfig { grid: Dim3::new(grid[0], grid[1], grid[2]), block: Dim3::new(block[0], block[1], block[2]), shared_mem_bytes: 0, cluster: None }
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
        let module = match Module::load_embedded(ctx, Fatbin::TESTING_GRAPH_SAFETY.ok_or_else(unsupported)?) {
            Err(Error::Driver { code, .. }) if code == c::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU.0 => return Err(unsupported()),
            other => other?,
        };
        Ok(TestKernels { split_k: module.function("gs_splitk_gemv")?, empty: module.function("gs_empty")? })
    }

    /// The raw split-K kernel, `gs_splitk_gemv(a, x, y, partials, counters, m, k, splits)` (f32
    /// pointers, the counters u32, then three ints; the grid of [`SplitKShape::launch_config`]):
    /// for tests that launch it unguarded, with [`Function::launch`], to show what the guarded
    /// path prevents.
    pub fn split_k_function(&self) -> &Function {
        &self.split_k
    }

    /// The raw empty kernel, for benchmarks comparing against direct driver calls.
    pub fn empty_function(&self) -> &Function {
        &self.empty
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
        let (offset, bytes) = shape.counters_range()?;
        let g = SplitKGemv { a, x, y, partials: w, counters: w.skip("workspace", offset)?, m: shape.m, k: shape.k, splits: shape.splits };
        let launch = KernelLaunch::new(&self.split_k, module_kernels::split_k_gemv(&g)?)?;
        target.check_launch(&launch)?;
        let go = target.commit()?;
        // The counters must be zero at launch. The kernel resets them when it finishes, but a
        // workspace shared with other shapes or ops (what the planner sizes) holds their bytes
        // there: a split-K kernel zeroes its semaphores per launch (invariant 3), a memset node in
        // a graph. (tests/standin_failures.rs, split_k_shapes_sharing_one_workspace…)
        go.zero(w, offset, bytes)?;
        go.kernel(launch)
    }

    /// Launches the empty kernel (1 CTA of 32 threads) on `stream`.
    pub fn empty(&self, stream: &Stream) -> Result<()> {
        // The overhead bench's eager path: the check replays run (an atomic load, and a driver
        // query only on a stream whose handle other code holds), not every eager API's; the
        // kernel touches no memory.
        let mut target = OpTarget::eager_memoryless(stream)?;
        let launch = KernelLaunch::new(&self.empty, module_kernels::empty()?)?;
        target.commit()?.kernel(launch)
    }

    /// Captures the empty kernel.
    pub fn empty_captured(&self, cap: &Capture<'_, '_>) -> Result<()> {
        let launch = KernelLaunch::new(&self.empty, module_kernels::empty()?)?;
        OpTarget::captured(cap.site(), None)?.commit()?.kernel(launch)
    }
}

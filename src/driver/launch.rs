use super::{check, init, Function, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::Committed;
use crate::sys::cuda as c;
use crate::sys::module_kernels::{KernelArgs, Param, MAX_PARAMS};
use std::ffi::c_void;

/// A grid, block or cluster shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim3 {
    /// x
    pub x: u32,
    /// y
    pub y: u32,
    /// z
    pub z: u32,
}

impl Dim3 {
    /// (x, 1, 1)
    pub const fn x(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
    /// (x, y, z)
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }
    fn valid(&self) -> bool {
        self.x > 0 && self.y > 0 && self.z > 0
    }
}

/// How to launch a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Grid of blocks.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// Thread-block cluster shape (sm_90+); `None` launches without clusters.
    pub cluster: Option<Dim3>,
}

impl LaunchConfig {
    /// A 1-D launch without clusters or dynamic shared memory.
    pub const fn linear(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig { grid: Dim3::x(grid), block: Dim3::x(block), shared_mem_bytes: 0, cluster: None }
    }
}

/// Where [`Function::launch`] enqueues: a [`Stream`], or an open capture
/// ([`crate::graph::Capture`]), which then also keeps the kernel's module loaded for as long as
/// its graphs live. Sealed: the capturing stream is reached only through [`LaunchToken`], which
/// only this module makes, so no eager API is ever handed a capturing stream.
pub trait LaunchTarget: sealed::Sealed {
    /// The stream the launch goes to (callable only with a token this module makes).
    fn launch_stream(&self, token: LaunchToken) -> &Stream;
    /// Called before the launch with the kernel's module (a capture keeps it).
    fn keep_module(&self, module: &std::sync::Arc<super::Module>, token: LaunchToken) {
        let _ = (module, token);
    }
}

/// Proof that the call comes from [`Function::launch`]; nothing outside this module can make one.
#[derive(Clone, Copy, Debug)]
pub struct LaunchToken(());

pub mod sealed {
    /// Implemented by [`super::Stream`] and [`crate::graph::Capture`] only.
    pub trait Sealed {}
}

impl sealed::Sealed for Stream {}
impl LaunchTarget for Stream {
    fn launch_stream(&self, _: LaunchToken) -> &Stream {
        self
    }
}

impl Function {
    /// Refuses a launch of this kernel with `cfg` on `stream` that [`Function::launch`] would
    /// refuse: an empty grid or block, or a stream of another context.
    pub(crate) fn check_launch(&self, cfg: &LaunchConfig, stream: &Stream) -> Result<()> {
        if !cfg.grid.valid() || !cfg.block.valid() {
            return Err(Error::invalid("launch dimensions", "all of grid and block >= 1", format!("{cfg:?}")));
        }
        if stream.context().raw() != self.module().context().raw() {
            return Err(Error::other_context("stream", "a stream", "the kernel's", self.module().context().raw(), stream.context().raw()));
        }
        Ok(())
    }

    /// Launches the kernel on `target` (a [`Stream`], or an open capture: the graph then keeps
    /// the kernel's module loaded) with `cuLaunchKernel`, or `cuLaunchKernelEx` when a cluster
    /// shape is given.
    ///
    /// # Safety
    /// `params` must point to one value per kernel parameter, of the kernel's parameter types, and
    /// every device address among them must be valid for what the kernel does with it until the
    /// kernel has finished; in a capture, it must come from a workspace or buffer bound to the
    /// capture (or otherwise outlive every graph made from it).
    pub unsafe fn launch<T: LaunchTarget + ?Sized>(&self, cfg: &LaunchConfig, target: &T, params: &mut [*mut c_void]) -> Result<()> {
        let stream = target.launch_stream(LaunchToken(()));
        self.check_launch(cfg, stream)?;
        // Only a launch that goes ahead adds the module to a capture's keep list.
        target.keep_module(self.module(), LaunchToken(()));
        // No context switch: the function and the stream carry their context, and an eager launch
        // must cost what a raw cuLaunchKernel costs (benches/overhead.rs).
        match cfg.cluster {
            None => {
                let (f, name) = self.launch_fn;
                // SAFETY: the caller's contract covers `params`; the handles are live.
                let r = unsafe {
                    f(
                        self.raw,
                        cfg.grid.x,
                        cfg.grid.y,
                        cfg.grid.z,
                        cfg.block.x,
                        cfg.block.y,
                        cfg.block.z,
                        cfg.shared_mem_bytes,
                        stream.handle(),
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                check(r, name)
            }
            Some(cl) => {
                if !cl.valid() {
                    return Err(Error::invalid("cluster dimensions", "all >= 1", format!("{cl:?}")));
                }
                let mut attr = c::CUlaunchAttribute { id: c::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, ..Default::default() };
                attr.value.clusterDim.x = cl.x;
                attr.value.clusterDim.y = cl.y;
                attr.value.clusterDim.z = cl.z;
                let lc = c::CUlaunchConfig {
                    gridDimX: cfg.grid.x,
                    gridDimY: cfg.grid.y,
                    gridDimZ: cfg.grid.z,
                    blockDimX: cfg.block.x,
                    blockDimY: cfg.block.y,
                    blockDimZ: cfg.block.z,
                    sharedMemBytes: cfg.shared_mem_bytes,
                    hStream: stream.handle(),
                    attrs: &mut attr,
                    numAttrs: 1,
                };
                let f = init()?.cuLaunchKernelEx()?;
                // SAFETY: the caller's contract covers `params`; `lc` and `attr` outlive the call.
                check(unsafe { (f.f)(&lc, self.raw, params.as_mut_ptr(), std::ptr::null_mut()) }, f.name)
            }
        }
    }
}

/// A launch of one of graphsafe's fatbin kernels: the kernel, and the arguments a constructor of
/// `sys::module_kernels` built for its C signature from spans checked against what it touches.
/// Made only by [`KernelLaunch::new`], which refuses arguments built for another kernel; enqueued
/// only through `graph::op_target::Launch::kernel` (an op's committed launch), since
/// [`KernelLaunch::enqueue`] asks for the [`Committed`] proof only that `Launch` holds.
#[derive(Debug)]
pub(crate) struct KernelLaunch<'f> {
    f: &'f Function,
    cfg: LaunchConfig,
    args: KernelArgs,
}

impl<'f> KernelLaunch<'f> {
    /// The launch of `f` with `args`: refused unless `args` were built for `f`'s kernel (the same
    /// embedded fatbin and kernel name), so the kernel receives the parameters of its signature.
    pub(crate) fn new(f: &'f Function, args: KernelArgs) -> Result<KernelLaunch<'f>> {
        let same_image = f.module().embedded().is_some_and(|i| i.same(args.image()));
        if !same_image || f.name() != args.kernel() {
            return Err(Error::invalid("kernel", format!("{} of its embedded fatbin", args.kernel()), f.name()));
        }
        let dim = |d: [u32; 3]| Dim3::new(d[0], d[1], d[2]);
        let (grid, block) = args.dims();
        Ok(KernelLaunch { f, cfg: LaunchConfig { grid: dim(grid), block: dim(block), shared_mem_bytes: 0, cluster: None }, args })
    }

    /// The kernel (its module must outlive any graph that captures the launch).
    pub(crate) fn function(&self) -> &Function {
        self.f
    }

    /// What [`KernelLaunch::enqueue`] on `stream` would refuse, refused now: for ops to check
    /// before they commit (capture or enqueue) anything.
    pub(crate) fn check_for(&self, stream: &Stream) -> Result<()> {
        self.f.check_launch(&self.cfg, stream)
    }

    /// Enqueues the launch on `stream` (which must be of the kernel's context: checked). Only the
    /// `Launch` an op's commit returns holds the [`Committed`] this asks for.
    pub(crate) fn enqueue(self, stream: &Stream, _: &Committed) -> Result<()> {
        let (mut params, count) = self.args.into_params();
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (slot, p) in ptrs.iter_mut().zip(params[..count].iter_mut()) {
            *slot = match p {
                Param::Ptr(v) => (v as *mut u64).cast(),
                Param::I32(v) => (v as *mut i32).cast(),
                Param::F32(v) => (v as *mut f32).cast(),
            };
        }
        // SAFETY: one pointer per parameter, each to a value of the parameter's C type that lives
        // in `params` for the call; the arguments were built for this kernel (checked by `new`)
        // by a constructor whose contract covers the kernel's signature and every device address.
        unsafe { self.f.launch(&self.cfg, stream, &mut ptrs[..count]) }
    }
}

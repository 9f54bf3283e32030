use super::{check, init, Function, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
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

/// One kernel parameter, by value, as a typed launch passes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Param {
    /// A device address (a `T*` parameter).
    Ptr(super::DevicePtr),
    /// An `int`.
    I32(i32),
    /// A `float`.
    F32(f32),
}

/// The most parameters a [`KernelLaunch`] carries (graphsafe's module kernels take at most 14).
const MAX_PARAMS: usize = 16;

/// A kernel launch whose parameters were built, by a typed constructor in this layer, for the
/// kernel's C signature and from memory checked against what the kernel touches: what lets
/// [`KernelLaunch::enqueue`] (and `graph::op_target::OpTarget::launch`) be safe.
#[derive(Debug)]
pub(crate) struct KernelLaunch<'f> {
    f: &'f Function,
    cfg: LaunchConfig,
    params: [Param; MAX_PARAMS],
    count: usize,
}

impl<'f> KernelLaunch<'f> {
    /// A launch of `f` with `params`, in order.
    ///
    /// # Safety
    /// `params` match the kernel's parameters in number, order and C type, and every device
    /// address among them is valid for what the kernel does with it for `cfg`'s grid (the
    /// [`crate::sys::DeviceSpan`] invariant: until the launch has finished, or while any graph
    /// that captures it can run).
    pub(crate) unsafe fn new(f: &'f Function, cfg: LaunchConfig, params: &[Param]) -> Result<KernelLaunch<'f>> {
        if params.len() > MAX_PARAMS {
            return Err(Error::invalid("kernel parameters", format!("at most {MAX_PARAMS}"), params.len()));
        }
        let mut all = [Param::I32(0); MAX_PARAMS];
        all[..params.len()].copy_from_slice(params);
        Ok(KernelLaunch { f, cfg, params: all, count: params.len() })
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

    /// Enqueues the launch on `stream` (which must be of the kernel's context: checked).
    pub(crate) fn enqueue(mut self, stream: &Stream) -> Result<()> {
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (slot, p) in ptrs.iter_mut().zip(self.params[..self.count].iter_mut()) {
            *slot = match p {
                Param::Ptr(v) => (v as *mut super::DevicePtr).cast(),
                Param::I32(v) => (v as *mut i32).cast(),
                Param::F32(v) => (v as *mut f32).cast(),
            };
        }
        // SAFETY: one pointer per parameter, each to a value of the parameter's C type that lives
        // in `self` for the call; the constructor's contract covers the kernel's signature and
        // every device address.
        unsafe { self.f.launch(&self.cfg, stream, &mut ptrs[..self.count]) }
    }
}

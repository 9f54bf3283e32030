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

impl Function {
    /// Launches the kernel on `stream` with `cuLaunchKernel`, or `cuLaunchKernelEx` when a
    /// cluster shape is given.
    ///
    /// # Safety
    /// `params` must point to one value per kernel parameter, of the kernel's parameter types, and
    /// every device address among them must be valid for what the kernel does with it until the
    /// kernel has finished (or, in a capture, until every graph made from it is gone).
    pub unsafe fn launch(&self, cfg: &LaunchConfig, stream: &Stream, params: &mut [*mut c_void]) -> Result<()> {
        if !cfg.grid.valid() || !cfg.block.valid() {
            return Err(Error::invalid("launch dimensions", "all of grid and block >= 1", format!("{cfg:?}")));
        }
        if stream.context().raw() != self.module().context().raw() {
            return Err(Error::invalid("stream", "a stream of the kernel's context", "a stream of another context"));
        }
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
                        stream.raw(),
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
                    hStream: stream.raw(),
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

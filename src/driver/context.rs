use super::{check, init, log_drop_error, Device};
use crate::error::Result;
use crate::sys::cuda as c;
use std::sync::Arc;

/// The primary context of a device, retained for as long as this value (and every object made
/// from it) lives. The primary context is the one the CUDA runtime uses too, so kernels launched
/// through the runtime in the glue run in the same context.
#[derive(Debug)]
pub struct Context {
    raw: c::CUcontext,
    device: Device,
}

// SAFETY: a CUcontext handle may be used from any thread; we make it current per call.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal` and makes it current on this thread.
    pub fn new(ordinal: usize) -> Result<Arc<Context>> {
        let device = Device::get(ordinal)?;
        let a = init()?;
        let f = a.cuDevicePrimaryCtxRetain()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; device is valid.
        check(unsafe { (f.f)(&mut raw, device.raw) }, f.name)?;
        let ctx = Arc::new(Context { raw, device });
        ctx.bind()?;
        Ok(ctx)
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUcontext {
        self.raw
    }

    /// Makes this context current on the calling thread (skipped when it already is).
    pub fn bind(&self) -> Result<()> {
        let a = init()?;
        let get = a.cuCtxGetCurrent()?;
        let mut cur = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { (get.f)(&mut cur) }, get.name)?;
        if cur == self.raw {
            return Ok(());
        }
        let set = a.cuCtxSetCurrent()?;
        // SAFETY: raw is a retained primary context.
        check(unsafe { (set.f)(self.raw) }, set.name)
    }

    /// Waits for all work in the context.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        let f = init()?.cuCtxSynchronize()?;
        // SAFETY: no arguments.
        check(unsafe { (f.f)() }, f.name)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let r = (|| {
            let f = init()?.cuDevicePrimaryCtxRelease()?;
            // SAFETY: we retained it in new().
            check(unsafe { (f.f)(self.device.raw) }, f.name)
        })();
        log_drop_error("cuDevicePrimaryCtxRelease", r);
    }
}

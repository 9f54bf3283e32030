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
    // Asked once: ops dispatch on them at every call.
    compute_capability: (i32, i32),
    sm_count: u32,
    // False for adopted contexts: the caller owns them.
    retained: bool,
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
        let ctx = Arc::new(Context {
            raw,
            device,
            compute_capability: device.compute_capability()?,
            sm_count: device.sm_count()?,
            retained: true,
        });
        ctx.bind()?;
        Ok(ctx)
    }

    /// Wraps a context the caller owns (an engine's existing `CUcontext`, primary or not); it is
    /// made current on this thread and not released on drop.
    ///
    /// # Safety
    /// `raw` must be a valid context that outlives the returned value and everything made from it.
    pub unsafe fn adopt(raw: c::CUcontext) -> Result<Arc<Context>> {
        if raw.is_null() {
            return Err(crate::Error::invalid("context", "a CUcontext", "null"));
        }
        let a = init()?;
        let set = a.cuCtxSetCurrent()?;
        check((set.f)(raw), set.name)?;
        let get = a.cuCtxGetDevice()?;
        let mut dev = 0;
        check((get.f)(&mut dev), get.name)?;
        let n = super::device_count()?;
        let device = (0..n)
            .map(Device::get)
            .find(|d| d.as_ref().is_ok_and(|d| d.raw == dev))
            .ok_or_else(|| crate::Error::invalid("context", "a context of a visible device", "an unknown device"))??;
        Ok(Arc::new(Context {
            raw,
            device,
            compute_capability: device.compute_capability()?,
            sm_count: device.sm_count()?,
            retained: false,
        }))
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device's compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's SM count.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
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
        if !self.retained {
            return;
        }
        let r = (|| {
            let f = init()?.cuDevicePrimaryCtxRelease()?;
            // SAFETY: we retained it in new().
            check(unsafe { (f.f)(self.device.raw) }, f.name)
        })();
        log_drop_error("cuDevicePrimaryCtxRelease", r);
    }
}

use super::{check, init, Context};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::ffi::CString;
use std::sync::Arc;

/// A module loaded from a fatbin/cubin image (those build.rs embeds: [`crate::sys::modules`]).
#[derive(Debug)]
pub struct Module {
    raw: c::CUmodule,
    ctx: Arc<Context>,
    // The embedded fatbin it was loaded from, if any: what `KernelLaunch::new` matches a
    // kernel's launch arguments against.
    embedded: Option<crate::sys::Fatbin>,
}

// SAFETY: module handles may be used from any thread.
unsafe impl Send for Module {}
// SAFETY: as for Send: a loaded module is only read.
unsafe impl Sync for Module {}

impl Module {
    /// Loads an image into `ctx`. The driver picks the cubin for the device's arch; an image with
    /// none for it gives `CUDA_ERROR_NO_BINARY_FOR_GPU`. The images build.rs embeds
    /// ([`crate::sys::modules`]) satisfy the contract below.
    ///
    /// # Safety
    /// `image` is a complete, well-formed cubin (ELF) or fatbin, or PTX text with a NUL byte
    /// before its end. `cuModuleLoadData` takes no length: it reads as far as the image's own
    /// headers say (or to the NUL), so a truncated, corrupt or unterminated image makes the driver
    /// read past the slice (without that promise `Module::load(&ctx, &[])` read address 8).
    pub unsafe fn load(ctx: &Arc<Context>, image: &[u8]) -> Result<Arc<Module>> {
        // SAFETY: the caller's promise, passed on.
        unsafe { Module::load_image(ctx, image, None) }
    }

    /// # Safety
    /// As [`Module::load`]; `embedded`, when given, is the fatbin `image` is.
    unsafe fn load_image(ctx: &Arc<Context>, image: &[u8], embedded: Option<crate::sys::Fatbin>) -> Result<Arc<Module>> {
        // The driver reads the fatbin header through aligned loads; include_bytes! only promises
        // byte alignment, so copy into 8-byte-aligned storage.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: the destination has at least image.len() bytes; regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len()) };
        let _current = ctx.enter()?;
        let f = init()?.cuModuleLoadData()?;
        let mut raw = std::ptr::null_mut();
        // Loading allocates device memory for the code: refused like an allocation while a
        // graphsafe capture forbids allocating to this thread (the capture survives).
        super::captures::outside_forbidding_capture(|| {
            // SAFETY: aligned holds the image (complete and well-formed: the caller's contract)
            // and outlives the call (the driver copies it).
            check(unsafe { (f.f)(&mut raw, aligned.as_ptr().cast()) }, f.name)
        })?;
        Ok(Arc::new(Module { raw, ctx: ctx.clone(), embedded }))
    }

    /// Loads a fatbin build.rs embedded into `ctx` (an image with no cubin for the device's arch
    /// gives `CUDA_ERROR_NO_BINARY_FOR_GPU`).
    pub(crate) fn load_embedded(ctx: &Arc<Context>, image: crate::sys::Fatbin) -> Result<Arc<Module>> {
        // SAFETY: a `Fatbin` is an image build.rs embedded whole: complete and well-formed.
        unsafe { Module::load_image(ctx, image.bytes(), Some(image)) }
    }

    /// The embedded fatbin the module was loaded from (`None`: an image the caller gave).
    pub(crate) fn embedded(&self) -> Option<crate::sys::Fatbin> {
        self.embedded
    }

    /// A kernel of the module by its (extern "C") name.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function> {
        let cname = CString::new(name).map_err(|_| Error::invalid("kernel name", "no NUL bytes", name))?;
        let _current = self.ctx.enter()?;
        let f = init()?.cuModuleGetFunction()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; cname is NUL-terminated.
        check(unsafe { (f.f)(&mut raw, self.raw, cname.as_ptr()) }, f.name)?;
        let launch = init()?.cuLaunchKernel()?;
        Ok(Function { raw, module: self.clone(), name: name.into(), launch_fn: (launch.f, launch.name) })
    }

    /// The context it was loaded into.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Every Function, and every graph that launches one, holds an Arc<Module>: none is left.
        // Queued kernels or replays may still run its code, so the unload follows the rules of a
        // free: after graphsafe's streams of the context drained, never while a capture of the
        // context is open (src/driver/memory/release.rs, `release`).
        super::memory::unload_module_when_idle(self.raw, &self.ctx);
    }
}

/// A kernel in a loaded module. Keeps its module loaded.
#[derive(Clone, Debug)]
pub struct Function {
    pub(crate) raw: c::CUfunction,
    module: Arc<Module>,
    name: Arc<str>,
    // cuLaunchKernel, resolved once: eager launch is a hot path.
    pub(crate) launch_fn: (<c::PFN_cuLaunchKernel_v4000 as crate::sys::driver::OptionInner>::Inner, &'static str),
}

// SAFETY: function handles may be used from any thread.
unsafe impl Send for Function {}
// SAFETY: as for Send: launches and attribute calls on a function are thread-safe in the driver.
unsafe impl Sync for Function {}

impl Function {
    /// The raw handle.
    pub fn raw(&self) -> c::CUfunction {
        self.raw
    }
    /// The module.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }
    /// The kernel's (extern "C") name, as it was looked up.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Sets a function attribute (e.g. the dynamic shared memory limit).
    pub fn set_attribute(&self, attr: c::CUfunction_attribute, value: i32) -> Result<()> {
        let _current = self.module.ctx.enter()?;
        let f = init()?.cuFuncSetAttribute()?;
        // SAFETY: live handle.
        check(unsafe { (f.f)(self.raw, attr, value) }, f.name)
    }
}

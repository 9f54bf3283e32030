//! Driver, devices and contexts through the C ABI.

use super::core::{GraphsafeContext, GraphsafeDeviceInfo};
use super::handles::{self, Tag};
use super::{guard, null, put};
use crate::driver::{self, Context};
use std::ffi::{c_char, c_int, c_void};

/// The driver's CUDA version.
///
/// # Safety
/// `major` and `minor` are null (refused) or point to writable `int`s. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_driver_version(major: *mut c_int, minor: *mut c_int) -> c_int {
    guard(|| {
        if major.is_null() || minor.is_null() {
            return Err(null("major/minor"));
        }
        let (a, b) = driver::driver_version()?;
        // SAFETY: non-null; the caller's contract.
        unsafe {
            put(major, "major", a)?;
            put(minor, "minor", b)
        }
    })
}

/// Number of CUDA devices. Fails with GRAPHSAFE_ERROR_DRIVER_NOT_FOUND without a driver.
///
/// # Safety
/// `count` is null (refused) or points to a writable `int`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_device_count(count: *mut c_int) -> c_int {
    guard(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        let n = driver::device_count()?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(count, "count", n as c_int) }
    })
}

/// Name, compute capability, SMs and memory of device `ordinal`.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeDeviceInfo`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_device_info(ordinal: c_int, out: *mut GraphsafeDeviceInfo) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if ordinal < 0 {
            return Err(crate::Error::invalid("ordinal", "a device ordinal >= 0", ordinal).into());
        }
        let info = driver::Device::get(ordinal as usize)?.info()?;
        let mut name = [0 as c_char; 256];
        for (d, s) in name.iter_mut().zip(info.name.bytes().take(255)) {
            *d = s as c_char;
        }
        let v = GraphsafeDeviceInfo {
            name,
            cc_major: info.compute_capability.0,
            cc_minor: info.compute_capability.1,
            sm_count: info.sm_count as c_int,
            total_memory: info.total_memory,
        };
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", v) }
    })
}

/// The GPU archs the kernels were built for, comma separated (static storage; never null).
///
/// # Safety
/// None beyond C's: the returned text must not be written or freed. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_build_archs() -> *const c_char {
    concat!(env!("GRAPHSAFE_BUILD_ARCHS"), "\0").as_ptr().cast()
}

/// Retains the primary context of device `ordinal`. Release with graphsafe_context_destroy (the
/// context lives on while streams or workspaces made from it do). The calling thread's current
/// context is left as it was (as by every graphsafe call).
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeContext`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_context_create(ordinal: c_int, out: *mut GraphsafeContext) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if ordinal < 0 {
            return Err(crate::Error::invalid("ordinal", "a device ordinal >= 0", ordinal).into());
        }
        let ctx = Context::new(ordinal as usize)?;
        let id = handles::insert(Tag::Context, ctx)?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeContext { id }) }
    })
}

/// Wraps the caller's existing `CUcontext` (engines usually have one); graphsafe never destroys it.
///
/// # Safety
/// `cu_context` is a valid `CUcontext` that outlives the handle and everything made from it;
/// once any graphsafe_cudnn_* call used the handle, that includes cuDNN's per-context state,
/// which graphsafe keeps until the process exits (its plans outlive the graphs that captured
/// them): such a context must then stay alive until exit. `out` is null (refused) or points to a
/// writable `GraphsafeContext`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_context_adopt(cu_context: *mut c_void, out: *mut GraphsafeContext) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if cu_context.is_null() {
            return Err(null("cu_context"));
        }
        // SAFETY: the caller's contract (above).
        let ctx = unsafe { Context::adopt(cu_context.cast()) }?;
        let id = handles::insert(Tag::Context, ctx)?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeContext { id }) }
    })
}

/// Waits for the work of the context. Refused with GRAPHSAFE_ERROR_BUSY while a graphsafe capture
/// is open on the calling thread, in any context (a context-wide wait there would invalidate it).
/// With no graphsafe capture of the context open it waits for all work in the context (every
/// stream of it, graphsafe's or not); while graphsafe captures are open on other threads it waits
/// for each of graphsafe's streams of the context instead (for a capturing one, the work queued
/// before its capture began), since a context-wide wait would invalidate them. Also what gives
/// memory back after a stream was destroyed while it could not be waited for (an engine's
/// capture open on an adopted stream: from then on graphsafe defers every free of the context,
/// never freeing early, until this call has waited with no capture open) or after a free whose
/// wait failed. Captures graphsafe did not begin are not seen: by CUDA's rules the wait
/// invalidates the caller's own GLOBAL-mode captures on other threads and its non-relaxed captures
/// on this one, so do not call it while the caller captures.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_context_synchronize(ctx: GraphsafeContext) -> c_int {
    guard(|| Ok(handles::get::<Context>(Tag::Context, ctx.id)?.synchronize()?))
}

/// Releases a context handle; a second call gives GRAPHSAFE_ERROR_INVALID_HANDLE.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_context_destroy(ctx: GraphsafeContext) -> c_int {
    guard(|| handles::remove::<Context>(Tag::Context, ctx.id).map(drop))
}

/// The SM count of the GPU called `name` (a NUL-terminated name such as "H200", "B200" or
/// "RTX 5090"; case, spaces and an "NVIDIA"/"GeForce" prefix do not matter), for the planners'
/// `sm_count` when planning for a GPU that is not at hand. An unknown name is
/// GRAPHSAFE_ERROR_INVALID_ARGUMENT, whose text lists every name known. Host-only. Thread-safe.
///
/// # Safety
/// `name` is null (refused) or points to a NUL-terminated string; `out` is null (refused) or
/// points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_gpu_sm_count(name: *const c_char, out: *mut c_int) -> c_int {
    guard(|| {
        if name.is_null() {
            return Err(null("name"));
        }
        // SAFETY: non-null; the caller promises a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        let sms = crate::arch::sm_count_of(&name)?;
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", sms as c_int) }
    })
}

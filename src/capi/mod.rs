//! The C ABI (`include/graphsafe.h`, generated from this module by cbindgen).
//!
//! Conventions, for every function:
//! * returns an `int` status: `GRAPHSAFE_OK` (0) or one negative `GRAPHSAFE_ERROR_*` code per error
//!   kind; `graphsafe_last_error()` has this thread's text for the last failure;
//! * never lets a Rust panic cross the boundary (it becomes `GRAPHSAFE_ERROR_PANIC`);
//! * handles are small structs holding a 64-bit id (type tag, generation, slot): a wrong-type,
//!   destroyed, never-created or twice-destroyed handle gives `GRAPHSAFE_ERROR_INVALID_HANDLE`,
//!   never a crash; output pointers may not be null (`GRAPHSAFE_ERROR_NULL_POINTER`);
//! * thread safety: every function may be called from any thread; calls on one stream, capture or
//!   workspace from several threads at once are serialized internally, except that a capture in
//!   `GRAPHSAFE_CAPTURE_THREAD_LOCAL`/`GLOBAL` mode must be begun and ended on one thread (CUDA's rule).
//!
//! The type-level guarantees of the Rust API become run-time checks here: a workspace bound to an
//! open capture cannot grow or be destroyed (`GRAPHSAFE_ERROR_BUSY`), a capturing stream takes no
//! eager work from graphsafe, and graphs keep every graphsafe-owned buffer they captured alive.
//! Raw device pointers passed in (engine-owned tensors) are the caller's to keep alive.

// Entry points take raw pointers from C and check them for null before use; marking them
// `unsafe` would say nothing to a C caller.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod core;
mod cudnn;
mod handles;
mod mla;
mod nvfp4;

use crate::error::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use self::core::*;
pub use self::cudnn::*;
pub use self::mla::*;
pub use self::nvfp4::*;

/// Success.
pub const GRAPHSAFE_OK: i32 = 0;
/// An argument is out of range or inconsistent (shape, dtype, stride, alignment, size).
pub const GRAPHSAFE_ERROR_INVALID_ARGUMENT: i32 = -1;
/// A required pointer argument is null.
pub const GRAPHSAFE_ERROR_NULL_POINTER: i32 = -2;
/// A handle is of the wrong type, destroyed, or was never created.
pub const GRAPHSAFE_ERROR_INVALID_HANDLE: i32 = -3;
/// No CUDA driver (`libcuda.so.1`) on this machine.
pub const GRAPHSAFE_ERROR_DRIVER_NOT_FOUND: i32 = -4;
/// The driver or cuDNN lacks a needed entry point (too old).
pub const GRAPHSAFE_ERROR_MISSING_SYMBOL: i32 = -5;
/// A CUDA driver call failed (the text names the call and the CUresult).
pub const GRAPHSAFE_ERROR_DRIVER: i32 = -6;
/// A CUDA runtime call in the kernel glue failed.
pub const GRAPHSAFE_ERROR_CUDA_RUNTIME: i32 = -7;
/// CUTLASS refused the arguments or failed.
pub const GRAPHSAFE_ERROR_CUTLASS: i32 = -8;
/// No cuDNN library found.
pub const GRAPHSAFE_ERROR_CUDNN_NOT_FOUND: i32 = -9;
/// A cuDNN call failed.
pub const GRAPHSAFE_ERROR_CUDNN: i32 = -10;
/// No kernel for this GPU's architecture (or not in this build).
pub const GRAPHSAFE_ERROR_ARCH_UNSUPPORTED: i32 = -11;
/// A kernel needs more workspace than the (captured) workspace holds; nothing was launched.
pub const GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL: i32 = -12;
/// The driver invalidated the capture; no graph was made and the stream is usable again.
pub const GRAPHSAFE_ERROR_CAPTURE_INVALIDATED: i32 = -13;
/// The object is in use by an open capture (e.g. growing or destroying a bound workspace).
pub const GRAPHSAFE_ERROR_BUSY: i32 = -14;
/// An internal panic was caught at the boundary (a bug: please report the text).
pub const GRAPHSAFE_ERROR_PANIC: i32 = -15;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Internal result of a C entry point: a status code and its text.
pub(crate) struct Fail(i32, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::InvalidArgument { .. } => GRAPHSAFE_ERROR_INVALID_ARGUMENT,
            Error::DriverNotFound { .. } => GRAPHSAFE_ERROR_DRIVER_NOT_FOUND,
            Error::MissingSymbol { .. } => GRAPHSAFE_ERROR_MISSING_SYMBOL,
            Error::Driver { .. } => GRAPHSAFE_ERROR_DRIVER,
            Error::CudaRuntime { .. } => GRAPHSAFE_ERROR_CUDA_RUNTIME,
            Error::Cutlass { .. } => GRAPHSAFE_ERROR_CUTLASS,
            Error::CudnnNotFound { .. } => GRAPHSAFE_ERROR_CUDNN_NOT_FOUND,
            Error::Cudnn { .. } => GRAPHSAFE_ERROR_CUDNN,
            Error::ArchUnsupported { .. } => GRAPHSAFE_ERROR_ARCH_UNSUPPORTED,
            Error::WorkspaceTooSmall { .. } => GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL,
            Error::CaptureInvalidated { .. } => GRAPHSAFE_ERROR_CAPTURE_INVALIDATED,
            #[allow(unreachable_patterns)]
            _ => GRAPHSAFE_ERROR_INVALID_ARGUMENT,
        };
        Fail(code, e.to_string())
    }
}

pub(crate) fn null(what: &str) -> Fail {
    Fail(GRAPHSAFE_ERROR_NULL_POINTER, format!("`{what}` is a null pointer"))
}

pub(crate) fn busy(what: String) -> Fail {
    Fail(GRAPHSAFE_ERROR_BUSY, what)
}

/// Runs an entry point: catches panics, records the error text, returns the status.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Fail>) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Fail(GRAPHSAFE_ERROR_PANIC, format!("internal panic: {msg}")))
    });
    match r {
        Ok(()) => GRAPHSAFE_OK,
        Err(Fail(code, text)) => {
            let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
            LAST_ERROR.with(|e| *e.borrow_mut() = c);
            code
        }
    }
}

/// Caller-owned device memory: its size is unknown, so only shape, stride and alignment are
/// checked (and the device, by the context it is given).
#[derive(Clone, Copy)]
pub(crate) struct Raw {
    pub ptr: crate::driver::DevicePtr,
    pub ctx: crate::sys::cuda::CUcontext,
}

impl crate::ops::tensor::DeviceMemory for Raw {
    fn device_ptr(&self) -> crate::driver::DevicePtr {
        self.ptr
    }
    fn len(&self) -> usize {
        usize::MAX
    }
    fn context_raw(&self) -> crate::sys::cuda::CUcontext {
        self.ctx
    }
}

/// Writes `v` through `out`, or fails with NULL_POINTER naming `what`.
pub(crate) fn put<T>(out: *mut T, what: &str, v: T) -> Result<(), Fail> {
    if out.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null; the caller promises it points to writable storage for a T.
    unsafe { out.write(v) };
    Ok(())
}

/// This thread's text for the last failed call (empty if none). The pointer stays valid until this
/// thread's next failing graphsafe call. Thread-safe; never null.
#[no_mangle]
pub extern "C" fn graphsafe_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library version, e.g. "0.1.0" (static storage; never null).
#[no_mangle]
pub extern "C" fn graphsafe_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

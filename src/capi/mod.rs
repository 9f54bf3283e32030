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
//!
//! From Rust every entry point is an `unsafe fn`: it takes raw pointers (and raw CUDA handles) that
//! only the caller can vouch for. Rust code uses the safe API (`graphsafe::{driver, graph, ops}`).
//!
//! # Lock discipline (what keeps the ABI free of deadlocks)
//!
//! 1. **Handle lookups first.** An entry point resolves every handle it needs in the registry
//!    (`handles::get`) before it takes any object lock. No code holding an object lock touches the
//!    registry (`get`, `insert` or `remove`); objects that must reach others while locked hold
//!    `Arc`s to them (a capture holds its stream and its bound workspaces).
//! 2. **The registry lock is a leaf.** It is held only to find, insert or remove an entry; no
//!    object lock is taken and no object is dropped inside it.
//! 3. **One order for object locks:** an entry point that needs two takes them in the crate's
//!    lock order (`crate::locks`, row 1); most take one.
//! 4. **Hold what was checked.** A check ("the stream is not capturing", "the workspace is not
//!    bound") and the act it guards (the launch, the growth, `cuStreamBeginCapture`) happen under
//!    the same lock, never check-release-act.
//! 5. **Destroy closes, then unregisters.** Destroying a stream, workspace or capture marks the
//!    object closed under its lock (refusing with BUSY if it is in use), releases the lock, then
//!    removes the handle: a call that resolved the handle just before sees "closed" under the lock
//!    and fails with `GRAPHSAFE_ERROR_INVALID_HANDLE`.
//! 6. **Nothing that can panic runs outside the panic guard**, and the guard itself never panics:
//!    at thread exit (a C++ `thread_local` or static destructor calling into graphsafe) the error
//!    text is dropped rather than written to a thread-local that is already gone.

// In the order include/graphsafe.h lists them (cbindgen follows these declarations).
mod core;
mod device;
mod stream;
mod memory;
mod capture;
mod graph;
mod cudnn;
mod handles;
mod mla;
mod nvfp4;

use crate::error::Error;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use self::capture::*;
pub use self::core::*;
pub use self::cudnn::*;
pub use self::device::*;
pub use self::graph::*;
pub use self::memory::*;
pub use self::mla::*;
pub use self::nvfp4::*;
pub use self::stream::*;

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

/// What `graphsafe_last_error` returns when this thread's error text is gone (thread exit).
static NO_TEXT: &[u8] = b"\0";

/// Internal result of a C entry point: a status code and its text.
#[derive(Debug)]
pub(crate) struct Fail(pub(crate) i32, pub(crate) String);

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
            Error::StreamCapturing { .. } => GRAPHSAFE_ERROR_BUSY,
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

/// Runs an entry point: catches panics, records the error text, returns the status. Recording
/// the text runs inside the guard too, and never panics: at thread exit, when this thread's
/// storage is already destroyed, the text is dropped (the status still says what failed).
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Fail>) -> i32 {
    let run = AssertUnwindSafe(|| match f() {
        Ok(()) => GRAPHSAFE_OK,
        Err(Fail(code, text)) => {
            record(text);
            code
        }
    });
    catch_unwind(run).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        // Recording can itself only fail quietly (try_with), so nothing escapes this closure.
        let _ = catch_unwind(AssertUnwindSafe(|| record(format!("internal panic: {msg}"))));
        GRAPHSAFE_ERROR_PANIC
    })
}

fn record(text: String) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut slot) = e.try_borrow_mut() {
            *slot = c;
        }
    });
}

/// Device memory the C caller names by address. Its extent is what the driver reports of the
/// allocation it lies in (a caching allocator's whole segment, so an upper bound), or unknown
/// (`usize::MAX`) when the driver reports no range or the pointer was not checked (planning
/// only). An address inside a graphsafe allocation (a buffer's or workspace's, read with
/// `graphsafe_buffer_info`) carries that allocation: an op holds it for the call, and a capture
/// keeps it alive with its graphs, exactly as a bound buffer.
#[derive(Clone)]
pub(crate) struct Raw {
    pub ptr: crate::driver::DevicePtr,
    pub ctx: crate::sys::cuda::CUcontext,
    pub len: usize,
    pub alloc: Option<std::sync::Arc<crate::driver::memory::Allocation>>,
}

impl crate::ops::tensor::DeviceMemory for Raw {
    fn device_ptr(&self) -> crate::driver::DevicePtr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context_raw(&self) -> crate::sys::cuda::CUcontext {
        self.ctx
    }
    fn allocation(&self) -> Option<&std::sync::Arc<crate::driver::memory::Allocation>> {
        self.alloc.as_ref()
    }
}

/// Where the C ABI's raw device pointers are checked: against the context of the stream an op
/// runs on (each pointer must be device memory of that device, and the tensor must fit in the
/// allocation the driver reports), or not at all when a planner only reads shapes.
#[derive(Clone, Copy)]
pub(crate) struct CallerMemory<'a> {
    ctx: crate::sys::cuda::CUcontext,
    checked_against: Option<&'a crate::driver::Context>,
}

impl<'a> CallerMemory<'a> {
    /// Pointers an op will use on `ctx`'s device.
    pub(crate) fn on(ctx: &'a crate::driver::Context) -> CallerMemory<'a> {
        CallerMemory { ctx: ctx.raw(), checked_against: Some(ctx) }
    }

    /// Pointers a planner never dereferences (shapes only).
    pub(crate) fn planning(ctx: crate::sys::cuda::CUcontext) -> CallerMemory<'static> {
        CallerMemory { ctx, checked_against: None }
    }

    /// `ptr` as an op's memory: NULL_POINTER for 0; INVALID_ARGUMENT naming `what` for an address
    /// the driver does not know as device memory, memory of another device, memory allocated in
    /// another context of the same device, memory inside a graphsafe workspace (current or
    /// retired), or a destroyed graphsafe buffer or workspace whose free is still pending.
    pub(crate) fn pointer(&self, ptr: u64, what: &str) -> Result<Raw, Fail> {
        if ptr == 0 {
            return Err(null(what));
        }
        let Some(ctx) = self.checked_against else {
            return Ok(Raw { ptr, ctx: self.ctx, len: usize::MAX, alloc: None });
        };
        let ordinal = ctx.device().ordinal();
        let want = || format!("device memory of the stream's device {ordinal}");
        match crate::driver::memory::query_pointer(ctx, ptr)? {
            None => Err(crate::Error::invalid(what, want(), format!("{ptr:#x}, an address the driver does not know as device memory")).into()),
            Some(p) if usize::try_from(p.device).ok() != Some(ordinal) => Err(crate::Error::invalid(what, want(), format!("{ptr:#x}, memory of device {}", p.device)).into()),
            // Another context of the same device (an engine's own beside the primary one): its
            // allocations are not mapped in this one.
            Some(p) if p.context != 0 && p.context != ctx.raw() as usize => {
                Err(crate::Error::invalid(what, format!("memory of the stream's context {:?}", ctx.raw()), format!("{ptr:#x}, memory of another context ({:#x}) of device {ordinal}", p.context)).into())
            }
            Some(p) => {
                let len = p.bytes_to_end.map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX));
                use crate::driver::memory::Holder;
                match crate::driver::memory::holder(ctx, ptr) {
                    // A workspace's buffer, current or retired (an address read with
                    // graphsafe_workspace_info, maybe before a growth): its kernels keep scratch
                    // there that they trust (schedules, split partials), ordered only with the
                    // workspace's own uses, which an operand does not join.
                    Holder::Live(a) if a.is_workspace() => Err(crate::Error::invalid(
                        what,
                        "memory outside every graphsafe workspace (a workspace is scratch for the op calls given it)",
                        format!("{ptr:#x}, inside a graphsafe workspace's buffer [{:#x}, {:#x})", a.ptr(), a.ptr() + a.len() as u64),
                    )
                    .into()),
                    // graphsafe's own memory: bounded by, and keeping, its allocation.
                    Holder::Live(a) => Ok(Raw { ptr, ctx: self.ctx, len: len.min(a.len() - (ptr - a.ptr()) as usize), alloc: Some(a) }),
                    // A graphsafe buffer or workspace destroyed (by another thread, maybe this
                    // very moment) whose memory graphsafe is giving back, or whose free waits for
                    // a capture to end: the driver still holds it, but the graph would replay
                    // into it after that free.
                    Holder::Dropped => Err(crate::Error::invalid(
                        what,
                        want(),
                        format!("{ptr:#x}, memory of a graphsafe buffer or workspace already destroyed (its memory is being given back)"),
                    )
                    .into()),
                    Holder::Nothing => Ok(Raw { ptr, ctx: self.ctx, len, alloc: None }),
                }
            }
        }
    }
}

/// Writes `v` through `out`, or fails with NULL_POINTER naming `what`.
///
/// # Safety
/// `out` is null or points to writable storage for a `T` (the entry point's contract), aligned or
/// not: a C caller's struct may sit packed inside a message.
pub(crate) unsafe fn put<T>(out: *mut T, what: &str, v: T) -> Result<(), Fail> {
    if out.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null; the caller promises it points to writable storage for a T (no alignment
    // is assumed).
    unsafe { out.write_unaligned(v) };
    Ok(())
}

/// Reads the argument struct behind `p`, or fails with NULL_POINTER naming `what`.
///
/// # Safety
/// `p` is null or points to a readable, initialized `T` (the entry point's contract), aligned or not.
pub(crate) unsafe fn read<T: Copy>(p: *const T, what: &str) -> Result<T, Fail> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null; the caller promises a valid T behind it (no alignment is assumed).
    Ok(unsafe { p.read_unaligned() })
}

/// This thread's text for the last failed call (empty if none). The pointer stays valid until this
/// thread's next failing graphsafe call, or until the thread exits (the text is thread-local: a
/// pointer kept past that, e.g. read in a later `thread_local` destructor, dangles). Thread-safe;
/// never null, also during thread exit.
///
/// # Safety
/// None beyond C's: the returned text must not be written or freed.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_last_error() -> *const c_char {
    let text = catch_unwind(|| LAST_ERROR.try_with(|e| e.try_borrow().map(|c| c.as_ptr()).ok()).ok().flatten());
    text.ok().flatten().unwrap_or(NO_TEXT.as_ptr().cast())
}

/// The library version, e.g. "0.1.0" (static storage; never null).
///
/// # Safety
/// None beyond C's: the returned text must not be written or freed.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

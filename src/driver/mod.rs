//! A safe-ish CUDA driver API: devices, primary contexts, streams, events, device memory, modules
//! and kernel launch. Every call returns [`Result`]; a machine without a driver gets
//! [`Error::DriverNotFound`], never a panic.
//!
//! Objects hold an `Arc<Context>` and make it current on the calling thread before each driver
//! call that needs it, so they can be used from any thread.

pub(crate) mod captures;
mod context;
/// cudarc interop (feature `cudarc`): adopt cudarc's context, streams and slices.
#[cfg(feature = "cudarc")]
pub mod cudarc;
mod device;
mod event;
// Engine memory adopted from Rust: `DeviceBuffer::adopt`.
mod foreign;
pub(crate) mod graph;
pub(crate) mod launch;
pub mod memory;
mod module;
pub(crate) mod order;
mod stream;

pub use context::Context;
pub use device::{device_count, Device, DeviceInfo};
pub use event::Event;
pub(crate) use launch::KernelLaunch;
pub use launch::{Dim3, LaunchConfig, LaunchTarget, LaunchToken};
pub use memory::{DeviceBuffer, MemInfo};
pub use module::{Function, Module};
pub use stream::Stream;

use crate::error::{Error, Result};
use crate::sys::cuda as c;
use crate::sys::driver::{api, Api};
use once_cell::sync::OnceCell;

/// A raw device address (`CUdeviceptr`).
pub type DevicePtr = c::CUdeviceptr;

/// A value outside graphsafe that owns a driver object graphsafe uses (the owner of engine memory
/// adopted with `DeviceBuffer::adopt`; with the `cudarc` feature, cudarc's context, stream or
/// slice). graphsafe never looks inside it; it only holds it, so the object outlives graphsafe's
/// use of its handle, and drops it when graphsafe is done (for memory: after the wait for
/// graphsafe's streams that precedes every free, in place of `cuMemFree`).
#[derive(Clone)]
pub(crate) struct ForeignOwner(
    // Held for its Drop only: graphsafe never reads it.
    #[allow(dead_code)] pub(crate) std::sync::Arc<dyn std::any::Any + Send + Sync>,
    // The stream the owner's Drop enqueues on (a cudarc slice frees itself with cuMemFreeAsync on
    // its stream), if any: dropping it while that stream captures would put the free into the
    // graph, so `Allocation` defers the drop until it does not. Held alive by the owner.
    pub(crate) Option<ForeignStream>,
);

/// A raw stream handle kept alive by the `ForeignOwner` it belongs to.
#[derive(Clone, Copy)]
pub(crate) struct ForeignStream(pub(crate) c::CUstream);

// SAFETY: a stream handle may be queried from any thread; its owner keeps it alive.
unsafe impl Send for ForeignStream {}
// SAFETY: as for Send.
unsafe impl Sync for ForeignStream {}

impl ForeignOwner {
    /// Whether the owner's stream is capturing (or cannot be asked: then it is treated as
    /// capturing, and the drop waits for a later attempt).
    pub(crate) fn stream_is_capturing(&self, ctx: &Context) -> bool {
        let Some(ForeignStream(s)) = self.1 else { return false };
        // SAFETY: the owner keeps the stream (of `ctx`) alive.
        unsafe { graph::stream_is_capturing(ctx, s) }.unwrap_or(true)
    }
}

impl std::fmt::Debug for ForeignOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForeignOwner(..)")
    }
}

/// The driver library after `cuInit(0)` succeeded (once per process).
pub fn init() -> Result<&'static Api> {
    static INIT: OnceCell<std::result::Result<(), Error>> = OnceCell::new();
    let a = api()?;
    INIT.get_or_init(|| {
        let f = a.cuInit()?;
        // SAFETY: cuInit takes flags by value.
        check(unsafe { (f.f)(0) }, f.name)
    })
    .clone()?;
    Ok(a)
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(i32, i32)> {
    let a = init()?;
    let f = a.cuDriverGetVersion()?;
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check(unsafe { (f.f)(&mut v) }, f.name)?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// Turns a `CUresult` into a `Result`, with the driver's own name and text for the error.
pub(crate) fn check(r: c::CUresult, call: &'static str) -> Result<()> {
    if r == c::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(driver_error(r, call))
}

pub(crate) fn driver_error(r: c::CUresult, call: &'static str) -> Error {
    let (mut name, mut text) = (format!("CUresult {}", r.0), String::from("no description"));
    if let Ok(a) = api() {
        let read = |p: *const std::os::raw::c_char| {
            // SAFETY: the driver returns static NUL-terminated strings.
            unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        if let Ok(f) = a.cuGetErrorName() {
            let mut p = std::ptr::null();
            // SAFETY: out-pointer to a local.
            if unsafe { (f.f)(r, &mut p) } == c::CUresult::CUDA_SUCCESS && !p.is_null() {
                name = read(p);
            }
        }
        if let Ok(f) = a.cuGetErrorString() {
            let mut p = std::ptr::null();
            // SAFETY: out-pointer to a local.
            if unsafe { (f.f)(r, &mut p) } == c::CUresult::CUDA_SUCCESS && !p.is_null() {
                text = read(p);
            }
        }
    }
    Error::Driver { call, code: r.0, name, text }
}

/// Logs an error from a destructor: `Drop` cannot return it, and hiding it would be worse. The
/// record reaches the application's logger once this thread holds no lock of graphsafe's
/// (`crate::logging`).
pub(crate) fn log_drop_error(what: &str, r: Result<()>) {
    if let Err(e) = r {
        crate::logging::error(format!("graphsafe: {what} failed in drop: {e}"));
    }
}

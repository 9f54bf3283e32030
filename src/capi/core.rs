//! Devices, contexts, streams, buffers, workspaces, captures and graphs through the C ABI, and the
//! two helpers every op entry point runs through ([`eager_op`], [`captured_op`]). The lock
//! discipline they follow is written down in `capi/mod.rs`.

use super::handles::{self, Tag};
use super::{busy, guard, null, put, Fail};
use crate::driver::{self, Context, DeviceBuffer, Stream};
use crate::graph::target::Target;
use crate::graph::{CaptureMode, DetachedCapture, Graph, GraphExec, WorkspaceView};
use crate::workspace::Workspace;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

/// A device's primary context (or an adopted one).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeContext {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// A CUDA stream.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeStream {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// Device memory owned by graphsafe (kept alive by graphs that captured it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeBuffer {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// A growable, zero-filled workspace that retires instead of resizing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeWorkspace {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// An open stream capture.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeCapture {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// A captured graph (owns every graphsafe buffer it captured).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeGraph {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}
/// An executable graph (owns every graphsafe buffer its graph captured).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeGraphExec {
    /// Opaque id; 0 is never valid.
    pub id: u64,
}

/// What `graphsafe_device_info` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeDeviceInfo {
    /// NUL-terminated device name.
    pub name: [c_char; 256],
    /// Compute capability, major.
    pub cc_major: c_int,
    /// Compute capability, minor.
    pub cc_minor: c_int,
    /// Streaming multiprocessors.
    pub sm_count: c_int,
    /// Total device memory in bytes.
    pub total_memory: u64,
}

/// Capture modes (CUDA's `CUstreamCaptureMode`).
pub const GRAPHSAFE_CAPTURE_GLOBAL: c_int = 0;
/// Potentially unsafe calls refused on the capturing thread only (the usual choice).
pub const GRAPHSAFE_CAPTURE_THREAD_LOCAL: c_int = 1;
/// Nothing refused.
pub const GRAPHSAFE_CAPTURE_RELAXED: c_int = 2;

pub(crate) struct StreamObj {
    pub stream: Arc<Stream>,
    state: Mutex<StreamState>,
}
struct StreamState {
    /// The open capture on this stream (its handle id), if any.
    capturing: Option<u64>,
    closed: bool,
}

pub(crate) struct WorkspaceObj {
    state: Mutex<WsState>,
}
struct WsState {
    ws: Workspace,
    /// The open capture this workspace is bound to (its handle id), if any.
    bound_to: Option<u64>,
    closed: bool,
}

pub(crate) struct CaptureObj {
    /// The capturing stream: reached through this `Arc`, never through the registry, so ending a
    /// capture needs no handle lookup under a lock.
    stream: Arc<StreamObj>,
    /// `None` until the driver's capture has begun, and again once it ended.
    state: Mutex<Option<CapState>>,
}
struct CapState {
    cap: DetachedCapture,
    /// Workspaces bound to this capture: handle id, the object, and the view fixed at binding.
    bound: Vec<(u64, Arc<WorkspaceObj>, WorkspaceView)>,
}

type GraphObj = Mutex<Graph>;
type GraphExecObj = Mutex<GraphExec>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its state consistent at each step, so a panic elsewhere while
    // holding the lock (caught by the guard) does not make the state unusable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn closed(what: &str, id: u64) -> Fail {
    Fail(super::GRAPHSAFE_ERROR_INVALID_HANDLE, format!("invalid {what} handle {id:#x} (destroyed)"))
}

pub(crate) fn stream_obj(s: GraphsafeStream) -> Result<Arc<StreamObj>, Fail> {
    handles::get::<StreamObj>(Tag::Stream, s.id)
}

pub(crate) fn workspace_obj(w: GraphsafeWorkspace) -> Result<Arc<WorkspaceObj>, Fail> {
    handles::get::<WorkspaceObj>(Tag::Workspace, w.id)
}

pub(crate) fn capture_obj(c: GraphsafeCapture) -> Result<Arc<CaptureObj>, Fail> {
    handles::get::<CaptureObj>(Tag::Capture, c.id)
}

fn new_stream_obj(stream: Stream) -> Arc<StreamObj> {
    Arc::new(StreamObj { stream: Arc::new(stream), state: Mutex::new(StreamState { capturing: None, closed: false }) })
}

/// Locks the stream for eager work: open and not capturing. Hold the guard for as long as the
/// work is being enqueued (rule 4: a capture cannot begin in between).
fn lock_eager(s: &StreamObj, id: u64) -> Result<MutexGuard<'_, StreamState>, Fail> {
    let st = lock(&s.state);
    if st.closed {
        return Err(closed("stream", id));
    }
    if let Some(c) = st.capturing {
        return Err(busy(format!("the stream is capturing (capture {c:#x}): use the captured variant of the call, or end the capture")));
    }
    Ok(st)
}

fn lock_workspace(w: &WorkspaceObj, id: u64) -> Result<MutexGuard<'_, WsState>, Fail> {
    let st = lock(&w.state);
    if st.closed {
        return Err(closed("workspace", id));
    }
    Ok(st)
}

/// Runs an eager op on `s` (resolved by the caller): stream locked and checked, then (with `ws`)
/// the workspace locked and checked, and both held while `f` validates, grows and launches.
pub(crate) fn eager_op<T>(s: (&StreamObj, u64), ws: Option<(&WorkspaceObj, u64)>, f: impl FnOnce(Target<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let _stream = lock_eager(s.0, s.1)?;
    match ws {
        None => f(Target::eager(&s.0.stream, None)?),
        Some((w, id)) => {
            let mut st = lock_workspace(w, id)?;
            if let Some(cid) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {cid:#x}: use the captured variant of the call")));
            }
            f(Target::eager(&s.0.stream, Some(&mut st.ws))?)
        }
    }
}

/// Runs a captured op of `c` (resolved by the caller) with workspace `ws_id`, which must be bound to
/// that capture (its view fixed at binding; never grown). The capture stays locked throughout, so
/// it cannot end while the op records into it.
pub(crate) fn captured_op<T>(c: (&CaptureObj, u64), ws_id: Option<u64>, f: impl FnOnce(Target<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let cs = lock(&c.0.state);
    let state = cs.as_ref().ok_or_else(|| closed("capture", c.1))?;
    let view = match ws_id {
        None => None,
        Some(id) => Some(state.bound.iter().find(|(w, _, _)| *w == id).map(|(_, _, v)| v).ok_or_else(|| {
            crate::Error::invalid("ws", "a workspace bound to this capture (graphsafe_capture_bind_workspace)", format!("{id:#x}"))
        })?),
    };
    f(Target::captured(state.cap.site(), view)?)
}

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
/// `out` is null (refused) or points to a writable `GraphsafeContext`. Thread-safe.
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

/// Releases a context handle; a second call gives GRAPHSAFE_ERROR_INVALID_HANDLE.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_context_destroy(ctx: GraphsafeContext) -> c_int {
    guard(|| handles::remove::<Context>(Tag::Context, ctx.id).map(drop))
}

/// A new non-blocking stream on `ctx`'s device.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeStream`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_create(ctx: GraphsafeContext, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        let id = handles::insert(Tag::Stream, new_stream_obj(Stream::new(&c)?))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeStream { id }) }
    })
}

/// Wraps the caller's existing `CUstream` of `ctx` (not destroyed by graphsafe). The legacy and
/// per-thread default streams are refused.
///
/// # Safety
/// `cu_stream` is a valid stream of `ctx` that outlives the handle; while a graphsafe capture on
/// it is open the caller issues no work to it, and the caller never begins a capture on it itself
/// while graphsafe uses it; `out` is null (refused) or points to a writable `GraphsafeStream`.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_adopt(ctx: GraphsafeContext, cu_stream: *mut c_void, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        // SAFETY: the caller's contract (above); null/legacy handles are refused inside.
        let s = unsafe { Stream::adopt(&c, cu_stream.cast()) }?;
        let id = handles::insert(Tag::Stream, new_stream_obj(s))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeStream { id }) }
    })
}

/// The raw `CUstream` (for the caller's own launches).
///
/// # Safety
/// `out` is null (refused) or points to writable storage for a pointer. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_raw(stream: GraphsafeStream, out: *mut *mut c_void) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", s.stream.raw().cast()) }
    })
}

/// Waits for all work on the stream. Refused (BUSY) while the stream is capturing.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_synchronize(stream: GraphsafeStream) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        Ok(s.stream.synchronize()?)
    })
}

/// Destroys a stream handle (and the stream, unless adopted). BUSY while it is capturing.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_destroy(stream: GraphsafeStream) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        {
            let mut st = lock(&s.state);
            if st.closed {
                return Err(closed("stream", stream.id));
            }
            if st.capturing.is_some() {
                return Err(busy("the stream is capturing: end or destroy the capture first".into()));
            }
            st.closed = true;
        }
        handles::remove::<StreamObj>(Tag::Stream, stream.id).map(drop)
    })
}

/// Allocates `bytes` (> 0) of device memory owned by graphsafe; `zeroed` != 0 zero-fills it on
/// `stream`. Graphs that bind it keep it alive after graphsafe_buffer_destroy.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeBuffer`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_create(stream: GraphsafeStream, bytes: u64, zeroed: c_int, out: *mut GraphsafeBuffer) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = stream_obj(stream)?;
        let len = usize::try_from(bytes).map_err(|_| crate::Error::invalid("bytes", "a size that fits in memory", bytes))?;
        let b = {
            let _st = lock_eager(&s, stream.id)?;
            if zeroed != 0 {
                DeviceBuffer::alloc_zeroed(&s.stream, len)?
            } else {
                DeviceBuffer::alloc(s.stream.context(), len)?
            }
        };
        let id = handles::insert(Tag::Buffer, Arc::new(b))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeBuffer { id }) }
    })
}

/// The buffer's device address and size. Either output may be null to skip it.
///
/// # Safety
/// Each output is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_info(buffer: GraphsafeBuffer, device_ptr: *mut u64, bytes: *mut u64) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        // SAFETY: each is written only when non-null; the caller's contract.
        unsafe {
            if !device_ptr.is_null() {
                put(device_ptr, "device_ptr", b.device_ptr())?;
            }
            if !bytes.is_null() {
                put(bytes, "bytes", b.len() as u64)?;
            }
        }
        Ok(())
    })
}

fn check_range(b: &DeviceBuffer, offset: u64, bytes: u64) -> Result<(), Fail> {
    if offset.checked_add(bytes).is_none_or(|end| end > b.len() as u64) {
        return Err(crate::Error::invalid("offset + bytes", format!("at most the buffer's {} bytes", b.len()), format!("{offset} + {bytes}")).into());
    }
    Ok(())
}

/// Copies `bytes` from host memory `src` into the buffer at byte `offset`, on `stream`; `src` may be
/// reused when this returns. Refused while the stream is capturing.
///
/// # Safety
/// `src` points to `bytes` readable bytes (it may be null only when `bytes` is 0). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_write(buffer: GraphsafeBuffer, offset: u64, src: *const c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = stream_obj(stream)?;
        if src.is_null() && bytes > 0 {
            return Err(null("src"));
        }
        check_range(&b, offset, bytes)?;
        let data: &[u8] = if bytes == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `bytes` readable bytes at src (non-null, checked).
            unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes as usize) }
        };
        let _st = lock_eager(&s, stream.id)?;
        Ok(b.copy_from_host_at(offset as usize, data, &s.stream)?)
    })
}

/// Copies `bytes` from the buffer at byte `offset` into host memory `dst` and waits for `stream`.
/// Refused while the stream is capturing.
///
/// # Safety
/// `dst` points to `bytes` writable bytes (it may be null only when `bytes` is 0). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_read(buffer: GraphsafeBuffer, offset: u64, dst: *mut c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = stream_obj(stream)?;
        if dst.is_null() && bytes > 0 {
            return Err(null("dst"));
        }
        check_range(&b, offset, bytes)?;
        let data: &mut [u8] = if bytes == 0 {
            &mut []
        } else {
            // SAFETY: the caller passes `bytes` writable bytes at dst (non-null, checked).
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes as usize) }
        };
        let _st = lock_eager(&s, stream.id)?;
        Ok(b.copy_to_host_at(offset as usize, data, &s.stream)?)
    })
}

/// Drops the handle's reference; the memory is freed when no graph holds it either.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_destroy(buffer: GraphsafeBuffer) -> c_int {
    guard(|| handles::remove::<DeviceBuffer>(Tag::Buffer, buffer.id).map(drop))
}

/// A workspace of at least `bytes` (0 allowed), zero-filled on `stream`.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeWorkspace`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_create(stream: GraphsafeStream, bytes: u64, out: *mut GraphsafeWorkspace) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = stream_obj(stream)?;
        let ws = {
            let _st = lock_eager(&s, stream.id)?;
            Workspace::new(&s.stream, bytes)?
        };
        let obj = Arc::new(WorkspaceObj { state: Mutex::new(WsState { ws, bound_to: None, closed: false }) });
        let id = handles::insert(Tag::Workspace, obj)?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeWorkspace { id }) }
    })
}

/// Grows the workspace to at least `bytes` by allocating a new zero-filled buffer on `stream` and
/// retiring the old one (graphs that captured it keep it alive). `grew` (nullable) receives 1 if it
/// grew. BUSY while the workspace is bound to an open capture or the stream is capturing. If growing
/// fails, the workspace is unchanged.
///
/// # Safety
/// `grew` is null or points to a writable `int`. Thread-safe (calls on one workspace serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_ensure_size(ws: GraphsafeWorkspace, bytes: u64, stream: GraphsafeStream, grew: *mut c_int) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let s = stream_obj(stream)?;
        let g = {
            let _st = lock_eager(&s, stream.id)?;
            let mut st = lock_workspace(&w, ws.id)?;
            if let Some(c) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {c:#x}: it cannot grow until the capture ends")));
            }
            st.ws.ensure_size(bytes, &s.stream)?
        };
        if !grew.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { put(grew, "grew", g as c_int)? };
        }
        Ok(())
    })
}

/// Capacity and current device address (0 while empty); either output may be null.
///
/// # Safety
/// Each output is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_info(ws: GraphsafeWorkspace, capacity: *mut u64, device_ptr: *mut u64) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let (cap, ptr) = {
            let st = lock_workspace(&w, ws.id)?;
            (st.ws.capacity(), st.ws.device_ptr())
        };
        // SAFETY: each is written only when non-null; the caller's contract.
        unsafe {
            if !capacity.is_null() {
                put(capacity, "capacity", cap)?;
            }
            if !device_ptr.is_null() {
                put(device_ptr, "device_ptr", ptr)?;
            }
        }
        Ok(())
    })
}

/// Destroys a workspace handle (its memory lives on in graphs that captured it). BUSY while bound
/// to an open capture.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_destroy(ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        {
            let mut st = lock_workspace(&w, ws.id)?;
            if let Some(c) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {c:#x}")));
            }
            st.closed = true;
        }
        handles::remove::<WorkspaceObj>(Tag::Workspace, ws.id).map(drop)
    })
}

/// Begins capturing `stream` (mode: GRAPHSAFE_CAPTURE_*). The stream takes no eager graphsafe work
/// until the capture ends or is destroyed. Same-thread rule for THREAD_LOCAL/GLOBAL (CUDA's).
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeCapture`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_begin(stream: GraphsafeStream, mode: c_int, out: *mut GraphsafeCapture) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let mode = match mode {
            GRAPHSAFE_CAPTURE_GLOBAL => CaptureMode::Global,
            GRAPHSAFE_CAPTURE_THREAD_LOCAL => CaptureMode::ThreadLocal,
            GRAPHSAFE_CAPTURE_RELAXED => CaptureMode::Relaxed,
            m => return Err(crate::Error::invalid("mode", "GRAPHSAFE_CAPTURE_GLOBAL, _THREAD_LOCAL or _RELAXED", m).into()),
        };
        let s = stream_obj(stream)?;
        // Register the (not yet begun) capture first: no registry call may happen under the
        // stream's lock (rule 1), and the stream must record the capture's id under that lock.
        let obj = Arc::new(CaptureObj { stream: s.clone(), state: Mutex::new(None) });
        let id = handles::insert(Tag::Capture, obj.clone())?;
        let begun = (|| {
            let mut st = lock(&s.state);
            if st.closed {
                return Err(closed("stream", stream.id));
            }
            if let Some(c) = st.capturing {
                return Err(busy(format!("the stream is already capturing (capture {c:#x})")));
            }
            let cap = DetachedCapture::begin(s.stream.clone(), mode)?;
            *lock(&obj.state) = Some(CapState { cap, bound: Vec::new() });
            st.capturing = Some(id);
            Ok(())
        })();
        if let Err(e) = begun {
            let _ = handles::remove::<CaptureObj>(Tag::Capture, id);
            return Err(e);
        }
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeCapture { id }) }
    })
}

/// Binds a workspace to the capture: until the capture ends it cannot grow or be destroyed, and
/// the graph keeps its current buffer alive. Outputs (nullable): its address and capacity, fixed
/// for the capture. A workspace may be bound to one capture at a time.
///
/// # Safety
/// Each output is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_bind_workspace(capture: GraphsafeCapture, ws: GraphsafeWorkspace, device_ptr: *mut u64, capacity: *mut u64) -> c_int {
    guard(|| {
        let c = capture_obj(capture)?;
        let w = workspace_obj(ws)?;
        let (ptr, cap) = {
            let mut cs = lock(&c.state);
            let state = cs.as_mut().ok_or_else(|| closed("capture", capture.id))?;
            let mut wst = lock_workspace(&w, ws.id)?;
            match wst.bound_to {
                Some(other) if other == capture.id => {}
                Some(other) => return Err(busy(format!("the workspace is bound to another open capture {other:#x}"))),
                None => {
                    let view = state.cap.bind_workspace(&wst.ws)?;
                    wst.bound_to = Some(capture.id);
                    state.bound.push((ws.id, w.clone(), view));
                }
            }
            (wst.ws.device_ptr(), wst.ws.capacity())
        };
        // SAFETY: each is written only when non-null; the caller's contract.
        unsafe {
            if !device_ptr.is_null() {
                put(device_ptr, "device_ptr", ptr)?;
            }
            if !capacity.is_null() {
                put(capacity, "capacity", cap)?;
            }
        }
        Ok(())
    })
}

/// Binds a graphsafe buffer: the graph keeps it alive. `device_ptr` (nullable) gets its address.
/// (Ops that take a graphsafe buffer handle, such as the W4A16 weight, bind it themselves.)
///
/// # Safety
/// `device_ptr` is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_bind_buffer(capture: GraphsafeCapture, buffer: GraphsafeBuffer, device_ptr: *mut u64) -> c_int {
    guard(|| {
        let c = capture_obj(capture)?;
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        {
            let mut cs = lock(&c.state);
            let state = cs.as_mut().ok_or_else(|| closed("capture", capture.id))?;
            state.cap.bind_buffer(&b)?;
        }
        if !device_ptr.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { put(device_ptr, "device_ptr", b.device_ptr())? };
        }
        Ok(())
    })
}

/// Ends (`keep_graph`) or abandons the capture. Stream, then capture, then workspaces are locked
/// (rule 3) and stay locked until the driver's capture is over, so no eager op can slip into it.
/// A capture the driver still holds open after a failed end (e.g. a thread-local capture ended
/// from another thread) is left exactly as it was.
fn finish(capture: GraphsafeCapture, keep_graph: bool) -> Result<Option<Graph>, Fail> {
    let c = capture_obj(capture)?;
    let s = c.stream.clone();
    let (outcome, _done) = {
        let mut st = lock(&s.state);
        let mut cs = lock(&c.state);
        let state = cs.as_mut().ok_or_else(|| closed("capture", capture.id))?;
        let ended = state.cap.end();
        if state.cap.is_open() {
            // The driver still captures: nothing changed, the handle stays valid.
            return Err(ended.err().map(Fail::from).unwrap_or_else(|| busy("the capture is still open".into())));
        }
        let done = cs.take().expect("checked above");
        for (_, w, _) in &done.bound {
            lock(&w.state).bound_to = None;
        }
        if st.capturing == Some(capture.id) {
            st.capturing = None;
        }
        // `done` (and what it still keeps alive) is dropped after the locks are released.
        (ended, done)
    };
    // Unregister outside every lock (rule 1); dropping the graph (abandon) also happens here.
    let _ = handles::remove::<CaptureObj>(Tag::Capture, capture.id);
    match outcome {
        Ok(g) if keep_graph => Ok(Some(g)),
        Ok(_) => Ok(None),
        Err(crate::Error::CaptureInvalidated { .. }) if !keep_graph => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Ends the capture; `out` receives the graph. On GRAPHSAFE_ERROR_CAPTURE_INVALIDATED no graph is
/// made. Either way the capture handle is consumed, bound workspaces are released and the stream
/// is usable again — except when the driver keeps the capture open (a THREAD_LOCAL/GLOBAL capture
/// ended from another thread): then nothing changes and the handle stays valid.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeGraph`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_end(capture: GraphsafeCapture, out: *mut GraphsafeGraph) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = finish(capture, true)?.ok_or_else(|| busy("no graph".into()))?;
        let id = handles::insert(Tag::Graph, Arc::new(Mutex::new(g)))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeGraph { id }) }
    })
}

/// Abandons a capture: ends it, discards the graph, releases bound workspaces.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_destroy(capture: GraphsafeCapture) -> c_int {
    guard(|| finish(capture, false).map(drop))
}

/// Number of nodes in a graph (what the capture recorded).
///
/// # Safety
/// `out` is null (refused) or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_node_count(graph: GraphsafeGraph, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<GraphObj>(Tag::Graph, graph.id)?;
        let n = lock(&g).node_kinds()?.len() as u64;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", n) }
    })
}

/// Instantiates an executable graph; it also keeps the captured buffers alive.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeGraphExec`. Thread-safe (calls on one
/// graph serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_instantiate(graph: GraphsafeGraph, out: *mut GraphsafeGraphExec) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<GraphObj>(Tag::Graph, graph.id)?;
        let e = lock(&g).instantiate()?;
        let id = handles::insert(Tag::GraphExec, Arc::new(Mutex::new(e)))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeGraphExec { id }) }
    })
}

/// Destroys a graph handle (executables made from it keep working).
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_destroy(graph: GraphsafeGraph) -> c_int {
    guard(|| handles::remove::<GraphObj>(Tag::Graph, graph.id).map(drop))
}

/// Replays the executable on `stream` (refused while that stream is capturing).
///
/// # Safety
/// None (any value is checked). Thread-safe (launches of one executable serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_launch(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExecObj>(Tag::GraphExec, exec.id)?;
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        let r = lock(&e).launch(&s.stream);
        Ok(r?)
    })
}

/// Uploads the executable's work ahead of its first launch.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_upload(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExecObj>(Tag::GraphExec, exec.id)?;
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        let r = lock(&e).upload(&s.stream);
        Ok(r?)
    })
}

/// Destroys an executable; captured buffers are freed once no graph or executable holds them.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_graph_exec_destroy(exec: GraphsafeGraphExec) -> c_int {
    guard(|| handles::remove::<GraphExecObj>(Tag::GraphExec, exec.id).map(drop))
}

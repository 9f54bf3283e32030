//! Devices, contexts, streams, buffers, workspaces, captures and graphs through the C ABI.

use super::handles::{self, Tag};
use super::{busy, guard, null, put, Fail};
use crate::driver::{self, Context, DeviceBuffer, Stream};
use crate::graph::{CaptureMode, DetachedCapture, Graph, GraphExec};
use crate::workspace::{Workspace, WorkspaceArg};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

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
    /// The open capture on this stream, if any.
    pub capturing: Mutex<Option<u64>>,
}

pub(crate) struct WorkspaceObj {
    pub state: Mutex<WsState>,
}
pub(crate) struct WsState {
    pub ws: Workspace,
    /// The open capture this workspace is bound to, if any.
    pub bound_to: Option<u64>,
}

pub(crate) struct CaptureObj {
    pub state: Mutex<Option<CapState>>,
}
pub(crate) struct CapState {
    pub cap: DetachedCapture,
    pub stream_id: u64,
    /// Workspaces bound to this capture: (id, address, capacity at binding).
    pub bound: Vec<(u64, u64, u64)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn stream_obj(s: GraphsafeStream) -> Result<Arc<StreamObj>, Fail> {
    handles::get::<StreamObj>(Tag::Stream, s.id)
}

/// The stream for eager work: refused while a capture is open on it.
pub(crate) fn eager_stream(s: GraphsafeStream) -> Result<Arc<StreamObj>, Fail> {
    let obj = stream_obj(s)?;
    if lock(&obj.capturing).is_some() {
        return Err(busy("the stream is capturing: use the captured variant of the call, or end the capture".into()));
    }
    Ok(obj)
}

pub(crate) fn workspace_obj(w: GraphsafeWorkspace) -> Result<Arc<WorkspaceObj>, Fail> {
    handles::get::<WorkspaceObj>(Tag::Workspace, w.id)
}

pub(crate) fn capture_obj(c: GraphsafeCapture) -> Result<Arc<CaptureObj>, Fail> {
    handles::get::<CaptureObj>(Tag::Capture, c.id)
}

/// Runs an eager op: the stream must not be capturing and `ws` must not be bound to an open
/// capture; the op may grow `ws`.
pub(crate) fn eager_op<T>(ws: GraphsafeWorkspace, stream: GraphsafeStream, f: impl FnOnce(&Stream, WorkspaceArg<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let s = eager_stream(stream)?;
    let w = workspace_obj(ws)?;
    let mut st = lock(&w.state);
    if let Some(cid) = st.bound_to {
        return Err(busy(format!("the workspace is bound to open capture {cid:#x}: use the captured variant of the call")));
    }
    f(&s.stream, WorkspaceArg::Grow(&mut st.ws, &s.stream))
}

/// Runs a captured op on `capture`'s stream with `ws`, which must be bound to that capture (its
/// captured address and capacity; never grown).
pub(crate) fn captured_op<T>(capture: GraphsafeCapture, ws: GraphsafeWorkspace, f: impl FnOnce(&Stream, WorkspaceArg<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let cobj = capture_obj(capture)?;
    let cs = lock(&cobj.state);
    let state = cs.as_ref().ok_or_else(|| busy("the capture has ended".into()))?;
    let (ptr, capacity) = state
        .bound
        .iter()
        .find(|(id, _, _)| *id == ws.id)
        .map(|&(_, p, c)| (p, c))
        .ok_or_else(|| crate::Error::invalid("ws", "a workspace bound to this capture (graphsafe_capture_bind_workspace)", format!("{:#x}", ws.id)))?;
    f(state.cap.stream(), WorkspaceArg::Fixed { ptr, capacity })
}

/// The driver's CUDA version. Thread-safe. `major`/`minor`: non-null outputs.
#[no_mangle]
pub extern "C" fn graphsafe_driver_version(major: *mut c_int, minor: *mut c_int) -> c_int {
    guard(|| {
        if major.is_null() || minor.is_null() {
            return Err(null("major/minor"));
        }
        let (a, b) = driver::driver_version()?;
        put(major, "major", a)?;
        put(minor, "minor", b)
    })
}

/// Number of CUDA devices. Fails with GRAPHSAFE_ERROR_DRIVER_NOT_FOUND without a driver.
/// Thread-safe. `count`: non-null output.
#[no_mangle]
pub extern "C" fn graphsafe_device_count(count: *mut c_int) -> c_int {
    guard(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        let n = driver::device_count()?;
        put(count, "count", n as c_int)
    })
}

/// Name, compute capability, SMs and memory of device `ordinal`. Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_device_info(ordinal: c_int, out: *mut GraphsafeDeviceInfo) -> c_int {
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
        put(
            out,
            "out",
            GraphsafeDeviceInfo {
                name,
                cc_major: info.compute_capability.0,
                cc_minor: info.compute_capability.1,
                sm_count: info.sm_count as c_int,
                total_memory: info.total_memory,
            },
        )
    })
}

/// The GPU archs the kernels were built for, comma separated (static storage; never null).
#[no_mangle]
pub extern "C" fn graphsafe_build_archs() -> *const c_char {
    concat!(env!("GRAPHSAFE_BUILD_ARCHS"), "\0").as_ptr().cast()
}

/// Retains the primary context of device `ordinal`. Release with graphsafe_context_destroy (the
/// context lives on while streams or workspaces made from it do). Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_context_create(ordinal: c_int, out: *mut GraphsafeContext) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if ordinal < 0 {
            return Err(crate::Error::invalid("ordinal", "a device ordinal >= 0", ordinal).into());
        }
        let ctx = Context::new(ordinal as usize)?;
        put(out, "out", GraphsafeContext { id: handles::insert(Tag::Context, ctx) })
    })
}

/// Wraps the caller's existing `CUcontext` (engines usually have one); the caller keeps it alive
/// longer than everything made from it, and graphsafe never destroys it. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_context_adopt(cu_context: *mut c_void, out: *mut GraphsafeContext) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if cu_context.is_null() {
            return Err(null("cu_context"));
        }
        // SAFETY: the caller's contract (documented above).
        let ctx = unsafe { Context::adopt(cu_context.cast()) }?;
        put(out, "out", GraphsafeContext { id: handles::insert(Tag::Context, ctx) })
    })
}

/// Releases a context handle. Thread-safe; a second call gives GRAPHSAFE_ERROR_INVALID_HANDLE.
#[no_mangle]
pub extern "C" fn graphsafe_context_destroy(ctx: GraphsafeContext) -> c_int {
    guard(|| handles::remove_if::<Context>(Tag::Context, ctx.id, |_| Ok(())).map(drop))
}

/// A new non-blocking stream on `ctx`'s device. Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_stream_create(ctx: GraphsafeContext, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        let s = Arc::new(Stream::new(&c)?);
        put(out, "out", GraphsafeStream { id: handles::insert(Tag::Stream, Arc::new(StreamObj { stream: s, capturing: Mutex::new(None) })) })
    })
}

/// Wraps the caller's existing `CUstream` of `ctx` (not destroyed by graphsafe; the caller keeps it
/// alive and issues no work to it while a graphsafe capture on it is open). The legacy and
/// per-thread default streams are refused. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_stream_adopt(ctx: GraphsafeContext, cu_stream: *mut c_void, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        // SAFETY: the caller's contract (documented above); null/legacy handles are refused inside.
        let s = Arc::new(unsafe { Stream::adopt(&c, cu_stream.cast()) }?);
        put(out, "out", GraphsafeStream { id: handles::insert(Tag::Stream, Arc::new(StreamObj { stream: s, capturing: Mutex::new(None) })) })
    })
}

/// The raw `CUstream` (for the caller's own launches). Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_stream_raw(stream: GraphsafeStream, out: *mut *mut c_void) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        put(out, "out", s.stream.raw().cast())
    })
}

/// Waits for all work on the stream. Refused (BUSY) while the stream is capturing.
#[no_mangle]
pub extern "C" fn graphsafe_stream_synchronize(stream: GraphsafeStream) -> c_int {
    guard(|| Ok(eager_stream(stream)?.stream.synchronize()?))
}

/// Destroys a stream handle (and the stream, unless adopted). BUSY while it is capturing.
#[no_mangle]
pub extern "C" fn graphsafe_stream_destroy(stream: GraphsafeStream) -> c_int {
    guard(|| {
        handles::remove_if::<StreamObj>(Tag::Stream, stream.id, |s| match *lock(&s.capturing) {
            Some(_) => Err(busy("the stream is capturing: end or destroy the capture first".into())),
            None => Ok(()),
        })
        .map(drop)
    })
}

/// Allocates `bytes` (> 0) of device memory owned by graphsafe; `zeroed` != 0 zero-fills it on
/// `stream`. Graphs that bind it keep it alive after graphsafe_buffer_destroy. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_buffer_create(stream: GraphsafeStream, bytes: u64, zeroed: c_int, out: *mut GraphsafeBuffer) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = eager_stream(stream)?;
        let len = usize::try_from(bytes).map_err(|_| crate::Error::invalid("bytes", "a size that fits in memory", bytes))?;
        let b = if zeroed != 0 { DeviceBuffer::alloc_zeroed(&s.stream, len)? } else { DeviceBuffer::alloc(s.stream.context(), len)? };
        put(out, "out", GraphsafeBuffer { id: handles::insert(Tag::Buffer, Arc::new(b)) })
    })
}

/// The buffer's device address and size. Thread-safe. Either output may be null to skip it.
#[no_mangle]
pub extern "C" fn graphsafe_buffer_info(buffer: GraphsafeBuffer, device_ptr: *mut u64, bytes: *mut u64) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        if !device_ptr.is_null() {
            put(device_ptr, "device_ptr", b.device_ptr())?;
        }
        if !bytes.is_null() {
            put(bytes, "bytes", b.len() as u64)?;
        }
        Ok(())
    })
}

/// Copies `bytes` from host memory `src` into the buffer at byte `offset`, on `stream`; `src` may be
/// reused when this returns. Refused while the stream is capturing. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_buffer_write(buffer: GraphsafeBuffer, offset: u64, src: *const c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = eager_stream(stream)?;
        if src.is_null() && bytes > 0 {
            return Err(null("src"));
        }
        check_range(&b, offset, bytes)?;
        // SAFETY: the caller passes `bytes` readable bytes at src.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes as usize) };
        Ok(b.copy_from_host_at(offset as usize, data, &s.stream)?)
    })
}

/// Copies `bytes` from the buffer at byte `offset` into host memory `dst` and waits for `stream`.
/// Refused while the stream is capturing. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_buffer_read(buffer: GraphsafeBuffer, offset: u64, dst: *mut c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = eager_stream(stream)?;
        if dst.is_null() && bytes > 0 {
            return Err(null("dst"));
        }
        check_range(&b, offset, bytes)?;
        // SAFETY: the caller passes `bytes` writable bytes at dst.
        let data = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes as usize) };
        Ok(b.copy_to_host_at(offset as usize, data, &s.stream)?)
    })
}

fn check_range(b: &DeviceBuffer, offset: u64, bytes: u64) -> Result<(), Fail> {
    if offset.checked_add(bytes).is_none_or(|end| end > b.len() as u64) {
        return Err(crate::Error::invalid("offset + bytes", format!("at most the buffer's {} bytes", b.len()), format!("{offset} + {bytes}")).into());
    }
    Ok(())
}

/// Drops the handle's reference; the memory is freed when no graph holds it either. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_buffer_destroy(buffer: GraphsafeBuffer) -> c_int {
    guard(|| handles::remove_if::<DeviceBuffer>(Tag::Buffer, buffer.id, |_| Ok(())).map(drop))
}

/// A workspace of at least `bytes` (0 allowed), zero-filled on `stream`. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_workspace_create(stream: GraphsafeStream, bytes: u64, out: *mut GraphsafeWorkspace) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = eager_stream(stream)?;
        let ws = Workspace::new(&s.stream, bytes)?;
        let obj = Arc::new(WorkspaceObj { state: Mutex::new(WsState { ws, bound_to: None }) });
        put(out, "out", GraphsafeWorkspace { id: handles::insert(Tag::Workspace, obj) })
    })
}

/// Grows the workspace to at least `bytes` by allocating a new zero-filled buffer on `stream` and
/// retiring the old one (graphs that captured it keep it alive). `grew` (nullable) receives 1 if it
/// grew. BUSY while the workspace is bound to an open capture or the stream is capturing.
#[no_mangle]
pub extern "C" fn graphsafe_workspace_ensure_size(ws: GraphsafeWorkspace, bytes: u64, stream: GraphsafeStream, grew: *mut c_int) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let s = eager_stream(stream)?;
        let mut st = lock(&w.state);
        if let Some(c) = st.bound_to {
            return Err(busy(format!("the workspace is bound to open capture {c:#x}: it cannot grow until the capture ends")));
        }
        let g = st.ws.ensure_size(bytes, &s.stream)?;
        if !grew.is_null() {
            put(grew, "grew", g as c_int)?;
        }
        Ok(())
    })
}

/// Capacity and current device address (0 while empty); either output may be null. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_workspace_info(ws: GraphsafeWorkspace, capacity: *mut u64, device_ptr: *mut u64) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let st = lock(&w.state);
        if !capacity.is_null() {
            put(capacity, "capacity", st.ws.capacity())?;
        }
        if !device_ptr.is_null() {
            put(device_ptr, "device_ptr", st.ws.device_ptr())?;
        }
        Ok(())
    })
}

/// Destroys a workspace handle (its memory lives on in graphs that captured it). BUSY while bound
/// to an open capture.
#[no_mangle]
pub extern "C" fn graphsafe_workspace_destroy(ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        handles::remove_if::<WorkspaceObj>(Tag::Workspace, ws.id, |w| match lock(&w.state).bound_to {
            Some(c) => Err(busy(format!("the workspace is bound to open capture {c:#x}"))),
            None => Ok(()),
        })
        .map(drop)
    })
}

/// Begins capturing `stream` (mode: GRAPHSAFE_CAPTURE_*). The stream takes no eager graphsafe work
/// until the capture ends or is destroyed. Same-thread rule for THREAD_LOCAL/GLOBAL (CUDA's).
#[no_mangle]
pub extern "C" fn graphsafe_capture_begin(stream: GraphsafeStream, mode: c_int, out: *mut GraphsafeCapture) -> c_int {
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
        let mut capturing = lock(&s.capturing);
        if let Some(c) = *capturing {
            return Err(busy(format!("the stream is already capturing (capture {c:#x})")));
        }
        let cap = DetachedCapture::begin(s.stream.clone(), mode)?;
        let obj = Arc::new(CaptureObj { state: Mutex::new(Some(CapState { cap, stream_id: stream.id, bound: Vec::new() })) });
        let id = handles::insert(Tag::Capture, obj);
        *capturing = Some(id);
        put(out, "out", GraphsafeCapture { id })
    })
}

/// Binds a workspace to the capture: until the capture ends it cannot grow or be destroyed, and
/// the graph keeps its current buffer alive. Outputs (nullable): its address and capacity, fixed
/// for the capture. A workspace may be bound to one capture at a time.
#[no_mangle]
pub extern "C" fn graphsafe_capture_bind_workspace(capture: GraphsafeCapture, ws: GraphsafeWorkspace, device_ptr: *mut u64, capacity: *mut u64) -> c_int {
    guard(|| {
        let c = capture_obj(capture)?;
        let w = workspace_obj(ws)?;
        let mut cs = lock(&c.state);
        let state = cs.as_mut().ok_or_else(|| busy("the capture has ended".into()))?;
        let mut wst = lock(&w.state);
        match wst.bound_to {
            Some(other) if other == capture.id => {}
            Some(other) => return Err(busy(format!("the workspace is bound to another open capture {other:#x}"))),
            None => {
                if wst.ws.context().raw() != state.cap.stream().context().raw() {
                    return Err(crate::Error::invalid("ws", "a workspace on the capturing stream's device", "one on another device").into());
                }
                if let Some(a) = wst.ws.allocation().cloned() {
                    state.cap.keep(a);
                }
                wst.bound_to = Some(capture.id);
                state.bound.push((ws.id, wst.ws.device_ptr(), wst.ws.capacity()));
            }
        }
        if !device_ptr.is_null() {
            put(device_ptr, "device_ptr", wst.ws.device_ptr())?;
        }
        if !capacity.is_null() {
            put(capacity, "capacity", wst.ws.capacity())?;
        }
        Ok(())
    })
}

/// Binds a graphsafe buffer: the graph keeps it alive. `device_ptr` (nullable) gets its address.
#[no_mangle]
pub extern "C" fn graphsafe_capture_bind_buffer(capture: GraphsafeCapture, buffer: GraphsafeBuffer, device_ptr: *mut u64) -> c_int {
    guard(|| {
        let c = capture_obj(capture)?;
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let mut cs = lock(&c.state);
        let state = cs.as_mut().ok_or_else(|| busy("the capture has ended".into()))?;
        if b.context().raw() != state.cap.stream().context().raw() {
            return Err(crate::Error::invalid("buffer", "a buffer on the capturing stream's device", "one on another device").into());
        }
        state.cap.keep(b.allocation().clone());
        if !device_ptr.is_null() {
            put(device_ptr, "device_ptr", b.device_ptr())?;
        }
        Ok(())
    })
}

fn finish(capture: GraphsafeCapture) -> Result<CapState, Fail> {
    let obj = handles::remove_if::<CaptureObj>(Tag::Capture, capture.id, |_| Ok(()))?;
    let state = lock(&obj.state).take().ok_or_else(|| busy("the capture has ended".into()))?;
    for (ws_id, _, _) in &state.bound {
        if let Ok(w) = handles::get::<WorkspaceObj>(Tag::Workspace, *ws_id) {
            lock(&w.state).bound_to = None;
        }
    }
    if let Ok(s) = handles::get::<StreamObj>(Tag::Stream, state.stream_id) {
        *lock(&s.capturing) = None;
    }
    Ok(state)
}

/// Ends the capture; `out` receives the graph. On GRAPHSAFE_ERROR_CAPTURE_INVALIDATED no graph is
/// made. Either way the capture handle is consumed, bound workspaces are released and the stream
/// is usable again.
#[no_mangle]
pub extern "C" fn graphsafe_capture_end(capture: GraphsafeCapture, out: *mut GraphsafeGraph) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let state = finish(capture)?;
        let g = state.cap.end()?;
        put(out, "out", GraphsafeGraph { id: handles::insert(Tag::Graph, Arc::new(g)) })
    })
}

/// Abandons a capture: ends it, discards the graph, releases bound workspaces.
#[no_mangle]
pub extern "C" fn graphsafe_capture_destroy(capture: GraphsafeCapture) -> c_int {
    guard(|| finish(capture).map(drop))
}

/// Number of nodes in a graph (what the capture recorded). Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_graph_node_count(graph: GraphsafeGraph, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<Graph>(Tag::Graph, graph.id)?;
        put(out, "out", g.node_kinds()?.len() as u64)
    })
}

/// Instantiates an executable graph; it also keeps the captured buffers alive. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_graph_instantiate(graph: GraphsafeGraph, out: *mut GraphsafeGraphExec) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let g = handles::get::<Graph>(Tag::Graph, graph.id)?;
        let e = g.instantiate()?;
        put(out, "out", GraphsafeGraphExec { id: handles::insert(Tag::GraphExec, Arc::new(e)) })
    })
}

/// Destroys a graph handle (executables made from it keep working). Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_graph_destroy(graph: GraphsafeGraph) -> c_int {
    guard(|| handles::remove_if::<Graph>(Tag::Graph, graph.id, |_| Ok(())).map(drop))
}

/// Replays the executable on `stream` (refused while that stream is capturing). Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_graph_exec_launch(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExec>(Tag::GraphExec, exec.id)?;
        let s = eager_stream(stream)?;
        Ok(e.launch(&s.stream)?)
    })
}

/// Uploads the executable's work ahead of its first launch. Thread-safe.
#[no_mangle]
pub extern "C" fn graphsafe_graph_exec_upload(exec: GraphsafeGraphExec, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let e = handles::get::<GraphExec>(Tag::GraphExec, exec.id)?;
        let s = eager_stream(stream)?;
        Ok(e.upload(&s.stream)?)
    })
}

/// Destroys an executable; captured buffers are freed once no graph or executable holds them.
#[no_mangle]
pub extern "C" fn graphsafe_graph_exec_destroy(exec: GraphsafeGraphExec) -> c_int {
    guard(|| handles::remove_if::<GraphExec>(Tag::GraphExec, exec.id, |_| Ok(())).map(drop))
}

//! The objects behind the C ABI's handles (streams, workspaces, captures, graphs), the locks and
//! checks every entry point shares, and the two helpers every op entry point runs through
//! ([`eager_op`], [`captured_op`]). The lock discipline they follow is written down in
//! `capi/mod.rs`; the entry points themselves are in `device.rs`, `stream.rs`, `memory.rs`,
//! `capture.rs` and `graph.rs`.

use super::handles::{self, Tag};
use super::{busy, Fail};
use crate::driver::Stream;
use crate::graph::op_target::OpTarget;
use crate::graph::{DetachedCapture, Graph, GraphExec, WorkspaceView};
use crate::workspace::Workspace;
use std::ffi::{c_char, c_int};
use crate::locks::Locked;
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

/// Capture modes (after CUDA's `CUstreamCaptureMode`). GLOBAL: graphsafe refuses its own
/// allocations on every thread while the capture is open; the driver's capture is begun
/// thread-local, because driver 580 crashes when two threads capture in its global mode (see
/// `graphsafe::graph::CaptureMode::Global`).
pub const GRAPHSAFE_CAPTURE_GLOBAL: c_int = 0;
/// Potentially unsafe calls refused on the capturing thread only (the usual choice).
pub const GRAPHSAFE_CAPTURE_THREAD_LOCAL: c_int = 1;
/// Nothing refused.
pub const GRAPHSAFE_CAPTURE_RELAXED: c_int = 2;

pub(crate) struct StreamObj {
    pub stream: Arc<Stream>,
    pub(super) state: Mutex<StreamState>,
}
pub(super) struct StreamState {
    /// The open capture on this stream (its handle id), if any.
    pub(super) capturing: Option<u64>,
    pub(super) closed: bool,
}

pub(crate) struct WorkspaceObj {
    pub(super) state: Mutex<WsState>,
}
pub(super) struct WsState {
    pub(super) ws: Workspace,
    /// The open capture this workspace is bound to (its handle id), if any.
    pub(super) bound_to: Option<u64>,
    pub(super) closed: bool,
}

pub(crate) struct CaptureObj {
    /// The capturing stream: reached through this `Arc`, never through the registry, so ending a
    /// capture needs no handle lookup under a lock.
    pub(super) stream: Arc<StreamObj>,
    /// `None` until the driver's capture has begun, and again once it ended.
    pub(super) state: Mutex<Option<CapState>>,
    /// Set when graphsafe abandoned the capture at the exit of the thread that began it: the
    /// handle stays registered for its owner's end (CAPTURE_INVALIDATED) or destroy (OK).
    pub(super) abandoned: std::sync::atomic::AtomicBool,
}
pub(super) struct CapState {
    pub(super) cap: DetachedCapture,
    /// Workspaces bound to this capture: handle id, the object, and the view fixed at binding.
    pub(super) bound: Vec<(u64, Arc<WorkspaceObj>, WorkspaceView)>,
}

pub(super) type GraphObj = Mutex<Graph>;
pub(super) type GraphExecObj = Mutex<GraphExec>;

/// An object lock of the C ABI's. Records graphsafe logs while one is held (a free failing under
/// a workspace's growth) reach the logger once the thread holds none: a logger calling the C ABI
/// on the same object would wait for its own thread.
pub(super) type Guard<'a, T> = Locked<MutexGuard<'a, T>>;

pub(super) fn lock<T>(m: &Mutex<T>) -> Guard<'_, T> {
    // Every critical section leaves its state consistent at each step, so a panic elsewhere while
    // holding the lock (caught by the guard) does not make the state unusable.
    Locked::new(m.lock().unwrap_or_else(|p| p.into_inner()))
}

pub(super) fn closed(what: &str, id: u64) -> Fail {
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

pub(super) fn new_stream_obj(stream: Stream) -> Arc<StreamObj> {
    Arc::new(StreamObj { stream: Arc::new(stream), state: Mutex::new(StreamState { capturing: None, closed: false }) })
}

/// Locks the stream for eager work: open and not capturing. Hold the guard for as long as the
/// work is being enqueued (rule 4: a capture cannot begin in between).
pub(super) fn lock_eager(s: &StreamObj, id: u64) -> Result<Guard<'_, StreamState>, Fail> {
    let st = lock(&s.state);
    if st.closed {
        return Err(closed("stream", id));
    }
    if let Some(c) = st.capturing {
        return Err(busy(format!("the stream is capturing (capture {c:#x}): use the captured variant of the call, or end the capture")));
    }
    Ok(st)
}

pub(super) fn lock_workspace(w: &WorkspaceObj, id: u64) -> Result<Guard<'_, WsState>, Fail> {
    let st = lock(&w.state);
    if st.closed {
        return Err(closed("workspace", id));
    }
    Ok(st)
}

/// Runs an eager op on `s` (resolved by the caller): stream locked and checked, then (with `ws`)
/// the workspace locked and checked, and both held while `f` validates, grows and launches.
pub(crate) fn eager_op<T>(s: (&StreamObj, u64), ws: Option<(&WorkspaceObj, u64)>, f: impl FnOnce(OpTarget<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let _stream = lock_eager(s.0, s.1)?;
    match ws {
        None => f(OpTarget::eager(&s.0.stream, None)?),
        Some((w, id)) => {
            let mut st = lock_workspace(w, id)?;
            if let Some(cid) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {cid:#x}: use the captured variant of the call")));
            }
            // Bound first: a tail expression's temporaries would outlive `st`.
            let r = f(OpTarget::eager(&s.0.stream, Some(&mut st.ws))?);
            r
        }
    }
}

/// Runs a captured op of `c` (resolved by the caller) with workspace `ws_id`, which must be bound to
/// that capture (its view fixed at binding; never grown). The capture stays locked throughout, so
/// it cannot end while the op records into it.
pub(crate) fn captured_op<T>(c: (&CaptureObj, u64), ws_id: Option<u64>, f: impl FnOnce(OpTarget<'_>) -> Result<T, Fail>) -> Result<T, Fail> {
    let cs = lock(&c.0.state);
    let state = cs.as_ref().ok_or_else(|| closed("capture", c.1))?;
    let view = match ws_id {
        None => None,
        Some(id) => Some(state.bound.iter().find(|(w, _, _)| *w == id).map(|(_, _, v)| v).ok_or_else(|| {
            crate::Error::invalid("ws", "a workspace bound to this capture (graphsafe_capture_bind_workspace)", format!("{id:#x}"))
        })?),
    };
    let r = f(OpTarget::captured(state.cap.site(), view)?);
    r
}

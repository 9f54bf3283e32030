//! Stream capture through the C ABI: begin, bind workspaces and buffers (the graph keeps them),
//! end or abandon. Ending locks stream, then capture, then workspaces (the order: `crate::locks`).

use super::core::{
    capture_obj, closed, lock, lock_workspace, stream_obj, workspace_obj, CapState, CaptureObj, GraphsafeBuffer, GraphsafeCapture, GraphsafeGraph,
    GraphsafeStream, GraphsafeWorkspace, GRAPHSAFE_CAPTURE_GLOBAL, GRAPHSAFE_CAPTURE_RELAXED, GRAPHSAFE_CAPTURE_THREAD_LOCAL,
};
use super::handles::{self, Tag};
use super::{busy, guard, null, put, Fail};
use crate::driver::DeviceBuffer;
use crate::graph::{CaptureMode, DetachedCapture, Graph};
use std::cell::RefCell;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Begins capturing `stream` (mode: GRAPHSAFE_CAPTURE_*). The stream takes no eager graphsafe work
/// until the capture ends or is destroyed. Same-thread rule for THREAD_LOCAL/GLOBAL (CUDA's): end
/// or destroy it on the thread that began it. While it is open, graphsafe refuses (BUSY) the calls
/// the driver forbids there and that would invalidate it: allocations (buffer and workspace
/// creation, growth, eager ops that grow) on this thread, and for GLOBAL on every thread; a
/// context synchronize on this thread. If the thread exits with it still open, graphsafe abandons
/// it at the thread's exit, as graphsafe_capture_destroy would (the stream and bound workspaces
/// are usable again); the handle then stays valid until its owner consumes it:
/// graphsafe_capture_end answers GRAPHSAFE_ERROR_CAPTURE_INVALIDATED, graphsafe_capture_destroy OK.
/// So a THREAD_LOCAL or GLOBAL capture begun from a thread-exit destructor that runs after
/// graphsafe's thread-locals are destroyed is refused (INVALID_ARGUMENT); RELAXED is allowed there.
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
        // A non-relaxed capture must be abandoned at this thread's exit if still open, which takes
        // the thread's list of them: once the thread's exit has destroyed that list (a
        // thread_local destructor of the caller's running after graphsafe's), such a capture would
        // stay open for good. Refused before anything is begun.
        if mode != CaptureMode::Relaxed && BEGUN_HERE.try_with(|_| ()).is_err() {
            return Err(crate::Error::invalid(
                "mode",
                "GRAPHSAFE_CAPTURE_RELAXED on a thread that is exiting (graphsafe could not abandon a THREAD_LOCAL or GLOBAL capture it left open)",
                "a THREAD_LOCAL or GLOBAL capture begun after this thread's exit destroyed graphsafe's thread-locals",
            )
            .into());
        }
        let s = stream_obj(stream)?;
        // Register the (not yet begun) capture first: no registry call may happen under the
        // stream's lock (rule 1), and the stream must record the capture's id under that lock.
        let obj = Arc::new(CaptureObj { stream: s.clone(), state: Mutex::new(None), abandoned: AtomicBool::new(false) });
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
            **lock(&obj.state) = Some(CapState { cap, bound: Vec::new() });
            st.capturing = Some(id);
            Ok(())
        })();
        if let Err(e) = begun {
            let _ = handles::remove::<CaptureObj>(Tag::Capture, id);
            return Err(e);
        }
        if mode != CaptureMode::Relaxed {
            // Only this thread can end it (CUDA's rule): if it exits first, the capture is
            // abandoned then, from here.
            let _ = BEGUN_HERE.try_with(|b| b.remember(id));
        }
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeCapture { id }) }
    })
}

/// The THREAD_LOCAL and GLOBAL captures begun on this thread through the C ABI (handle ids): the
/// driver lets only this thread end them, so a thread that exits with one open would leave it open
/// for good (its stream and workspaces BUSY, `capture_end` BUSY from every other thread). At the
/// thread's exit, while it still runs, each one still open is abandoned as by
/// graphsafe_capture_destroy: the driver's capture ended (from the right thread), its graph thrown
/// away, the bound workspaces released; the handle stays registered for its owner (`finish`).
struct BegunHere(RefCell<Vec<u64>>);

impl BegunHere {
    fn remember(&self, id: u64) {
        let Ok(mut ids) = self.0.try_borrow_mut() else { return };
        // Ended ones are forgotten now and then (their end, on this thread, already happened).
        if ids.len() >= 64 {
            ids.retain(|&c| capture_obj(GraphsafeCapture { id: c }).is_ok());
        }
        ids.push(id);
    }
}

impl Drop for BegunHere {
    fn drop(&mut self) {
        for id in std::mem::take(self.0.get_mut()) {
            // Nothing may unwind out of a thread-exit destructor (the process would abort); an id
            // already ended or destroyed is skipped.
            let _ = catch_unwind(AssertUnwindSafe(|| abandon_at_exit(id)));
        }
    }
}

thread_local! {
    static BEGUN_HERE: BegunHere = const { BegunHere(RefCell::new(Vec::new())) };
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

/// Ends the driver's capture of `c` (handle `id`) and closes it: stream, then capture, then
/// workspaces are locked (rule 3) and stay locked until the driver's capture is over, so no eager
/// op can slip into it. Returns the end's outcome and what the capture kept (for the caller to
/// drop outside the locks). A capture the driver still holds open after a failed end (e.g. a
/// thread-local capture ended from another thread) is left exactly as it was: BUSY.
fn close(c: &CaptureObj, id: u64) -> Result<(crate::Result<Graph>, CapState), Fail> {
    let s = c.stream.clone();
    let mut st = lock(&s.state);
    let mut cs = lock(&c.state);
    let state = cs.as_mut().ok_or_else(|| closed("capture", id))?;
    let ended = state.cap.end();
    if state.cap.is_open() {
        // The driver still captures: nothing changed, the handle stays valid. Always BUSY, so
        // a caller can tell this from a failed end that consumed the handle (DRIVER et al.).
        let why = ended.err().map_or_else(String::new, |e| format!(": {e}"));
        return Err(busy(format!("the capture is still open and its handle still valid{why}")));
    }
    let Some(done) = cs.take() else { return Err(closed("capture", id)) };
    for (_, w, _) in &done.bound {
        lock(&w.state).bound_to = None;
    }
    if st.capturing == Some(id) {
        st.capturing = None;
    }
    Ok((ended, done))
}

/// Ends (`keep_graph`) or abandons the capture, consuming the handle (unless BUSY: see `close`).
fn finish(capture: GraphsafeCapture, keep_graph: bool) -> Result<Option<Graph>, Fail> {
    let c = capture_obj(capture)?;
    if c.abandoned.load(Ordering::Acquire) {
        // Abandoned at its thread's exit: only the handle is left.
        let _ = handles::remove::<CaptureObj>(Tag::Capture, capture.id);
        if keep_graph {
            return Err(Fail(
                super::GRAPHSAFE_ERROR_CAPTURE_INVALIDATED,
                format!("capture {:#x} was abandoned when the thread that began it exited: no graph (the handle is now consumed)", capture.id),
            ));
        }
        return Ok(None);
    }
    // `_done` (and what it still keeps alive) is dropped after the locks are released.
    let (outcome, _done) = close(&c, capture.id)?;
    // Unregister outside every lock (rule 1); dropping the graph (abandon) also happens here.
    let _ = handles::remove::<CaptureObj>(Tag::Capture, capture.id);
    match outcome {
        Ok(g) if keep_graph => Ok(Some(g)),
        Ok(_) => Ok(None),
        Err(crate::Error::CaptureInvalidated { .. }) if !keep_graph => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Abandons capture `id` at the exit of the thread that began it (the only one the driver lets
/// end it), if it is still open: the driver's capture ended and its graph thrown away, the bound
/// workspaces released and the stream usable, as by graphsafe_capture_destroy; the handle stays
/// registered, marked, for its owner's end or destroy (a C++ `thread_local` owner may still run
/// its destructor after this one).
fn abandon_at_exit(id: u64) {
    let Ok(c) = capture_obj(GraphsafeCapture { id }) else { return };
    if let Ok((_, done)) = close(&c, id) {
        c.abandoned.store(true, Ordering::Release);
        drop(done);
    }
}

/// Ends the capture; `out` receives the graph. On GRAPHSAFE_ERROR_CAPTURE_INVALIDATED no graph is
/// made. GRAPHSAFE_ERROR_BUSY means the driver keeps the capture open (a THREAD_LOCAL/GLOBAL
/// capture ended from another thread): nothing changed and the handle stays valid; end it from the
/// thread that began it. Every other status (OK included) consumes the handle: bound workspaces
/// are released and the stream is usable again.
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

/// Abandons a capture: ends it, discards the graph, releases bound workspaces. GRAPHSAFE_ERROR_BUSY,
/// as for `graphsafe_capture_end`: the driver keeps the capture open and the handle stays valid.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_capture_destroy(capture: GraphsafeCapture) -> c_int {
    guard(|| finish(capture, false).map(drop))
}

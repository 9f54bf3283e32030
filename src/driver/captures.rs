//! The graphsafe captures open in the process, for the rules a capture imposes beyond its stream:
//! which threads' allocations it forbids, and which thread began it.
//!
//! The driver forbids "potentially unsafe" calls (allocations, module loads, a context-wide wait)
//! on the thread of a non-relaxed capture, and, for a GLOBAL-mode capture, on every thread; a call
//! it forbids invalidates the capture. graphsafe refuses such calls of its own first
//! ([`Error::StreamCapturing`], nothing done), so a capture is never invalidated by graphsafe
//! itself: allocations while this thread has a THREAD_LOCAL or GLOBAL capture open, or any thread
//! a GLOBAL one (whose driver capture is begun thread-local: see `CaptureMode::Global`); a context
//! synchronize while this thread has any capture open.
//!
//! A capture whose guard was forgotten (`mem::forget`) or whose thread exited is still open at the
//! driver. Its refusals end when its stream is dropped (which ends or discards it), or as soon as
//! the driver no longer reports its stream capturing: a refusal asks the driver first. So an
//! abandoned capture degrades its own stream, not the process.
//!
//! A capture opens and closes under the context's free gate and this registry's write side;
//! allocations take only its read side, from their check to their allocation, so a GLOBAL capture
//! never begins while one is in flight (where both stand among graphsafe's locks: `crate::locks`).

use super::{check, init, log_drop_error, Context, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Whose allocations a capture forbids (after its `CaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forbids {
    /// Nothing (relaxed).
    Nothing,
    /// The capturing thread's (thread-local).
    ThisThread,
    /// Every thread's (global).
    EveryThread,
}

struct Open {
    id: u64,
    stream: usize,
    // Holds the stream's context for the driver query (the entry leaves before the stream goes).
    ctx: Arc<Context>,
    forbids: Forbids,
    thread: u64,
}

static OPEN: RwLock<Vec<Open>> = RwLock::new(Vec::new());

/// The calling thread's number, unique in the process (a `Cell`, which has no destructor: readable
/// during thread exit too).
pub(crate) fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ME: Cell<u64> = const { Cell::new(0) };
    }
    ME.with(|me| {
        if me.get() == 0 {
            me.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        me.get()
    })
}

/// Opens graphsafe capture `id` on `stream` (not capturing: the caller checked) with `begin`, the
/// driver's cuStreamBeginCapture: under the context's free gate (which records the work before
/// the capture, for frees) and this registry's write side, so no allocation a GLOBAL capture
/// forbids is in flight as it begins. Nothing is left behind if `begin` fails.
pub(crate) fn open(stream: &Stream, id: u64, forbids: Forbids, begin: impl FnOnce() -> Result<()>) -> Result<()> {
    let ctx = stream.context();
    ctx.capture_opening(id, stream.handle(), || {
        let mut open = OPEN.write().unwrap_or_else(|p| p.into_inner());
        begin()?;
        open.push(Open { id, stream: stream.handle() as usize, ctx: ctx.clone(), forbids, thread: this_thread() });
        Ok(())
    })
}

/// Graphsafe capture `id` of `ctx` is over (`left_work` false), or its stream is dropped with the
/// capture still open at the driver (`left_work` true: see `Context::capture_closed`). Returns
/// whether it was still open (the first path to close a capture does the bookkeeping).
pub(crate) fn close(ctx: &Context, id: u64, left_work: bool) -> bool {
    let was_open = ctx.capture_closed(id, left_work);
    let gone: Vec<Open> = {
        let mut open = OPEN.write().unwrap_or_else(|p| p.into_inner());
        let (gone, kept) = std::mem::take(&mut *open).into_iter().partition(|o| o.id == id);
        *open = kept;
        gone
    };
    // Dropped (with their `Arc<Context>`) outside the registry's lock.
    drop(gone);
    was_open
}

/// Whether the driver still reports capture `o`'s stream capturing (an error counts as yes).
fn still_captures(o: &Open) -> bool {
    // SAFETY: the entry leaves the registry before its stream is destroyed (`Stream`'s drop closes
    // it first), and the registry's lock is held by the caller: a live stream of `o.ctx`.
    unsafe { super::graph::stream_is_capturing(&o.ctx, o.stream as c::CUstream) }.unwrap_or(true)
}

/// Runs `alloc` (an allocation, a module load, cuDNN's handle or plans: what the driver forbids
/// during a non-relaxed capture) unless a graphsafe capture forbids it to this thread: then
/// `StreamCapturing` and nothing is called. A capture forbids it when it is GLOBAL, or
/// THREAD_LOCAL/GLOBAL and begun on this thread, and the driver still reports it.
pub(crate) fn outside_forbidding_capture<T>(alloc: impl FnOnce() -> Result<T>) -> Result<T> {
    let open = OPEN.read().unwrap_or_else(|p| p.into_inner());
    let me = this_thread();
    let forbidding = open.iter().find(|o| {
        let forbids = match o.forbids {
            Forbids::EveryThread => true,
            Forbids::ThisThread => o.thread == me,
            Forbids::Nothing => false,
        };
        forbids && still_captures(o)
    });
    if let Some(o) = forbidding {
        let whose = if o.forbids == Forbids::EveryThread { "a GLOBAL-mode capture, which forbids allocating on every thread" } else { "a THREAD_LOCAL capture of this thread" };
        return Err(Error::StreamCapturing { detail: format!("graphsafe capture #{} is open ({whose}); the driver would invalidate it", o.id) });
    }
    alloc()
}

/// A graphsafe capture open on the calling thread (begun here, of any mode and context) that the
/// driver still reports, if any: a context-wide wait here would invalidate it.
pub(crate) fn open_on_this_thread() -> Option<u64> {
    let open = OPEN.read().unwrap_or_else(|p| p.into_inner());
    let me = this_thread();
    open.iter().find(|o| o.thread == me && still_captures(o)).map(|o| o.id)
}

/// This thread's capture mode set to relaxed until dropped (then restored).
pub(crate) struct RelaxedCaptureMode(c::CUstreamCaptureMode);

impl RelaxedCaptureMode {
    pub(crate) fn enter() -> Result<RelaxedCaptureMode> {
        let f = init()?.cuThreadExchangeStreamCaptureMode()?;
        let mut mode = c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in/out pointer to a local holding a valid mode.
        check(unsafe { (f.f)(&mut mode) }, f.name)?;
        Ok(RelaxedCaptureMode(mode))
    }
}

impl Drop for RelaxedCaptureMode {
    fn drop(&mut self) {
        let r = (|| {
            let f = init()?.cuThreadExchangeStreamCaptureMode()?;
            let mut mode = self.0;
            // SAFETY: in/out pointer to a local holding the mode saved by `enter`.
            check(unsafe { (f.f)(&mut mode) }, f.name)
        })();
        log_drop_error("cuThreadExchangeStreamCaptureMode (restoring)", r);
    }
}

use super::context::StreamWork;
use super::{check, init, log_drop_error, Context, ForeignOwner};
use crate::error::{Error, Result};
use crate::graph::op_target::Committed;
use crate::sys::cuda as c;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A CUDA stream. Never the legacy (null) stream: every memset, copy and launch of the crate goes
/// to a `Stream` the caller passed, so it is ordered and, during a capture, captured.
///
/// Beginning a capture borrows the stream mutably (see [`crate::graph::Capture`]), so nothing
/// eager can be issued to it until the capture ends. The stream also remembers the open capture
/// (cleared only when that capture ends or is dropped), so a capture leaked with `mem::forget`
/// still makes every eager API refuse the stream ([`Error::StreamCapturing`]) instead of letting
/// its work land in the graph.
#[derive(Debug)]
pub struct Stream {
    raw: c::CUstream,
    ctx: Arc<Context>,
    owned: bool,
    // The id of the graphsafe capture open on this stream; 0 when none.
    capture: AtomicU64,
    // Other code holds the raw handle (adopted, or handed out by the C ABI's graphsafe_stream_raw)
    // and could begin a capture of its own on it: replays then ask the driver first.
    shared: AtomicBool,
    // Unique for the process (raw handles are reused once a stream is destroyed): what a
    // workspace's use order (`super::order`) compares to see a change of stream.
    uid: u64,
    // What keeps an adopted stream alive (cudarc's `Arc<CudaStream>`).
    _owner: Option<ForeignOwner>,
}

static NEXT_STREAM_UID: AtomicU64 = AtomicU64::new(1);

/// `cuStreamSynchronize`'s function pointer type.
pub(crate) type SyncFn = <c::PFN_cuStreamSynchronize_v2000 as crate::sys::driver::OptionInner>::Inner;

/// Errors after which the wait for a stream cannot be had and is not needed: the context's work
/// stopped for good (a sticky fault: 214, 700, 702, 709, 710, 714-719; the driver torn down: 4;
/// 999, which the driver keeps answering once it is broken), or the stream was pulled into a
/// capture graphsafe did not begin (900-908), which only the caller's broken promise on an
/// adopted or exported stream allows.
fn no_more_work_runs(code: u32) -> bool {
    matches!(code, 4 | 214 | 700 | 702 | 709 | 710 | 714..=719 | 900..=908 | 999)
}

fn next_uid() -> u64 {
    NEXT_STREAM_UID.fetch_add(1, Ordering::Relaxed)
}

// SAFETY: stream handles may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as for Send: work may be enqueued on one stream from several threads; the capture
// marker is atomic.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream (it does not synchronize with the legacy stream).
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        let _current = ctx.enter()?;
        let f = init()?.cuStreamCreate()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut raw, c::CUstream_flags::CU_STREAM_NON_BLOCKING.0) }, f.name)?;
        // A handle the driver just made is wrapped by nobody else.
        let uid = next_uid();
        let fresh = ctx.register_stream(raw);
        debug_assert!(fresh, "cuStreamCreate returned a handle graphsafe still wraps");
        Ok(Stream { raw, ctx: ctx.clone(), owned: true, capture: AtomicU64::new(0), shared: AtomicBool::new(false), uid, _owner: None })
    }

    /// Wraps a stream the caller owns (an engine's existing `CUstream`); it is not destroyed on drop.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `ctx` that outlives the returned value; no other code may
    /// issue work to it while a graphsafe capture on it is open, and no other code may begin a
    /// capture on it *during* a graphsafe call on it on another thread (every graphsafe call on an
    /// adopted stream, replays included, asks the driver first and refuses a capture it did not
    /// begin, but cannot see one that starts between that question and its own enqueue). Frees of
    /// graphsafe memory in `ctx`, and the unload of a module whose last holder goes (a
    /// `TestKernels`, a graph that launched its kernels), wait for every graphsafe stream of it,
    /// this one included: work on it that waits for the host (`cuStreamWaitValue32`, a
    /// collective) must not wait for something the freeing thread does only after the free, or the
    /// free never returns.
    ///
    /// Refused (`InvalidArgument`): the legacy and per-thread default streams, and a handle another
    /// graphsafe `Stream` (created or adopted, C ABI handles included) already wraps: two wrappers
    /// would each have their own capture marker, so one could replay or enqueue into the other's
    /// open capture. Drop the first wrapper, or share it.
    pub unsafe fn adopt(ctx: &Arc<Context>, raw: c::CUstream) -> Result<Stream> {
        // SAFETY: the caller's promise, passed on.
        unsafe { Stream::adopt_owned(ctx, raw, None) }
    }

    /// [`Stream::adopt`], holding `owner` (what keeps `raw` alive) for as long as the value lives.
    ///
    /// # Safety
    /// As [`Stream::adopt`], with "outlives the returned value" met by `owner` when there is one.
    pub(crate) unsafe fn adopt_owned(ctx: &Arc<Context>, raw: c::CUstream, owner: Option<ForeignOwner>) -> Result<Stream> {
        if raw.is_null() || raw as usize == 1 || raw as usize == 2 {
            return Err(Error::invalid(
                "stream",
                "a created stream (the legacy and per-thread default streams cannot be captured safely)",
                format!("{raw:?}"),
            ));
        }
        // A stream of another context would be listed under the wrong free gate: its work would
        // not be waited for before that context's frees, and a second wrapper under its own
        // context's gate would not be refused.
        let of = {
            let _current = ctx.enter()?;
            let f = init()?.cuStreamGetCtx()?;
            let mut of: c::CUcontext = std::ptr::null_mut();
            // SAFETY: a live stream (the caller's contract); out-pointer to a local.
            check(unsafe { (f.f)(raw, &mut of) }, f.name)?;
            of
        };
        if of != ctx.raw() {
            return Err(Error::invalid("stream", format!("a stream of the context {:?}", ctx.raw()), format!("{raw:?}, a stream of context {of:?}")));
        }
        let uid = next_uid();
        if !ctx.register_stream(raw) {
            return Err(Error::invalid("stream", "a stream no other graphsafe Stream wraps", format!("{raw:?}, already wrapped")));
        }
        Ok(Stream { raw, ctx: ctx.clone(), owned: false, capture: AtomicU64::new(0), shared: AtomicBool::new(true), uid, _owner: owner })
    }

    /// The raw handle, for code outside graphsafe (an engine's kernels, its own captures). Taking
    /// it marks the stream as shared: from then on replays on it also ask the driver whether a
    /// capture graphsafe did not begin is open there (one `cuStreamIsCapturing` each), and refuse
    /// to be recorded into it, as on an adopted stream.
    pub fn raw(&self) -> c::CUstream {
        self.mark_shared();
        self.raw
    }

    /// The raw handle without marking the stream shared, so replays on it keep the fast path (no
    /// driver query): for code that launches its own work on the stream but never captures on it
    /// while graphsafe replays or uses a workspace there (a benchmark's raw baseline).
    ///
    /// # Safety
    /// While graphsafe replays a graph on this stream, or runs an op on it, no capture graphsafe
    /// did not begin may be open on the handle (the promise [`Stream::adopt`] asks for): such a
    /// replay would be recorded into that capture, whose graph keeps none of its memory alive.
    pub unsafe fn raw_unshared(&self) -> c::CUstream {
        self.raw
    }

    /// The raw handle for the driver layer's own calls on it (not marking it shared): copies,
    /// events, captures, launches. Private to the driver layer; the rest of the crate reaches the
    /// handle only through [`Stream::committed_handle`].
    /// (See also [`crate::graph::CaptureStream::raw_unshared`], the same inside a capture.)
    pub(in crate::driver) fn handle(&self) -> c::CUstream {
        self.raw
    }

    /// The raw handle, for an op's committed launch (kernel glue, cuDNN): only the
    /// `graph::op_target::Launch` an op's commit returns holds the [`Committed`] this asks for,
    /// so an op that skipped its commit (the capture's keep list, the workspace's use order)
    /// cannot reach the stream.
    pub(crate) fn committed_handle(&self, _: &Committed) -> c::CUstream {
        self.raw
    }

    /// This wrapper's identity for the process (never reused, unlike raw handles).
    pub(crate) fn uid(&self) -> u64 {
        self.uid
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Blocks until all work on the stream has finished. Refused while it is capturing
    /// (synchronizing would invalidate the capture).
    pub fn synchronize(&self) -> Result<()> {
        self.ensure_eager()?;
        let _current = self.ctx.enter()?;
        let f = init()?.cuStreamSynchronize()?;
        // SAFETY: raw is a live stream.
        check(unsafe { (f.f)(self.raw) }, f.name)
    }

    /// The wait of a host copy just enqueued on this stream (`sync`, its `cuStreamSynchronize`,
    /// resolved before the copy so that nothing can fail between the enqueue and the wait): the
    /// caller's host memory is borrowed only for the call, and page-locked memory is read or
    /// written by the device asynchronously. So this returns only once the copy is over: no capture
    /// check first (the copy's own check ran before the enqueue, and a check that failed here
    /// returned with the copy in flight), and a failed wait is retried until the stream is idle,
    /// then reported (`Err`: something failed, but the copy no longer touches the caller's memory).
    /// The retries stop early only on errors after which no work of the context runs any more
    /// (a sticky fault, a torn-down driver) or when the stream has been pulled into a capture
    /// graphsafe did not begin (the caller's promise on adopted and exported streams, broken).
    pub(crate) fn wait_for_host_copy(&self, sync: &crate::sys::driver::Entry<SyncFn>) -> Result<()> {
        // SAFETY: a live stream (this value holds it).
        let first = check(unsafe { (sync.f)(self.raw) }, sync.name);
        let Err(failed) = first else { return Ok(()) };
        let mut pause = std::time::Duration::from_micros(50);
        loop {
            // SAFETY: as above.
            match check(unsafe { (sync.f)(self.raw) }, sync.name) {
                Ok(()) => return Err(failed),
                Err(Error::Driver { code, .. }) if no_more_work_runs(code) => return Err(failed),
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
            }
        }
    }

    /// Whether the driver reports the stream in the middle of a capture (graphsafe's, an invalidated
    /// one not yet ended, or one begun outside graphsafe).
    pub fn is_capturing(&self) -> Result<bool> {
        // SAFETY: a live stream of its context (this value holds both).
        unsafe { super::graph::stream_is_capturing(&self.ctx, self.raw) }
    }

    /// Records that code outside graphsafe now holds the raw handle (the C ABI hands it out), so
    /// replays on the stream also ask the driver whether a capture graphsafe did not begin is open.
    fn mark_shared(&self) {
        self.shared.store(true, Ordering::Release);
    }

    /// The check of the replay hot path: no graphsafe capture open on the stream (an atomic load),
    /// and, on a stream whose handle other code holds (adopted, or handed out by the C ABI), no
    /// capture the driver reports either (one `cuStreamIsCapturing`): a replay recorded into a
    /// foreign capture would put the graph's memory into a graph that keeps none of it alive.
    pub(crate) fn ensure_replayable(&self) -> Result<()> {
        self.ensure_no_open_capture()?;
        if self.shared.load(Ordering::Acquire) && self.is_capturing()? {
            return Err(Error::StreamCapturing { detail: "the driver reports a capture graphsafe did not begin; a replay would be recorded into it".into() });
        }
        Ok(())
    }

    /// Whether graphsafe created the stream (and destroys it on drop), rather than adopting it.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Refuses eager work while a graphsafe capture is open on the stream (an atomic load).
    pub(crate) fn ensure_no_open_capture(&self) -> Result<()> {
        match self.capture.load(Ordering::Acquire) {
            0 => Ok(()),
            id => Err(Error::StreamCapturing { detail: format!("graphsafe capture #{id} is open on it") }),
        }
    }

    /// The check every eager API runs before it enqueues anything: no graphsafe capture open on the
    /// stream, and the driver does not report a capture either (one begun outside graphsafe, or a
    /// stream pulled into another stream's capture by an event wait).
    pub fn ensure_eager(&self) -> Result<()> {
        self.ensure_no_open_capture()?;
        if self.is_capturing()? {
            return Err(Error::StreamCapturing { detail: "the driver reports a capture graphsafe did not begin".into() });
        }
        Ok(())
    }

    /// Records that graphsafe capture `id` is open on the stream; fails if one already is.
    pub(crate) fn mark_capturing(&self, id: u64) -> Result<()> {
        self.capture
            .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(|open| Error::StreamCapturing { detail: format!("graphsafe capture #{open} is already open on it") })
    }

    /// Forgets capture `id` (it ended or was abandoned).
    pub(crate) fn clear_capturing(&self, id: u64) {
        let _ = self.capture.compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Stream {
    /// Abandons graphsafe capture `id`, leaked on this stream (see `Drop`): ends the driver's
    /// capture from here if this thread may (the one that began it, or any for a relaxed capture),
    /// throwing the graph away, and closes it in the context's free gate and the process-wide
    /// registry, so that its refusals end. Returns whether the driver's capture is over; if not
    /// (wrong thread), the work queued before the capture stays waited for by later frees.
    fn abandon_leaked_capture(&self, id: u64) -> bool {
        let over = match super::graph::end_capture(self) {
            Ok(graph) => {
                drop(graph);
                true
            }
            Err(_) => !self.is_capturing().unwrap_or(true),
        };
        super::captures::close(&self.ctx, id, !over);
        let how = if over {
            "ended"
        } else if self.owned {
            "discarded with the stream (it could not be ended from the dropping thread)"
        } else {
            "left open on the adopted stream (it could not be ended from the dropping thread)"
        };
        crate::logging::warn(format!("graphsafe: capture #{id}, leaked with mem::forget, was abandoned as its stream was dropped: {how}"));
        over
    }

    /// Waits for the stream's work before it is dropped: `Ok(false)`, having waited for nothing,
    /// when the driver reports it in a capture (not graphsafe's: an engine's, on an adopted stream
    /// or on the handle `raw()` gave out).
    fn wait_before_drop(&self) -> Result<bool> {
        let _current = self.ctx.enter()?;
        let _relaxed = super::captures::RelaxedCaptureMode::enter()?;
        if self.is_capturing()? {
            return Ok(false);
        }
        let f = init()?.cuStreamSynchronize()?;
        // SAFETY: a live stream, not capturing.
        check(unsafe { (f.f)(self.raw) }, f.name)?;
        Ok(true)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let (raw, owned) = (self.raw, self.owned);
        // A graphsafe capture still marked here was leaked: its `Capture` borrowed this stream
        // mutably, so none can be alive now (the C ABI's holds the stream, and ends or abandons
        // its capture before letting go). graphsafe abandons it, which ends its refusals; a
        // forgotten capture degrades its stream, and only for as long as the stream lives.
        let leaked = self.capture.swap(0, Ordering::AcqRel);
        let discarded = leaked != 0 && !self.abandon_leaked_capture(leaked);
        // Frees wait only for listed streams and the events dropped ones left, so the work
        // graphsafe enqueued here (eager ops, graph replays) is waited for, or stood for by an
        // event, before the stream leaves the list: cuStreamDestroy does not wait. A stream whose
        // leaked capture could not be ended left the event recorded before that capture (nothing
        // of it ran since). One in an engine's capture leaves nothing to wait for: every later
        // free of the context waits for a context synchronize (`FreeGate`).
        let work = if discarded {
            StreamWork::Waited
        } else {
            match self.wait_before_drop() {
                Ok(true) => StreamWork::Waited,
                Ok(false) => StreamWork::Captured,
                Err(e) => {
                    crate::logging::error(format!(
                        "graphsafe: waiting for a stream before it is dropped failed: {e}; later frees wait for an event recorded on it instead"
                    ));
                    StreamWork::Unwaited
                }
            }
        };
        let engine_captures = matches!(work, StreamWork::Captured);
        self.ctx.unregister_stream(raw, work, || {
            if !owned {
                return;
            }
            if engine_captures {
                // Destroying a stream ends the capture on it: an engine's capture on the handle
                // `raw()` gave out would lose its graph. The stream is left to whoever captures
                // it: a leak, logged.
                crate::logging::error("graphsafe: a stream was dropped while a capture graphsafe did not begin is open on it; it is not destroyed (left to the capture's owner)".into());
                return;
            }
            // (A leaked capture graphsafe could not end from here is discarded with the stream.)
            let r = (|| {
                let _current = self.ctx.enter()?;
                let f = init()?.cuStreamDestroy()?;
                // SAFETY: we created it.
                check(unsafe { (f.f)(raw) }, f.name)
            })();
            log_drop_error("cuStreamDestroy", r);
        });
    }
}

impl crate::graph::CaptureStream<'_> {
    /// The raw handle without marking the stream shared: [`Stream::raw_unshared`]'s contract, for
    /// code that only launches its own work into this capture (a benchmark's baseline). (Defined
    /// here, in the driver layer, with the crate's other `unsafe`.)
    ///
    /// # Safety
    /// As [`Stream::raw_unshared`]: while graphsafe replays a graph on this stream, or runs an op
    /// on it, no capture graphsafe did not begin may be open on the handle.
    pub unsafe fn raw_unshared(&self) -> c::CUstream {
        self.inner().handle()
    }
}

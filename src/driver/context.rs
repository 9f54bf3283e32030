use super::{check, init, log_drop_error, Device, ForeignOwner};
use crate::error::Result;
use crate::locks::Locked;
use crate::sys::cuda as c;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// The primary context of a device, retained for as long as this value (and every object made
/// from it) lives. The primary context is the one the CUDA runtime uses too, so kernels launched
/// through the runtime in the glue run in the same context.
#[derive(Debug)]
pub struct Context {
    raw: c::CUcontext,
    device: Device,
    // Asked once: ops dispatch on them at every call.
    compute_capability: (i32, i32),
    sm_count: u32,
    // False for adopted contexts: the caller owns them.
    retained: bool,
    // What keeps an adopted context alive (cudarc's `Arc<CudaContext>`); dropped after `Drop::drop`.
    _owner: Option<ForeignOwner>,
    // Orders frees against captures: see `FreeGate`. One per CUcontext, shared by every
    // `Context` value of it (two `Context::new(0)` are the same primary context).
    gate: Arc<Mutex<FreeGate>>,
}

/// The free gate of a CUcontext, shared by every `Context` value that wraps it.
fn gate_of(raw: c::CUcontext) -> Arc<Mutex<FreeGate>> {
    use std::sync::Weak;
    static GATES: Mutex<Vec<(usize, Weak<Mutex<FreeGate>>)>> = Mutex::new(Vec::new());
    let mut gates = GATES.lock().unwrap_or_else(|p| p.into_inner());
    gates.retain(|(_, w)| w.strong_count() > 0);
    if let Some(g) = gates.iter().find(|(r, _)| *r == raw as usize).and_then(|(_, w)| w.upgrade()) {
        return g;
    }
    let g = Arc::new(Mutex::new(FreeGate::default()));
    gates.push((raw as usize, Arc::downgrade(&g)));
    g
}

/// What a free has to know to wait for the work that may still use a block without disturbing a
/// capture: graphsafe's streams of this context (graphsafe enqueues work only on those, and graph
/// replays run only on those), and the graphsafe captures open on them. Frees hold the lock while
/// they wait and free; beginning a capture (the driver's begin included) and destroying a stream
/// take it briefly, so neither can slip in between. Under it only the deferred-free list's lock and
/// the open-capture registry's (`super::captures`, after it, never before) are taken, and driver
/// calls are made; no other graphsafe lock.
///
/// A stream in a graphsafe capture is not synchronized (that would invalidate the capture): no work
/// of it runs until the capture ends, and the work queued on it before is stood for by an event
/// recorded there just before the capture began (`captures`). A stream dropped without its work
/// waited for (its wait failed, or a capture leaked on it could not be ended from the dropping
/// thread) leaves an event behind too (`pending`). Only a stream dropped with no way to wait for it
/// (an engine's capture open on an adopted stream, or on a graphsafe stream whose raw handle it
/// took: recording there would be captured) counts in `unwaited`, and while it is not zero every
/// free is deferred, until [`Context::synchronize`] has waited for all of the context's work.
#[derive(Debug, Default)]
pub(crate) struct FreeGate {
    streams: Vec<usize>,
    captures: Vec<GateCapture>,
    pending: Vec<GateEvent>,
    unwaited: usize,
}

/// A graphsafe capture open on one of the context's streams, and the event recorded on that stream
/// just before the capture began.
#[derive(Debug)]
struct GateCapture {
    id: u64,
    stream: usize,
    before: GateEvent,
}

/// An event of the gate's context, recorded on one of its streams outside any capture. A raw
/// handle, not an [`super::Event`], which holds its `Context`: the gate belongs to the context.
#[derive(Debug)]
struct GateEvent(c::CUevent);

// SAFETY: an event handle may be used from any thread; the gate's lock serializes its uses.
unsafe impl Send for GateEvent {}

impl GateEvent {
    /// A new event recorded on `stream` (of the current context, and not capturing: the caller
    /// checked).
    fn record(stream: c::CUstream) -> Result<GateEvent> {
        let a = init()?;
        let (create, record) = (a.cuEventCreate()?, a.cuEventRecord()?);
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { (create.f)(&mut raw, c::CUevent_flags::CU_EVENT_DISABLE_TIMING.0) }, create.name)?;
        let ev = GateEvent(raw);
        // SAFETY: a live event and stream of the current context.
        match check(unsafe { (record.f)(ev.0, stream) }, record.name) {
            Ok(()) => Ok(ev),
            Err(e) => {
                ev.destroy();
                Err(e)
            }
        }
    }

    /// Blocks until the work before the record is done.
    fn wait(&self) -> Result<()> {
        let f = init()?.cuEventSynchronize()?;
        // SAFETY: a live event, recorded outside any capture.
        check(unsafe { (f.f)(self.0) }, f.name)
    }

    /// Destroys the event (its context current).
    fn destroy(self) {
        let r = (|| {
            let f = init()?.cuEventDestroy()?;
            // SAFETY: created by `record`, destroyed once (this consumes it).
            check(unsafe { (f.f)(self.0) }, f.name)
        })();
        log_drop_error("cuEventDestroy (an event of the free gate)", r);
    }
}

/// How one listed stream is waited for.
enum Wait<'a> {
    Stream(usize),
    Event(&'a GateEvent),
}

/// What a dropped stream leaves for later frees to wait for.
pub(crate) enum StreamWork {
    /// Nothing: its work was waited for (or it is a leaked capture's, whose earlier work the
    /// capture's event stands for, already in `pending`).
    Waited,
    /// Its wait failed: an event recorded on it now stands for its work, or, if that cannot be
    /// recorded, frees wait for a [`Context::synchronize`].
    Unwaited,
    /// It is in a capture graphsafe did not begin: frees wait for a [`Context::synchronize`].
    Captured,
}

impl FreeGate {
    /// Waits for the work that may still use a block of the context (its context current): every
    /// listed stream that is not capturing, and for those in a graphsafe capture the work queued
    /// before it began; then the work of dropped streams (`pending`). With this thread's capture
    /// mode relaxed, so the waits are legal inside this thread's own capture. `Ok(false)`, having
    /// waited for nothing, when the driver reports a listed stream in a capture graphsafe did not
    /// begin (an engine's, on an adopted stream: it cannot be waited for without invalidating it).
    /// The caller checks [`FreeGate::has_unwaited`] too.
    pub(crate) fn wait_for_streams(&mut self) -> Result<bool> {
        let _relaxed = super::captures::RelaxedCaptureMode::enter()?;
        let mut waits = Vec::with_capacity(self.streams.len());
        for &s in &self.streams {
            // SAFETY: a live stream of the current context: streams leave the list (under the gate
            // the caller holds) before they are destroyed.
            let capturing = unsafe { super::graph::stream_is_capturing_current(s as c::CUstream) }?;
            match (capturing, self.captures.iter().find(|c| c.stream == s)) {
                (false, _) => waits.push(Wait::Stream(s)),
                (true, Some(c)) => waits.push(Wait::Event(&c.before)),
                (true, None) => return Ok(false),
            }
        }
        let sync = init()?.cuStreamSynchronize()?;
        for w in waits {
            match w {
                // SAFETY: as above; it is not capturing, and no graphsafe capture can begin on it
                // while the gate is held (captures begin under it).
                Wait::Stream(s) => check(unsafe { (sync.f)(s as c::CUstream) }, sync.name)?,
                Wait::Event(e) => e.wait()?,
            }
        }
        for e in &self.pending {
            e.wait()?;
        }
        // That work is over: its events have served.
        for e in self.pending.drain(..) {
            e.destroy();
        }
        Ok(true)
    }

    /// Whether a stream was dropped with no way to wait for its work (see [`FreeGate`]).
    pub(crate) fn has_unwaited(&self) -> bool {
        self.unwaited > 0
    }

    /// Whether a graphsafe capture of the context is open (on any thread).
    pub(crate) fn capturing(&self) -> bool {
        !self.captures.is_empty()
    }
}

// SAFETY: a CUcontext handle may be used from any thread; we make it current per call.
unsafe impl Send for Context {}
// SAFETY: as for Send: the handle is immutable, and the driver's context calls are thread-safe.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`. It is not made current: every call that
    /// needs it makes it current for its own duration and restores whatever the
    /// calling thread had current before (invariant 12; engines own their threads' contexts).
    pub fn new(ordinal: usize) -> Result<Arc<Context>> {
        let device = Device::get(ordinal)?;
        let a = init()?;
        let f = a.cuDevicePrimaryCtxRetain()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; device is valid.
        check(unsafe { (f.f)(&mut raw, device.raw) }, f.name)?;
        let (compute_capability, sm_count) = match (device.compute_capability(), device.sm_count()) {
            (Ok(cc), Ok(n)) => (cc, n),
            (Err(e), _) | (_, Err(e)) => {
                release_primary(device);
                return Err(e);
            }
        };
        Ok(Arc::new(Context { raw, device, compute_capability, sm_count, retained: true, _owner: None, gate: gate_of(raw) }))
    }

    /// Wraps a context the caller owns (an engine's existing `CUcontext`, primary or not); it is
    /// not released on drop, and the calling thread's current context is left as it was.
    ///
    /// # Safety
    /// `raw` must be a valid context that outlives the returned value and everything made from it.
    /// Note that [`crate::ops::cudnn::Cudnn::new`] keeps its device's `Context` for the rest of the
    /// process (cuDNN plans outlive the graphs that captured them): an adopted context used with
    /// cuDNN must stay alive until the process exits.
    pub unsafe fn adopt(raw: c::CUcontext) -> Result<Arc<Context>> {
        // SAFETY: the caller's promise, passed on.
        unsafe { Context::adopt_owned(raw, None) }
    }

    /// [`Context::adopt`], holding `owner` (what keeps `raw` alive) for as long as the value lives.
    ///
    /// # Safety
    /// `raw` must be a valid context that stays valid while `owner` lives (or, with no owner, as
    /// [`Context::adopt`]).
    pub(crate) unsafe fn adopt_owned(raw: c::CUcontext, owner: Option<ForeignOwner>) -> Result<Arc<Context>> {
        if raw.is_null() {
            return Err(crate::Error::invalid("context", "a CUcontext", "null"));
        }
        let a = init()?;
        // The device of `raw` is only readable while it is current: enter it as every call does,
        // so the caller's own current context comes back afterwards.
        let dev = {
            let _current = CurrentGuard::enter(raw)?;
            let get = a.cuCtxGetDevice()?;
            let mut dev = 0;
            // SAFETY: `raw` is current (the caller promises it is valid); out-pointer to a local.
            check(unsafe { (get.f)(&mut dev) }, get.name)?;
            dev
        };
        let n = super::device_count()?;
        let device = (0..n)
            .map(Device::get)
            .find(|d| d.as_ref().is_ok_and(|d| d.raw == dev))
            .ok_or_else(|| crate::Error::invalid("context", "a context of a visible device", "an unknown device"))??;
        Ok(Arc::new(Context {
            raw,
            device,
            compute_capability: device.compute_capability()?,
            sm_count: device.sm_count()?,
            retained: false,
            _owner: owner,
            gate: gate_of(raw),
        }))
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device's compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's SM count.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUcontext {
        self.raw
    }

    /// Makes this context current on the calling thread until the guard is dropped, which makes
    /// current again whatever the thread had before (nothing is switched when it already is this
    /// one). Every driver call of the crate that needs a current context runs inside one.
    ///
    /// Not public: a guard can be dropped out of order or forgotten, and either leaves one of
    /// graphsafe's contexts current on the caller's thread (invariant 12). Code outside the crate
    /// uses [`Context::with_current`], whose scope is a closure.
    pub(crate) fn enter(&self) -> Result<CurrentGuard> {
        CurrentGuard::enter(self.raw)
    }

    /// Runs `f` with this context current on the calling thread, then makes current again
    /// whatever the thread had before (also when `f` panics): for the caller's own driver calls
    /// that need the context current (raw launches, an engine's copies). Scopes of nested calls
    /// nest by construction, so the caller's context always comes back.
    pub fn with_current<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        let _current = self.enter()?;
        Ok(f())
    }

    /// The free gate (see [`FreeGate`]); records logged while it is held reach the logger once
    /// this thread holds no lock of graphsafe's.
    pub(crate) fn free_gate(&self) -> Locked<MutexGuard<'_, FreeGate>> {
        Locked::new(self.gate.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Lists `raw` among graphsafe's streams of this context; `false` (nothing changed) when a
    /// graphsafe `Stream` already wraps it. One wrapper per handle is what makes the stream's
    /// capture marker, and the C ABI's stream lock, the only ones for that handle.
    pub(crate) fn register_stream(&self, raw: c::CUstream) -> bool {
        let mut g = self.free_gate();
        if g.streams.contains(&(raw as usize)) {
            return false;
        }
        g.streams.push(raw as usize);
        true
    }

    /// Forgets `raw` and runs `destroy` (its `cuStreamDestroy`) under the gate, so that no free is
    /// synchronizing the stream while it goes. `work`: how later frees cover what the stream may
    /// still run ([`StreamWork`]).
    pub(crate) fn unregister_stream(&self, raw: c::CUstream, work: StreamWork, destroy: impl FnOnce()) {
        let mut g = self.free_gate();
        if let Some(i) = g.streams.iter().position(|&s| s == raw as usize) {
            g.streams.swap_remove(i);
            match work {
                StreamWork::Waited => {}
                StreamWork::Unwaited => {
                    // Stood for by an event recorded on it now, if the driver says the record will
                    // not be captured.
                    let recorded = (|| {
                        let _current = self.enter()?;
                        // SAFETY: a live stream of this context (destroyed below, after this).
                        if unsafe { super::graph::stream_is_capturing_current(raw) }? {
                            return Err(crate::Error::StreamCapturing { detail: "a capture graphsafe did not begin".into() });
                        }
                        GateEvent::record(raw)
                    })();
                    match recorded {
                        Ok(e) => g.pending.push(e),
                        Err(_) => g.unwaited += 1,
                    }
                }
                StreamWork::Captured => g.unwaited += 1,
            }
        }
        destroy();
    }

    /// A graphsafe capture begins on `stream` (of this context, not capturing: the caller checked):
    /// under the gate an event is recorded on the stream (the work before the capture, which frees
    /// wait for instead of the capturing stream), then `begin` (the process-wide registry's entry
    /// and the driver's cuStreamBeginCapture) runs, so whoever holds the gate sees no stream of the
    /// context start a capture until it lets go. If `begin` fails, nothing is left behind.
    pub(crate) fn capture_opening(&self, id: u64, stream: c::CUstream, begin: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut g = self.free_gate();
        let _current = self.enter()?;
        let before = GateEvent::record(stream)?;
        if let Err(e) = begin() {
            before.destroy();
            return Err(e);
        }
        g.captures.push(GateCapture { id, stream: stream as usize, before });
        Ok(())
    }

    /// Graphsafe capture `id` of this context is over (`left_work` false), or its stream leaves
    /// with the capture still open at the driver (`left_work` true: the work queued before the
    /// capture is then still waited for by later frees). Returns whether it was open here: the
    /// first of the paths that close a capture (its end, its stream's drop, its thread's exit)
    /// closes it, the others find nothing.
    pub(crate) fn capture_closed(&self, id: u64, left_work: bool) -> bool {
        let mut g = self.free_gate();
        let Some(i) = g.captures.iter().position(|c| c.id == id) else { return false };
        let c = g.captures.swap_remove(i);
        if left_work {
            g.pending.push(c.before);
        } else {
            let _current = self.enter();
            c.before.destroy();
        }
        true
    }

    /// Waits for the work of the context.
    ///
    /// Refused with [`Error::StreamCapturing`](crate::Error::StreamCapturing) while a graphsafe
    /// capture is open on the calling thread, in any context: a context-wide wait there is illegal
    /// and invalidates it (a capture leaked with `mem::forget` counts until its stream is dropped or
    /// the driver no longer reports it).
    ///
    /// With no graphsafe capture of this context open, it waits for all work in the context
    /// (`cuCtxSynchronize`). While captures are open on other threads, a context-wide wait would
    /// invalidate them (seen on the H200), so it waits instead for each of graphsafe's streams of
    /// the context, for a capturing one the work queued before its capture began; work the engine
    /// queued on streams graphsafe does not know is then not waited for. No capture can begin while
    /// it waits (it holds the context's free gate).
    ///
    /// Frees deferred until the context's work was waited for (after a stream was dropped while an
    /// engine's capture was open on it, or after a free whose wait failed) are given back when it
    /// has. Captures graphsafe did not begin are not seen: by CUDA's rules the wait invalidates an
    /// engine's GLOBAL-mode captures on other threads and its non-relaxed captures on this one, so
    /// do not call it while the engine captures.
    pub fn synchronize(&self) -> Result<()> {
        self.synchronize_waiting_for(SyncScope::AsMuchAsCaptures)
    }

    /// [`Context::synchronize`] that waits for all work in the context or refuses
    /// (`StreamCapturing`): never the partial wait for graphsafe's own streams while captures are
    /// open. For a caller that must know work on streams graphsafe does not know is over (a cudarc
    /// slice handed over, whose pending uses may be on any stream).
    #[cfg(feature = "cudarc")]
    pub(crate) fn synchronize_all(&self) -> Result<()> {
        self.synchronize_waiting_for(SyncScope::All)
    }

    fn synchronize_waiting_for(&self, scope: SyncScope) -> Result<()> {
        if let Some(id) = super::captures::open_on_this_thread() {
            return Err(crate::Error::StreamCapturing {
                detail: format!("graphsafe capture #{id} is open on this thread; a context synchronize here would invalidate it"),
            });
        }
        // Declared first, dropped last: what it holds is given back after the gate is released.
        let mut later = super::memory::AfterGate::default();
        {
            let mut gate = self.free_gate();
            let _current = self.enter()?;
            let all = if gate.capturing() {
                if scope == SyncScope::All {
                    return Err(crate::Error::StreamCapturing {
                        detail: "a graphsafe capture of the context is open on another thread: a context-wide wait would invalidate it, and graphsafe's own streams are not all the work there is".into(),
                    });
                }
                if !gate.wait_for_streams()? {
                    return Err(crate::Error::StreamCapturing {
                        detail: "the driver reports one of graphsafe's streams of the context in a capture graphsafe did not begin; waiting for it would invalidate that capture".into(),
                    });
                }
                !gate.has_unwaited()
            } else {
                let f = init()?.cuCtxSynchronize()?;
                // SAFETY: no arguments.
                check(unsafe { (f.f)() }, f.name)?;
                // Everything the gate waits for is over: the dropped streams' events too.
                gate.unwaited = 0;
                for e in gate.pending.drain(..) {
                    e.destroy();
                }
                true
            };
            if all {
                super::memory::free_deferred_after_synchronize(self, &mut later);
            }
        }
        drop(later);
        Ok(())
    }
}

/// How much [`Context::synchronize`] may settle for while graphsafe captures of the context are
/// open on other threads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SyncScope {
    /// Every stream graphsafe knows (the documented behaviour of `synchronize`).
    AsMuchAsCaptures,
    /// All work of the context, or a refusal.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    All,
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.retained {
            release_primary(self.device);
        }
    }
}

fn release_primary(device: Device) {
    let r = (|| {
        let f = init()?.cuDevicePrimaryCtxRelease()?;
        // SAFETY: balances the cuDevicePrimaryCtxRetain of Context::new.
        check(unsafe { (f.f)(device.raw) }, f.name)
    })();
    log_drop_error("cuDevicePrimaryCtxRelease", r);
}

/// A context made current for a scope ([`Context::enter`]); dropping it restores the context the
/// thread had current before. Not `Send`: it restores the current context of its own thread. Only
/// the crate makes them, each dropped in the scope that made it.
#[must_use = "the context is current only while the guard lives"]
pub(crate) struct CurrentGuard {
    // The caller's context (possibly null: none) when we switched; None when nothing changed.
    previous: Option<c::CUcontext>,
    _same_thread: PhantomData<*const ()>,
}

impl CurrentGuard {
    fn enter(raw: c::CUcontext) -> Result<CurrentGuard> {
        let a = init()?;
        let get = a.cuCtxGetCurrent()?;
        let mut current = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { (get.f)(&mut current) }, get.name)?;
        if current == raw {
            return Ok(CurrentGuard { previous: None, _same_thread: PhantomData });
        }
        let set = a.cuCtxSetCurrent()?;
        // SAFETY: raw is a live context (retained by a Context, or the adopter's promise).
        check(unsafe { (set.f)(raw) }, set.name)?;
        Ok(CurrentGuard { previous: Some(current), _same_thread: PhantomData })
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        let Some(previous) = self.previous else { return };
        let r = (|| {
            let set = init()?.cuCtxSetCurrent()?;
            // SAFETY: `previous` was current on this thread when the guard was made (null unbinds).
            check(unsafe { (set.f)(previous) }, set.name)
        })();
        log_drop_error("cuCtxSetCurrent (restoring the caller's context)", r);
    }
}

use super::{check, init, log_drop_error, Device, ForeignOwner};
use crate::error::Result;
use crate::logging::Locked;
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
/// replays run only on those), and how many graphsafe captures are open (synchronizing a
/// capturing stream, or the whole context, would invalidate the capture). Frees hold the lock
/// while they wait and free; beginning a capture (the driver's begin included) and destroying a
/// stream take it briefly, so neither can slip in between. Under it
/// only the deferred-free list's lock and, beginning a GLOBAL-mode capture, the global-capture
/// count's write lock are taken (after it, never before), and driver calls are made; no other
/// graphsafe lock.
///
/// A stream dropped while it could not be waited for (an engine's capture open on an adopted
/// stream, or on a graphsafe stream whose raw handle it took) leaves work behind that no listed
/// stream covers: `unwaited` counts those, and while it is not zero every free is deferred, until
/// [`Context::synchronize`] has waited for all of the context's work.
#[derive(Debug, Default)]
pub(crate) struct FreeGate {
    open_captures: usize,
    unwaited: usize,
    streams: Vec<usize>,
}

impl FreeGate {
    /// The streams to wait for, if no graphsafe capture is open and no stream was dropped unwaited
    /// (else a free must wait).
    pub(crate) fn quiescent_streams(&self) -> Option<&[usize]> {
        (self.open_captures == 0 && self.unwaited == 0).then_some(&self.streams)
    }
}

// SAFETY: a CUcontext handle may be used from any thread; we make it current per call.
unsafe impl Send for Context {}
// SAFETY: as for Send: the handle is immutable, and the driver's context calls are thread-safe.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`. It is not made current: every call that
    /// needs it makes it current for its own duration ([`Context::enter`]) and restores whatever the
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
    /// synchronizing the stream while it goes.
    /// `waited`: whether the stream's work was waited for first; if not, later frees of the
    /// context are deferred until [`Context::synchronize`] (see [`FreeGate`]).
    pub(crate) fn unregister_stream(&self, raw: c::CUstream, waited: bool, destroy: impl FnOnce()) {
        let mut g = self.free_gate();
        if let Some(i) = g.streams.iter().position(|&s| s == raw as usize) {
            g.streams.swap_remove(i);
            if !waited {
                g.unwaited += 1;
            }
        }
        destroy();
    }

    /// A capture begins in this context: it counts as open (from now until
    /// [`Context::capture_closed`] frees wait: they are deferred, never lost), and `begin` (the
    /// driver's cuStreamBeginCapture) runs under the gate, so that whoever holds the gate sees no
    /// stream of the context start a graphsafe capture until it lets go (a free, which asks the
    /// driver about every stream before it synchronizes them). If `begin` fails the count is given back before the gate is (no free can
    /// have seen it, so none was deferred for it); if it succeeds the capture's end closes it
    /// ([`Context::capture_closed`]).
    pub(crate) fn capture_opening<T>(&self, begin: impl FnOnce() -> crate::error::Result<T>) -> crate::error::Result<T> {
        let mut g = self.free_gate();
        g.open_captures += 1;
        let r = begin();
        if r.is_err() {
            g.open_captures -= 1;
        }
        r
    }

    /// A capture of this context is over (ended, abandoned, or it never began). Returns how many
    /// remain open.
    pub(crate) fn capture_closed(&self) -> usize {
        let mut g = self.free_gate();
        g.open_captures = g.open_captures.saturating_sub(1);
        g.open_captures
    }

    /// Waits for all work in the context.
    ///
    /// Refused with [`Error::StreamCapturing`](crate::Error::StreamCapturing) while a graphsafe capture of this context is open,
    /// on any thread: a context-wide synchronize is illegal in a capture on the calling thread and,
    /// on the H200, invalidated captures other threads had open. No capture can begin while it
    /// waits (it holds the context's free gate). A capture leaked with `mem::forget` stays open,
    /// so it keeps this refused; wait for streams with [`Stream::synchronize`](crate::driver::Stream::synchronize).
    ///
    /// After a stream was dropped while it could not be waited for (an engine's capture was open
    /// on it), frees of this context are deferred until this has waited for all of the context's
    /// work; it then gives them back. Captures graphsafe did not begin are not seen: by CUDA's
    /// rules the wait invalidates an engine's GLOBAL-mode captures on other threads and its
    /// non-relaxed captures on this one, so do not call it while the engine captures.
    pub fn synchronize(&self) -> Result<()> {
        let mut gate = self.free_gate();
        if gate.open_captures > 0 {
            return Err(crate::Error::StreamCapturing {
                detail: format!("{} graphsafe capture(s) open in this context; a context synchronize would invalidate them", gate.open_captures),
            });
        }
        let _current = self.enter()?;
        let f = init()?.cuCtxSynchronize()?;
        // SAFETY: no arguments.
        let r = check(unsafe { (f.f)() }, f.name);
        let release = r.is_ok() && gate.unwaited > 0;
        if release {
            gate.unwaited = 0;
        }
        drop(gate);
        if release {
            super::memory::retry_deferred_frees(self);
        }
        r
    }
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

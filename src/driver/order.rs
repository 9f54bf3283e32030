//! The use order of one piece of scratch memory across streams (a workspace buffer): graphsafe
//! orders every use of it after the previous one, whichever streams they are on.
//!
//! Two kernels on two streams that share a workspace buffer (eager calls on two streams, or
//! replays of two graphs that captured it, or one of each) otherwise run in any order, or at the
//! same time: split-K/split-KV partial sums and semaphores, and on sm100 the MLA decode's
//! sanitized lengths and page table (what CUTLASS indexes the KV cache with), are overwritten
//! under a running kernel. Convention elsewhere is "one workspace per stream"; here the order is
//! kept instead:
//!
//! * Each buffer has one event, made with the buffer, and recorded on the stream of every use
//!   right after the use's work was enqueued (its zero-fill is the first use). The buffer also
//!   remembers that stream (a [`Stream`]'s process-unique uid: raw handles are reused).
//! * A use on another stream first makes its stream wait for that event: it runs after the
//!   previous use and whatever preceded it there. Only the use's own stream is ever touched, never
//!   the previous one, so that stream may meanwhile have been dropped, or be capturing (a capture
//!   of graphsafe's, a leaked one, or an engine's own on an adopted stream): the event was
//!   recorded before, outside any capture.
//! * A use holds the buffer's order from its wait until its record (a [`UseToken`], whose drop
//!   records), so another stream's use cannot slip in between.
//!
//! Uses never happen on a capturing stream (eager work and replays refuse one), so every record is
//! eager. A replay takes its buffers' tokens in address order, and nothing holding the context's
//! free gate takes a token (where tokens stand among graphsafe's locks: `crate::locks`).
//! (An earlier version recorded on the previous stream at each change of stream instead; on the
//! H200 a capture begun between its "is that stream capturing?" and its record took the record,
//! and the wait on it forked the new stream into that capture: CUDA_ERROR_STREAM_CAPTURE_UNJOINED.)

use super::{check, init, log_drop_error, Context, Event, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

struct State {
    // The uid of the stream of the last recorded use.
    last: u64,
    // Recorded on the stream of every use, right after it.
    event: Event,
    // Why a record failed (then the last use cannot be waited for: further uses are refused).
    broken: Option<String>,
}

/// The use order of one buffer (see the module docs).
pub(crate) struct StreamOrder {
    ctx: Arc<Context>,
    held: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only touched by the holder of `held` (acquired with Acquire, released with
// Release when the token drops), so at most one thread accesses it at a time; Event is Send.
unsafe impl Send for StreamOrder {}
// SAFETY: as for Send.
unsafe impl Sync for StreamOrder {}

impl std::fmt::Debug for StreamOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrder").field("held", &self.held.load(Ordering::Relaxed)).finish()
    }
}

/// The buffer's order, held by one use. [`UseToken::enter`] orders the use after the previous one
/// (a stream wait if needed); dropping an entered token records the buffer's event on the use's
/// stream, which it borrows for its whole life (`'s`), so enqueue the use's work before.
#[must_use]
pub(crate) struct UseToken<'s> {
    order: Arc<StreamOrder>,
    on: Option<(c::CUstream, u64)>,
    _stream: PhantomData<&'s Stream>,
}

impl StreamOrder {
    /// The order of a buffer whose first use (its zero-fill) was just enqueued on `first`.
    pub(crate) fn new(first: &Stream) -> Result<Arc<StreamOrder>> {
        let ctx = first.context().clone();
        let event = Event::new(&ctx, false)?;
        event.record(first)?;
        Ok(Arc::new(StreamOrder { ctx, held: AtomicBool::new(false), state: UnsafeCell::new(State { last: first.uid(), event, broken: None }) }))
    }

    /// Takes the order for one use (waits while another thread's use of the buffer holds it:
    /// only between its wait and its record, plus whatever that use enqueues in between).
    pub(crate) fn hold<'s>(self: &Arc<Self>) -> UseToken<'s> {
        while self.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        // Counted as a lock of this thread's: a record logged meanwhile (a free's failure) waits
        // until the token is released, as a logger replaying a graph over this buffer would spin
        // on it.
        crate::locks::hold_marker();
        UseToken { order: self.clone(), on: None, _stream: PhantomData }
    }

    // SAFETY (for callers): only with `held` taken by the caller's token.
    #[allow(clippy::mut_from_ref)]
    unsafe fn state(&self) -> &mut State {
        // SAFETY: the caller holds `held`, so no other thread touches the state.
        unsafe { &mut *self.state.get() }
    }
}

impl<'s> UseToken<'s> {
    /// Refused if the buffer's last use could not be recorded (nothing enqueued).
    pub(crate) fn check(&self) -> Result<()> {
        // SAFETY: this token holds the order.
        match unsafe { &self.order.state().broken } {
            Some(why) => Err(Error::invalid("workspace", "a workspace whose last use was recorded", format!("one whose last use could not be recorded ({why})"))),
            None => Ok(()),
        }
    }

    /// Orders the use about to be enqueued on `stream` after the buffer's previous use (a wait for
    /// its event when that was on another stream). Enqueue the use next; the token's drop records
    /// the event on `stream`.
    pub(crate) fn enter(&mut self, stream: &'s Stream) -> Result<()> {
        self.check()?;
        if stream.context().raw() != self.order.ctx.raw() {
            return Err(Error::other_context("stream", "a stream", "the workspace's", self.order.ctx.raw(), stream.context().raw()));
        }
        // SAFETY: this token holds the order.
        let state = unsafe { self.order.state() };
        if state.last != stream.uid() {
            let _current = self.order.ctx.enter()?;
            let wait = init()?.cuStreamWaitEvent()?;
            // SAFETY: a live stream (borrowed for 's) and a live event of its context; flags 0.
            check(unsafe { (wait.f)(stream.handle(), state.event.raw(), 0) }, wait.name)?;
        }
        self.on = Some((stream.handle(), stream.uid()));
        Ok(())
    }
}

impl Drop for UseToken<'_> {
    fn drop(&mut self) {
        if let Some((raw, uid)) = self.on {
            // SAFETY: this token holds the order.
            let state = unsafe { self.order.state() };
            let r = (|| {
                let _current = self.order.ctx.enter()?;
                let record = init()?.cuEventRecord()?;
                // SAFETY: `raw` is the stream this token borrows for 's (still live); a live event
                // of its context.
                check(unsafe { (record.f)(state.event.raw(), raw) }, record.name)
            })();
            let failed = match r {
                Ok(()) => {
                    state.last = uid;
                    None
                }
                Err(e) => {
                    state.broken = Some(e.to_string());
                    Some(e)
                }
            };
            if let Some(e) = failed {
                // Kept until the order is released below (`crate::logging`).
                log_drop_error("recording a workspace use", Err::<(), _>(e));
            }
        }
        self.order.held.store(false, Ordering::Release);
        crate::locks::release_marker();
    }
}

/// Takes and enters every order in `orders` for a replay on `stream`, in address order so that
/// two such calls never wait for each other crosswise. Refused, with nothing enqueued, if one of
/// the buffers' last use could not be recorded.
pub(crate) fn hold_all<'s>(orders: &[Arc<StreamOrder>], stream: &'s Stream) -> Result<Vec<UseToken<'s>>> {
    debug_assert!(orders.windows(2).all(|w| Arc::as_ptr(&w[0]) < Arc::as_ptr(&w[1])), "orders sorted, without repeats");
    let mut tokens: Vec<UseToken<'s>> = orders.iter().map(|o| o.hold()).collect();
    for t in &tokens {
        t.check()?;
    }
    for t in &mut tokens {
        t.enter(stream)?;
    }
    Ok(tokens)
}

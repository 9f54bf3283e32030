//! The use order of one piece of scratch memory across streams (a workspace buffer): graphsafe
//! orders every use of it after the previous one, whichever streams they are on.
//!
//! Two kernels on two streams that share a workspace buffer (eager calls on two streams, or
//! replays of two graphs that captured it, or one of each) otherwise run in any order, or at the
//! same time: split-K/split-KV partial sums and semaphores, and on sm100 the MLA decode's
//! sanitized lengths and page table (what CUTLASS indexes the KV cache with), are overwritten
//! under a running kernel. Convention elsewhere is "one workspace per stream"; here the order is
//! kept instead, at no cost while the stream does not change:
//!
//! * Each buffer remembers the stream of its last use (a [`Stream`]'s process-unique uid: raw
//!   handles are reused).
//! * A use on another stream first makes the new stream wait for everything enqueued so far on
//!   the previous one (an event recorded there now, waited for here), so it runs after the
//!   previous use and whatever preceded it. If the previous stream was dropped, nothing is
//!   waited for: dropping a `Stream` waits for its work. If it is capturing now, its earlier work
//!   cannot be waited for (a record there would be a node of that graph, and a wait on it would
//!   pull this stream into the capture), so the use is refused ([`Error::StreamCapturing`]) and
//!   nothing is enqueued.
//! * A use holds the buffer's order from that check until its work is enqueued (a
//!   [`UseToken`]), so a use on a third stream cannot record its event between them.
//!
//! The liveness check, the capture check and the record run under the context's free gate: a
//! listed stream is destroyed, and a graphsafe capture begun (the driver's cuStreamBeginCapture),
//! only under it, so neither can happen between the check and the record (on the H200, a capture
//! begun in between took the record and this stream's wait into its graph, and its end failed
//! with CUDA_ERROR_STREAM_CAPTURE_UNJOINED). A capture begun outside graphsafe on an adopted
//! stream during the call is excluded by `Stream::adopt`'s contract.
//!
//! Lock order: a use token, then the context's free gate (inside [`Context::with_live_stream`]);
//! never the reverse. A caller holds at most one token while waiting for another only in
//! [`hold_all`], which takes them in address order.

use super::{check, init, Context, Event, Stream};
use crate::error::{Error, Result};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

struct State {
    // (raw handle, uid) of the stream of the last use; None before the first.
    last: Option<(usize, u64)>,
    // Recorded on the previous stream at a change of stream; made at the first change.
    event: Option<Event>,
}

/// The use order of one buffer (see the module docs).
pub(crate) struct StreamOrder {
    ctx: Arc<Context>,
    held: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only touched by the holder of `held` (acquired with Acquire, released with
// Release in `UseToken::drop`), so at most one thread accesses it at a time; Event is Send.
unsafe impl Send for StreamOrder {}
// SAFETY: as for Send.
unsafe impl Sync for StreamOrder {}

impl std::fmt::Debug for StreamOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrder").field("held", &self.held.load(Ordering::Relaxed)).finish()
    }
}

/// One use of a buffer in progress: its order is held until this drops (after the use's work was
/// enqueued).
#[must_use]
pub(crate) struct UseToken {
    order: Arc<StreamOrder>,
}

impl Drop for UseToken {
    fn drop(&mut self) {
        self.order.held.store(false, Ordering::Release);
    }
}

impl StreamOrder {
    /// The order of a buffer whose first use (its zero-fill) was just enqueued on `first`.
    pub(crate) fn new(first: &Stream) -> Arc<StreamOrder> {
        Arc::new(StreamOrder {
            ctx: first.context().clone(),
            held: AtomicBool::new(false),
            state: UnsafeCell::new(State { last: Some((first.raw() as usize, first.uid())), event: None }),
        })
    }

    fn acquire(self: &Arc<Self>) -> UseToken {
        // Contended only by uses of the same buffer on several threads at once: short waits.
        while self.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        UseToken { order: self.clone() }
    }

    /// Begins a use on `stream`: orders it after the previous use if that was on another stream
    /// (see the module docs) and holds the order until the returned token drops. The caller
    /// enqueues the use's work on `stream` before dropping it. On `Err` nothing was enqueued on
    /// `stream` and the order is unchanged.
    pub(crate) fn begin(self: &Arc<Self>, stream: &Stream) -> Result<UseToken> {
        let token = self.acquire();
        // SAFETY: the token holds `held`, so no other thread touches the state until it drops.
        let state = unsafe { &mut *self.state.get() };
        let here = (stream.raw() as usize, stream.uid());
        if let Some(prev) = state.last {
            if prev.1 != here.1 {
                self.follow(state, prev, stream)?;
            }
        }
        state.last = Some(here);
        Ok(token)
    }

    /// Makes `stream` wait for everything enqueued so far on `prev`, the stream of the last use.
    fn follow(&self, state: &mut State, prev: (usize, u64), stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::invalid("stream", "a stream of the workspace's context", "a stream of another context"));
        }
        if state.event.is_none() {
            state.event = Some(Event::new(&self.ctx, false)?);
        }
        let event = state.event.as_ref().map_or(std::ptr::null_mut(), |e| e.raw());
        self.ctx.with_live_stream(prev.0, prev.1, |live| {
            if !live {
                return Ok(()); // dropped: Stream::drop waited for its work
            }
            let prev_raw = prev.0 as crate::sys::cuda::CUstream;
            // SAFETY: `prev_raw` is the live, listed stream of this context (checked under the
            // gate, which its destroy needs, and still held).
            if unsafe { super::graph::stream_is_capturing(&self.ctx, prev_raw)? } {
                return Err(Error::StreamCapturing {
                    detail: format!(
                        "the workspace was last used on stream {prev_raw:?}, which is capturing now: its earlier use cannot be waited for (use one workspace per stream, or end that capture first)"
                    ),
                });
            }
            let _current = self.ctx.enter()?;
            let record = init()?.cuEventRecord()?;
            // SAFETY: a live event of this context and a live stream of it (above).
            check(unsafe { (record.f)(event, prev_raw) }, record.name)?;
            let wait = init()?.cuStreamWaitEvent()?;
            // SAFETY: `stream` is a live graphsafe stream (borrowed), the event live; flags 0.
            check(unsafe { (wait.f)(stream.raw(), event, 0) }, wait.name)
        })
    }
}

/// Begins a use of every order in `orders` on `stream` (a replay of a graph that captured those
/// buffers), in address order so that two such calls never wait for each other crosswise.
/// On `Err`, the tokens already taken are released and nothing was enqueued.
pub(crate) fn hold_all(orders: &[Arc<StreamOrder>], stream: &Stream) -> Result<Vec<UseToken>> {
    debug_assert!(orders.windows(2).all(|w| Arc::as_ptr(&w[0]) < Arc::as_ptr(&w[1])), "orders sorted, without repeats");
    orders.iter().map(|o| o.begin(stream)).collect()
}

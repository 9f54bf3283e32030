//! GPU workspaces that never move under a captured graph.
//!
//! * **Retire, never resize** (invariant 2): [`Workspace::ensure_size`] allocates a new buffer and
//!   drops the workspace's reference to the old one. The old memory is given back when the last
//!   reference goes (at once if nothing captured it, else with the last graph or executable that
//!   did), after the work of graphsafe's streams of its context drained (see
//!   [`crate::driver::memory::Allocation`]).
//! * **Zeroed on allocation** (invariant 3): new memory is zero-filled on the caller's stream
//!   before anything issued after it; split-K/split-KV kernels keep semaphores there and expect
//!   zeros, and a recycled block holds a previous owner's bytes.
//! * **No growth while captured** (invariant 4): binding a workspace to a capture
//!   ([`crate::graph::Capture::bind_workspace`]) borrows it mutably until the capture ends, so
//!   `ensure_size` does not compile there; kernels get a [`crate::graph::CapturedWorkspace`] view instead,
//!   which can only check its capacity and fail with [`Error::WorkspaceTooSmall`]. Growth on a
//!   capturing stream (a capture leaked with `mem::forget`, or one begun outside graphsafe) is
//!   refused with [`Error::StreamCapturing`]: its zero-fill would land in the graph.
//! * **One owner** (invariant 6): the workspace is the only holder of its current pointer outside
//!   captured graphs; ops read it at the moment they launch, never cache it.
//! * **Uses in order across streams** (invariant 3): every use of a buffer (an eager op, a replay
//!   of a graph that captured it, a read-back) runs after the previous one even when they are on
//!   different streams: each use records the buffer's event after its work, and a change of
//!   stream waits for it first (the buffer's use order, `src/driver/order.rs`).

mod planner;

pub use planner::{Requirement, WorkspacePlanner};

use crate::driver::memory::{memset_u8_raw, Allocation};
use crate::driver::order::{StreamOrder, UseToken};
use crate::driver::{Context, DeviceBuffer, DevicePtr, Stream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Workspace sizes are rounded up to this, and every workspace address is aligned to it (TMA
/// descriptors want 128 B, some CUTLASS kernels 256 B).
pub const WORKSPACE_ALIGN: u64 = 256;

/// A growable, zero-initialised GPU scratch buffer for the kernels of one or more streams.
///
/// Uses on different streams are ordered by graphsafe: each op (or replay of a graph that
/// captured the buffer, or [`Workspace::to_host_vec`]) records the buffer's event on its stream
/// after its work, and one on another stream than the last first waits for that event, so two
/// kernels never share the scratch memory at once. One workspace per stream avoids the waits.
///
/// ```no_run
/// use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let mut ws = Workspace::new(&stream, 1 << 20)?; // zero-filled on `stream`
/// assert!(ws.capacity() >= 1 << 20);
/// let graph = {
///     let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
///     let w = cap.bind_workspace(&mut ws)?; // `ws.ensure_size` does not compile until the end
///     // ... captured ops take `&w` ...
///     # let _ = w;
///     cap.end()?
/// };
/// // Growing retires the captured buffer: the graph keeps it alive for its replays.
/// assert!(ws.ensure_size(64 << 20, &stream)?);
/// assert_eq!((ws.retired_count(), graph.kept_alive()), (1, 1));
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Workspace {
    ctx: Arc<Context>,
    current: Option<DeviceBuffer>,
    // The use order of `current` (made with it; graphs that capture the buffer share it).
    order: Option<Arc<StreamOrder>>,
    capacity: u64,
    retired: u64,
}

impl Workspace {
    /// A workspace of at least `bytes` (0 allowed: nothing is allocated until needed), zero-filled
    /// on `stream`.
    pub fn new(stream: &Stream, bytes: u64) -> Result<Workspace> {
        let mut ws = Workspace { ctx: stream.context().clone(), current: None, order: None, capacity: 0, retired: 0 };
        ws.ensure_size(bytes, stream)?;
        Ok(ws)
    }

    /// Bytes usable now.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How many buffers this workspace has retired (grown past) so far.
    pub fn retired_count(&self) -> u64 {
        self.retired
    }

    /// The device address of the current buffer (0 while the capacity is 0). Read it when you
    /// launch; do not keep it: the next growth retires this buffer.
    pub fn device_ptr(&self) -> DevicePtr {
        self.current.as_ref().map_or(0, |b| b.device_ptr())
    }

    /// The current buffer's shared allocation, if any (what a capture keeps alive).
    pub(crate) fn allocation(&self) -> Option<&Arc<Allocation>> {
        self.current.as_ref().map(|b| b.allocation())
    }

    /// The use order of the current buffer, if any (what a capture gives its graphs).
    pub(crate) fn order(&self) -> Option<&Arc<StreamOrder>> {
        self.order.as_ref()
    }

    /// Takes the current buffer's use order for one use (see `src/driver/order.rs`); `None`
    /// without a buffer. Enter the token on the use's stream before enqueueing the use.
    pub(crate) fn hold_use<'s>(&self) -> Option<UseToken<'s>> {
        self.order.as_ref().map(|o| o.hold())
    }

    /// The context the workspace lives in.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Makes the capacity at least `bytes`. Growing allocates a new buffer, zero-fills it on
    /// `stream`, and retires the old one (never resizes in place). Returns whether it grew.
    ///
    /// The old buffer is given back here if nothing else holds it, after the work of graphsafe's
    /// streams of the context drained (see [`Allocation`]), so kernels queued before the growth
    /// still see it. If growing fails
    /// (allocation, zero-fill), the workspace is unchanged: same buffer, same capacity, same bytes.
    pub fn ensure_size(&mut self, bytes: u64, stream: &Stream) -> Result<bool> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::other_context("stream", "a stream", "the workspace's", self.ctx.raw(), stream.context().raw()));
        }
        if bytes <= self.capacity {
            return Ok(false);
        }
        stream.ensure_eager()?;
        let rounded = bytes
            .checked_next_multiple_of(WORKSPACE_ALIGN)
            .ok_or_else(|| Error::invalid("workspace bytes", "a size that fits in memory", bytes))?;
        let len = usize::try_from(rounded).map_err(|_| Error::invalid("workspace bytes", "a size that fits in memory", bytes))?;
        let fresh = DeviceBuffer::alloc(&self.ctx, len)?;
        if fresh.device_ptr() % WORKSPACE_ALIGN != 0 {
            return Err(Error::invalid("allocation alignment", format!("{WORKSPACE_ALIGN} bytes"), fresh.device_ptr()));
        }
        // Before anyone can read its address: the C ABI takes no operand inside a workspace.
        fresh.allocation().mark_workspace();
        memset_u8_raw(fresh.device_ptr(), 0, len, stream)?;
        // The zero-fill is the new buffer's first use; the old one keeps its order with the
        // graphs that captured it.
        let order = StreamOrder::new(stream)?;
        self.order = Some(order);
        if self.current.replace(fresh).is_some() {
            self.retired += 1;
        }
        self.capacity = rounded;
        Ok(true)
    }

    /// Copies the current buffer to the host (waits for `stream`). For diagnostics and tests: it
    /// shows what a kernel would find in the workspace.
    pub fn to_host_vec(&self, stream: &Stream) -> Result<Vec<u8>> {
        match &self.current {
            Some(b) => {
                stream.ensure_eager()?;
                let mut using = self.hold_use();
                if let Some(u) = &mut using {
                    u.enter(stream)?;
                }
                b.to_host_vec::<u8>(stream)
            }
            None => Ok(Vec::new()),
        }
    }

    /// The eager path for ops: grows to `needed` if necessary and returns the address to launch
    /// with. Graphsafe's own ops go through [`crate::graph`]'s eager target, which also orders the
    /// use after the previous one on another stream; a caller launching its own kernels on the
    /// address orders them itself.
    pub fn prepare(&mut self, needed: u64, stream: &Stream) -> Result<DevicePtr> {
        self.ensure_size(needed, stream)?;
        Ok(self.device_ptr())
    }
}

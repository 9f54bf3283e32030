//! graphsafe's locks: the one order they are taken in, and the count of those the calling thread
//! holds.
//!
//! # Lock order
//!
//! This table is the only statement of the order; the modules that take the locks link here. A
//! thread holding a lock takes only locks of later rows (within a row, in the order given); a
//! leaf takes no other lock while held. The C ABI's own rules (lookups first, hold what was
//! checked, destroy closes then unregisters) are in `capi`'s module docs.
//!
//! | # | lock | where | notes |
//! |---|---|---|---|
//! | 1 | the C ABI's object locks: stream, then capture, then workspace, then graph or executable | `capi::core` (`lock`) | an entry point resolves every handle before taking the first; ending a capture takes its stream, then it, then its workspaces |
//! | 2 | workspace use orders (a flag per buffer) | `driver::order` (`UseToken`) | several in address order (a replay); taken after a workspace grew, never while the context's free gate is held |
//! | 3 | cuDNN's device registry, then a device's plan cache, then a plan's variant pack | `ops::cudnn` (`REGISTRY`, `Cudnn::lock`, `Plan::last_pack`) | a plan is built or executed under the cache |
//! | 4 | a context's free gate | `driver::context` (`FreeGate`) | every free and module unload waits for the context's streams under it; foreign owners are dropped after it is released (`AfterGate`) |
//! | 5 | the open-capture registry | `driver::captures` (`OPEN`) | captures open and close under the gate and its write side; an allocation holds its read side from its check to the allocation |
//! | 6 | leaves: a graph's family lock; the live and released allocation lists; the deferred frees; the free-gate table; the C ABI's handle registry | `driver::graph` (`Family`), `driver::memory` (`LIVE`, `RELEASED`, `DEFERRED`), `driver::context` (`GATES`), `capi::handles` (`REGISTRY`) | no object is dropped under the handle registry, and no `Arc<Allocation>` under the live list (an allocation's drop takes it) |
//!
//! Every lock under which graphsafe may log (those of rows 1 to 4, and the family lock) is taken
//! through [`Locked`] (a use order through [`hold_marker`]): while this thread holds one, log
//! records are kept and handed to the logger after the last release (`crate::logging`), because
//! the application's logger may call graphsafe and take the same lock. No lock of graphsafe's is
//! held while an adopted owner is dropped.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

thread_local! {
    // No destructor (a `Cell` of an integer): readable at every point of thread exit.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread holds a lock counted here.
pub(crate) fn any_held() -> bool {
    HELD.with(Cell::get) > 0
}

/// A lock guard of graphsafe's (or any guard under which graphsafe may log), counted for this
/// thread while it lives. Dropping it releases the guard first, then, if it was the last one this
/// thread held, hands the records kept meanwhile to the logger.
pub(crate) struct Locked<G> {
    guard: Option<G>,
}

impl<G> Locked<G> {
    /// Counts `guard` (just acquired) until this value drops.
    pub(crate) fn new(guard: G) -> Locked<G> {
        HELD.with(|h| h.set(h.get() + 1));
        Locked { guard: Some(guard) }
    }
}

/// Counts a lock that is not a guard value (a flag taken with a compare-and-swap) until
/// [`release_marker`] is called once for it.
pub(crate) fn hold_marker() {
    HELD.with(|h| h.set(h.get() + 1));
}

/// The release of a lock counted with [`hold_marker`], after the lock itself was released.
pub(crate) fn release_marker() {
    let left = HELD.with(|h| {
        let n = h.get().saturating_sub(1);
        h.set(n);
        n
    });
    if left == 0 {
        crate::logging::flush();
    }
}

impl<G> Deref for Locked<G> {
    type Target = G;
    fn deref(&self) -> &G {
        self.guard.as_ref().expect("a Locked holds its guard until it drops")
    }
}

impl<G> DerefMut for Locked<G> {
    fn deref_mut(&mut self) -> &mut G {
        self.guard.as_mut().expect("a Locked holds its guard until it drops")
    }
}

impl<G> Drop for Locked<G> {
    fn drop(&mut self) {
        drop(self.guard.take());
        release_marker();
    }
}

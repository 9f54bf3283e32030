//! The count of graphsafe's locks the calling thread holds: every lock under which graphsafe may
//! log is taken through [`Locked`], so that log records wait for the last release
//! (`crate::logging`).

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

//! graphsafe's log records, handed to the application's logger only while the calling thread holds
//! none of graphsafe's locks.
//!
//! The logger is the application's code, and an engine's logger may call graphsafe (free a staging
//! buffer, replay a graph, synchronize a stream to flush metrics). Destructors log what they cannot
//! return (a failed free, a failed graph destroy) and some of them run under a lock: the context's
//! free gate, a graph's family lock, the C ABI's object locks, cuDNN's plan cache. A logger run
//! there that took the same lock would wait for its own thread forever. So every such lock is
//! taken through [`Locked`], which counts the locks this thread holds, and every record goes
//! through [`error`] or [`debug`], which keep it while that count is not zero; the last lock's
//! release hands the kept records to the logger, once nothing is held.
//!
//! Only the level check reaches the `log` crate before that (`log::max_level()`, a static, not the
//! logger). At thread exit, when the kept records' storage is gone, a record is written to
//! standard error instead (never to a logger under a lock).

use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};

thread_local! {
    // No destructor (a `Cell` of an integer): readable at every point of thread exit.
    static HELD: Cell<usize> = const { Cell::new(0) };
    // Whether KEPT holds anything: read at every release without touching KEPT, whose destructor
    // would otherwise be registered on every thread that takes a lock (and, in a shared library,
    // keep it loaded past a `dlclose` until the thread exits).
    static ANY_KEPT: Cell<bool> = const { Cell::new(false) };
    static KEPT: RefCell<Vec<(log::Level, String)>> = const { RefCell::new(Vec::new()) };
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
        flush();
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

/// Logs an error record (`graphsafe: ` prefixed by the caller's text).
pub(crate) fn error(text: String) {
    emit(log::Level::Error, text);
}

/// Logs a warning record.
pub(crate) fn warn(text: String) {
    emit(log::Level::Warn, text);
}

/// Logs a debug record; `text` is built only when debug records are enabled at all.
pub(crate) fn debug(text: impl FnOnce() -> String) {
    if log::Level::Debug <= log::max_level() {
        emit(log::Level::Debug, text());
    }
}

fn emit(level: log::Level, text: String) {
    if level > log::max_level() {
        return;
    }
    if HELD.with(Cell::get) > 0 {
        let mut kept = Some((level, text));
        let _ = KEPT.try_with(|k| {
            if let (Ok(mut k), Some(record)) = (k.try_borrow_mut(), kept.take()) {
                k.push(record);
                ANY_KEPT.with(|a| a.set(true));
            }
        });
        // This thread's storage is gone (thread exit) or in use: never the logger under a lock.
        if let Some((level, text)) = kept {
            eprintln!("[{level}] {text}");
        }
        return;
    }
    log::log!(level, "{text}");
}

/// Hands the kept records to the logger (this thread holds no lock of graphsafe's).
fn flush() {
    if !ANY_KEPT.with(|a| a.replace(false)) {
        return;
    }
    let kept = KEPT.try_with(|k| k.try_borrow_mut().map(|mut k| std::mem::take(&mut *k)).unwrap_or_default()).unwrap_or_default();
    for (level, text) in kept {
        // A record the logger's own graphsafe calls log is kept and handed over by their release.
        log::log!(level, "{text}");
    }
}

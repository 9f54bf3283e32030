//! graphsafe's log records, handed to the application's logger only while the calling thread holds
//! none of graphsafe's locks.
//!
//! The logger is the application's code, and an engine's logger may call graphsafe (free a staging
//! buffer, replay a graph, synchronize a stream to flush metrics). Destructors log what they cannot
//! return (a failed free, a failed graph destroy) and some of them run under a lock: the context's
//! free gate, a graph's family lock, the C ABI's object locks, cuDNN's plan cache. A logger run
//! there that took the same lock would wait for its own thread forever. So every such lock is
//! taken through [`Locked`](crate::locks::Locked), which counts the locks this thread holds, and every record goes
//! through [`error`] or [`debug`], which keep it while that count is not zero; the last lock's
//! release hands the kept records to the logger, once nothing is held.
//!
//! Only the level check reaches the `log` crate before that (`log::max_level()`, a static, not the
//! logger). At thread exit, when the kept records' storage is gone, a record is written to
//! standard error instead (never to a logger under a lock).

use std::cell::{Cell, RefCell};

thread_local! {
    // Whether KEPT holds anything: read at every release without touching KEPT, whose destructor
    // would otherwise be registered on every thread that takes a lock (and, in a shared library,
    // keep it loaded past a `dlclose` until the thread exits).
    static ANY_KEPT: Cell<bool> = const { Cell::new(false) };
    static KEPT: RefCell<Vec<(log::Level, String)>> = const { RefCell::new(Vec::new()) };
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
    if crate::locks::any_held() {
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
pub(crate) fn flush() {
    if !ANY_KEPT.with(|a| a.replace(false)) {
        return;
    }
    let kept = KEPT.try_with(|k| k.try_borrow_mut().map(|mut k| std::mem::take(&mut *k)).unwrap_or_default()).unwrap_or_default();
    for (level, text) in kept {
        // A record the logger's own graphsafe calls log is kept and handed over by their release.
        log::log!(level, "{text}");
    }
}

//! An application logger that calls back into graphsafe, on the stand-in driver (tests/standin).
//!
//! graphsafe logs what its destructors cannot return (a failed free, a failed graph destroy, a
//! stream dropped with a capture leaked on it). The logger is the application's code, and an
//! engine's logger may well touch the GPU (flush metrics, free a staging buffer, replay a graph):
//! graphsafe must never run it while it holds one of its own locks, or the logger waits for a lock
//! its own thread holds. Each test here makes one of those logs happen with a logger that, on its
//! first record, calls graphsafe in a way that takes the lock the log site held (the context's free
//! gate, a graph's family lock, the C ABI's stream lock). A deadlock is caught by a watchdog, which
//! exits the process with status 3 naming the test; each test also checks that the logger did run
//! (else it proved nothing).
//!
//! One binary, one logger (the `log` crate allows one per process): the tests share it and run one
//! at a time under the stand-in's lock.

mod standin;

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::sys::cuda::CUresult;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

/// What the logger does on its next record (taken out first, so that a record logged from inside
/// the action does not run it again).
type Action = Box<dyn FnOnce() + Send>;
static ACTION: Mutex<Option<Action>> = Mutex::new(None);
static RECORDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct CallsGraphsafe;

impl log::Log for CallsGraphsafe {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if !record.target().starts_with("graphsafe") {
            return;
        }
        RECORDS.lock().unwrap_or_else(|p| p.into_inner()).push(format!("{}: {}", record.level(), record.args()));
        let action = ACTION.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(action) = action {
            action();
        }
    }
    fn flush(&self) {}
}

static LOGGER: CallsGraphsafe = CallsGraphsafe;

/// Runs `scenario` with the logger armed with `action`, under a watchdog: if it has not returned
/// after 20 s, the process exits with status 3. Returns the records logged meanwhile.
fn with_logger(name: &str, action: impl FnOnce() + Send + 'static, scenario: impl FnOnce() + Send + 'static) -> Vec<String> {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        log::set_logger(&LOGGER).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
    RECORDS.lock().unwrap().clear();
    *ACTION.lock().unwrap() = Some(Box::new(action));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, name) = (done.clone(), name.to_string());
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !done.load(Ordering::SeqCst) {
                if t0.elapsed() > Duration::from_secs(20) {
                    eprintln!("{name}: no progress for 20 s: graphsafe ran the logger under a lock the logger's call needs (a deadlock)");
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let r = std::thread::spawn(scenario).join();
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    *ACTION.lock().unwrap() = None;
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
    std::mem::take(&mut *RECORDS.lock().unwrap())
}

#[track_caller]
fn logged(records: &[String], says: &str) {
    assert!(records.iter().any(|r| r.contains(says)), "the logger was not called with {says:?} (nothing was proved): {records:#?}");
}

/// A free whose wait for the streams fails logs (the block is kept): the log site held the
/// context's free gate, and the logger's own free needs it.
#[test]
fn a_logger_that_frees_memory_while_a_failed_free_is_logged() {
    let (_g, s) = standin::exclusive();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let victim = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    let freed_by_logger = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    s.fail("cuStreamSynchronize", 0, CUresult::CUDA_ERROR_UNKNOWN);
    let records = with_logger("a failed free's wait", move || drop(freed_by_logger), move || drop(victim));
    logged(&records, "cuStreamSynchronize");
    drop(stream);
    // What the failure kept is given back at the next free or synchronize of the context.
    ctx.synchronize().unwrap();
}

/// The same with `cuMemFree` itself failing: logged under the gate too.
#[test]
fn a_logger_that_frees_memory_while_a_failed_cu_mem_free_is_logged() {
    let (_g, s) = standin::exclusive();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let victim = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    let freed_by_logger = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    s.fail("cuMemFree", 0, CUresult::CUDA_ERROR_UNKNOWN);
    let records = with_logger("a failed cuMemFree", move || drop(freed_by_logger), move || drop(victim));
    logged(&records, "cuMemFree");
    drop(stream);
    ctx.synchronize().unwrap();
}

/// A stream dropped with a capture leaked on it (`mem::forget`) logs: its drop held the free gate
/// while logging, and the logger frees a buffer.
#[test]
fn a_logger_that_frees_memory_while_a_stream_with_a_leaked_capture_is_dropped() {
    let (_g, s) = standin::exclusive();
    let _ = s;
    let ctx = Context::new(0).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let freed_by_logger = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    std::mem::forget(stream.begin_capture(CaptureMode::Relaxed).unwrap());
    let records = with_logger("a stream dropped with a leaked capture", move || drop(freed_by_logger), move || drop(stream));
    logged(&records, "capture");
}

/// A graph whose `cuGraphDestroy` fails logs under its family's lock; the logger drops an
/// executable of that graph, whose destroy takes the same lock.
#[test]
fn a_logger_that_drops_an_executable_while_its_graphs_failed_destroy_is_logged() {
    let (_g, s) = standin::exclusive();
    let ctx = Context::new(0).unwrap();
    let mut stream = Stream::new(&ctx).unwrap();
    let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |_| Ok(())).unwrap();
    let exec = graph.instantiate().unwrap();
    s.fail("cuGraphDestroy", 0, CUresult::CUDA_ERROR_UNKNOWN);
    let records = with_logger("a failed cuGraphDestroy", move || drop(exec), move || drop(graph));
    logged(&records, "cuGraphDestroy");
}

/// Through the C ABI: growing a workspace frees its old buffer under the C ABI's stream and
/// workspace locks; that free's wait fails and is logged, and the logger synchronizes the same
/// stream through the C ABI (its lock).
#[test]
fn a_logger_that_calls_the_c_abi_on_the_stream_whose_call_logged() {
    use graphsafe::capi::*;
    let (_g, s) = standin::exclusive();
    let (mut cx, mut st, mut ws) = (GraphsafeContext::default(), GraphsafeStream::default(), GraphsafeWorkspace::default());
    // SAFETY: out-pointers to locals; handles made here.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_create(st, 4096, &mut ws), GRAPHSAFE_OK);
    }
    // The growth's allocation and zero-fill pass; the wait of the old buffer's free fails.
    s.fail("cuStreamSynchronize", 0, CUresult::CUDA_ERROR_UNKNOWN);
    let status = Arc::new(Mutex::new(None));
    let seen = status.clone();
    // SAFETY (both closures): live handles made above.
    let records = with_logger(
        "a C ABI growth whose old buffer's free fails",
        move || *seen.lock().unwrap() = Some(unsafe { graphsafe_stream_synchronize(st) }),
        move || assert_eq!(unsafe { graphsafe_workspace_ensure_size(ws, 1 << 20, st, std::ptr::null_mut()) }, GRAPHSAFE_OK),
    );
    logged(&records, "cuStreamSynchronize");
    assert_eq!(*status.lock().unwrap(), Some(GRAPHSAFE_OK), "the logger's own call on the stream");
    // SAFETY: made above.
    unsafe {
        assert_eq!(graphsafe_workspace_destroy(ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_synchronize(cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(cx), GRAPHSAFE_OK);
    }
}

/// One transient driver error inside a free: in its wait (`cuStreamSynchronize`,
/// `cuStreamIsCapturing`, `cuThreadExchangeStreamCaptureMode`) or in `cuMemFree` itself. The
/// block used to be leaked for good (its address refused, later the primary context released under
/// it) with the failure only logged; it is now kept, the failure reported to the logger, and the
/// block given back at the next free of the context.
#[test]
fn a_transient_error_in_a_free_is_reported_and_retried_at_the_next_free() {
    let (_g, s) = standin::exclusive();
    for entry in ["cuStreamSynchronize", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode", "cuMemFree"] {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let live = s.live_allocations();
        let victim = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
        let next = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
        s.fail(entry, 0, CUresult::CUDA_ERROR_UNKNOWN);
        let records = with_logger(entry, || {}, move || drop(victim));
        logged(&records, entry);
        assert_eq!(s.live_allocations(), live + 2, "{entry}: a free whose wait failed gave the block back");
        drop(next);
        assert_eq!(s.live_allocations(), live, "{entry}: the kept block was not given back at the next free");
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// A stream whose wait fails as it is dropped used to leave the context's later frees deferred
/// until someone happened to call `Context::synchronize`: its work is now stood for by an event
/// recorded on it before it goes, which later frees wait for.
#[test]
fn a_stream_whose_wait_fails_as_it_drops_does_not_defer_the_contexts_frees() {
    let (_g, s) = standin::exclusive();
    let ctx = Context::new(0).unwrap();
    let (dropped, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let live = s.live_allocations();
    s.fail("cuStreamSynchronize", 0, CUresult::CUDA_ERROR_UNKNOWN);
    let records = with_logger("a stream whose wait fails", || {}, move || drop(dropped));
    logged(&records, "cuStreamSynchronize");
    drop(DeviceBuffer::alloc_zeroed(&other, 4096).unwrap());
    assert_eq!(s.live_allocations(), live, "the free after a stream's failed wait was deferred");
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// A block kept after a failed free holds its context: the primary context is not released under
/// it (the stand-in counts that as a violation: the real driver frees everything in a context it
/// resets), and the block goes back at the next synchronize of a new value of the context.
#[test]
fn a_block_kept_after_a_failed_free_keeps_its_context_retained() {
    let (_g, s) = standin::exclusive();
    let live = s.live_allocations();
    {
        let ctx = Context::new(1).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let victim = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
        s.fail("cuStreamSynchronize", 0, CUresult::CUDA_ERROR_UNKNOWN);
        logged(&with_logger("a failed free before the context goes", || {}, move || drop(victim)), "cuStreamSynchronize");
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
    Context::new(1).unwrap().synchronize().unwrap();
    assert_eq!(s.live_allocations(), live, "the kept block was not given back at the context's next synchronize");
}

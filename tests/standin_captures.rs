//! Captures that graphsafe cannot end through their guard, on the stand-in driver (tests/standin):
//! a `Capture` leaked with `mem::forget`, and a C ABI capture whose beginning thread exited with it
//! open. A leak is safe in Rust's sense, but one forgotten guard must not take down the process:
//! such a capture degrades its own stream and nothing else.
//!
//! * frees of memory used elsewhere go through, and `Context::synchronize` from another thread
//!   waits per stream instead of being refused (the capture's stream: the work before it began);
//! * a GLOBAL-mode capture's refusal of allocations on every thread ends when its stream is
//!   dropped, or when the driver no longer reports the capture;
//! * a THREAD_LOCAL capture's thread gets its allocations back when the stream is dropped (graphsafe
//!   ends the driver's capture, from that thread, or destroys the stream from another);
//! * a C ABI capture whose thread exits is abandoned by graphsafe at that thread's exit: its stream
//!   and workspaces usable again, its handle invalid;
//! * while a thread has a THREAD_LOCAL capture open, graphsafe refuses its eager allocations
//!   (`StreamCapturing`, nothing done) instead of letting the driver invalidate the capture, and a
//!   context synchronize from that thread (of any context) is refused too.

mod common;
mod soundness;
mod standin;

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use standin::exclusive;
use std::sync::Arc;

#[track_caller]
fn no_violations(s: &standin::Standin) {
    assert_eq!(s.violations(), 0, "the stand-in saw a memory-safety violation: {}", s.last_violation());
}

#[track_caller]
fn capturing<T: std::fmt::Debug>(r: graphsafe::Result<T>, what: &str) {
    assert!(matches!(r, Err(Error::StreamCapturing { .. })), "{what}: expected StreamCapturing, got {r:?}");
}

/// An allocation on a fresh thread (whose own captures cannot be in the way).
fn alloc_elsewhere(ctx: &Arc<Context>) -> graphsafe::Result<()> {
    let ctx = ctx.clone();
    std::thread::spawn(move || DeviceBuffer::alloc(&ctx, 256).map(drop)).join().unwrap()
}

#[test]
fn a_forgotten_capture_leaves_frees_and_synchronizes_of_other_streams_alone() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    soundness::a_forgotten_capture_leaves_frees_and_synchronizes_of_other_streams_alone(&ctx, &mut stream, &|| s.stat("live_bytes") as u64);
    drop(stream);
    ctx.synchronize().expect("allowed on this thread once the forgotten capture's stream is gone");
    no_violations(s);
}

#[test]
fn a_forgotten_global_capture_stops_refusing_allocations_once_its_stream_is_dropped() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let captures = s.stat("open_captures");
    let mut leaky = Stream::new(&ctx).unwrap();
    std::mem::forget(leaky.begin_capture(CaptureMode::Global).unwrap());
    capturing(alloc_elsewhere(&ctx), "an allocation on another thread during the GLOBAL capture");
    drop(leaky);
    alloc_elsewhere(&ctx).expect("allocations on every thread once the forgotten capture's stream is gone");
    DeviceBuffer::alloc(&ctx, 256).expect("and on the capturing thread");
    assert_eq!(s.stat("open_captures"), captures, "the driver's capture was left open");
    no_violations(s);
}

/// "Or the driver reports the capture gone": the capture was ended through the stream's raw handle
/// (here by hand, as an engine holding `Stream::raw()` could): graphsafe's refusals end with it,
/// although the stream lives on.
#[test]
fn a_forgotten_global_capture_the_driver_no_longer_reports_refuses_nothing() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut leaky = Stream::new(&ctx).unwrap();
    std::mem::forget(leaky.begin_capture(CaptureMode::Global).unwrap());
    capturing(alloc_elsewhere(&ctx), "an allocation on another thread during the GLOBAL capture");
    // SAFETY: a live stream of ctx with a capture begun on this thread.
    assert_eq!(unsafe { standin::engine::end_capture(&ctx, leaky.raw()) }, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
    alloc_elsewhere(&ctx).expect("the driver reports no capture: nothing to refuse for");
    DeviceBuffer::alloc(&ctx, 256).expect("and on the capturing thread");
    drop(leaky);
    no_violations(s);
}

#[test]
fn a_forgotten_thread_local_capture_is_ended_when_its_stream_drops_on_its_thread() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let (captures, streams) = (s.stat("open_captures"), s.stat("live_streams"));
    let mut leaky = Stream::new(&ctx).unwrap();
    std::mem::forget(leaky.begin_capture(CaptureMode::ThreadLocal).unwrap());
    capturing(DeviceBuffer::alloc(&ctx, 256), "an allocation on the thread of an open THREAD_LOCAL capture");
    alloc_elsewhere(&ctx).expect("another thread allocates during a THREAD_LOCAL capture");
    drop(leaky);
    DeviceBuffer::alloc(&ctx, 256).expect("the capturing thread allocates once the forgotten capture's stream is gone");
    ctx.synchronize().expect("and synchronizes its context");
    assert_eq!((s.stat("open_captures"), s.stat("live_streams")), (captures, streams), "the driver's capture, or the stream, was left behind");
    no_violations(s);
}

/// The stream is `Send`, the capture is not: a forgotten capture's stream dropped on another
/// thread cannot end the driver's capture (CUDA: wrong thread), so graphsafe destroys the stream
/// it made, which ends it; the work queued before the capture is still waited for by later frees.
#[test]
fn a_forgotten_thread_local_capture_whose_stream_drops_on_another_thread_is_discarded() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let (captures, streams, live) = (s.stat("open_captures"), s.stat("live_streams"), s.live_allocations());
    let mut leaky = Stream::new(&ctx).unwrap();
    std::mem::forget(leaky.begin_capture(CaptureMode::ThreadLocal).unwrap());
    std::thread::spawn(move || drop(leaky)).join().unwrap();
    DeviceBuffer::alloc(&ctx, 256).expect("the capturing thread allocates once the stream is gone");
    assert_eq!(s.live_allocations(), live, "the free after the discarded capture was deferred");
    assert_eq!((s.stat("open_captures"), s.stat("live_streams")), (captures, streams), "the driver's capture, or the stream, was left behind");
    no_violations(s);
}

/// Inside a THREAD_LOCAL capture, growing a workspace on another stream of the same thread used to
/// reach `cuMemAlloc`, which the driver refuses on a capturing thread, invalidating the capture
/// (its end: `CaptureInvalidated`). graphsafe refuses first, as it does for GLOBAL captures, and
/// the capture survives.
#[test]
fn eager_allocations_during_a_thread_local_capture_of_this_thread_are_refused_and_it_survives() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let mut ws = Workspace::new(&b, 256).unwrap();
    let before = (ws.capacity(), ws.device_ptr());
    let cap = a.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let allocs = s.calls("cuMemAlloc");
    capturing(ws.ensure_size(1 << 20, &b), "Workspace::ensure_size on another stream");
    capturing(DeviceBuffer::alloc(&ctx, 256), "DeviceBuffer::alloc");
    capturing(DeviceBuffer::from_host(&b, &[1u8; 16]), "DeviceBuffer::from_host on another stream");
    assert_eq!(s.calls("cuMemAlloc"), allocs, "a refused call allocated");
    assert_eq!((ws.capacity(), ws.device_ptr()), before, "a refused growth changed the workspace");
    alloc_elsewhere(&ctx).expect("another thread allocates during a THREAD_LOCAL capture");
    let graph = cap.end().expect("the capture survived the refused calls");
    assert!(graph.node_kinds().unwrap().is_empty());
    ws.ensure_size(1 << 20, &b).expect("growth once the capture is over");
    no_violations(s);
}

/// A context synchronize is illegal on a thread with a non-relaxed capture open, whatever context
/// it names: `graphsafe_context_synchronize(B)` on a thread capturing in context A invalidated that
/// capture (BUSY was checked for B's captures only). Refused now for any graphsafe capture open on
/// the calling thread; the capture survives.
#[test]
fn a_context_synchronize_on_a_capturing_thread_is_refused_whatever_context_it_names() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let (mut a, mut b, mut st) = (GraphsafeContext::default(), GraphsafeContext::default(), GraphsafeStream::default());
    let (mut cap, mut g) = (GraphsafeCapture::default(), GraphsafeGraph::default());
    // SAFETY (every call): out-pointers to locals; handles made here.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut a), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_create(1, &mut b), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(a, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_synchronize(b), GRAPHSAFE_ERROR_BUSY, "a context synchronize of device 1 during a capture of device 0");
        assert_eq!(graphsafe_context_synchronize(a), GRAPHSAFE_ERROR_BUSY);
        assert_eq!(graphsafe_capture_end(cap, &mut g), GRAPHSAFE_OK, "the capture was invalidated");
        assert_eq!(graphsafe_context_synchronize(b), GRAPHSAFE_OK);
        assert_eq!(graphsafe_graph_destroy(g), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(a), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(b), GRAPHSAFE_OK);
    }
    no_violations(s);
}

/// A C caller's thread that exits with a THREAD_LOCAL or GLOBAL capture open: nobody can end that
/// capture any more (CUDA: only its thread may), so it used to stay open for good (`capture_end`
/// BUSY forever, its stream and workspace BUSY, the context's frees deferred, and for GLOBAL every
/// allocation of every thread refused). graphsafe now abandons it at the thread's exit, from that
/// thread: the stream and workspace are usable, frees and allocations proceed, and the handle is
/// left for its owner to consume (its end: CAPTURE_INVALIDATED, no graph; its destroy: OK).
#[test]
fn a_c_abi_capture_whose_thread_exits_is_abandoned_at_the_threads_exit() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    for mode in [GRAPHSAFE_CAPTURE_THREAD_LOCAL, GRAPHSAFE_CAPTURE_GLOBAL] {
        let (captures, live) = (s.stat("open_captures"), s.live_allocations());
        let (mut cx, mut st, mut ws, mut buf) = (GraphsafeContext::default(), GraphsafeStream::default(), GraphsafeWorkspace::default(), GraphsafeBuffer::default());
        // SAFETY (every call in this test): out-pointers to locals; handles made here.
        unsafe {
            assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
            assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
            assert_eq!(graphsafe_workspace_create(st, 4096, &mut ws), GRAPHSAFE_OK);
            assert_eq!(graphsafe_buffer_create(st, 4096, 1, &mut buf), GRAPHSAFE_OK);
        }
        let cap = std::thread::spawn(move || {
            let mut cap = GraphsafeCapture::default();
            // SAFETY: as above.
            unsafe {
                assert_eq!(graphsafe_capture_begin(st, mode, &mut cap), GRAPHSAFE_OK);
                assert_eq!(graphsafe_capture_bind_workspace(cap, ws, std::ptr::null_mut(), std::ptr::null_mut()), GRAPHSAFE_OK);
            }
            cap // the thread exits with the capture open
        })
        .join()
        .unwrap();
        let mut g = GraphsafeGraph::default();
        // SAFETY: as above.
        unsafe {
            if mode == GRAPHSAFE_CAPTURE_THREAD_LOCAL {
                let end = graphsafe_capture_end(cap, &mut g);
                assert_eq!(end, GRAPHSAFE_ERROR_CAPTURE_INVALIDATED, "mode {mode}: the end of a capture abandoned at its thread's exit (BUSY forever before)");
            } else {
                let destroy = graphsafe_capture_destroy(cap);
                assert_eq!(destroy, GRAPHSAFE_OK, "mode {mode}: the destroy of a capture abandoned at its thread's exit (BUSY forever before)");
            }
            assert_eq!(graphsafe_capture_destroy(cap), GRAPHSAFE_ERROR_INVALID_HANDLE, "mode {mode}: the handle was not consumed");
            assert_eq!(graphsafe_stream_synchronize(st), GRAPHSAFE_OK, "mode {mode}: the stream");
            assert_eq!(graphsafe_workspace_ensure_size(ws, 1 << 20, st, std::ptr::null_mut()), GRAPHSAFE_OK, "mode {mode}: the workspace");
            let mut other = GraphsafeBuffer::default();
            assert_eq!(graphsafe_buffer_create(st, 4096, 0, &mut other), GRAPHSAFE_OK, "mode {mode}: an allocation");
            assert_eq!(graphsafe_buffer_destroy(other), GRAPHSAFE_OK);
            assert_eq!(graphsafe_buffer_destroy(buf), GRAPHSAFE_OK);
            assert_eq!(graphsafe_workspace_destroy(ws), GRAPHSAFE_OK);
            assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        }
        assert_eq!(s.live_allocations(), live, "mode {mode}: frees were deferred");
        assert_eq!(s.stat("open_captures"), captures, "mode {mode}: the driver's capture is still open");
        // SAFETY: made above.
        assert_eq!(unsafe { graphsafe_context_destroy(cx) }, GRAPHSAFE_OK);
    }
    no_violations(s);
}

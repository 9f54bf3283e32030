//! The soundness scenarios of tests/soundness on the CPU, over the stand-in driver (tests/standin):
//! the same refusals as on a GPU, and the stand-in's own check that no memset, copy, kernel or
//! replay touched memory outside a live allocation.

mod common;
mod soundness;
mod standin;

use graphsafe::driver::{Context, Stream};
use standin::exclusive;
use std::sync::Arc;

#[track_caller]
fn no_violations(s: &standin::Standin) {
    assert_eq!(s.violations(), 0, "the stand-in saw a memory-safety violation: {}", s.last_violation());
}

/// Runs a scenario on a stream of the stand-in's device 0, holding the stand-in for the test, and
/// checks that the stand-in saw no memory-safety violation meanwhile.
fn on_standin(scenario: impl FnOnce(&Arc<Context>, &mut Stream)) {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    scenario(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn views_of_another_capture_are_refused_and_graph_b_touches_nothing_in_1000_replays() {
    on_standin(soundness::views_of_another_capture_are_refused);
}

#[test]
fn views_of_an_abandoned_capture_are_refused() {
    on_standin(soundness::views_of_an_abandoned_capture_are_refused);
}

#[test]
fn a_leaked_capture_makes_eager_apis_refuse_the_stream() {
    on_standin(soundness::a_leaked_capture_makes_eager_apis_refuse_the_stream);
}

#[test]
fn calls_restore_the_callers_current_context() {
    on_standin(|ctx, _stream| {
        soundness::calls_restore_the_callers_current_context(ctx, std::ptr::null_mut());
        let other = Context::new(1).unwrap();
        soundness::calls_restore_the_callers_current_context(ctx, other.raw());
    });
}

#[test]
fn a_failed_growth_leaves_the_workspace_and_its_graphs_intact() {
    // More than the stand-in's device memory.
    on_standin(|ctx, stream| soundness::a_failed_growth_leaves_the_workspace_and_its_graphs_intact(ctx, stream, 1 << 50));
}

#[test]
fn a_graph_holds_each_baked_in_allocation_once() {
    on_standin(soundness::a_graph_holds_each_baked_in_allocation_once);
}

#[test]
fn a_graph_keeps_its_kernels_module_loaded() {
    // The stand-in counts a replayed kernel of an unloaded module as a violation.
    on_standin(soundness::a_graph_keeps_its_kernels_module_loaded);
}

#[test]
fn memory_of_another_device_is_refused() {
    let (_g, s) = exclusive();
    let ctx0 = Context::new(0).unwrap();
    let ctx1 = Context::new(1).unwrap();
    soundness::memory_of_another_device_is_refused(&ctx0, &ctx1);
    no_violations(s);
}

#[test]
fn a_context_synchronize_never_disturbs_a_capture() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let before = s.calls("cuCtxSynchronize");
    soundness::a_context_synchronize_never_disturbs_a_capture(&ctx, &mut stream);
    assert_eq!(s.calls("cuCtxSynchronize"), before + 1, "only the synchronize after the capture reached the driver");
    no_violations(s);
}

/// A stream handle graphsafe already wraps cannot be wrapped again, through the Rust API or the C
/// ABI: two wrappers would have two capture markers (and two C ABI stream locks), so a replay or
/// an eager op through one could land in a capture open through the other.
#[test]
fn a_stream_graphsafe_already_wraps_cannot_be_adopted_again() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    // SAFETY: a live stream of ctx that outlives the attempt.
    let twice = unsafe { Stream::adopt(&ctx, stream.raw()) };
    assert!(matches!(twice, Err(graphsafe::Error::InvalidArgument { .. })), "adopted a wrapped stream: {twice:?}");
    // Once the first wrapper is gone, the handle may be wrapped again (here: an engine's stream).
    let api = graphsafe::sys::driver::api().unwrap();
    let mut raw: graphsafe::sys::cuda::CUstream = std::ptr::null_mut();
    {
        ctx.with_current(|| {
            // SAFETY: out-pointer to a local.
            unsafe { (api.cuStreamCreate().unwrap().f)(&mut raw, 1) };
        }).unwrap()
    }
    // SAFETY: raw is a live stream of ctx, destroyed below after every wrapper is gone.
    let first = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    // SAFETY: as above.
    assert!(unsafe { Stream::adopt(&ctx, raw) }.is_err(), "a second wrapper of an adopted stream");
    drop(first);
    // SAFETY: as above.
    drop(unsafe { Stream::adopt(&ctx, raw) }.expect("wrapping again after the first wrapper dropped"));

    // The C ABI: a handle's raw stream adopted as a second handle is refused.
    use graphsafe::capi::*;
    // SAFETY: out-pointers to locals; handles made here.
    unsafe {
        let mut c = std::mem::zeroed::<GraphsafeContext>();
        assert_eq!(graphsafe_context_create(0, &mut c), GRAPHSAFE_OK);
        let mut h = std::mem::zeroed::<GraphsafeStream>();
        assert_eq!(graphsafe_stream_create(c, &mut h), GRAPHSAFE_OK);
        let mut cu: *mut std::ffi::c_void = std::ptr::null_mut();
        assert_eq!(graphsafe_stream_raw(h, &mut cu), GRAPHSAFE_OK);
        let mut second = std::mem::zeroed::<GraphsafeStream>();
        assert_eq!(graphsafe_stream_adopt(c, cu, &mut second), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
        assert_eq!(graphsafe_stream_destroy(h), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(c), GRAPHSAFE_OK);
    }
    {
        ctx.with_current(|| {
            // SAFETY: made above; no wrapper of it is left.
            unsafe { (api.cuStreamDestroy().unwrap().f)(raw) };
        }).unwrap()
    }
    no_violations(s);
}

/// Frees wait only for the streams graphsafe lists, so dropping a stream (created or adopted)
/// first waits for the work graphsafe queued on it: a free right after the drop can then not
/// return memory a kernel queued there still uses.
#[test]
fn dropping_a_stream_waits_for_its_work_before_it_leaves_the_free_gate() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    let before = s.calls("cuStreamSynchronize");
    drop(stream);
    assert_eq!(s.calls("cuStreamSynchronize"), before + 1, "a created stream was dropped without waiting for it");
    // An engine's own stream, adopted.
    let api = graphsafe::sys::driver::api().unwrap();
    let mut raw: graphsafe::sys::cuda::CUstream = std::ptr::null_mut();
    {
        ctx.with_current(|| {
            // SAFETY: out-pointer to a local.
            unsafe { (api.cuStreamCreate().unwrap().f)(&mut raw, 1) };
        }).unwrap()
    }
    // SAFETY: raw is a live stream of ctx, destroyed below.
    let adopted = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    let before = s.calls("cuStreamSynchronize");
    drop(adopted);
    assert_eq!(s.calls("cuStreamSynchronize"), before + 1, "an adopted stream was dropped without waiting for it");
    {
        ctx.with_current(|| {
            // SAFETY: made above; its wrapper is gone.
            unsafe { (api.cuStreamDestroy().unwrap().f)(raw) };
        }).unwrap()
    }
    no_violations(s);
}

/// An executable is dropped on one thread while its source graph is instantiated again on
/// another. The real driver (580, H200) crashes in cuGraphExecDestroy when these overlap
/// (tests/capi/capi_stress.cpp found it; graph objects are not thread-safe, and an executable
/// shares state with the graph it came from), so graphsafe serializes each graph's family: the
/// stand-in, whose cuGraphExecDestroy and cuGraphInstantiateWithFlags are slowed down here, reports
/// any overlap as a violation. Also checks the same for dropping the graph itself.
#[test]
fn an_executable_is_never_destroyed_while_its_graph_is_instantiated_on_another_thread() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let (graph, ()) = stream.capture(graphsafe::graph::CaptureMode::ThreadLocal, |_| Ok(())).unwrap();
    s.delay("cuGraphExecDestroy", 2000);
    s.delay("cuGraphInstantiateWithFlags", 2000);
    let execs: Vec<_> = (0..20).map(|_| graph.instantiate().unwrap()).collect();
    std::thread::scope(|scope| {
        scope.spawn(move || drop(execs));
        for _ in 0..20 {
            drop(graph.instantiate().unwrap());
        }
    });
    let late: Vec<_> = (0..10).map(|_| graph.instantiate().unwrap()).collect();
    std::thread::scope(|scope| {
        scope.spawn(move || drop(late));
        drop(graph);
    });
    s.delay("cuGraphExecDestroy", 0);
    s.delay("cuGraphInstantiateWithFlags", 0);
    no_violations(s);
}

/// A capture begins under the context's free gate, so a free never overlaps it: a free during a
/// begin the driver refuses waits for the begin, then goes through (not deferred to an unrelated
/// later free).
#[test]
fn a_free_during_a_failed_capture_begin_waits_for_it_and_goes_through() {
    use graphsafe::driver::DeviceBuffer;
    use graphsafe::sys::cuda::CUresult;
    let (_g, s) = exclusive();
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let buf = DeviceBuffer::alloc_zeroed(&other, 1 << 16).unwrap();
    let live = s.live_allocations();
    s.delay("cuStreamBeginCapture_v2", 200_000);
    s.fail("cuStreamBeginCapture_v2", 0, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    let begins = s.calls("cuStreamBeginCapture_v2");
    let waited = std::thread::scope(|scope| {
        let dropper = scope.spawn(|| {
            // Inside the begin's window (it sleeps 200 ms in the driver, counted on entry): the
            // free waits for the begin (which runs under the context's free gate), then sees no
            // capture open.
            while s.calls("cuStreamBeginCapture_v2") == begins {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            let t0 = std::time::Instant::now();
            drop(buf);
            t0.elapsed()
        });
        let r = stream.begin_capture(graphsafe::graph::CaptureMode::ThreadLocal).map(drop);
        assert!(r.is_err(), "the injected begin failure was not reported");
        dropper.join().unwrap()
    });
    s.delay("cuStreamBeginCapture_v2", 0);
    // The free waited for the rest of the begin (about 195 ms; with the begin outside the gate it
    // was deferred at once).
    assert!(waited >= std::time::Duration::from_millis(50), "a free overlapped a capture begin (it took {waited:?})");
    assert_eq!(s.live_allocations(), live - 1, "the buffer dropped during the failed begin is still held");
    no_violations(s);
}

/// One transient driver failure of `cuStreamEndCapture` must not leave the capture open for good:
/// the failed `end` reports the error, the drop of the capture ends it, and afterwards the stream
/// takes eager work and (a GLOBAL capture) allocations on other threads are allowed again. Frees
/// of memory the capture does not hold go through while it is open (its stream's work before the
/// capture is waited for through the event recorded as it began).
#[test]
fn a_failed_capture_end_does_not_leave_the_capture_open_for_good() {
    use graphsafe::driver::DeviceBuffer;
    use graphsafe::sys::cuda::CUresult;
    let (_g, s) = exclusive();
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let buf = DeviceBuffer::alloc_zeroed(&other, 4096).unwrap();
    let live = s.live_allocations();
    let cap = stream.begin_capture(graphsafe::graph::CaptureMode::Global).unwrap();
    drop(buf); // not bound to the capture: given back at once
    assert_eq!(s.live_allocations(), live - 1, "a free of memory the open capture does not hold was deferred");
    s.fail("cuStreamEndCapture", 0, CUresult::CUDA_ERROR_UNKNOWN);
    assert!(cap.end().is_err(), "the injected end failure was not reported");
    assert!(!stream.is_capturing().unwrap(), "the stream is still capturing after the failed end was dropped");
    stream.synchronize().expect("eager work on the stream after the failed end");
    let elsewhere = std::thread::spawn(|| {
        let ctx0 = Context::new(0).unwrap();
        DeviceBuffer::alloc_zeroed(&Stream::new(&ctx0).unwrap(), 256).map(drop)
    });
    elsewhere.join().unwrap().expect("an allocation on another thread is still refused as if a GLOBAL capture were open");
    ctx.synchronize().expect("Context::synchronize is still refused");
    no_violations(s);
}

/// A replay on a stream whose handle other code holds (adopted, or handed out by the C ABI) while
/// that code has begun a capture of its own on it: graphsafe refuses it (StreamCapturing / BUSY)
/// instead of letting the foreign graph record a child copy of the executable whose memory it does
/// not keep. On the old code the replay went through, and the foreign graph's replay touched
/// freed memory once the executable was dropped.
#[test]
fn a_replay_into_a_capture_graphsafe_did_not_begin_is_refused() {
    use graphsafe::capi::*;
    use graphsafe::driver::DeviceBuffer;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut own = Stream::new(&ctx).unwrap();
    let buf = DeviceBuffer::alloc_zeroed(&own, 4096).unwrap();
    let (graph, ()) = own
        .capture(graphsafe::graph::CaptureMode::ThreadLocal, |cap| {
            let b = cap.bind_buffer(&buf)?;
            cap.memset_u8(&b, 7)
        })
        .unwrap();
    let exec = graph.instantiate().unwrap();
    drop((graph, buf));
    let api = graphsafe::sys::driver::api().unwrap();
    let foreign_capture = |raw: graphsafe::sys::cuda::CUstream, begin: bool| {
        ctx.with_current(|| {
            if begin {
                // SAFETY: a live stream of ctx; a valid mode.
                let r = unsafe { (api.cuStreamBeginCapture().unwrap().f)(raw, graphsafe::sys::cuda::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) };
                assert_eq!(r, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
            } else {
                let mut g = std::ptr::null_mut();
                // SAFETY: the stream is capturing (begun above); out-pointer to a local.
                unsafe { (api.cuStreamEndCapture().unwrap().f)(raw, &mut g) };
                // SAFETY: the graph the capture returned, destroyed once.
                unsafe { (api.cuGraphDestroy().unwrap().f)(g) };
            }
        }).unwrap()
    };
    // The Rust API: an engine's stream, adopted.
    let mut raw: graphsafe::sys::cuda::CUstream = std::ptr::null_mut();
    {
        ctx.with_current(|| {
            // SAFETY: out-pointer to a local.
            unsafe { (api.cuStreamCreate().unwrap().f)(&mut raw, 1) };
        }).unwrap()
    }
    // SAFETY: raw is a live stream of ctx, destroyed below after its wrapper.
    let adopted = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    exec.launch(&adopted).expect("a replay on the adopted stream with no capture open");
    foreign_capture(raw, true);
    match exec.launch(&adopted) {
        Err(graphsafe::Error::StreamCapturing { .. }) => {}
        other => panic!("a replay into the engine's own capture was not refused: {other:?}"),
    }
    foreign_capture(raw, false);
    exec.launch(&adopted).expect("a replay once the engine's capture ended");
    drop(adopted);
    {
        ctx.with_current(|| {
            // SAFETY: made above; its wrapper is gone.
            unsafe { (api.cuStreamDestroy().unwrap().f)(raw) };
        }).unwrap()
    }
    // The C ABI: a stream whose raw handle the caller asked for.
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    // SAFETY: out-pointers to locals.
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_stream_create(cx, &mut st) }, GRAPHSAFE_OK);
    let mut c_raw: *mut std::ffi::c_void = std::ptr::null_mut();
    assert_eq!(unsafe { graphsafe_stream_raw(st, &mut c_raw) }, GRAPHSAFE_OK);
    // A C caller's executable: the Rust one above, through a C ABI graph made the same way.
    let mut cap = GraphsafeCapture::default();
    assert_eq!(unsafe { graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap) }, GRAPHSAFE_OK);
    let mut g = GraphsafeGraph::default();
    assert_eq!(unsafe { graphsafe_capture_end(cap, &mut g) }, GRAPHSAFE_OK);
    let mut e = GraphsafeGraphExec::default();
    assert_eq!(unsafe { graphsafe_graph_instantiate(g, &mut e) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_graph_exec_launch(e, st) }, GRAPHSAFE_OK);
    foreign_capture(c_raw.cast(), true);
    assert_eq!(unsafe { graphsafe_graph_exec_launch(e, st) }, GRAPHSAFE_ERROR_BUSY, "a C replay into the caller's own capture");
    foreign_capture(c_raw.cast(), false);
    assert_eq!(unsafe { graphsafe_graph_exec_launch(e, st) }, GRAPHSAFE_OK);
    unsafe {
        graphsafe_graph_exec_destroy(e);
        graphsafe_graph_destroy(g);
        graphsafe_stream_destroy(st);
        graphsafe_context_destroy(cx);
    }
    drop((exec, own));
    no_violations(s);
}

/// A module kernel launched into a capture through `Function::launch` (raw parameters): the launch
/// is recorded as a kernel node, the graph keeps the module loaded after every other handle is
/// gone, and its replay runs it. The same call on a plain stream runs at once and records nothing.
#[test]
fn a_raw_kernel_launch_into_a_capture_is_recorded_and_keeps_its_module() {
    use graphsafe::driver::LaunchConfig;
    use graphsafe::graph::{CaptureMode, NodeKind};
    use graphsafe::ops::testing::TestKernels;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let cfg = LaunchConfig::linear(1, 32);
    // SAFETY: the empty kernel takes no parameters.
    unsafe { k.empty_function().launch(&cfg, &stream, &mut []) }.expect("an eager launch");
    let (graph, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            // SAFETY: as above.
            unsafe { k.empty_function().launch(&cfg, cap, &mut []) }
        })
        .unwrap();
    assert_eq!(graph.node_kinds().unwrap(), vec![NodeKind::Kernel], "the captured launch is not the graph's one kernel node");
    assert_eq!(graph.kept_modules(), 1, "the graph does not keep the kernel's module");
    let exec = graph.instantiate().unwrap();
    drop((graph, k));
    exec.launch(&stream).expect("a replay after the module's last other handle went");
    stream.synchronize().unwrap();
    no_violations(s);
}

/// Uses of one workspace buffer on several streams are put in order: every use (eager op, replay
/// of a graph that captured the buffer, read-back) records the buffer's event on its stream after
/// its work, and a use on another stream than the last one first waits for that event — exactly
/// once per change, never while the stream stays the same. The previous stream is never touched,
/// so it may be dropped or capturing by then. Before, none of these waited (a kernel on B could
/// share the scratch memory with one on A still running).
#[test]
fn workspace_uses_on_different_streams_are_put_in_order() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&a, 3);
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap();
    let waits = || s.calls("cuStreamWaitEvent");
    let records = || s.calls("cuEventRecord");
    let (w0, r0) = (waits(), records());
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &a).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &a).unwrap();
    assert_eq!(waits(), w0, "uses on the stream that zero-filled the workspace waited");
    assert_eq!(records(), r0 + 2, "each use records the buffer's event after its work");
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(waits(), w0 + 1, "a use on another stream did not wait for the previous one");
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(waits(), w0 + 1, "a second use on the same stream waited again");

    // A graph that captured the buffer: its replays are uses too.
    let exec = common::captured_split_k(&k, &mut a, &p, shape, &mut ws);
    exec.launch(&b).unwrap();
    assert_eq!(waits(), w0 + 1, "a replay on the stream of the last use waited");
    exec.launch(&a).unwrap();
    assert_eq!(waits(), w0 + 2, "a replay on another stream than the last use's did not wait");
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(waits(), w0 + 3, "an eager use after a replay on another stream did not wait");
    ws.to_host_vec(&a).unwrap();
    assert_eq!(waits(), w0 + 4, "a read-back on another stream did not wait");

    // The previous stream dropped: the wait is for an event recorded before; nothing touches it.
    let c = Stream::new(&ctx).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &c).unwrap();
    drop(c);
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(waits(), w0 + 6);

    // The previous stream capturing now (b): the use on a waits for the event b recorded before
    // its capture, records nothing on b, and b's capture stays its own (ends with no node).
    let mut b_mut = b;
    let nodes_before = s.stat("nodes_recorded");
    {
        let cap = b_mut.begin_capture(CaptureMode::ThreadLocal).unwrap();
        k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &a).unwrap();
        assert_eq!(cap.end().unwrap().node_kinds().unwrap().len(), 0, "the use on a reached b's capture");
    }
    assert_eq!(s.stat("nodes_recorded"), nodes_before);
    assert_eq!(waits(), w0 + 7, "the use after the capture-time use did not wait");
    a.synchronize().unwrap();
    no_violations(s);
}

/// On the stand-in's device 1: an engine's own stream (`raw`, made with cuStreamCreate) adopted
/// as `a`, a graphsafe stream `b`, the test kernels and a split-K problem. The test destroys `raw`
/// (standin::engine::destroy_stream) after `a` is gone.
struct EngineAndOurs {
    ctx: std::sync::Arc<Context>,
    raw: graphsafe::sys::cuda::CUstream,
    a: Stream,
    b: Stream,
    k: graphsafe::ops::testing::TestKernels,
    p: common::SplitKProblem,
}

fn engine_and_ours() -> EngineAndOurs {
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let raw = standin::engine::create_stream(&ctx);
    // SAFETY: raw is a live stream of ctx; each test destroys it only after dropping `a`.
    let a = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    let b = Stream::new(&ctx).unwrap();
    let k = graphsafe::ops::testing::TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&b, 5);
    EngineAndOurs { ctx, raw, a, b, k, p }
}

/// An engine begins its own capture on its adopted stream while graphsafe orders a workspace use
/// on another stream after the last use on the engine's stream (the engine makes no graphsafe call
/// on its stream meanwhile, so `Stream::adopt`'s contract allows it). graphsafe never touches the
/// previous stream, so the engine's capture records nothing of graphsafe's and ends cleanly, and
/// the use runs eagerly. (With a record on the previous stream at the change, the capture took
/// the record and the wait forked the other stream into it: UNJOINED.)
#[test]
fn an_engine_capture_on_the_previous_stream_is_never_touched() {
    use graphsafe::sys::cuda as c;
    use graphsafe::workspace::Workspace;
    use standin::engine;
    let (_g, s) = exclusive();
    let EngineAndOurs { ctx, raw, a, b, k, p } = engine_and_ours();
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap(); // last use: a
    let nodes_before = s.stat("nodes_recorded");
    let raw_u = raw as usize;
    let engine_ctx = ctx.clone();
    let engine = std::thread::spawn(move || {
        let raw = raw_u as c::CUstream;
        // SAFETY: a live stream of engine_ctx (destroyed only after this thread is joined).
        unsafe { engine::begin_capture(&engine_ctx, raw) };
        std::thread::sleep(std::time::Duration::from_millis(100));
        // SAFETY: as above, with the capture begun above.
        unsafe { engine::end_capture(&engine_ctx, raw) }
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(engine.join().unwrap(), c::CUresult::CUDA_SUCCESS, "the engine's own capture was broken by a graphsafe call on another stream");
    assert_eq!(s.stat("nodes_recorded"), nodes_before, "graphsafe's eager op was recorded into the engine's graph");
    assert!(!b.is_capturing().unwrap(), "the use's stream was forked into the engine's capture");
    drop(a);
    // SAFETY: made above; its wrapper is gone.
    unsafe { engine::destroy_stream(&ctx, raw) };
    no_violations(s);
}

/// A capture leaked on A with `mem::forget`, then A dropped (its drop cannot wait for a capturing
/// stream), then a use on B of the workspace last used on A: B still waits for the event recorded
/// after A's last use (before the capture). (The first design skipped the wait for a dropped
/// stream, assuming its drop had waited.)
#[test]
fn a_use_after_the_previous_stream_leaked_a_capture_and_was_dropped_still_waits() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    let (_g, s) = exclusive();
    // Device 0, where `a_leaked_capture_…` leaves a capture open anyway: this one stays open for
    // the rest of the process too (frees there deferred).
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&b, 6);
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &a).unwrap();
    std::mem::forget(a.begin_capture(CaptureMode::Relaxed).unwrap());
    drop(a);
    let w0 = s.calls("cuStreamWaitEvent");
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b).unwrap();
    assert_eq!(s.calls("cuStreamWaitEvent"), w0 + 1, "the use on b did not wait for a's last use");
    b.synchronize().unwrap();
    no_violations(s);
}

/// A graphsafe capture begun on the previous stream while a workspace use on another stream
/// orders itself after the last use there. The first design asked "is that stream capturing?" and
/// then recorded an event on it: a capture begun in between took the record, and the wait on it
/// forked the other stream into the capture, whose end failed with
/// CUDA_ERROR_STREAM_CAPTURE_UNJOINED (seen on the H200 with driver 580 under
/// tests/capi/capi_stress.cpp). Now nothing is recorded on the previous stream: the use runs
/// eagerly and the capture ends cleanly, whatever the timing. The stand-in models the fork
/// (tests/standin/standin_streams.c); its delay knobs put the first design's question inside the
/// capture's begin and its record after it, where it failed with exactly the H200's error.
#[test]
fn a_capture_begun_while_a_workspace_use_orders_itself_does_not_take_its_wait() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    let (_g, s) = exclusive();
    // Device 1: a capture left open on device 0 by `a_leaked_capture_…` would defer frees here.
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&a, 9);
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap(); // last use: a
    let nodes_before = s.stat("nodes_recorded");
    s.delay("cuStreamBeginCapture_v2", 100_000);
    s.delay("cuEventRecord", 150_000);
    let a_ref = &mut a;
    let (used, ended) = std::thread::scope(|scope| {
        let capturer = scope.spawn(move || {
            let cap = a_ref.begin_capture(CaptureMode::ThreadLocal).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            cap.end().map(|g| g.node_kinds().unwrap().len())
        });
        // While the begin is in the driver: the use asks about a, then records there.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let used = k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &b);
        (used, capturer.join().unwrap())
    });
    s.delay("cuStreamBeginCapture_v2", 0);
    s.delay("cuEventRecord", 0);
    assert_eq!(ended.expect("the capture begun during the use's ordering did not end cleanly"), 0, "the capture recorded the other stream's work");
    assert!(matches!(used, Ok(()) | Err(graphsafe::Error::StreamCapturing { .. })), "the use: {used:?}");
    assert_eq!(s.stat("nodes_recorded"), nodes_before, "work of the eager use was recorded into a graph");
    assert!(!b.is_capturing().unwrap(), "the eager use's stream was forked into the capture");
    b.synchronize().unwrap();
    no_violations(s);
}

/// Six threads, each on its own stream (replaced now and then), mixing replays of three graphs
/// whose workspace buffers overlap in a cycle (0-1, 1-2, 2-0), eager split-K ops and read-backs on
/// the three workspaces, allocations and frees, and ThreadLocal and Global captures that bind a
/// workspace and replay what they captured: every path that takes a workspace's use order, the
/// free gate (capture begins run under it) and the global-capture lock, at once. No call may hang
/// (a watchdog aborts the process after 120 s), the stand-in sees no violation (an unjoined fork
/// among them), and most calls succeed.
#[test]
fn use_orders_free_gate_and_captures_never_deadlock_under_six_threads() {
    use graphsafe::driver::DeviceBuffer;
    use graphsafe::graph::{CaptureMode, GraphExec};
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    const THREADS: usize = 6;
    const ROUNDS: usize = 2000;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut s0 = Stream::new(&ctx).unwrap();
    let k = Arc::new(TestKernels::load(&ctx).unwrap());
    let shape = soundness::SHAPE;
    let p = Arc::new(soundness::problem(&s0, 1));
    let wss: Vec<Arc<Mutex<Workspace>>> = (0..3).map(|_| Arc::new(Mutex::new(Workspace::new(&s0, shape.workspace_bytes().unwrap()).unwrap()))).collect();
    let graph_over = |s0: &mut Stream, i: usize, j: usize| -> GraphExec {
        let (mut a, mut b) = (wss[i].lock().unwrap(), wss[j].lock().unwrap());
        let mut cap = s0.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let (w1, w2) = (cap.bind_workspace(&mut a).unwrap(), cap.bind_workspace(&mut b).unwrap());
        let (ca, cx, cy) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        k.split_k_gemv_captured(&ca, &cx, &cy, shape, &w1, &cap).unwrap();
        k.split_k_gemv_captured(&ca, &cx, &cy, shape, &w2, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    let execs: Arc<Vec<Mutex<GraphExec>>> = Arc::new(vec![Mutex::new(graph_over(&mut s0, 0, 1)), Mutex::new(graph_over(&mut s0, 1, 2)), Mutex::new(graph_over(&mut s0, 2, 0))]);
    let (done, ok) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut threads = Vec::new();
    for t in 0..THREADS as u64 {
        let (ctx, k, p, wss, execs, done, ok) = (ctx.clone(), k.clone(), p.clone(), wss.clone(), execs.clone(), done.clone(), ok.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = t * 7919 + 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut st = Stream::new(&ctx).unwrap();
            for _ in 0..ROUNDS {
                let r: graphsafe::Result<()> = match next() % 8 {
                    0 | 1 => execs[(next() % 3) as usize].lock().unwrap().launch(&st),
                    2 | 3 => k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut wss[(next() % 3) as usize].lock().unwrap(), &st),
                    4 => DeviceBuffer::alloc_zeroed(&st, 4096).map(drop),
                    5 => {
                        let mode = if next() % 2 == 0 { CaptureMode::Global } else { CaptureMode::ThreadLocal };
                        let mut w = wss[(next() % 3) as usize].lock().unwrap();
                        let r = (|| {
                            let mut cap = st.begin_capture(mode)?;
                            let wv = cap.bind_workspace(&mut w)?;
                            let (ca, cx, cy) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
                            k.split_k_gemv_captured(&ca, &cx, &cy, shape, &wv, &cap)?;
                            let e = cap.end()?.instantiate()?;
                            e.launch(&st)
                        })();
                        r
                    }
                    6 => wss[(next() % 3) as usize].lock().unwrap().to_host_vec(&st).map(drop),
                    _ => Stream::new(&ctx).map(|fresh| st = fresh),
                };
                if r.is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            st.synchronize().unwrap();
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let t0 = std::time::Instant::now();
    while done.load(Ordering::SeqCst) < THREADS {
        if t0.elapsed() > std::time::Duration::from_secs(120) {
            eprintln!("use_orders_free_gate_and_captures_never_deadlock: {} of {THREADS} threads done after 120 s: a deadlock", done.load(Ordering::SeqCst));
            std::process::abort();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for t in threads {
        t.join().unwrap();
    }
    let ok = ok.load(Ordering::Relaxed);
    eprintln!("{ok} of {} calls succeeded in {:?}", THREADS * ROUNDS, t0.elapsed());
    assert!(ok >= THREADS * ROUNDS / 2, "only {ok} of {} calls succeeded", THREADS * ROUNDS);
    no_violations(s);
}

/// An engine captures on a graphsafe stream whose raw handle it took with `Stream::raw()`: a
/// replay there must be refused, not recorded into the engine's graph (which keeps none of the
/// replayed graph's memory alive), and a later use of the workspace on another stream must not
/// wait on an event recorded inside that capture (the wait would fork that stream into it too).
/// (`Stream::raw()` did not mark the stream as shared, so only graphsafe's own capture marker was
/// looked at.)
#[test]
fn a_replay_on_a_stream_an_engine_captures_through_its_raw_handle_is_refused() {
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::sys::cuda as c;
    use graphsafe::workspace::Workspace;
    use standin::engine;
    let (_g, s) = exclusive();
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut a = Stream::new(&ctx).unwrap();
    let b = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&a, 5);
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap();
    let exec = common::captured_split_k(&k, &mut a, &p, shape, &mut ws);
    let raw = b.raw(); // handed to the engine
    let nodes_before = s.stat("nodes_recorded");
    // SAFETY: b's live stream, which outlives the capture.
    unsafe { engine::begin_capture(&ctx, raw) };
    let replay = exec.launch(&b);
    let eager = k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &other);
    // SAFETY: as above, with the capture begun above.
    assert_eq!(unsafe { engine::end_capture(&ctx, raw) }, c::CUresult::CUDA_SUCCESS, "the engine's capture was broken");
    assert!(matches!(replay, Err(graphsafe::Error::StreamCapturing { .. })), "the replay into the engine's capture: {replay:?}");
    assert_eq!(s.stat("nodes_recorded"), nodes_before, "graphsafe work was recorded into the engine's graph");
    eager.expect("the eager use on another stream");
    assert!(!other.is_capturing().unwrap(), "the other stream was forked into the engine's capture");
    drop(exec);
    no_violations(s);
}

/// The same, with the handle taken inside a capture through `CaptureStream::raw` (the capturing
/// stream as captured ops see it): once handed out, the stream is shared like one taken with
/// `Stream::raw`, so a later replay asks the driver, and finds the engine's capture. (The accessor
/// returned the handle without marking the stream shared, so replays kept the fast path and were
/// recorded into the engine's graph.)
#[test]
fn a_replay_on_a_stream_whose_handle_left_through_its_capture_is_refused_in_an_engine_capture() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::sys::cuda as c;
    use graphsafe::workspace::Workspace;
    use standin::engine;
    let (_g, s) = exclusive();
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut a = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&a, 5);
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap();
    let mut raw: c::CUstream = std::ptr::null_mut();
    let (graph, ()) = a
        .capture(CaptureMode::ThreadLocal, |cap| {
            raw = cap.stream().raw(); // handed to the engine from inside the capture
            let w = cap.bind_workspace(&mut ws)?;
            let (x, y, m) = (cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?, cap.bind_buffer(&p.a)?);
            k.split_k_gemv_captured(&m, &x, &y, shape, &w, cap)
        })
        .unwrap();
    let exec = graph.instantiate().unwrap();
    let nodes_before = s.stat("nodes_recorded");
    // SAFETY: a's live stream, which outlives the capture.
    unsafe { engine::begin_capture(&ctx, raw) };
    let replay = exec.launch(&a);
    let empty = k.empty(&a);
    let eager = k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &other);
    // SAFETY: as above, with the capture begun above.
    assert_eq!(unsafe { engine::end_capture(&ctx, raw) }, c::CUresult::CUDA_SUCCESS, "the engine's capture was broken");
    assert!(matches!(replay, Err(graphsafe::Error::StreamCapturing { .. })), "the replay into the engine's capture: {replay:?}");
    assert!(matches!(empty, Err(graphsafe::Error::StreamCapturing { .. })), "the empty kernel into the engine's capture: {empty:?}");
    assert_eq!(s.stat("nodes_recorded"), nodes_before, "graphsafe work was recorded into the engine's graph");
    eager.expect("the eager use on another stream");
    assert!(!other.is_capturing().unwrap(), "the other stream was forked into the engine's capture");
    drop(exec);
    no_violations(s);
}

/// An adopted stream dropped while the engine captures on it: its drop cannot wait for the work
/// graphsafe enqueued there, so no later free of the context may go through until something has
/// waited for it (a context synchronize), or a kernel still queued there could use freed memory.
/// (The drop unlisted the stream anyway, and the next free waited only for the streams still
/// listed.)
#[test]
fn frees_after_an_adopted_stream_was_dropped_mid_engine_capture_wait_for_a_context_synchronize() {
    use graphsafe::sys::cuda as c;
    use graphsafe::workspace::Workspace;
    use standin::engine;
    let (_g, s) = exclusive();
    let EngineAndOurs { ctx, raw, a, b, k, p } = engine_and_ours();
    let shape = soundness::SHAPE;
    let mut ws = Workspace::new(&a, shape.workspace_bytes().unwrap()).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, shape, &mut ws, &a).unwrap();
    // SAFETY: a live stream of ctx.
    unsafe { engine::begin_capture(&ctx, raw) };
    drop(a); // cannot wait: the engine's capture is open on it
    let live = s.stat("live_allocations");
    ws.ensure_size(4 * shape.workspace_bytes().unwrap(), &b).unwrap(); // retires the buffer a's kernel used
    assert_eq!(s.stat("live_allocations"), live + 1, "the retired buffer was freed although the work on the dropped stream was never waited for");
    // SAFETY: the capture begun above; then the stream, whose wrapper is gone.
    unsafe {
        assert_eq!(engine::end_capture(&ctx, raw), c::CUresult::CUDA_SUCCESS);
        engine::destroy_stream(&ctx, raw);
    }
    ctx.synchronize().unwrap(); // all of the context's work is over: the deferred free goes through
    assert_eq!(s.stat("live_allocations"), live, "the deferred free was lost");
    no_violations(s);
}

/// graphsafe_stream_destroy is documented BUSY while the stream is capturing: also while a capture
/// the caller began on the handle it took with graphsafe_stream_raw is open, not only graphsafe's
/// own. (Before, the destroy went through: cuStreamDestroy on a stream in the middle of the
/// caller's capture, and every later free of the context deferred.)
#[test]
fn a_stream_handle_is_not_destroyed_while_the_caller_captures_its_raw_stream() {
    use graphsafe::capi::*;
    use graphsafe::sys::cuda as c;
    use standin::engine;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    let mut raw: *mut std::ffi::c_void = std::ptr::null_mut();
    // Relative: the stand-in's count of live streams is process-wide, and a test that leaks a
    // capture (a_leaked_capture_…) leaves its stream alive on purpose.
    let streams_before = s.stat("live_streams");
    // SAFETY: out-pointers to locals; handles made here.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_raw(st, &mut raw), GRAPHSAFE_OK);
        engine::begin_capture(&ctx, raw.cast());
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_ERROR_BUSY, "destroyed mid-capture");
        assert_eq!(engine::end_capture(&ctx, raw.cast()), c::CUresult::CUDA_SUCCESS, "the caller's capture was broken");
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK, "destroyed once the capture is over");
        assert_eq!(graphsafe_context_destroy(cx), GRAPHSAFE_OK);
    }
    assert_eq!(s.stat("live_streams"), streams_before, "the stream was not destroyed");
    no_violations(s);
}

/// A captured cuDNN matmul on a context no cuDNN call has touched is refused (INVALID_ARGUMENT:
/// it takes plans built before the capture only) without touching cuDNN: no library load, no
/// cudnnCreate inside the caller's capture (it allocates, which invalidates a thread-local
/// capture), and the capture still ends with nothing in it. (Before, the entry point created the
/// context's cuDNN handle first, inside the capture.)
#[test]
fn a_captured_cudnn_matmul_without_a_plan_touches_no_cudnn_inside_the_capture() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    let mut ws = GraphsafeWorkspace::default();
    let mut buf = GraphsafeBuffer::default();
    let (mut ptr, mut bytes) = (0u64, 0u64);
    // SAFETY: out-pointers to locals; handles made here; `args` is a valid description.
    unsafe {
        // Device 1: no test of this binary plans cuDNN there.
        assert_eq!(graphsafe_context_create(1, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_create(st, 1 << 20, &mut ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_create(st, 3 << 16, 1, &mut buf), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_info(buf, &mut ptr, &mut bytes), GRAPHSAFE_OK);
        let args = GraphsafeCudnnMatmulArgs {
            input_dtype: GRAPHSAFE_DTYPE_BF16,
            output_dtype: GRAPHSAFE_DTYPE_BF16,
            batch: 1,
            m: 64,
            n: 64,
            k: 64,
            a: ptr,
            a_batch: 1,
            a_strides: [64 * 64, 64, 1],
            b: ptr + (1 << 16),
            b_batch: 1,
            b_strides: [64 * 64, 64, 1],
            c: ptr + (2 << 16),
            c_strides: [64 * 64, 64, 1],
        };
        let mut cap = GraphsafeCapture::default();
        assert_eq!(graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap), GRAPHSAFE_OK);
        assert_eq!(graphsafe_capture_bind_workspace(cap, ws, std::ptr::null_mut(), std::ptr::null_mut()), GRAPHSAFE_OK);
        let r = graphsafe_cudnn_matmul_captured(cx, &args, cap, ws);
        let text = std::ffi::CStr::from_ptr(graphsafe_last_error()).to_string_lossy().into_owned();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{text}");
        assert!(text.contains("before the capture"), "{text}");
        let mut g = GraphsafeGraph::default();
        assert_eq!(graphsafe_capture_end(cap, &mut g), GRAPHSAFE_OK, "the capture was invalidated");
        let mut n = 1u64;
        assert_eq!(graphsafe_graph_node_count(g, &mut n), GRAPHSAFE_OK);
        assert_eq!(n, 0, "the refused call recorded something");
        assert_eq!(graphsafe_graph_destroy(g), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_destroy(buf), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_destroy(ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(cx), GRAPHSAFE_OK);
    }
    no_violations(s);
}

/// Host-to-device copies return once the source may be reused, as documented, also when the
/// source is page-locked memory (the driver then copies asynchronously, reading the host bytes
/// later): the stand-in's async mode reads the source at the next ordered operation, and the
/// source is overwritten right after each call. (Before, the copies returned at once, and a caller
/// reusing a pinned staging buffer, the usual pattern, got its next contents.)
#[test]
fn host_to_device_copies_have_read_their_source_when_they_return() {
    use graphsafe::capi::*;
    use graphsafe::driver::DeviceBuffer;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    s.async_htod(true);
    let mut host = vec![0x11u8; 4096];
    let b = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    b.copy_from_host(&host, &stream).unwrap();
    host.fill(0xEE);
    assert!(b.to_host_vec::<u8>(&stream).unwrap().iter().all(|&v| v == 0x11), "copy_from_host read its source after returning");
    host.fill(0x22);
    b.copy_from_host_at(1024, &host[..512], &stream).unwrap();
    host.fill(0xEE);
    let back = b.to_host_vec::<u8>(&stream).unwrap();
    assert!(back[1024..1536].iter().all(|&v| v == 0x22) && back[..1024].iter().all(|&v| v == 0x11), "copy_from_host_at read its source after returning");
    host.fill(0x33);
    let c = DeviceBuffer::from_host(&stream, &host).unwrap();
    host.fill(0xEE);
    assert!(c.to_host_vec::<u8>(&stream).unwrap().iter().all(|&v| v == 0x33), "from_host read its source after returning");
    // The C ABI's write.
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    let mut buf = GraphsafeBuffer::default();
    let mut out = vec![0u8; 4096];
    host.fill(0x44);
    // SAFETY: out-pointers to locals; host and out hold 4096 bytes; handles made here.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_create(st, 4096, 1, &mut buf), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_write(buf, 0, host.as_ptr().cast(), 4096, st), GRAPHSAFE_OK);
        host.fill(0xEE);
        assert_eq!(graphsafe_buffer_read(buf, 0, out.as_mut_ptr().cast(), 4096, st), GRAPHSAFE_OK);
        assert!(out.iter().all(|&v| v == 0x44), "graphsafe_buffer_write read its source after returning");
        assert_eq!(graphsafe_buffer_destroy(buf), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(cx), GRAPHSAFE_OK);
    }
    s.async_htod(false);
    no_violations(s);
}

/// A module is unloaded the way memory is freed: only after graphsafe's streams of its context
/// were waited for (a kernel or replay queued there may still run its code). A capture open in the
/// context does not hold it up, nor is it disturbed: its stream is not synchronized (that would
/// invalidate it), the work queued there before it began is waited for through the event recorded
/// then. (Before, the last handle's drop called cuModuleUnload at once, which the driver does not
/// promise to order after queued work; later, the unload waited for every capture of the context
/// to end.)
#[test]
fn a_module_is_unloaded_only_after_the_streams_drained_and_never_disturbs_a_capture() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    let (_g, s) = exclusive();
    // An engine's own context of device 1, which no other test of this binary uses: earlier tests
    // leave the primary contexts' frees deferred (a leaked capture, a stream dropped mid-capture).
    let _init = Context::new(1).unwrap(); // the driver initialised: the engine context exists
    // SAFETY: the stand-in's engine context lives for the whole process.
    let ctx = unsafe { Context::adopt(s.engine_context(1)) }.unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let mut other = Stream::new(&ctx).unwrap();
    // Dropped with work queued: the streams are waited for first.
    let k = TestKernels::load(&ctx).unwrap();
    k.empty(&stream).unwrap();
    let (syncs, unloads) = (s.calls("cuStreamSynchronize"), s.calls("cuModuleUnload"));
    drop(k);
    assert_eq!(s.calls("cuModuleUnload"), unloads + 1, "the module was not unloaded");
    assert!(s.calls("cuStreamSynchronize") >= syncs + 2, "unloaded without waiting for the context's streams");
    // Dropped while a capture of the context is open (one that does not launch its kernels).
    let k = TestKernels::load(&ctx).unwrap();
    k.empty(&other).unwrap();
    let cap = other.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let (unloads, event_waits) = (s.calls("cuModuleUnload"), s.calls("cuEventSynchronize"));
    drop(k);
    assert_eq!(s.calls("cuModuleUnload"), unloads + 1, "the unload waited for an unrelated capture");
    assert!(s.calls("cuEventSynchronize") > event_waits, "the capturing stream's earlier work was not waited for");
    let graph = cap.end().expect("the capture survived the module's drop");
    assert!(graph.node_kinds().unwrap().is_empty());
    drop(graph);
    no_violations(s);
}

/// A GLOBAL-mode capture forbids graphsafe's potentially unsafe calls on every thread: loading a
/// module (cuModuleLoadData allocates device memory for its code) is refused like an allocation,
/// and the capture survives. (Before, only cuMemAlloc went through the gate.)
#[test]
fn a_module_load_is_refused_on_any_thread_while_a_global_capture_is_open() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::testing::TestKernels;
    let (_g, s) = exclusive();
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let mut stream = Stream::new(&ctx).unwrap();
    let cap = stream.begin_capture(CaptureMode::Global).unwrap();
    let elsewhere = std::thread::spawn(|| TestKernels::load(&Context::new(0).unwrap()).map(drop)).join().unwrap();
    assert!(matches!(elsewhere, Err(graphsafe::Error::StreamCapturing { .. })), "a module load during a GLOBAL capture: {elsewhere:?}");
    let graph = cap.end().expect("the capture survived");
    assert_eq!(graph.node_kinds().unwrap(), vec![]);
    TestKernels::load(&ctx).expect("allowed again once the capture is over");
    no_violations(s);
}

/// A context, stream and empty workspace made through the C ABI, the sm90 W4A16 plan of [m, n, k]
/// (the stand-in is an sm90 device), and buffers made on the stream; destroyed on drop, since C ABI
/// handles are process-wide and the stand-in counts live streams across tests.
struct CapiNvfp4 {
    cx: graphsafe::capi::GraphsafeContext,
    st: graphsafe::capi::GraphsafeStream,
    ws: graphsafe::capi::GraphsafeWorkspace,
    plan: graphsafe::capi::GraphsafeNvfp4Plan,
}

impl CapiNvfp4 {
    fn new(m: i32, n: i32, k: i32) -> CapiNvfp4 {
        use graphsafe::capi::*;
        let mut f = CapiNvfp4 { cx: Default::default(), st: Default::default(), ws: Default::default(), plan: Default::default() };
        // SAFETY: out-pointers to fields; handles made here.
        unsafe {
            assert_eq!(graphsafe_context_create(0, &mut f.cx), GRAPHSAFE_OK);
            assert_eq!(graphsafe_stream_create(f.cx, &mut f.st), GRAPHSAFE_OK);
            assert_eq!(graphsafe_workspace_create(f.st, 0, &mut f.ws), GRAPHSAFE_OK);
            assert_eq!(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, m, n, k, GRAPHSAFE_DTYPE_BF16, 132, &mut f.plan), GRAPHSAFE_OK);
        }
        f
    }

    /// A zeroed buffer of `bytes` on the stream: its handle and address.
    fn buffer(&self, bytes: u64) -> (graphsafe::capi::GraphsafeBuffer, u64) {
        use graphsafe::capi::*;
        let (mut b, mut ptr) = (GraphsafeBuffer::default(), 0u64);
        // SAFETY: out-pointers to locals; a live stream.
        unsafe {
            assert_eq!(graphsafe_buffer_create(self.st, bytes, 1, &mut b), GRAPHSAFE_OK);
            assert_eq!(graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()), GRAPHSAFE_OK);
        }
        (b, ptr)
    }

    /// The workspace's capacity (a refused call must not have grown it).
    fn workspace_capacity(&self) -> u64 {
        let mut capacity = 1u64;
        // SAFETY: out-pointer to a local; a live workspace.
        assert_eq!(unsafe { graphsafe::capi::graphsafe_workspace_info(self.ws, &mut capacity, std::ptr::null_mut()) }, graphsafe::capi::GRAPHSAFE_OK);
        capacity
    }
}

impl Drop for CapiNvfp4 {
    fn drop(&mut self) {
        use graphsafe::capi::*;
        // SAFETY: handles made in new(), destroyed once.
        unsafe {
            assert_eq!(graphsafe_workspace_destroy(self.ws), GRAPHSAFE_OK);
            assert_eq!(graphsafe_stream_destroy(self.st), GRAPHSAFE_OK);
            assert_eq!(graphsafe_context_destroy(self.cx), GRAPHSAFE_OK);
        }
    }
}

/// This thread's error text for the last failed C ABI call.
fn last_error_text() -> String {
    // SAFETY: never null; valid until this thread's next failing call.
    unsafe { std::ffi::CStr::from_ptr(graphsafe::capi::graphsafe_last_error()) }.to_string_lossy().into_owned()
}

/// NVFP4 operands whose rows overlap (a row stride below the row length, more than one row) are
/// refused by the op before anything is enqueued, naming the stride: before, they passed the
/// op's checks and the kernel glue refused them after the op committed, when an eager W4A16 had
/// already grown and zero-filled its workspace.
#[test]
fn overlapping_rows_are_refused_before_anything_is_enqueued() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let (m, n, k) = (4i32, 256i32, 256i32);
    let f = CapiNvfp4::new(m, n, k);
    let (weight, _) = f.buffer(f.plan.prepared_weight_bytes);
    let (_, a) = f.buffer((m * k * 2) as u64);
    let (_, d) = f.buffer((m * n * 2) as u64);
    let (_, alpha) = f.buffer(4);
    let args = GraphsafeW4a16Args { a, lda: (k / 2) as i64, weight, n, k, alpha, d, ldd: n as i64, m };
    // SAFETY: every address is a live buffer of the sizes above; handles made here.
    let r = unsafe { graphsafe_nvfp4_w4a16_gemm(&args, f.ws, f.st) };
    let text = last_error_text();
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{text}");
    assert!(text.contains("a.strides[0]"), "{text}");
    assert_eq!(f.workspace_capacity(), 0, "the workspace grew for a call that was refused");
    let out_overlap = GraphsafeW4a16Args { lda: k as i64, ldd: (n - 16) as i64, ..args };
    // SAFETY: as above.
    assert_eq!(unsafe { graphsafe_nvfp4_w4a16_gemm(&out_overlap, f.ws, f.st) }, GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    let text = last_error_text();
    assert!(text.contains("d.strides[0]"), "{text}");
    drop(f);
    no_violations(s);
}

/// A stream graphsafe made, dropped while a capture it did not begin is open on it (an engine's,
/// on the handle taken with `Stream::raw`): it is not destroyed under that capture, which would
/// end it and lose the engine's graph; the handle is left to the engine (logged), and the
/// context's frees wait for a context synchronize as for any stream dropped unwaited. (Before,
/// the drop destroyed the stream mid-capture.)
#[test]
fn a_stream_dropped_during_a_capture_it_did_not_begin_is_not_destroyed_under_it() {
    use graphsafe::sys::cuda as c;
    use standin::engine;
    let (_g, s) = exclusive();
    let _init = Context::new(0).unwrap(); // the driver initialised: the engine context exists
    // SAFETY: the stand-in's engine context lives for the whole process.
    let ctx = unsafe { Context::adopt(s.engine_context(0)) }.unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let raw = stream.raw();
    let live = s.stat("live_streams");
    // SAFETY: a live stream of ctx.
    unsafe { engine::begin_capture(&ctx, raw) };
    drop(stream);
    assert_eq!(s.stat("live_streams"), live, "the stream was destroyed under the engine's capture");
    // SAFETY: the capture begun above; then the stream, which no wrapper holds any more.
    unsafe {
        assert_eq!(engine::end_capture(&ctx, raw), c::CUresult::CUDA_SUCCESS, "the engine's capture was lost");
        engine::destroy_stream(&ctx, raw);
    }
    ctx.synchronize().unwrap();
    no_violations(s);
}

/// An operand lying in the workspace the same call uses is refused before anything is enqueued:
/// the kernels write scratch there (split partials) while reading the operand. Safe Rust cannot
/// build one; a C caller can, with the address graphsafe_workspace_info reports. Here q_nope of an
/// MLA decode that splits (so it uses the workspace) starts at the workspace's first byte.
/// (Before, only out and lse were checked against the workspace, by the MLA op alone.)
#[test]
fn an_operand_inside_the_workspace_of_the_same_call_is_refused() {
    use graphsafe::capi::*;
    if standin::real_driver_present() {
        // Before the fix this call reached the kernel glue, whose CUDA runtime would open the real
        // driver with the stand-in's handles.
        eprintln!("SKIP: a real driver is present (see standin::real_driver_present)");
        return;
    }
    let (_g, s) = exclusive();
    let (heads, page, pages) = (16i64, 64i64, 64i64);
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    let mut ws = GraphsafeWorkspace::default();
    let mut ws_ptr = 0u64;
    // SAFETY: out-pointers to locals; handles made here; every address a live buffer (or inside
    // the live workspace) of at least the bytes the arguments describe.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_create(st, 32 << 20, &mut ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_info(ws, std::ptr::null_mut(), &mut ws_ptr), GRAPHSAFE_OK);
        let buffer = |bytes: u64| {
            let mut b = GraphsafeBuffer::default();
            let mut ptr = 0u64;
            assert_eq!(graphsafe_buffer_create(st, bytes, 1, &mut b), GRAPHSAFE_OK);
            assert_eq!(graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()), GRAPHSAFE_OK);
            ptr
        };
        let args = GraphsafeMlaDecodeArgs {
            dtype: GRAPHSAFE_DTYPE_BF16,
            batch: 1,
            num_heads: heads as i32,
            s_q: 1,
            causal: 0,
            num_kv_heads: 0,
            q_nope: ws_ptr,
            q_nope_stride_batch: heads * 512,
            q_nope_stride_token: heads * 512,
            q_nope_stride_head: 512,
            q_pe: buffer((heads * 64 * 2) as u64),
            q_pe_stride_batch: heads * 64,
            q_pe_stride_token: heads * 64,
            q_pe_stride_head: 64,
            kv_cache: buffer((pages * page * 576 * 2) as u64),
            num_pages: pages as i32,
            page_size: page as i32,
            seq_lens: buffer(4),
            page_table: buffer((pages * 4) as u64),
            max_pages: pages as i32,
            out: buffer((heads * 512 * 2) as u64),
            out_stride_batch: heads * 512,
            out_stride_token: heads * 512,
            out_stride_head: 512,
            lse: buffer((heads * 4) as u64),
            sm_scale: 0.0721,
            max_seq_len: (pages * page) as i32,
            num_splits: 0,
        };
        let mut plan = GraphsafeMlaPlan::default();
        let r = graphsafe_mla_decode(&args, ws, st, &mut plan);
        let text = std::ffi::CStr::from_ptr(graphsafe_last_error()).to_string_lossy().into_owned();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{text}");
        assert!(text.contains("q_nope") && text.contains("workspace"), "{text}");
    }
    no_violations(s);
}

/// A C caller's capture end from the wrong thread: the driver keeps a THREAD_LOCAL capture open,
/// so the status must be BUSY (the handle still valid), distinct from the DRIVER status of a failed
/// end that consumed the handle. On the old code it was DRIVER, which tells the caller to drop the
/// handle: the capture then stayed open for good (its stream busy, every free of the context
/// deferred). Ending it from the thread that began it then succeeds.
#[test]
fn a_capture_end_from_the_wrong_thread_is_busy_and_keeps_the_handle() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_stream_create(cx, &mut st) }, GRAPHSAFE_OK);
    let mut cap = GraphsafeCapture::default();
    assert_eq!(unsafe { graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap) }, GRAPHSAFE_OK);
    for destroy in [false, true] {
        let (r, text) = std::thread::spawn(move || {
            let r = if destroy {
                unsafe { graphsafe_capture_destroy(cap) }
            } else {
                let mut g = GraphsafeGraph::default();
                unsafe { graphsafe_capture_end(cap, &mut g) }
            };
            (r, unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned())
        })
        .join()
        .unwrap();
        let what = if destroy { "graphsafe_capture_destroy" } else { "graphsafe_capture_end" };
        assert_eq!(r, GRAPHSAFE_ERROR_BUSY, "{what} from another thread: {text}");
        assert!(text.contains("still open"), "{what}: the error does not say the capture is still open: {text}");
    }
    let mut g = GraphsafeGraph::default();
    assert_eq!(unsafe { graphsafe_capture_end(cap, &mut g) }, GRAPHSAFE_OK, "the handle was lost");
    assert_eq!(unsafe { graphsafe_graph_destroy(g) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_stream_synchronize(st) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_stream_destroy(st) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_context_destroy(cx) }, GRAPHSAFE_OK);
    no_violations(s);
}

/// The address of a graphsafe buffer destroyed while its free cannot happen yet (here: an engine
/// captures on an adopted stream of the context, which no free may wait for): the driver still
/// reports it allocated, but it is dead. Passed to a captured op as a raw pointer it must be
/// refused (INVALID_ARGUMENT, nothing captured); on the old code it passed as the caller's own
/// memory, the capture kept nothing alive, and the graph's replays wrote into memory freed when
/// the free went through. The same for an old workspace address after the workspace grew.
#[test]
fn a_destroyed_buffer_whose_free_waits_is_refused_as_a_raw_pointer() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let mut cx = GraphsafeContext::default();
    let mut st = [GraphsafeStream::default(); 2];
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    for x in &mut st {
        assert_eq!(unsafe { graphsafe_stream_create(cx, x) }, GRAPHSAFE_OK);
    }
    let buffer = |bytes: u64| {
        let mut b = GraphsafeBuffer::default();
        assert_eq!(unsafe { graphsafe_buffer_create(st[0], bytes, 1, &mut b) }, GRAPHSAFE_OK);
        let mut ptr = 0u64;
        assert_eq!(unsafe { graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()) }, GRAPHSAFE_OK);
        (b, ptr)
    };
    let (heads, page) = (16i64, 64i64);
    let (out_b, out) = buffer((heads * 512 * 2) as u64);
    let mut keep = Vec::new();
    let mut buf = |bytes: i64| {
        let (b, p) = buffer(bytes as u64);
        keep.push(b);
        p
    };
    let args = GraphsafeMlaDecodeArgs {
        dtype: GRAPHSAFE_DTYPE_BF16,
        batch: 1,
        num_heads: heads as i32,
        s_q: 1,
        causal: 0,
        num_kv_heads: 0,
        q_nope: buf(heads * 512 * 2),
        q_nope_stride_batch: heads * 512,
        q_nope_stride_token: heads * 512,
        q_nope_stride_head: 512,
        q_pe: buf(heads * 64 * 2),
        q_pe_stride_batch: heads * 64,
        q_pe_stride_token: heads * 64,
        q_pe_stride_head: 64,
        kv_cache: buf(page * 576 * 2),
        num_pages: 1,
        page_size: page as i32,
        seq_lens: buf(4),
        page_table: buf(4),
        max_pages: 1,
        out,
        out_stride_batch: heads * 512,
        out_stride_token: heads * 512,
        out_stride_head: 512,
        lse: buf(heads * 4),
        sm_scale: 0.0721,
        max_seq_len: 64,
        num_splits: 1,
    };
    let mut ws = GraphsafeWorkspace::default();
    assert_eq!(unsafe { graphsafe_workspace_create(st[0], 1 << 16, &mut ws) }, GRAPHSAFE_OK);
    let (mut old_ws, mut cap_bytes) = (0u64, 0u64);
    assert_eq!(unsafe { graphsafe_workspace_info(ws, &mut cap_bytes, &mut old_ws) }, GRAPHSAFE_OK);
    // The engine's stream, adopted, then captured by the engine: frees of the context wait.
    let ctx0 = Context::new(0).unwrap();
    let engine_stream = standin::engine::create_stream(&ctx0);
    let mut adopted = GraphsafeStream::default();
    assert_eq!(unsafe { graphsafe_stream_adopt(cx, engine_stream.cast(), &mut adopted) }, GRAPHSAFE_OK);
    // SAFETY: a live stream of ctx0.
    unsafe { standin::engine::begin_capture(&ctx0, engine_stream) };
    let mut cap = GraphsafeCapture::default();
    assert_eq!(unsafe { graphsafe_capture_begin(st[1], GRAPHSAFE_CAPTURE_RELAXED, &mut cap) }, GRAPHSAFE_OK);
    let live = s.live_allocations();
    assert_eq!(unsafe { graphsafe_buffer_destroy(out_b) }, GRAPHSAFE_OK);
    let mut grew = 0;
    assert_eq!(unsafe { graphsafe_workspace_ensure_size(ws, 1 << 20, st[0], &mut grew) }, GRAPHSAFE_OK);
    assert_eq!(grew, 1);
    assert_eq!(s.live_allocations(), live + 1, "the frees were not deferred while the engine captures");
    let mut other_ws = GraphsafeWorkspace::default();
    assert_eq!(unsafe { graphsafe_workspace_create(st[0], 0, &mut other_ws) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_capture_bind_workspace(cap, other_ws, std::ptr::null_mut(), std::ptr::null_mut()) }, GRAPHSAFE_OK);
    for (what, a) in [("out", GraphsafeMlaDecodeArgs { out: args.out + 64, ..args }), ("lse", GraphsafeMlaDecodeArgs { lse: old_ws, ..args })] {
        let r = unsafe { graphsafe_mla_decode_captured(&a, cap, other_ws, std::ptr::null_mut()) };
        let text = unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{what} in memory destroyed during the capture: {text}");
        assert!(text.contains("destroyed"), "{what}: the error does not say the memory was destroyed: {text}");
    }
    // SAFETY: the engine's capture, begun above.
    assert_eq!(unsafe { standin::engine::end_capture(&ctx0, engine_stream) }, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
    let mut g = GraphsafeGraph::default();
    assert_eq!(unsafe { graphsafe_capture_end(cap, &mut g) }, GRAPHSAFE_OK);
    let mut nodes = 0u64;
    assert_eq!(unsafe { graphsafe_graph_node_count(g, &mut nodes) }, GRAPHSAFE_OK);
    assert_eq!(nodes, 0, "a refused call captured work");
    assert_eq!(unsafe { graphsafe_graph_destroy(g) }, GRAPHSAFE_OK);
    assert_eq!(s.live_allocations(), live - 1, "the deferred frees did not go through once they could");
    assert_eq!(unsafe { graphsafe_stream_destroy(adopted) }, GRAPHSAFE_OK);
    // SAFETY: its wrapper is gone.
    unsafe { standin::engine::destroy_stream(&ctx0, engine_stream) };
    for b in keep {
        assert_eq!(unsafe { graphsafe_buffer_destroy(b) }, GRAPHSAFE_OK);
    }
    for w in [ws, other_ws] {
        assert_eq!(unsafe { graphsafe_workspace_destroy(w) }, GRAPHSAFE_OK);
    }
    for x in st {
        assert_eq!(unsafe { graphsafe_stream_destroy(x) }, GRAPHSAFE_OK);
    }
    assert_eq!(unsafe { graphsafe_context_destroy(cx) }, GRAPHSAFE_OK);
    no_violations(s);
}

/// NVFP4 outputs overlapping what the same call reads or writes elsewhere: W4A16's d over its
/// alpha or activations, a quantize whose codes and scales share memory or overlap its input.
/// Other CTAs still read (or write) those bytes while one writes, so the result would depend on
/// timing; refused before anything is enqueued (the workspace not grown). All were accepted on
/// the old code.
#[test]
fn nvfp4_outputs_overlapping_their_inputs_are_refused_before_anything_is_enqueued() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let (m, n, k) = (4i32, 256i32, 256i32);
    let f = CapiNvfp4::new(m, n, k);
    let refused = |r: i32, says: &str| {
        let text = last_error_text();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{says}: {text}");
        assert!(text.contains(says), "the error does not name {says}: {text}");
    };
    let (weight, _) = f.buffer(f.plan.prepared_weight_bytes);
    let (_, a) = f.buffer((m * k * 2) as u64);
    let (_, d) = f.buffer((m * n * 2) as u64 + 64);
    let args = GraphsafeW4a16Args { a, lda: k as i64, weight, n, k, alpha: d + (m * n * 2) as u64 - 16, d, ldd: n as i64, m };
    // SAFETY (every call below): each address lies in a live buffer of the sizes made here.
    let gemm = |args: &GraphsafeW4a16Args| unsafe { graphsafe_nvfp4_w4a16_gemm(args, f.ws, f.st) };
    refused(gemm(&args), "memory that does not overlap alpha");
    refused(gemm(&GraphsafeW4a16Args { a: d, alpha: d + (m * n * 2) as u64, ..args }), "memory that does not overlap a");
    assert_eq!(f.workspace_capacity(), 0, "the workspace grew for a call that was refused");

    let mut scale_bytes = 0u64;
    // SAFETY: out-pointer to a local.
    assert_eq!(unsafe { graphsafe_nvfp4_scale_bytes(m, k, &mut scale_bytes) }, GRAPHSAFE_OK);
    let (_, x) = f.buffer((m * k * 2) as u64);
    let (_, out) = f.buffer((m * k / 2) as u64 + scale_bytes + 16);
    let good = GraphsafeNvfp4Matrix { packed: out, scales: out + (m * k / 2) as u64, global_scale: out + (m * k / 2) as u64 + scale_bytes, rows: m, k };
    let launches = s.calls("cuLaunchKernel") + s.calls("cuLaunchKernelEx");
    // SAFETY: as above.
    let q = |o: &GraphsafeNvfp4Matrix, x: u64| unsafe { graphsafe_nvfp4_quantize(x, GRAPHSAFE_DTYPE_BF16, m, k, k as i64, o, f.st) };
    refused(q(&GraphsafeNvfp4Matrix { scales: out, ..good }, x), "out.packed");
    refused(q(&GraphsafeNvfp4Matrix { global_scale: good.scales, ..good }, x), "out.scales");
    refused(q(&good, out), "memory that does not overlap x");
    assert_eq!(s.calls("cuLaunchKernel") + s.calls("cuLaunchKernelEx"), launches, "a refused quantize launched");
    // The well-formed quantize gets past validation (on the stand-in the glue's CUDA runtime
    // then fails: it opens the real driver).
    assert_ne!(q(&good, x), GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{}", last_error_text());
    drop(f);
    no_violations(s);
}

/// Every op and copy that writes refuses an output overlapping what the same call reads, before
/// anything is enqueued or captured: the split-K test kernel's `y` over `x` (other CTAs still read
/// x while y is written: reference 128, got 16448 on the old code) or over `a`, eager and
/// captured; NVFP4's global scale with `out` inside `x` (the glue zeroes `out` before the amax
/// kernel reads `x`); a device copy from a buffer onto itself, eager and captured (overlapping
/// ranges are undefined for cuMemcpy). All were accepted on the old code.
#[test]
fn outputs_overlapping_what_the_same_call_reads_are_refused_before_anything_is_enqueued() {
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::nvfp4;
    use graphsafe::ops::tensor::{DType, Tensor};
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let shape = soundness::SHAPE;
    let p = soundness::problem(&stream, 9);
    let mut ws = Workspace::new(&stream, shape.workspace_bytes().unwrap()).unwrap();
    let enqueued = || {
        ["cuLaunchKernel", "cuLaunchKernelEx", "cuMemsetD8Async", "cuMemsetD32Async", "cuMemcpyDtoDAsync"].iter().map(|e| s.calls(e)).sum::<i64>()
    };
    #[track_caller]
    fn refused<T: std::fmt::Debug>(r: graphsafe::Result<T>, names: &str) {
        match r {
            Err(graphsafe::Error::InvalidArgument { what, .. }) => assert_eq!(what, names, "the refusal names the output"),
            other => panic!("an output overlapping an input of the same call was not refused: {other:?}"),
        }
    }
    let before = enqueued();
    refused(k.split_k_gemv(&p.a, &p.x, &p.x, shape, &mut ws, &stream), "y");
    refused(k.split_k_gemv(&p.a, &p.x, &p.a, shape, &mut ws, &stream), "y");
    refused(p.y.copy_from_device(&p.y, &stream), "src");
    refused(p.y.copy_from_device(&p.y.clone(), &stream), "src");
    let x16 = Tensor::contiguous(&p.a, DType::Bf16, &[1024]);
    refused(nvfp4::global_scale(&x16, &p.a, &stream), "out");
    assert_eq!(enqueued(), before, "a refused call enqueued work");
    // A copy between two distinct buffers is still fine.
    p.x.copy_from_device(&p.y, &stream).unwrap_or_else(|e| panic!("{e}"));

    let (graph, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let w = cap.bind_workspace(&mut ws)?;
            let (ca, cx) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?);
            refused(k.split_k_gemv_captured(&ca, &cx, &cx, shape, &w, cap), "y");
            refused(cap.copy(&cx, &cx), "src");
            Ok(())
        })
        .unwrap();
    assert!(graph.node_kinds().unwrap().is_empty(), "a refused captured call left a node: {:?}", graph.node_kinds());
    no_violations(s);
}

/// A refusal names what differs. Two contexts of one device (the primary one and an engine's
/// own) used to read "expected a stream on device 0, got a stream on device 0"; the texts now
/// name both contexts. A negative dimension given to the C ABI used to be reported as the matrix
/// (`a`, `x`) rather than the dimension (`m`, `k`, `a.rows`).
#[test]
fn refusals_name_what_differs() {
    use graphsafe::capi::*;
    use graphsafe::driver::DeviceBuffer;
    let (_g, s) = exclusive();
    let primary = Context::new(0).expect("the stand-in's device 0");
    let on_primary = Stream::new(&primary).unwrap();
    // SAFETY: the stand-in's engine context of device 0 lives for the process.
    let engine = unsafe { Context::adopt(s.engine_context(0)) }.unwrap();
    let on_engine = Stream::new(&engine).unwrap();
    let buf = DeviceBuffer::alloc_zeroed(&on_primary, 64).unwrap();
    let other = DeviceBuffer::alloc_zeroed(&on_engine, 64).unwrap();
    let names_both = |r: graphsafe::Result<()>, call: &str| {
        let e = r.expect_err(call);
        let text = e.to_string();
        let (p, g) = (format!("{:?}", primary.raw()), format!("{:?}", engine.raw()));
        assert!(text.contains(&p) && text.contains(&g), "{call}: the refusal does not name both contexts ({p}, {g}): {text}");
    };
    names_both(buf.memset_u8(0, &on_engine), "memset_u8 on a stream of another context of the device");
    names_both(buf.copy_from_device(&other, &on_primary), "copy_from_device from a buffer of another context");

    let (m, n, k) = (4i32, 256i32, 256i32);
    let f = CapiNvfp4::new(m, n, k);
    let (weight, _) = f.buffer(f.plan.prepared_weight_bytes);
    let (_, a) = f.buffer((m * k * 2) as u64);
    let (_, d) = f.buffer((m * n * 2) as u64);
    let (_, alpha) = f.buffer(4);
    let args = GraphsafeW4a16Args { a, lda: k as i64, weight, n, k, alpha, d, ldd: n as i64, m };
    let names = |r: i32, dim: &str| {
        let text = last_error_text();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{text}");
        assert!(text.starts_with(&format!("invalid argument `{dim}`")), "the refusal does not name `{dim}`: {text}");
    };
    // SAFETY (each call): every address is a live buffer of the sizes above; handles made here.
    names(unsafe { graphsafe_nvfp4_w4a16_gemm(&GraphsafeW4a16Args { m: -1, ..args }, f.ws, f.st) }, "m");
    names(unsafe { graphsafe_nvfp4_w4a16_gemm(&GraphsafeW4a16Args { k: -1, ..args }, f.ws, f.st) }, "k");
    let mut scale_bytes = 0u64;
    // SAFETY: out-pointer to a local.
    assert_eq!(unsafe { graphsafe_nvfp4_scale_bytes(m, k, &mut scale_bytes) }, GRAPHSAFE_OK);
    let (_, out) = f.buffer((m * k / 2) as u64 + scale_bytes + 16);
    let q = GraphsafeNvfp4Matrix { packed: out, scales: out + (m * k / 2) as u64, global_scale: out + (m * k / 2) as u64 + scale_bytes, rows: m, k };
    names(unsafe { graphsafe_nvfp4_quantize(a, GRAPHSAFE_DTYPE_BF16, -1, k, k as i64, &q, f.st) }, "m");
    names(unsafe { graphsafe_nvfp4_quantize(a, GRAPHSAFE_DTYPE_BF16, m, -1, k as i64, &q, f.st) }, "k");
    names(unsafe { graphsafe_nvfp4_quantize(a, GRAPHSAFE_DTYPE_BF16, m, k, k as i64, &GraphsafeNvfp4Matrix { rows: -1, ..q }, f.st) }, "out.rows");
    drop((f, buf, other));
    no_violations(s);
}

/// Invariant 7's run-time half, which the README claims: `Stream::adopt` (and the C ABI's
/// `graphsafe_stream_adopt`) refuses the legacy stream (null, and its `CU_STREAM_LEGACY` handle 1)
/// and the per-thread default stream (`CU_STREAM_PER_THREAD`, 2): work there synchronizes with
/// every other stream, and a capture on it is not graphsafe's to make safe. Nothing is wrapped.
#[test]
fn adopting_the_legacy_or_per_thread_stream_is_refused() {
    use graphsafe::capi::*;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let (mut cx, mut st) = (GraphsafeContext::default(), GraphsafeStream::default());
    // SAFETY: out-pointer to a local.
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    let queries = s.calls("cuStreamGetCtx");
    for (name, raw) in [("null (legacy)", 0usize), ("CU_STREAM_LEGACY", 1), ("CU_STREAM_PER_THREAD", 2)] {
        let handle = raw as graphsafe::sys::cuda::CUstream;
        // SAFETY: the handles are the driver's special values, refused before any use.
        match unsafe { Stream::adopt(&ctx, handle) } {
            Err(graphsafe::Error::InvalidArgument { what, expected, .. }) => {
                assert_eq!(what, "stream", "{name}");
                assert!(expected.contains("legacy and per-thread"), "{name}: {expected}");
            }
            other => panic!("Stream::adopt accepted {name}: {other:?}"),
        }
        // SAFETY: as above; out-pointer to a local.
        assert_eq!(unsafe { graphsafe_stream_adopt(cx, handle.cast(), &mut st) }, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "graphsafe_stream_adopt of {name}");
    }
    assert_eq!(s.calls("cuStreamGetCtx"), queries, "a refused handle reached the driver");
    // SAFETY: made above.
    assert_eq!(unsafe { graphsafe_context_destroy(cx) }, GRAPHSAFE_OK);
    no_violations(s);
}

/// `Graph` and `GraphExec` are `Send` (the README's claim; they are not `Sync`,
/// tests/compile_fail/graphs_are_not_sync.rs): an engine builds graphs on one thread and replays
/// or drops them on another. Checked by the type system and on the stand-in: an executable moved
/// to another thread replays there into the buffer its graph captured, and both are dropped there.
#[test]
fn graphs_and_executables_are_send() {
    use graphsafe::graph::{CaptureMode, Graph, GraphExec};
    use graphsafe::ops::testing::TestKernels;
    use graphsafe::workspace::Workspace;
    fn send<T: Send>() {}
    send::<Graph>();
    send::<GraphExec>();
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let shape = soundness::SHAPE;
    let p = soundness::problem(&stream, 17);
    let mut ws = Workspace::new(&stream, shape.workspace_bytes().unwrap()).unwrap();
    let (graph, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let w = cap.bind_workspace(&mut ws)?;
            let (a, x, y) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
            cap.memset_u8(&y, 0)?;
            k.split_k_gemv_captured(&a, &x, &y, shape, &w, cap)
        })
        .unwrap();
    let exec = graph.instantiate().unwrap();
    let y = p.y.clone();
    let got = std::thread::spawn(move || {
        let other = Stream::new(stream.context()).unwrap();
        exec.launch(&other).unwrap();
        let got = y.to_host_vec::<f32>(&other).unwrap();
        drop((exec, graph));
        got
    })
    .join()
    .unwrap();
    assert_eq!(got, p.expected, "the replay on the other thread");
    no_violations(s);
}

/// A host copy waits for its stream on every path that enqueued it: a failing check before the
/// wait (an injected `cuStreamIsCapturing` failure, as the wait used to run the capture check
/// first) or a failing wait (`cuStreamSynchronize`, once) must not return while the copy may still
/// read the caller's source. The stand-in's async mode reads page-locked sources at the next
/// ordered operation; the source is overwritten right after each call, whatever it returned, and
/// the device must hold the bytes of the call. The call may report the failure (Err), never with
/// the copy in flight. (On the old code the call returned Err at once and the device then held
/// the overwritten bytes; for `copy_to_host` into page-locked memory the device would write the
/// destination after its borrow ended.)
#[test]
fn host_copies_wait_for_their_stream_even_when_a_check_or_the_wait_fails() {
    use graphsafe::capi::*;
    use graphsafe::driver::DeviceBuffer;
    use graphsafe::sys::cuda::CUresult;
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    let b = DeviceBuffer::alloc_zeroed(&stream, 4096).unwrap();
    let (mut cx, mut st, mut cb) = (GraphsafeContext::default(), GraphsafeStream::default(), GraphsafeBuffer::default());
    // SAFETY: out-pointers to locals; handles made here, destroyed below.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_buffer_create(st, 4096, 1, &mut cb), GRAPHSAFE_OK);
    }
    // Each failure once, on the call that comes after the copy was enqueued: the second
    // cuStreamIsCapturing of a copy (its first is the check before the copy), and the first
    // cuStreamSynchronize.
    let failures = [("cuStreamIsCapturing", 1, CUresult::CUDA_ERROR_UNKNOWN), ("cuStreamSynchronize", 0, CUresult::CUDA_ERROR_UNKNOWN)];
    let mut host = vec![0u8; 4096];
    let mut seen = Vec::new();
    for (i, &(entry, after, code)) in failures.iter().enumerate() {
        for call in ["copy_from_host", "copy_from_host_at", "graphsafe_buffer_write"] {
            let value = 0x10 + i as u8;
            host.fill(value);
            s.async_htod(true);
            s.fail(entry, after, code);
            let ok = match call {
                "copy_from_host" => b.copy_from_host(&host, &stream).is_ok(),
                "copy_from_host_at" => b.copy_from_host_at(0, &host, &stream).is_ok(),
                // SAFETY: `host` holds 4096 readable bytes; a live buffer and stream.
                _ => (unsafe { graphsafe_buffer_write(cb, 0, host.as_ptr().cast(), 4096, st) }) == GRAPHSAFE_OK,
            };
            s.fail_repeat(entry, 0, 0, CUresult::CUDA_SUCCESS); // disarmed, had it not fired
            host.fill(0xEE);
            s.async_htod(false); // the copies still pending read the host now
            let mut back = vec![0u8; 4096];
            if call.starts_with("graphsafe") {
                // SAFETY: `back` holds 4096 writable bytes; live handles.
                assert_eq!(unsafe { graphsafe_buffer_read(cb, 0, back.as_mut_ptr().cast(), 4096, st) }, GRAPHSAFE_OK);
            } else {
                b.copy_to_host(&mut back, &stream).unwrap();
            }
            seen.push(format!("{call} with {entry} failing: returned {}, device holds {:#x}", if ok { "Ok" } else { "Err" }, back[0]));
            assert!(back.iter().all(|&v| v == value), "{call} with {entry} failing returned ({}) before its copy read the source: the device holds {:#x}, not {value:#x}", if ok { "Ok" } else { "Err" }, back[0]);
        }
    }
    eprintln!("{seen:#?}");
    // SAFETY: made above.
    unsafe {
        assert_eq!(graphsafe_buffer_destroy(cb), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_destroy(st), GRAPHSAFE_OK);
        assert_eq!(graphsafe_context_destroy(cx), GRAPHSAFE_OK);
    }
    no_violations(s);
}

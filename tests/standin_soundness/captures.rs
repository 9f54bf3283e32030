//! Captures and graphs: begin and end under failures, replays into captures graphsafe did not
//! begin, raw launches into a capture, and graph families across threads.

use super::*;

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

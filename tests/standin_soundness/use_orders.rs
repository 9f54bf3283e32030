//! Workspace uses across streams (invariant 3): every use ordered after the previous one, the
//! previous stream never touched, and no deadlock between use orders, the free gate and captures.

use super::*;

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

//! Host copies and module unloads: a copy has read its source when it returns, and a module is
//! unloaded only once the work that may run its code drained, never disturbing a capture.

use super::*;

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

//! Streams: one wrapper per handle, what a stream's drop waits for, and the streams no capture may
//! be begun on (the legacy ones, one another code is capturing).

use super::*;

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

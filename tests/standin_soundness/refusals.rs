//! What an op refuses before anything is enqueued or captured, through the Rust API and the C ABI:
//! overlapping operands, an operand inside the call's workspace, freed memory as a raw pointer, a
//! captured cuDNN matmul without a plan; each refusal names what differs.

use super::*;

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

    /// W4A16 arguments over fresh buffers of the plan's sizes with dense rows (`lda` k, `ldd`
    /// n): a prepared weight, `a`, `d` and `alpha`, each its own buffer.
    fn dense_w4a16(&self, m: i32, n: i32, k: i32) -> graphsafe::capi::GraphsafeW4a16Args {
        let (weight, _) = self.buffer(self.plan.prepared_weight_bytes);
        let (_, a) = self.buffer((m * k * 2) as u64);
        let (_, d) = self.buffer((m * n * 2) as u64);
        let (_, alpha) = self.buffer(4);
        graphsafe::capi::GraphsafeW4a16Args { a, lda: k as i64, weight, n, k, alpha, d, ldd: n as i64, m }
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
    let args = GraphsafeW4a16Args { lda: (k / 2) as i64, ..f.dense_w4a16(m, n, k) };
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

/// The stand-in to itself and a C-ABI stream on it, for the workspace refusals below; `None` (the
/// skip printed) where a real driver is present: without the refusals these calls reach the
/// kernel glue, whose CUDA runtime would open the real driver with the stand-in's handles.
fn c_refusal_stream() -> Option<(std::sync::MutexGuard<'static, ()>, &'static standin::Standin, graphsafe::capi::GraphsafeStream)> {
    if standin::real_driver_present() {
        eprintln!("SKIP: a real driver is present (see standin::real_driver_present)");
        return None;
    }
    let (g, s) = exclusive();
    Some((g, s, c_stream()))
}

/// A C-ABI context of device 0 and a stream of it, for the workspace refusals below.
fn c_stream() -> graphsafe::capi::GraphsafeStream {
    use graphsafe::capi::*;
    let mut cx = GraphsafeContext::default();
    let mut st = GraphsafeStream::default();
    // SAFETY: out-pointers to locals.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut cx), GRAPHSAFE_OK);
        assert_eq!(graphsafe_stream_create(cx, &mut st), GRAPHSAFE_OK);
    }
    st
}

/// The MLA decode the C-ABI workspace refusals call: bf16, one request, 16 heads, a cache of 64
/// pages of 64 tokens, every operand a fresh buffer of `st` (tests then point one into a workspace).
fn c_mla_args(st: graphsafe::capi::GraphsafeStream) -> graphsafe::capi::GraphsafeMlaDecodeArgs {
    use graphsafe::capi::*;
    let (heads, page, pages) = (16i64, 64i64, 64i64);
    let buffer = |bytes: u64| {
        let mut b = GraphsafeBuffer::default();
        let mut ptr = 0u64;
        // SAFETY: out-pointers to locals; `st` is a live stream handle.
        unsafe {
            assert_eq!(graphsafe_buffer_create(st, bytes, 1, &mut b), GRAPHSAFE_OK);
            assert_eq!(graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()), GRAPHSAFE_OK);
        }
        ptr
    };
    GraphsafeMlaDecodeArgs {
        dtype: GRAPHSAFE_DTYPE_BF16,
        batch: 1,
        num_heads: heads as i32,
        s_q: 1,
        q_nope: buffer((heads * 512 * 2) as u64),
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
        ..Default::default()
    }
}

/// An operand lying in the workspace the same call uses is refused before anything is enqueued:
/// the kernels write scratch there (split partials) while reading the operand. Safe Rust cannot
/// build one; a C caller can, with the address graphsafe_workspace_info reports. Here q_nope of an
/// MLA decode that splits (so it uses the workspace) starts at the workspace's first byte.
/// (Before, only out and lse were checked against the workspace, by the MLA op alone.)
#[test]
fn an_operand_inside_the_workspace_of_the_same_call_is_refused() {
    use graphsafe::capi::*;
    let Some((_g, s, st)) = c_refusal_stream() else { return };
    let mut ws = GraphsafeWorkspace::default();
    let mut ws_ptr = 0u64;
    // SAFETY: out-pointers to locals; handles made here; every address a live buffer (or inside
    // the live workspace) of at least the bytes the arguments describe.
    unsafe {
        assert_eq!(graphsafe_workspace_create(st, 32 << 20, &mut ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_info(ws, std::ptr::null_mut(), &mut ws_ptr), GRAPHSAFE_OK);
        let args = GraphsafeMlaDecodeArgs { q_nope: ws_ptr, ..c_mla_args(st) };
        let mut plan = GraphsafeMlaPlan::default();
        let r = graphsafe_mla_decode(&args, ws, st, &mut plan);
        let text = last_error_text();
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{text}");
        assert!(text.contains("q_nope") && text.contains("workspace"), "{text}");
    }
    no_violations(s);
}

/// An operand lying in another workspace is refused, live or retired: its kernels' scratch
/// (another call's batch schedule and split partials, which the kernels read as trusted indices)
/// would be overwritten by this call with no order between the two, since an operand joins no
/// workspace's use order. A C caller can get such an address from graphsafe_workspace_info, also
/// one cached before the workspace grew (the graph that captured it keeps the old buffer alive).
#[test]
fn an_operand_inside_another_workspace_live_or_retired_is_refused() {
    use graphsafe::capi::*;
    let Some((_g, s, st)) = c_refusal_stream() else { return };
    let (mut ws, mut other) = (GraphsafeWorkspace::default(), GraphsafeWorkspace::default());
    let mut other_ptr = 0u64;
    // SAFETY: out-pointers to locals; handles made here; every address a live buffer (or inside
    // a live workspace's buffer, current or kept by a graph) of at least the bytes the arguments
    // describe.
    unsafe {
        assert_eq!(graphsafe_workspace_create(st, 32 << 20, &mut ws), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_create(st, 1 << 20, &mut other), GRAPHSAFE_OK);
        assert_eq!(graphsafe_workspace_info(other, std::ptr::null_mut(), &mut other_ptr), GRAPHSAFE_OK);
        let args = GraphsafeMlaDecodeArgs { out: other_ptr, ..c_mla_args(st) };
        let refused = |r: i32, what: &str| {
            let text = last_error_text();
            assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{what}: {text}");
            assert!(text.contains("out") && text.contains("workspace"), "{what}: {text}");
        };
        let eager = |args: &GraphsafeMlaDecodeArgs| graphsafe_mla_decode(args, ws, st, std::ptr::null_mut());
        refused(eager(&args), "out in another live workspace");
        // Captured, with `ws` bound: `other` is not, and its use order is not the graph's.
        let mut cap = GraphsafeCapture::default();
        let mut graph = GraphsafeGraph::default();
        assert_eq!(graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap), GRAPHSAFE_OK);
        assert_eq!(graphsafe_capture_bind_workspace(cap, ws, std::ptr::null_mut(), std::ptr::null_mut()), GRAPHSAFE_OK);
        refused(graphsafe_mla_decode_captured(&args, cap, ws, std::ptr::null_mut()), "captured, out in another workspace");
        assert_eq!(graphsafe_capture_end(cap, &mut graph), GRAPHSAFE_OK);
        let mut nodes = u64::MAX;
        assert_eq!(graphsafe_graph_node_count(graph, &mut nodes), GRAPHSAFE_OK);
        assert_eq!(nodes, 0, "the refused captured call recorded work");
        assert_eq!(graphsafe_graph_destroy(graph), GRAPHSAFE_OK);
        // A graph captures `other`'s buffer, then `other` grows: the old buffer is retired and
        // kept alive by the graph, its address still known to the driver and to graphsafe.
        assert_eq!(graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap), GRAPHSAFE_OK);
        assert_eq!(graphsafe_capture_bind_workspace(cap, other, std::ptr::null_mut(), std::ptr::null_mut()), GRAPHSAFE_OK);
        assert_eq!(graphsafe_capture_end(cap, &mut graph), GRAPHSAFE_OK);
        let mut grew = 0;
        assert_eq!(graphsafe_workspace_ensure_size(other, 4 << 20, st, &mut grew), GRAPHSAFE_OK);
        assert_eq!(grew, 1);
        let mut now = 0u64;
        assert_eq!(graphsafe_workspace_info(other, std::ptr::null_mut(), &mut now), GRAPHSAFE_OK);
        assert_ne!(now, other_ptr, "growth retires the buffer, never resizes it");
        refused(eager(&args), "out in a retired workspace buffer a graph keeps");
        refused(eager(&GraphsafeMlaDecodeArgs { out: now + 4096, ..args }), "out inside another workspace's current buffer");
        assert_eq!(graphsafe_graph_destroy(graph), GRAPHSAFE_OK);
    }
    no_violations(s);
}

/// The address of a graphsafe buffer destroyed while its free cannot happen yet (here: an engine
/// captures on an adopted stream of the context, which no free may wait for): the driver still
/// reports it allocated, but it is dead. Passed to a captured op as a raw pointer it must be
/// refused (INVALID_ARGUMENT, nothing captured); on the old code it passed as the caller's own
/// memory, the capture kept nothing alive, and the graph's replays wrote into memory freed when
/// the free went through. The same for an old workspace address after the workspace grew. Nor may
/// it be adopted (`DeviceBuffer::adopt`) as foreign memory: before, that succeeded.
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
        ..Default::default()
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
    // Nor may the dead buffer's address be adopted as foreign memory: its deferred free would give
    // it back under the adopted buffer's graphs, whatever the new owner promises.
    // SAFETY: the call under test; it must refuse before relying on the promise (which is false).
    match unsafe { graphsafe::driver::DeviceBuffer::adopt(&ctx0, out, 64, ()) } {
        Err(graphsafe::Error::InvalidArgument { got, .. }) => assert!(got.contains("giving back"), "{got}"),
        other => panic!("adopting the address of a buffer whose free is deferred: {:?}", other.map(|b| b.len())),
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
    let args = f.dense_w4a16(m, n, k);
    let a = args.a;
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

//! Two devices on the stand-in driver (tests/standin), on the CPU:
//!
//! * invariant 12 — every call that has to make a context current restores the caller's current
//!   context (none, or another device's) before it returns, through the Rust API and the C ABI;
//! * objects of one device are refused with another device's stream or capture, instead of
//!   reaching the driver (on the stand-in, a kernel touching another device's memory is a counted
//!   violation, as it is an illegal address on a GPU without peer access).
#![allow(unused_unsafe)]

mod common;
mod standin;

use common::random_f32;
use graphsafe::capi::*;
use graphsafe::driver::{Context, DeviceBuffer, Event, MemInfo, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::sys::cuda as c;
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use standin::exclusive;

const SHAPE: SplitKShape = SplitKShape { m: 130, k: 64, splits: 4 };

fn current() -> c::CUcontext {
    let f = graphsafe::sys::driver::api().unwrap().cuCtxGetCurrent().unwrap().f;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    assert_eq!(unsafe { f(&mut ctx) }, c::CUresult::CUDA_SUCCESS);
    ctx
}

fn set_current(ctx: c::CUcontext) {
    let f = graphsafe::sys::driver::api().unwrap().cuCtxSetCurrent().unwrap().f;
    // SAFETY: null or a retained primary context of the stand-in.
    assert_eq!(unsafe { f(ctx) }, c::CUresult::CUDA_SUCCESS);
}

#[test]
fn every_call_that_makes_a_context_current_restores_the_callers() {
    let (_g, s) = exclusive();
    let ctx0 = Context::new(0).unwrap();
    let ctx1 = Context::new(1).unwrap();
    let mut left = Vec::new();
    for (who, caller) in [("no context", std::ptr::null_mut()), ("device 1's context", ctx1.raw())] {
        set_current(caller);
        let mut step = |name: &str| {
            let now = current();
            if now != caller {
                left.push(format!("{name} (the caller had {who})"));
                set_current(caller);
            }
        };
        let mut stream = Stream::new(&ctx0).unwrap();
        step("Stream::new");
        let k = TestKernels::load(&ctx0).unwrap();
        step("TestKernels::load (cuModuleLoadData, cuModuleGetFunction)");
        let host = random_f32((SHAPE.m * SHAPE.k) as usize, 1);
        let a = DeviceBuffer::from_host(&stream, &host).unwrap();
        step("DeviceBuffer::from_host");
        let x = DeviceBuffer::alloc_zeroed(&stream, SHAPE.k as usize * 4).unwrap();
        step("DeviceBuffer::alloc_zeroed");
        let y = DeviceBuffer::alloc(&ctx0, SHAPE.m as usize * 4).unwrap();
        step("DeviceBuffer::alloc");
        y.memset_u8(0, &stream).unwrap();
        step("DeviceBuffer::memset_u8");
        let _ = y.to_host_vec::<f32>(&stream).unwrap();
        step("DeviceBuffer::to_host_vec");
        stream.synchronize().unwrap();
        step("Stream::synchronize");
        let _ = stream.is_capturing().unwrap();
        step("Stream::is_capturing");
        let mut ws = Workspace::new(&stream, 256).unwrap();
        step("Workspace::new");
        ws.ensure_size(1 << 16, &stream).unwrap();
        step("Workspace::ensure_size");
        k.split_k_gemv(&a, &x, &y, SHAPE, &mut ws, &stream).unwrap();
        step("TestKernels::split_k_gemv");
        let (e0, e1) = (Event::new(&ctx0, true).unwrap(), Event::new(&ctx0, true).unwrap());
        step("Event::new");
        e0.record(&stream).unwrap();
        e1.record(&stream).unwrap();
        step("Event::record");
        e1.synchronize().unwrap();
        let _ = e1.elapsed_ms(&e0).unwrap();
        step("Event::synchronize/elapsed_ms");
        let _ = MemInfo::query(&ctx0).unwrap();
        step("MemInfo::query");
        ctx0.synchronize().unwrap();
        step("Context::synchronize");
        let graph = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            step("Stream::begin_capture");
            let w = cap.bind_workspace(&mut ws).unwrap();
            let (ca, cx, cy) = (cap.bind_buffer(&a).unwrap(), cap.bind_buffer(&x).unwrap(), cap.bind_buffer(&y).unwrap());
            k.split_k_gemv_captured(&ca, &cx, &cy, SHAPE, &w, &cap).unwrap();
            step("a captured launch");
            let g = cap.end().unwrap();
            step("Capture::end");
            g
        };
        let _ = graph.node_kinds().unwrap();
        step("Graph::node_kinds");
        let exec = graph.instantiate().unwrap();
        step("Graph::instantiate");
        exec.upload(&stream).unwrap();
        exec.launch(&stream).unwrap();
        step("GraphExec::upload/launch");
        drop(graph);
        step("dropping a Graph (cuGraphDestroy)");
        drop(exec);
        step("dropping a GraphExec (cuGraphExecDestroy)");
        drop((e0, e1));
        step("dropping Events");
        drop(ws);
        drop((a, x, y));
        step("dropping buffers (cuMemFree)");
        drop(k);
        step("dropping TestKernels (cuModuleUnload)");
        drop(stream);
        step("dropping a Stream (cuStreamDestroy)");

        // The C ABI, whose callers are C++ engines that keep their own context current.
        let mut cx = GraphsafeContext::default();
        assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
        step("graphsafe_context_create");
        let mut st = GraphsafeStream::default();
        assert_eq!(unsafe { graphsafe_stream_create(cx, &mut st) }, GRAPHSAFE_OK);
        step("graphsafe_stream_create");
        let mut b = GraphsafeBuffer::default();
        assert_eq!(unsafe { graphsafe_buffer_create(st, 4096, 1, &mut b) }, GRAPHSAFE_OK);
        step("graphsafe_buffer_create");
        let bytes = [7u8; 64];
        assert_eq!(unsafe { graphsafe_buffer_write(b, 0, bytes.as_ptr().cast(), 64, st) }, GRAPHSAFE_OK);
        step("graphsafe_buffer_write");
        let mut w = GraphsafeWorkspace::default();
        assert_eq!(unsafe { graphsafe_workspace_create(st, 4096, &mut w) }, GRAPHSAFE_OK);
        step("graphsafe_workspace_create");
        let mut cap = GraphsafeCapture::default();
        assert_eq!(unsafe { graphsafe_capture_begin(st, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap) }, GRAPHSAFE_OK);
        step("graphsafe_capture_begin");
        let mut g = GraphsafeGraph::default();
        assert_eq!(unsafe { graphsafe_capture_end(cap, &mut g) }, GRAPHSAFE_OK);
        step("graphsafe_capture_end");
        let mut n = 0u64;
        assert_eq!(unsafe { graphsafe_graph_node_count(g, &mut n) }, GRAPHSAFE_OK);
        step("graphsafe_graph_node_count");
        let mut e = GraphsafeGraphExec::default();
        assert_eq!(unsafe { graphsafe_graph_instantiate(g, &mut e) }, GRAPHSAFE_OK);
        step("graphsafe_graph_instantiate");
        assert_eq!(unsafe { graphsafe_graph_exec_launch(e, st) }, GRAPHSAFE_OK);
        assert_eq!(unsafe { graphsafe_stream_synchronize(st) }, GRAPHSAFE_OK);
        step("graphsafe_graph_exec_launch/stream_synchronize");
        for r in unsafe {
            [
                graphsafe_graph_exec_destroy(e),
                graphsafe_graph_destroy(g),
                graphsafe_workspace_destroy(w),
                graphsafe_buffer_destroy(b),
                graphsafe_stream_destroy(st),
                graphsafe_context_destroy(cx),
            ]
        } {
            assert_eq!(r, GRAPHSAFE_OK);
        }
        step("graphsafe_*_destroy");
    }
    set_current(std::ptr::null_mut());
    assert!(left.is_empty(), "{} call(s) left another context current than the caller's: {left:#?}", left.len());
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// The public way to make a graphsafe context current is a closure: inside it the context is
/// current, after it (nested scopes included, and a panic in the closure) the caller's context is
/// back. (The guard `Context::enter` returned could be dropped out of order or forgotten, leaving
/// a graphsafe context current: it is crate-private now, tests/compile_fail/context_guard_misnested.rs.)
#[test]
fn with_current_makes_a_context_current_for_its_closure_only() {
    let (_g, _s) = exclusive();
    let ctx0 = Context::new(0).unwrap();
    let ctx1 = Context::new(1).unwrap();
    for caller in [std::ptr::null_mut(), ctx1.raw()] {
        set_current(caller);
        let seen = ctx0
            .with_current(|| {
                let outer = current();
                let inner = ctx1.with_current(current).unwrap();
                (outer, inner, current())
            })
            .unwrap();
        assert_eq!(seen, (ctx0.raw(), ctx1.raw(), ctx0.raw()), "current inside the closures");
        assert_eq!(current(), caller, "the caller's context after the closure");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx0.with_current(|| panic!("the caller's closure panics"))));
        assert!(unwound.is_err());
        assert_eq!(current(), caller, "the caller's context after a panic in the closure");
    }
    set_current(std::ptr::null_mut());
}

#[test]
fn objects_of_another_device_are_refused() {
    let (_g, s) = exclusive();
    let (ctx0, ctx1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let (mut s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let k0 = TestKernels::load(&ctx0).unwrap();
    let invalid = |r: Result<_, Error>, what: &str| match r {
        Err(Error::InvalidArgument { .. }) => {}
        Err(e) => panic!("{what}: expected InvalidArgument, got {e}"),
        Ok(_) => panic!("{what}: accepted another device's object"),
    };
    let mut ws1 = Workspace::new(&s1, 4096).unwrap();
    invalid(ws1.ensure_size(1 << 16, &s0).map(drop), "growing device 1's workspace on device 0's stream");
    let buf1 = DeviceBuffer::alloc_zeroed(&s1, 4096).unwrap();
    invalid(buf1.memset_u8(1, &s0), "a memset of device 1's buffer on device 0's stream");
    let (a1, x1, y1) = (
        DeviceBuffer::alloc_zeroed(&s1, (SHAPE.m * SHAPE.k) as usize * 4).unwrap(),
        DeviceBuffer::alloc_zeroed(&s1, SHAPE.k as usize * 4).unwrap(),
        DeviceBuffer::alloc_zeroed(&s1, SHAPE.m as usize * 4).unwrap(),
    );
    let mut ws0 = Workspace::new(&s0, SHAPE.workspace_bytes().unwrap()).unwrap();
    invalid(k0.split_k_gemv(&a1, &x1, &y1, SHAPE, &mut ws0, &s0), "device 0's kernel on device 1's buffers");
    let graph = {
        let mut cap = s0.begin_capture(CaptureMode::ThreadLocal).unwrap();
        invalid(cap.bind_buffer(&buf1).map(drop), "binding device 1's buffer to device 0's capture");
        invalid(cap.bind_workspace(&mut ws1).map(drop), "binding device 1's workspace to device 0's capture");
        cap.end().unwrap()
    };
    assert_eq!(graph.node_kinds().unwrap(), vec![], "a refused call captured something");
    // The C ABI.
    let mut cx = [GraphsafeContext::default(); 2];
    let mut st = [GraphsafeStream::default(); 2];
    let mut w = [GraphsafeWorkspace::default(); 2];
    for d in 0..2 {
        assert_eq!(unsafe { graphsafe_context_create(d as i32, &mut cx[d]) }, GRAPHSAFE_OK);
        assert_eq!(unsafe { graphsafe_stream_create(cx[d], &mut st[d]) }, GRAPHSAFE_OK);
        assert_eq!(unsafe { graphsafe_workspace_create(st[d], 4096, &mut w[d]) }, GRAPHSAFE_OK);
    }
    let ia = GRAPHSAFE_ERROR_INVALID_ARGUMENT;
    assert_eq!(unsafe { graphsafe_workspace_ensure_size(w[1], 1 << 16, st[0], std::ptr::null_mut()) }, ia);
    let mut b1 = GraphsafeBuffer::default();
    assert_eq!(unsafe { graphsafe_buffer_create(st[1], 4096, 1, &mut b1) }, GRAPHSAFE_OK);
    let bytes = [1u8; 16];
    assert_eq!(unsafe { graphsafe_buffer_write(b1, 0, bytes.as_ptr().cast(), 16, st[0]) }, ia);
    let mut cap = GraphsafeCapture::default();
    assert_eq!(unsafe { graphsafe_capture_begin(st[0], GRAPHSAFE_CAPTURE_THREAD_LOCAL, &mut cap) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_capture_bind_workspace(cap, w[1], std::ptr::null_mut(), std::ptr::null_mut()) }, ia);
    assert_eq!(unsafe { graphsafe_capture_bind_buffer(cap, b1, std::ptr::null_mut()) }, ia);
    let mut g = GraphsafeGraph::default();
    assert_eq!(unsafe { graphsafe_capture_end(cap, &mut g) }, GRAPHSAFE_OK);
    let mut n = 1u64;
    assert_eq!(unsafe { graphsafe_graph_node_count(g, &mut n) }, GRAPHSAFE_OK);
    assert_eq!(n, 0);
    let mut e = GraphsafeGraphExec::default();
    assert_eq!(unsafe { graphsafe_graph_instantiate(g, &mut e) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_graph_exec_launch(e, st[1]) }, ia, "device 0's graph on device 1's stream");
    unsafe {
        graphsafe_graph_exec_destroy(e);
        graphsafe_graph_destroy(g);
        graphsafe_buffer_destroy(b1);
        for d in 0..2 {
            graphsafe_workspace_destroy(w[d]);
            graphsafe_stream_destroy(st[d]);
            graphsafe_context_destroy(cx[d]);
        }
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// Kernels loaded in another context than the call's stream and buffers: refused before anything
/// is enqueued or captured. On the old code the split-K op committed and zero-filled its counters
/// (a memset enqueued eagerly, a memset node captured, the module added to the keep list) before
/// the launch itself noticed the context.
#[test]
fn kernels_of_another_context_are_refused_before_anything_is_enqueued() {
    let (_g, s) = exclusive();
    let (ctx0, ctx1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let mut s0 = Stream::new(&ctx0).unwrap();
    let k1 = TestKernels::load(&ctx1).unwrap();
    let invalid = |r: Result<(), Error>, what: &str| match r {
        Err(Error::InvalidArgument { .. }) => {}
        Err(e) => panic!("{what}: expected InvalidArgument, got {e}"),
        Ok(()) => panic!("{what}: accepted"),
    };
    let (a, x, y) = (
        DeviceBuffer::alloc_zeroed(&s0, (SHAPE.m * SHAPE.k) as usize * 4).unwrap(),
        DeviceBuffer::alloc_zeroed(&s0, SHAPE.k as usize * 4).unwrap(),
        DeviceBuffer::alloc_zeroed(&s0, SHAPE.m as usize * 4).unwrap(),
    );
    let mut ws0 = Workspace::new(&s0, SHAPE.workspace_bytes().unwrap()).unwrap();
    s0.synchronize().unwrap();
    let memsets = || s.calls("cuMemsetD8Async") + s.calls("cuMemsetD32Async");
    let (before, launches) = (memsets(), s.calls("cuLaunchKernel"));
    invalid(k1.split_k_gemv(&a, &x, &y, SHAPE, &mut ws0, &s0), "device 1's kernel on device 0's stream and buffers");
    assert_eq!(memsets(), before, "the refused eager call enqueued its counters' zero-fill");
    assert_eq!(s.calls("cuLaunchKernel"), launches, "the refused eager call launched");
    let graph = {
        let mut cap = s0.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws0).unwrap();
        let (ca, cx, cy) = (cap.bind_buffer(&a).unwrap(), cap.bind_buffer(&x).unwrap(), cap.bind_buffer(&y).unwrap());
        invalid(k1.split_k_gemv_captured(&ca, &cx, &cy, SHAPE, &w, &cap), "device 1's kernel in device 0's capture");
        invalid(k1.empty_captured(&cap), "device 1's empty kernel in device 0's capture");
        cap.end().unwrap()
    };
    assert_eq!(graph.node_kinds().unwrap(), vec![], "a refused call captured something");
    assert_eq!(graph.kept_modules(), 0, "a refused launch left its module in the graph's keep list");
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// The C ABI's raw device pointers (engine-owned tensors) are asked about before an op uses them:
/// memory of another device, an address the driver does not know, and a tensor that does not fit
/// in the allocation it starts in are refused (INVALID_ARGUMENT naming the argument), and the
/// well-formed call gets past validation (on the stand-in it then ends in the CUDA runtime's
/// error: the kernel glue opens the real driver).
#[test]
fn raw_pointers_of_another_device_unknown_or_too_small_are_refused() {
    let (_g, s) = exclusive();
    let mut cx = [GraphsafeContext::default(); 2];
    let mut st = [GraphsafeStream::default(); 2];
    for d in 0..2 {
        assert_eq!(unsafe { graphsafe_context_create(d as i32, &mut cx[d]) }, GRAPHSAFE_OK);
        assert_eq!(unsafe { graphsafe_stream_create(cx[d], &mut st[d]) }, GRAPHSAFE_OK);
    }
    let mut made = Vec::new();
    let mut buffer = |device: usize, bytes: u64| {
        let mut b = GraphsafeBuffer::default();
        assert_eq!(unsafe { graphsafe_buffer_create(st[device], bytes, 1, &mut b) }, GRAPHSAFE_OK);
        let mut ptr = 0u64;
        assert_eq!(unsafe { graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()) }, GRAPHSAFE_OK);
        made.push(b);
        ptr
    };
    let (heads, page) = (16i64, 64i64);
    let mut args = GraphsafeMlaDecodeArgs {
        dtype: GRAPHSAFE_DTYPE_BF16,
        batch: 1,
        num_heads: heads as i32,
        s_q: 1,
        q_nope: buffer(0, (heads * 512 * 2) as u64),
        q_nope_stride_batch: heads * 512,
        q_nope_stride_token: heads * 512,
        q_nope_stride_head: 512,
        q_pe: buffer(0, (heads * 64 * 2) as u64),
        q_pe_stride_batch: heads * 64,
        q_pe_stride_token: heads * 64,
        q_pe_stride_head: 64,
        kv_cache: buffer(0, (page * 576 * 2) as u64),
        num_pages: 1,
        page_size: page as i32,
        seq_lens: buffer(0, 4),
        page_table: buffer(0, 4),
        max_pages: 1,
        out: buffer(0, (heads * 512 * 2) as u64),
        out_stride_batch: heads * 512,
        out_stride_token: heads * 512,
        out_stride_head: 512,
        lse: buffer(0, (heads * 4) as u64),
        sm_scale: 0.0721,
        max_seq_len: 64,
        ..Default::default()
    };
    let kv_of_device_1 = buffer(1, (page * 576 * 2) as u64);
    let out_too_small = buffer(0, (heads * 512 * 2 - 2) as u64);
    let mut ws = GraphsafeWorkspace::default();
    assert_eq!(unsafe { graphsafe_workspace_create(st[0], 0, &mut ws) }, GRAPHSAFE_OK);
    let decode = |a: &GraphsafeMlaDecodeArgs| {
        let r = unsafe { graphsafe_mla_decode(a, ws, st[0], std::ptr::null_mut()) };
        (r, unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned())
    };
    let (r, text) = decode(&args);
    assert_eq!(r, GRAPHSAFE_ERROR_CUDA_RUNTIME, "the well-formed decode was refused before the glue: {text}");
    let good = args;
    let refused = |a: GraphsafeMlaDecodeArgs, what: &str, says: &str| {
        let (r, text) = decode(&a);
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{what}: {text}");
        assert!(text.contains(says), "{what}: the error does not say {says:?}: {text}");
    };
    args.kv_cache = kv_of_device_1;
    refused(args, "device 1's KV cache on device 0's stream", "memory of device 1");
    args = good;
    args.out = 0x1000;
    refused(args, "an address no allocation holds", "does not know as device memory");
    args = good;
    args.out = out_too_small;
    refused(args, "an output 2 bytes smaller than [1, 16, 512] bf16", "within its buffer");
    args = good;
    args.lse = kv_of_device_1;
    refused(args, "device 1's LSE", "lse");
    // The output inside the call's own workspace (its address read with workspace_info): the
    // workspace holds what the kernels trust (on sm100 the sanitized lengths and page table).
    let mut big_ws = GraphsafeWorkspace::default();
    assert_eq!(unsafe { graphsafe_workspace_create(st[0], 1 << 20, &mut big_ws) }, GRAPHSAFE_OK);
    let (mut wptr, mut wcap) = (0u64, 0u64);
    assert_eq!(unsafe { graphsafe_workspace_info(big_ws, &mut wcap, &mut wptr) }, GRAPHSAFE_OK);
    args = good;
    args.out = wptr;
    let r = unsafe { graphsafe_mla_decode(&args, big_ws, st[0], std::ptr::null_mut()) };
    let text = unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned();
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "an output inside the call's workspace: {text}");
    assert!(text.contains("workspace"), "the error does not name the workspace: {text}");
    // An fp8 cache's per-tensor scale inside the workspace: every CTA reads it while the split
    // kernels write their partials there. The same call with the scale in a buffer of its own
    // reaches the launch (the stand-in runs no kernels).
    args = good;
    args.kv_cache = buffer(0, (page * 576) as u64);
    let decode_kv = |a: &GraphsafeMlaDecodeArgs, scale: u64| {
        let kv = GraphsafeMlaKvCache { kv_format: GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, kv_scale: scale };
        let r = unsafe { graphsafe_mla_decode_kv(a, &kv, big_ws, st[0], std::ptr::null_mut()) };
        (r, unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned())
    };
    let own_scale = buffer(0, 4);
    let (r, text) = decode_kv(&args, own_scale);
    assert_eq!(r, GRAPHSAFE_ERROR_CUDA_RUNTIME, "the well-formed fp8 decode was refused before the glue: {text}");
    let (r, text) = decode_kv(&args, kv_of_device_1);
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "a scale in device 1's memory: {text}");
    assert!(text.contains("memory of device 1"), "the error does not name the device: {text}");
    let (r, text) = decode_kv(&args, 0x1000);
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "a scale at an address no allocation holds: {text}");
    let (r, text) = decode_kv(&args, wptr + 256);
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "a scale inside the call's workspace: {text}");
    // Refused where the raw pointer is read, so the error names the C struct's field.
    assert!(text.contains("kv_scale") && text.contains("workspace"), "the error does not name the scale and the workspace: {text}");
    unsafe { graphsafe_workspace_destroy(big_ws) };
    // Memory of an engine's own context on device 0 (adopted beside the primary one).
    let mut engine = GraphsafeContext::default();
    let r = unsafe { graphsafe_context_adopt(s.engine_context(0).cast(), &mut engine) };
    assert_eq!(r, GRAPHSAFE_OK, "{}", unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy());
    let mut engine_stream = GraphsafeStream::default();
    assert_eq!(unsafe { graphsafe_stream_create(engine, &mut engine_stream) }, GRAPHSAFE_OK);
    let mut eb = GraphsafeBuffer::default();
    assert_eq!(unsafe { graphsafe_buffer_create(engine_stream, (page * 576 * 2) as u64, 1, &mut eb) }, GRAPHSAFE_OK);
    let mut engine_kv = 0u64;
    assert_eq!(unsafe { graphsafe_buffer_info(eb, &mut engine_kv, std::ptr::null_mut()) }, GRAPHSAFE_OK);
    args = good;
    args.kv_cache = engine_kv;
    refused(args, "a KV cache of another context of device 0", "another context");
    unsafe {
        graphsafe_buffer_destroy(eb);
        graphsafe_stream_destroy(engine_stream);
        graphsafe_context_destroy(engine);
    }
    unsafe {
        graphsafe_workspace_destroy(ws);
        for b in made {
            graphsafe_buffer_destroy(b);
        }
        for d in 0..2 {
            graphsafe_stream_destroy(st[d]);
            graphsafe_context_destroy(cx[d]);
        }
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// `Stream::adopt` (and `graphsafe_stream_adopt`) of a stream that belongs to another context is
/// refused: listed under the wrong context's free gate, its work would not be waited for before
/// that context's frees, and a second wrapper under its own context would not be refused.
#[test]
fn a_stream_of_another_context_cannot_be_adopted() {
    let (_g, s) = exclusive();
    let (ctx0, ctx1) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let api = graphsafe::sys::driver::api().unwrap();
    let mut raw: c::CUstream = std::ptr::null_mut();
    {
        ctx1.with_current(|| {
            // SAFETY: out-pointer to a local.
            assert_eq!(unsafe { (api.cuStreamCreate().unwrap().f)(&mut raw, 1) }, c::CUresult::CUDA_SUCCESS);
        }).unwrap()
    }
    // SAFETY: raw is a live stream (of ctx1), destroyed below; refused before anything is wrapped.
    match unsafe { Stream::adopt(&ctx0, raw) } {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("device 1's stream adopted into device 0's context: {:?}", other.map(|s| s.raw())),
    }
    // SAFETY: as above; the right context this time.
    let ok = unsafe { Stream::adopt(&ctx1, raw) }.expect("the stream adopted into its own context");
    drop(ok);
    let mut cx = GraphsafeContext::default();
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    let mut st = GraphsafeStream::default();
    assert_eq!(unsafe { graphsafe_stream_adopt(cx, raw.cast(), &mut st) }, GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    unsafe { graphsafe_context_destroy(cx) };
    {
        ctx1.with_current(|| {
            // SAFETY: made above; no wrapper of it is left.
            unsafe { (api.cuStreamDestroy().unwrap().f)(raw) };
        }).unwrap()
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// Through the C ABI: an adopted stream destroyed while the engine captures on it cannot be waited
/// for, so the workspace buffer last used there is not freed when the workspace grows on another
/// stream (a kernel queued on the dropped stream could still use it), and
/// graphsafe_context_synchronize gives it back once all of the context's work is over.
#[test]
fn graphsafe_context_synchronize_gives_back_frees_deferred_by_a_stream_destroyed_mid_capture() {
    use standin::engine;
    let (_g, s) = exclusive();
    let mut cx = GraphsafeContext::default();
    assert_eq!(unsafe { graphsafe_context_create(0, &mut cx) }, GRAPHSAFE_OK);
    let ctx = Context::new(0).unwrap();
    let raw = engine::create_stream(&ctx);
    let (mut adopted, mut other) = (GraphsafeStream::default(), GraphsafeStream::default());
    assert_eq!(unsafe { graphsafe_stream_adopt(cx, raw.cast(), &mut adopted) }, GRAPHSAFE_OK);
    assert_eq!(unsafe { graphsafe_stream_create(cx, &mut other) }, GRAPHSAFE_OK);
    let mut ws = GraphsafeWorkspace::default();
    assert_eq!(unsafe { graphsafe_workspace_create(adopted, 1 << 16, &mut ws) }, GRAPHSAFE_OK); // zero-filled on the adopted stream
    // SAFETY: a live stream of ctx.
    unsafe { engine::begin_capture(&ctx, raw) };
    assert_eq!(unsafe { graphsafe_stream_destroy(adopted) }, GRAPHSAFE_OK);
    let live = s.stat("live_allocations");
    assert_eq!(unsafe { graphsafe_workspace_ensure_size(ws, 1 << 20, other, std::ptr::null_mut()) }, GRAPHSAFE_OK);
    assert_eq!(s.stat("live_allocations"), live + 1, "the buffer last used on the unwaited stream was freed");
    // SAFETY: the capture begun above; then the stream, whose wrapper is gone.
    unsafe {
        assert_eq!(engine::end_capture(&ctx, raw), c::CUresult::CUDA_SUCCESS);
        engine::destroy_stream(&ctx, raw);
    }
    assert_eq!(unsafe { graphsafe_context_synchronize(cx) }, GRAPHSAFE_OK);
    assert_eq!(s.stat("live_allocations"), live, "the deferred free was not given back");
    unsafe {
        graphsafe_workspace_destroy(ws);
        graphsafe_stream_destroy(other);
        graphsafe_context_destroy(cx);
    }
    drop(ctx);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

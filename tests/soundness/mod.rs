//! Misuse that safe Rust can still write, and what graphsafe does about it: each scenario must be
//! refused at run time, capturing and launching nothing (what the type system rejects lives in
//! tests/compile_fail). The bodies take any device: tests/gpu_soundness.rs runs them on a GPU,
//! tests/standin_soundness.rs on the stand-in driver of tests/standin on the CPU. Both declare
//! `mod common;` (tests/common) for the split-K problem this module uses.
#![allow(dead_code)]

use crate::common::{captured_split_k, churn, split_k_problem, SplitKProblem};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::{CaptureMode, NodeKind};
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::sys::cuda as c;
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use std::sync::Arc;

pub const SHAPE: SplitKShape = SplitKShape { m: 256, k: 1024, splits: 8 };

/// The scenarios' split-K problem: SHAPE's, from `seed`.
pub fn problem(stream: &Stream, seed: u64) -> SplitKProblem {
    split_k_problem(stream, SHAPE, seed)
}

fn expect_invalid<T: std::fmt::Debug>(r: graphsafe::Result<T>, mentions: &str) {
    match r {
        Err(Error::InvalidArgument { what, expected, got }) => {
            let text = format!("{what} {expected} {got}");
            assert!(text.contains(mentions), "refusal should mention {mentions:?}: {text}");
        }
        other => panic!("expected InvalidArgument mentioning {mentions:?}, got {other:?}"),
    }
}

fn expect_capturing<T: std::fmt::Debug>(r: graphsafe::Result<T>, what: &str) {
    assert!(matches!(r, Err(Error::StreamCapturing { .. })), "{what}: expected StreamCapturing, got {r:?}");
}

/// Hole 1 of the soundness issue, with `begin_capture` (where the brand cannot separate two open
/// captures): a workspace view and a buffer view of capture A given to an op of capture B are
/// refused, B records nothing, and after graph A is dropped, the workspace grown and the
/// allocator churned, 1,000 replays of B touch nothing.
pub fn views_of_another_capture_are_refused(ctx: &Arc<Context>, a_stream: &mut Stream) {
    let k = TestKernels::load(ctx).unwrap();
    let mut b_stream = Stream::new(ctx).unwrap();
    let p = problem(a_stream, 1);
    let mut ws = Workspace::new(a_stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let sentinel = vec![7.0f32; SHAPE.m as usize];
    p.y.copy_from_host(&sentinel, a_stream).unwrap();
    a_stream.synchronize().unwrap();

    let (graph_a, graph_b) = {
        let mut cap_a = a_stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w_a = cap_a.bind_workspace(&mut ws).unwrap();
        let a_of_a = cap_a.bind_buffer(&p.a).unwrap();
        let mut cap_b = b_stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let (a, x, y) = (cap_b.bind_buffer(&p.a).unwrap(), cap_b.bind_buffer(&p.x).unwrap(), cap_b.bind_buffer(&p.y).unwrap());
        // B's own workspace view would be fine; A's is refused, naming both captures.
        expect_invalid(k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w_a, &cap_b), "capture");
        // A buffer view of A in B's op: refused too.
        expect_invalid(cap_b.memset_u8(&a_of_a, 0), "capture");
        let gb = cap_b.end().unwrap();
        let ga = cap_a.end().unwrap();
        (ga, gb)
    };
    assert_eq!(graph_b.node_kinds().unwrap(), Vec::<NodeKind>::new(), "capture B recorded something");
    let exec_b = graph_b.instantiate().unwrap();
    drop(graph_a);
    ws.ensure_size(4 * SHAPE.workspace_bytes().unwrap(), a_stream).unwrap();
    let _held = churn(a_stream, &[SHAPE.workspace_bytes().unwrap() as usize, 1 << 20], 8);
    for _ in 0..1000 {
        exec_b.launch(a_stream).unwrap();
    }
    assert_eq!(p.y.to_host_vec::<f32>(a_stream).unwrap(), sentinel, "an empty graph wrote y");
}

/// The same with a view of a capture that was abandoned (dropped without `end`).
pub fn views_of_an_abandoned_capture_are_refused(ctx: &Arc<Context>, a_stream: &mut Stream) {
    let mut b_stream = Stream::new(ctx).unwrap();
    let buf = DeviceBuffer::alloc_zeroed(a_stream, 4096).unwrap();
    let cap_a = a_stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let mut cap_a = cap_a;
    let stale = cap_a.bind_buffer(&buf).unwrap();
    drop(cap_a);
    let cap_b = b_stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    expect_invalid(cap_b.memset_u8(&stale, 0xFF), "capture");
    let g = cap_b.end().unwrap();
    assert!(g.node_kinds().unwrap().is_empty());
    assert_eq!(g.kept_alive(), 0);
}

/// Hole 4: a capture leaked with `mem::forget` leaves the stream capturing; every eager API must
/// refuse the stream instead of recording into the leaked graph (growth's zero-fill above all).
pub fn a_leaked_capture_makes_eager_apis_refuse_the_stream(ctx: &Arc<Context>, other: &mut Stream) {
    let k = TestKernels::load(ctx).unwrap();
    let mut s = Stream::new(ctx).unwrap();
    let p = problem(other, 3);
    let mut ws = Workspace::new(&s, 4096).unwrap();
    let before = (ws.capacity(), ws.device_ptr());
    let exec = {
        let cap = other.begin_capture(CaptureMode::ThreadLocal).unwrap();
        k.empty_captured(&cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    // Relaxed: a leaked thread-local capture would also forbid allocations on this thread.
    std::mem::forget(s.begin_capture(CaptureMode::Relaxed).unwrap());
    expect_capturing(ws.ensure_size(1 << 20, &s), "Workspace::ensure_size");
    assert_eq!((ws.capacity(), ws.device_ptr()), before, "a refused growth changed the workspace");
    expect_capturing(Workspace::new(&s, 1 << 20), "Workspace::new");
    expect_capturing(DeviceBuffer::alloc_zeroed(&s, 4096), "DeviceBuffer::alloc_zeroed");
    expect_capturing(p.y.memset_u8(0, &s), "DeviceBuffer::memset_u8");
    expect_capturing(p.y.copy_from_host(&[1.0f32], &s), "DeviceBuffer::copy_from_host");
    expect_capturing(s.synchronize(), "Stream::synchronize");
    expect_capturing(k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &s), "an eager op");
    expect_capturing(exec.launch(&s), "GraphExec::launch");
    expect_capturing(s.begin_capture(CaptureMode::ThreadLocal).map(drop), "a second capture");
    assert!(s.is_capturing().unwrap(), "the driver still captures the leaked graph");
    // Nothing of the above reached the leaked capture: end it by hand and count its nodes.
    let api = graphsafe::sys::driver::api().unwrap();
    let end = api.cuStreamEndCapture().unwrap();
    let mut g: c::CUgraph = std::ptr::null_mut();
    ctx.with_current(|| {
        // SAFETY: a live stream in capture; out-pointer to a local.
        assert_eq!(unsafe { (end.f)(s.raw(), &mut g) }, c::CUresult::CUDA_SUCCESS);
        let nodes = api.cuGraphGetNodes().unwrap();
        let mut n = 0usize;
        // SAFETY: a null array asks for the count.
        assert_eq!(unsafe { (nodes.f)(g, std::ptr::null_mut(), &mut n) }, c::CUresult::CUDA_SUCCESS);
        assert_eq!(n, 0, "eager work landed in the leaked capture");
        // SAFETY: g came from cuStreamEndCapture.
        unsafe { (api.cuGraphDestroy().unwrap().f)(g) };
    }).unwrap()
}

/// A context synchronize never disturbs a graphsafe capture. On the capturing thread it is refused
/// (a context-wide wait there is illegal and invalidates the capture); from another thread it waits
/// for each of graphsafe's streams instead of the whole context (on the H200 a context-wide wait
/// invalidated captures other threads had open), for the capturing one the work queued before the
/// capture began. The capture still ends with the work recorded before.
pub fn a_context_synchronize_never_disturbs_a_capture(ctx: &Arc<Context>, stream: &mut Stream) {
    let k = TestKernels::load(ctx).unwrap();
    k.empty(stream).unwrap();
    let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    k.empty_captured(&cap).unwrap();
    expect_capturing(ctx.synchronize(), "Context::synchronize on the capturing thread");
    let other = ctx.clone();
    std::thread::spawn(move || other.synchronize()).join().unwrap().expect("Context::synchronize on another thread waits per stream");
    let graph = cap.end().expect("the capture survived both");
    assert_eq!(graph.node_kinds().unwrap(), [NodeKind::Kernel], "the capture holds exactly the launch recorded before");
    drop(graph);
    ctx.synchronize().expect("a context-wide wait once the capture is over");
}

fn current() -> c::CUcontext {
    let api = graphsafe::sys::driver::api().unwrap();
    let mut cur = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    assert_eq!(unsafe { (api.cuCtxGetCurrent().unwrap().f)(&mut cur) }, c::CUresult::CUDA_SUCCESS);
    cur
}

fn set_current(ctx: c::CUcontext) {
    let api = graphsafe::sys::driver::api().unwrap();
    // SAFETY: null (unbind) or a live context.
    assert_eq!(unsafe { (api.cuCtxSetCurrent().unwrap().f)(ctx) }, c::CUresult::CUDA_SUCCESS);
}

/// Hole 8 (invariant 12): every call that makes its context current restores the caller's, in
/// `Drop` too. `foreign` is what the caller has current: none (null), or another device's context.
pub fn calls_restore_the_callers_current_context(ctx: &Arc<Context>, foreign: c::CUcontext) {
    set_current(foreign);
    let check = |what: &str| assert_eq!(current(), foreign, "{what} left another context current");
    let mut s = Stream::new(ctx).unwrap();
    check("Stream::new");
    let k = TestKernels::load(ctx).unwrap();
    check("TestKernels::load");
    let p = problem(&s, 5);
    check("DeviceBuffer::from_host");
    let mut ws = Workspace::new(&s, 0).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &s).unwrap();
    check("an eager op and the workspace growth");
    assert_eq!(p.y.to_host_vec::<f32>(&s).unwrap(), p.expected);
    check("DeviceBuffer::to_host_vec");
    let g = s
        .capture(CaptureMode::ThreadLocal, |cap| {
            let w = cap.bind_workspace(&mut ws)?;
            let (a, x, y) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
            k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, cap)
        })
        .unwrap()
        .0;
    check("a capture");
    let e = g.instantiate().unwrap();
    check("Graph::instantiate");
    e.launch(&s).unwrap();
    s.synchronize().unwrap();
    check("GraphExec::launch and Stream::synchronize");
    drop(e);
    check("GraphExec::drop");
    drop(g);
    check("Graph::drop");
    drop(p);
    check("DeviceBuffer::drop");
    drop(ws);
    check("Workspace::drop");
    drop(s);
    check("Stream::drop");
    set_current(std::ptr::null_mut());
}

/// A growth that fails (here: more memory than the device has) leaves the workspace
/// exactly as it was, and a graph captured on it still replays bit-identically.
pub fn a_failed_growth_leaves_the_workspace_and_its_graphs_intact(ctx: &Arc<Context>, stream: &mut Stream, too_big: u64) {
    let k = TestKernels::load(ctx).unwrap();
    let p = problem(stream, 7);
    let mut ws = Workspace::new(stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let exec = {
        let (g, ()) = stream
            .capture(CaptureMode::ThreadLocal, |cap| {
                let w = cap.bind_workspace(&mut ws)?;
                let (a, x, y) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
                cap.memset_u8(&y, 0)?;
                k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, cap)
            })
            .unwrap();
        g.instantiate().unwrap()
    };
    let before = (ws.capacity(), ws.device_ptr(), ws.retired_count(), ws.to_host_vec(stream).unwrap());
    // The allocation itself fails (not a check before it): the driver's out-of-memory error from
    // cuMemAlloc, which graphsafe passes on as it came.
    let oom = c::CUresult::CUDA_ERROR_OUT_OF_MEMORY.0;
    match ws.ensure_size(too_big, stream) {
        Err(Error::Driver { call, code, .. }) if call.starts_with("cuMemAlloc") && code == oom => {}
        other => panic!("a {too_big}-byte growth: expected cuMemAlloc's CUDA_ERROR_OUT_OF_MEMORY ({oom}), got {other:?}"),
    }
    assert_eq!((ws.capacity(), ws.device_ptr(), ws.retired_count(), ws.to_host_vec(stream).unwrap()), before, "a failed growth changed the workspace");
    for i in 0..100 {
        exec.launch(stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(stream).unwrap(), p.expected, "replay {i} after the failed growth");
    }
    // And the workspace still works eagerly.
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(stream).unwrap(), p.expected);
}

/// Invariant 8, belt and braces: the graph holds every allocation its ops baked in (deduplicated),
/// whatever was bound explicitly.
pub fn a_graph_holds_each_baked_in_allocation_once(ctx: &Arc<Context>, stream: &mut Stream) {
    let k = TestKernels::load(ctx).unwrap();
    let p = problem(stream, 9);
    let mut ws = Workspace::new(stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let (g, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let w = cap.bind_workspace(&mut ws)?;
            let (a, x, y) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
            for _ in 0..3 {
                k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, cap)?;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(g.kept_alive(), 4, "workspace, a, x, y: each once");
    assert_eq!(g.node_kinds().unwrap().len(), 6, "three [counters' zero-fill, kernel] pairs");
}

/// A graph keeps the module of every kernel it launches loaded: the kernels' owner may go (here:
/// the `TestKernels`, whose module is unloaded when the last handle to it drops) and the replays
/// still run loaded code.
pub fn a_graph_keeps_its_kernels_module_loaded(ctx: &Arc<Context>, stream: &mut Stream) {
    let p = problem(stream, 11);
    let mut ws = Workspace::new(stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let exec = {
        let k = TestKernels::load(ctx).unwrap();
        let (g, ()) = stream
            .capture(CaptureMode::ThreadLocal, |cap| {
                let w = cap.bind_workspace(&mut ws)?;
                let (a, x, y) = (cap.bind_buffer(&p.a)?, cap.bind_buffer(&p.x)?, cap.bind_buffer(&p.y)?);
                cap.memset_u8(&y, 0)?;
                k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, cap)?;
                k.empty_captured(cap)
            })
            .unwrap();
        assert_eq!(g.kept_modules(), 1);
        g.instantiate().unwrap()
        // `k` (the only other holder of the module) is dropped here.
    };
    assert_eq!(exec.kept_modules(), 1);
    for _ in 0..10 {
        exec.launch(stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(stream).unwrap(), p.expected);
    }
}

/// A workspace of another device cannot be bound to a capture, nor grown on another device's
/// stream; buffers of another device are refused by captured ops (checked again per op).
pub fn memory_of_another_device_is_refused(ctx0: &Arc<Context>, ctx1: &Arc<Context>) {
    let k = TestKernels::load(ctx0).unwrap();
    let mut s0 = Stream::new(ctx0).unwrap();
    let s1 = Stream::new(ctx1).unwrap();
    let p = problem(&s0, 13);
    let mut ws1 = Workspace::new(&s1, SHAPE.workspace_bytes().unwrap()).unwrap();
    let other_buf = DeviceBuffer::alloc_zeroed(&s1, 4096).unwrap();
    // Named by both contexts (two contexts of one device differ only there).
    expect_invalid(ws1.ensure_size(1 << 20, &s0).map(drop), &format!("{:?}", ctx0.raw()));
    expect_invalid(ws1.ensure_size(1 << 20, &s0).map(drop), &format!("{:?}", ctx1.raw()));
    let (g, ()) = s0
        .capture(CaptureMode::ThreadLocal, |cap| {
            expect_invalid(cap.bind_workspace(&mut ws1).map(drop), "device");
            expect_invalid(cap.bind_buffer(&other_buf).map(drop), "device");
            Ok(())
        })
        .unwrap();
    assert!(g.node_kinds().unwrap().is_empty());
    // Eager: a device-1 workspace with a device-0 op.
    expect_invalid(k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws1, &s0), "workspace");
}

/// One workspace, two streams, no host synchronization: 64 split-K GEMVs queued on A, then one on
/// B with other inputs (its partial sums and row counters in the same scratch memory). Ordered by
/// graphsafe, B's kernel starts after A's queue drained and both results are exact; unordered, it
/// runs while A's kernels use the workspace. The same for a replay on B of a graph captured on A.
pub fn workspace_uses_on_two_streams_do_not_race(ctx: &Arc<Context>, a: &mut Stream) {
    let k = TestKernels::load(ctx).unwrap();
    let b = Stream::new(ctx).unwrap();
    let shape = SplitKShape { m: 4096, k: 4096, splits: 16 };
    let pa = split_k_problem(a, shape, 21);
    let pb = split_k_problem(a, shape, 22);
    let mut ws = Workspace::new(a, shape.workspace_bytes().unwrap()).unwrap();
    a.synchronize().unwrap();
    for _ in 0..64 {
        k.split_k_gemv(&pa.a, &pa.x, &pa.y, shape, &mut ws, a).unwrap();
    }
    k.split_k_gemv(&pb.a, &pb.x, &pb.y, shape, &mut ws, &b).unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    assert_eq!(pb.y.to_host_vec::<f32>(&b).unwrap(), pb.expected, "B's GEMV shared the workspace with A's");
    assert_eq!(pa.y.to_host_vec::<f32>(a).unwrap(), pa.expected, "A's GEMVs shared the workspace with B's");

    // A graph captured on A, replayed on B right after a queue of eager calls on A.
    let exec = captured_split_k(&k, a, &pb, shape, &mut ws);
    pb.y.memset_u8(0, a).unwrap();
    for _ in 0..64 {
        k.split_k_gemv(&pa.a, &pa.x, &pa.y, shape, &mut ws, a).unwrap();
    }
    exec.launch(&b).unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    assert_eq!(pb.y.to_host_vec::<f32>(&b).unwrap(), pb.expected, "the replay on B shared the workspace with A's GEMVs");
    assert_eq!(pa.y.to_host_vec::<f32>(a).unwrap(), pa.expected);
}

/// A capture leaked with `mem::forget` degrades its own stream and nothing else: frees of memory
/// used on other streams go through at once (they used to be deferred for as long as the process
/// lived), and `Context::synchronize` from another thread waits for the context's streams (for
/// the leaked capture's: the work queued before it began) instead of being refused for good; on
/// the capture's own thread it is still refused. `in_use` reports the device memory in use, in
/// bytes. (The caller drops `leaky`, which ends the leaked capture.)
pub fn a_forgotten_capture_leaves_frees_and_synchronizes_of_other_streams_alone(ctx: &Arc<Context>, leaky: &mut Stream, in_use: &dyn Fn() -> u64) {
    const BIG: usize = 64 << 20;
    let k = TestKernels::load(ctx).unwrap();
    let other = Stream::new(ctx).unwrap();
    let p = problem(&other, 21);
    let mut ws = Workspace::new(&other, SHAPE.workspace_bytes().unwrap()).unwrap();
    // Work queued on the stream just before its capture begins: frees must still wait for it.
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, leaky).unwrap();
    std::mem::forget(leaky.begin_capture(CaptureMode::Relaxed).unwrap());
    let start = in_use();
    for round in 0..4u64 {
        let b = DeviceBuffer::alloc_zeroed(&other, BIG).unwrap();
        k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &other).unwrap();
        ws.ensure_size(SHAPE.workspace_bytes().unwrap() * (2 + round), &other).unwrap(); // retires a buffer
        drop(b);
    }
    let grown = in_use().saturating_sub(start);
    assert!(grown < BIG as u64, "frees were deferred by the forgotten capture: {grown} more bytes in use after 4 rounds of {BIG}");
    let c = ctx.clone();
    std::thread::spawn(move || c.synchronize()).join().unwrap().expect("Context::synchronize on another thread during the forgotten capture");
    expect_capturing(ctx.synchronize(), "Context::synchronize on the forgotten capture's thread");
    expect_capturing(leaky.synchronize(), "the forgotten capture's stream");
    assert_eq!(p.y.to_host_vec::<f32>(&other).unwrap(), p.expected);
}

//! The core invariants on real GPU memory: replay after grow, release, zero-fill, stream
//! discipline, errors inside a capture. Skips without a GPU unless GRAPHSAFE_REQUIRE_GPU=1.

mod common;

use common::{bind_split_k, churn, gpu, split_k_gemv_raw, split_k_problem};
use graphsafe::driver::{DeviceBuffer, Event, LaunchConfig, MemInfo};
use graphsafe::graph::{CaptureMode, NodeKind};
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::workspace::Workspace;
use graphsafe::Error;

const SHAPE: SplitKShape = SplitKShape { m: 1000, k: 4096, splits: 16 };

#[test]
fn eager_split_k_matches_the_host_reference_bit_for_bit() {
    let Some((ctx, stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 1);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for _ in 0..3 {
        k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    }
    assert_eq!(ws.capacity(), SHAPE.workspace_bytes().unwrap().next_multiple_of(256));
}

#[test]
fn replay_after_grow_and_allocator_churn_is_bit_identical_for_1000_replays() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 7);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let captured_ptr = ws.device_ptr();
    let captured_cap = ws.capacity() as usize;

    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
        cap.end().unwrap()
    };
    let exec = graph.instantiate().unwrap();
    exec.upload(&stream).unwrap();

    // Grow three times: each growth retires the buffer before it (the first is the captured one).
    let mut freed_sizes = vec![captured_cap];
    for step in 1..=3u64 {
        let before = ws.capacity() as usize;
        assert!(ws.ensure_size(SHAPE.workspace_bytes().unwrap() * (1 + step), &stream).unwrap());
        assert_ne!(ws.device_ptr(), captured_ptr);
        if step > 1 {
            freed_sizes.push(before);
        }
    }
    assert_eq!(ws.retired_count(), 3);
    // Take the freed blocks (the captured one is kept by the graph) and dirty them.
    let _held = churn(&stream, &freed_sizes, 8);
    // The eager result on the grown workspace is the reference too.
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);

    for i in 0..1000 {
        p.y.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        let got = p.y.to_host_vec::<f32>(&stream).unwrap();
        assert!(got == p.expected, "replay {i} differs from eager");
    }
}

#[test]
fn a_graph_keeps_its_buffers_alive_after_the_user_drops_them() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 11);
    let out = DeviceBuffer::alloc_zeroed(&stream, SHAPE.m as usize * 4).unwrap();
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let [a, x, y, o] = bind_split_k(&mut cap, &p, &out);
        k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
        cap.copy(&o, &y).unwrap();
        let g = cap.end().unwrap();
        assert_eq!(g.kept_alive(), 5);
        g.instantiate().unwrap()
        // the Graph is dropped here; the executable alone keeps the buffers
    };
    let expected = p.expected.clone();
    drop(p); // a, x, y: only the executable references them now
    drop(ws);
    let _held = churn(&stream, &[SHAPE.workspace_bytes().unwrap() as usize, SHAPE.m as usize * 4, SHAPE.k as usize * 4], 4);
    for _ in 0..10 {
        out.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(out.to_host_vec::<f32>(&stream).unwrap(), expected);
    }
}

#[test]
fn retired_buffers_are_released_when_the_last_graph_goes() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 3);
    // Warm up module and context allocations so they do not count.
    let mut warm = Workspace::new(&stream, 1 << 20).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut warm, &stream).unwrap();
    stream.synchronize().unwrap();
    drop(warm);
    let start = MemInfo::query(&ctx).unwrap().free;

    const BIG: u64 = 256 << 20;
    let mut ws = Workspace::new(&stream, BIG).unwrap();
    let (g, e1, e2) = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
        let g = cap.end().unwrap();
        let (e1, e2) = (g.instantiate().unwrap(), g.instantiate().unwrap());
        (g, e1, e2)
    };
    ws.ensure_size(2 * BIG, &stream).unwrap(); // retires the captured 256 MiB
    drop(ws); // frees the 512 MiB one at once: nothing captured it
    e1.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let held = MemInfo::query(&ctx).unwrap().free;
    assert!(start - held >= BIG - (2 << 20), "the retired captured buffer must still be held: {start} -> {held}");
    drop(g);
    drop(e1);
    let still = MemInfo::query(&ctx).unwrap().free;
    assert!(start - still >= BIG - (2 << 20), "e2 still references it: {start} -> {still}");
    drop(e2);
    let end = MemInfo::query(&ctx).unwrap().free;
    assert!(start.abs_diff(end) <= 2 << 20, "free memory {start} -> {end}: retired buffer not released");
}

#[test]
fn new_and_grown_workspaces_read_zero_even_on_dirty_recycled_blocks() {
    let Some((ctx, stream)) = gpu() else { return };
    for bytes in [4096usize, 1 << 20, 48 << 20] {
        // Dirty a block of this size, free it, and let the workspace take it (likely the same block).
        let dirty = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        dirty.memset_u8(0xAB, &stream).unwrap();
        stream.synchronize().unwrap();
        let dirty_ptr = dirty.device_ptr();
        drop(dirty);
        let ws = Workspace::new(&stream, bytes as u64).unwrap();
        eprintln!("{bytes} B: recycled block reused: {}", ws.device_ptr() == dirty_ptr);
        assert!(ws.to_host_vec(&stream).unwrap().iter().all(|&b| b == 0), "new workspace of {bytes} B not zero");
        let mut ws = ws;
        let dirty = DeviceBuffer::alloc(&ctx, 2 * bytes).unwrap();
        dirty.memset_u8(0xCD, &stream).unwrap();
        stream.synchronize().unwrap();
        drop(dirty);
        ws.ensure_size(2 * bytes as u64, &stream).unwrap();
        assert!(ws.to_host_vec(&stream).unwrap().iter().all(|&b| b == 0), "grown workspace of {} B not zero", 2 * bytes);
    }
    // And a kernel that depends on it: first use of a fresh workspace is correct. Through the raw
    // path, which does not zero the counters itself (the guarded op now does, per launch), so
    // only the workspace's own zero-fill can make this pass.
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 5);
    let dirty = DeviceBuffer::alloc(&ctx, SHAPE.workspace_bytes().unwrap().next_multiple_of(256) as usize).unwrap();
    dirty.memset_u8(0x5A, &stream).unwrap();
    drop(dirty);
    let ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    // SAFETY: every address is live until the read-back below synchronizes the stream.
    unsafe { split_k_gemv_raw(&k, p.a.device_ptr(), p.x.device_ptr(), p.y.device_ptr(), SHAPE, ws.device_ptr(), &stream).unwrap() };
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
}

#[test]
fn a_dirty_workspace_really_breaks_the_split_k_kernel() {
    // The zero-fill test above (its raw launch) can only fail if dirt matters: show that it does.
    let Some((ctx, stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 9);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let raw = DeviceBuffer::alloc(&ctx, ws.capacity() as usize).unwrap();
    raw.memset_u8(0x01, &stream).unwrap(); // counters = 0x01010101
    p.y.memset_u8(0, &stream).unwrap();
    // SAFETY: every address is live until the synchronize below.
    unsafe {
        split_k_gemv_raw(&k, p.a.device_ptr(), p.x.device_ptr(), p.y.device_ptr(), SHAPE, raw.device_ptr(), &stream)
            .unwrap()
    };
    assert_ne!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected, "dirty counters went unnoticed");
    // The same launch on the zeroed workspace is right.
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
}

#[test]
fn every_memset_copy_and_launch_in_a_capture_is_a_node_of_the_graph() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 13);
    let copy = DeviceBuffer::alloc_zeroed(&stream, SHAPE.m as usize * 4).unwrap();
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let [a, x, y, c] = bind_split_k(&mut cap, &p, &copy);
        cap.memset_u8(&y, 0).unwrap();
        k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
        cap.copy(&c, &y).unwrap();
        k.empty_captured(&cap).unwrap();
        cap.end().unwrap()
    };
    // Nothing ran during capture: y and the copy are still as before.
    assert!(copy.to_host_vec::<f32>(&stream).unwrap().iter().all(|&v| v == 0.0));
    let kinds = graph.node_kinds().unwrap();
    let count = |k: NodeKind| kinds.iter().filter(|&&n| n == k).count();
    // The memset of y, the split-K op's zero-fill of its counters, its kernel, the copy, the empty kernel.
    assert_eq!((count(NodeKind::Memset), count(NodeKind::Kernel), count(NodeKind::Memcpy), kinds.len()), (2, 2, 1, 5), "{kinds:?}");
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(copy.to_host_vec::<f32>(&stream).unwrap(), p.expected);
}

#[test]
fn too_small_a_captured_workspace_is_an_error_and_launches_nothing() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 17);
    let small = SHAPE.workspace_bytes().unwrap() / 2;
    let mut ws = Workspace::new(&stream, small).unwrap();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        match k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap) {
            Err(Error::WorkspaceTooSmall { needed, capacity }) => {
                assert_eq!(needed, SHAPE.workspace_bytes().unwrap());
                assert_eq!(capacity, small.next_multiple_of(256));
            }
            other => panic!("expected WorkspaceTooSmall, got {other:?}"),
        }
        cap.end().unwrap()
    };
    assert_eq!(graph.node_kinds().unwrap().len(), 0, "something was captured");
    assert_eq!(ws.capacity(), small.next_multiple_of(256), "the workspace must not have grown");
    // The stream is usable: the eager path grows and computes.
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
}

#[test]
fn an_invalidated_capture_is_an_error_and_leaves_the_stream_usable() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    {
        let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        k.empty_captured(&cap).unwrap();
        // Synchronizing a capturing stream is illegal: the driver invalidates the capture.
        let sync = graphsafe::sys::driver::api().unwrap().cuStreamSynchronize().unwrap();
        // SAFETY: a live stream handle; the call is refused, not executed.
        let r = unsafe { (sync.f)(cap.stream().raw()) };
        assert_ne!(r, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
        match cap.end() {
            Err(Error::CaptureInvalidated { .. }) => {}
            Err(e) => panic!("expected CaptureInvalidated, got {e}"),
            Ok(_) => panic!("expected CaptureInvalidated, got a graph"),
        }
    }
    assert!(!stream.is_capturing().unwrap());
    let p = split_k_problem(&stream, SHAPE, 19);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    // A capture abandoned without end() is ended by its drop.
    {
        let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        k.empty_captured(&cap).unwrap();
    }
    assert!(!stream.is_capturing().unwrap());
}

#[test]
fn every_capture_mode_records_a_working_graph() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let p = split_k_problem(&stream, SHAPE, 23);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    for mode in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
        let exec = {
            let mut cap = stream.begin_capture(mode).unwrap();
            assert_eq!(cap.mode(), mode);
            let w = cap.bind_workspace(&mut ws).unwrap();
            let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
            cap.memset_u8(&y, 0).unwrap();
            k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
            cap.end().unwrap().instantiate().unwrap()
        };
        exec.launch(&stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected, "{mode:?}");
    }
}

#[test]
fn cluster_launches_events_and_device_queries_work() {
    let Some((ctx, stream)) = gpu() else { return };
    let info = ctx.device().info().unwrap();
    assert!(info.sm_count > 0 && info.total_memory > 0 && !info.name.is_empty());
    assert!(info.compute_capability.0 >= 9, "graphsafe's kernels need sm_90+: {info:?}");
    let k = TestKernels::load(&ctx).unwrap();
    let (start, end) = (Event::new(&ctx, true).unwrap(), Event::new(&ctx, true).unwrap());
    start.record(&stream).unwrap();
    let cfg = LaunchConfig { grid: graphsafe::driver::Dim3::x(4), block: graphsafe::driver::Dim3::x(32), shared_mem_bytes: 0, cluster: Some(graphsafe::driver::Dim3::x(2)) };
    // SAFETY: the empty kernel takes no parameters.
    unsafe { k.empty_function().launch(&cfg, &stream, &mut []) }.unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(end.elapsed_ms(&start).unwrap() >= 0.0);
    // A cluster that does not divide the grid is the driver's error, returned, not a crash.
    let bad = LaunchConfig { cluster: Some(graphsafe::driver::Dim3::x(3)), ..cfg };
    // SAFETY: as above.
    assert!(matches!(unsafe { k.empty_function().launch(&bad, &stream, &mut []) }, Err(Error::Driver { .. })));
    stream.synchronize().unwrap();
}

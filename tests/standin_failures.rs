//! Failure injection and soundness checks through the Rust API, on the CPU, with the stand-in
//! driver (tests/standin): valid handles, host memory as device memory, every address a memset,
//! copy or kernel touches checked against the live allocations, and gs_splitk_gemv emulated with
//! the kernel's own fp32 order.
//!
//! * A failing allocation (or zero-fill) during `Workspace::ensure_size` leaves the workspace as it
//!   was: capacity, address, contents, and a graph captured over it replays bit-identically.
//! * A failing launch inside a capture returns `Err` and leaves no node in the graph.
//! * Replay after grow and allocator churn: 1000 bit-identical replays, 0 violations. And the
//!   counter-proofs that make those checks mean something: the unguarded raw path over a freed
//!   workspace *is* caught, and a workspace that is not zero-filled gives a wrong answer.

mod common;
mod standin;

use common::{churn, split_k_gemv_raw, split_k_problem, SplitKProblem};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::{CaptureMode, NodeKind};
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::sys::cuda::CUresult;
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use standin::exclusive;
use std::sync::Arc;

/// Small enough for the host emulation (1000 replays in well under a second), with several row
/// blocks and splits so the counters and the reduction order matter.
const SHAPE: SplitKShape = SplitKShape { m: 300, k: 640, splits: 8 };

fn setup() -> (Arc<Context>, Stream, TestKernels) {
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).expect("the test kernels (the stand-in accepts any image)");
    (ctx, stream, k)
}

fn problem(stream: &Stream, seed: u64) -> SplitKProblem {
    split_k_problem(stream, SHAPE, seed)
}

fn driver_code(e: &Error) -> Option<u32> {
    match e {
        Error::Driver { code, .. } => Some(*code),
        _ => None,
    }
}

#[test]
fn the_standin_exports_every_name_of_the_driver_table() {
    let s = standin::standin();
    // The table itself, read at compile time: a new entry point without a stand-in export fails here.
    let table = include_str!("../src/sys/driver.rs");
    let start = table.find("driver_api! {").expect("the driver_api! table");
    let body = &table[start..];
    let body = &body[..body.find("\n}\n").expect("end of the table")];
    let names: Vec<&str> = body
        .lines()
        .filter(|l| l.contains(": PFN_"))
        .flat_map(|l| l[l.find('[').unwrap() + 1..l.rfind(']').unwrap()].split(','))
        .map(|n| n.trim().trim_matches('"'))
        .filter(|n| !n.is_empty())
        .collect();
    assert!(names.len() >= 50, "parsed only {} names from the table", names.len());
    // SAFETY: only symbol addresses are looked up.
    let lib = unsafe { libloading::Library::new(&s.path) }.unwrap();
    let missing: Vec<&&str> = names
        .iter()
        // SAFETY: as above.
        .filter(|n| unsafe { lib.get::<*const ()>(format!("{n}\0").as_bytes()) }.is_err())
        .collect();
    assert!(missing.is_empty(), "the stand-in does not export {missing:?}");
}

#[test]
fn the_emulated_split_k_kernel_matches_the_host_reference_bit_for_bit() {
    let (_g, s) = exclusive();
    let (_ctx, stream, k) = setup();
    let p = problem(&stream, 1);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for _ in 0..3 {
        p.y.memset_u8(0, &stream).unwrap();
        k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    }
    // The kernel resets its counters: the workspace tail reads zero after every launch.
    let bytes = ws.to_host_vec(&stream).unwrap();
    let tail = &bytes[(SHAPE.workspace_bytes().unwrap() - SHAPE.m.div_ceil(128) as u64 * 4) as usize..SHAPE.workspace_bytes().unwrap() as usize];
    assert!(tail.iter().all(|&b| b == 0), "split-K counters left dirty: {tail:?}");
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

#[test]
fn a_failed_allocation_during_ensure_size_leaves_the_workspace_intact_and_usable() {
    let (_g, s) = exclusive();
    let (_ctx, mut stream, k) = setup();
    let p = problem(&stream, 2);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    let exec = common::captured_split_k(&k, &mut stream, &p, SHAPE, &mut ws);
    let (cap_before, ptr_before, retired_before) = (ws.capacity(), ws.device_ptr(), ws.retired_count());
    let bytes_before = ws.to_host_vec(&stream).unwrap();
    let live_before = s.live_allocations();

    s.fail("cuMemAlloc", 0, CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    let e = ws.ensure_size(cap_before * 4, &stream).unwrap_err();
    assert_eq!(driver_code(&e), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY.0), "{e}");
    assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"), "the error names the driver's code: {e}");

    assert_eq!((ws.capacity(), ws.device_ptr(), ws.retired_count()), (cap_before, ptr_before, retired_before));
    assert_eq!(ws.to_host_vec(&stream).unwrap(), bytes_before, "contents changed by a failed growth");
    assert_eq!(s.live_allocations(), live_before, "a failed growth leaked or freed an allocation");
    // Still usable: eagerly, and through the graph captured over it.
    p.y.memset_u8(0, &stream).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    for _ in 0..5 {
        p.y.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected, "replay after a failed growth");
    }
    // The fault was one call: growing works again, and the graph keeps the old buffer.
    assert!(ws.ensure_size(cap_before * 4, &stream).unwrap());
    assert_ne!(ws.device_ptr(), ptr_before);
    p.y.memset_u8(0, &stream).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

#[test]
fn a_failed_zero_fill_during_growth_frees_the_new_buffer_and_keeps_the_old_one() {
    let (_g, s) = exclusive();
    let (_ctx, stream, k) = setup();
    let p = problem(&stream, 3);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    let (cap_before, ptr_before) = (ws.capacity(), ws.device_ptr());
    let bytes_before = ws.to_host_vec(&stream).unwrap();
    let live_before = s.live_allocations();

    s.fail("cuMemsetD8Async", 0, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let e = ws.ensure_size(cap_before * 2, &stream).unwrap_err();
    assert_eq!(driver_code(&e), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED.0), "{e}");
    assert!(s.calls("cuMemAlloc") >= 1);
    assert_eq!((ws.capacity(), ws.device_ptr(), ws.retired_count()), (cap_before, ptr_before, 0));
    assert_eq!(ws.to_host_vec(&stream).unwrap(), bytes_before);
    assert_eq!(s.live_allocations(), live_before, "the unzeroed new buffer must be freed, not kept or leaked");
    p.y.memset_u8(0, &stream).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

#[test]
fn a_failing_launch_inside_a_capture_returns_err_and_leaves_no_node() {
    let (_g, s) = exclusive();
    let (_ctx, mut stream, k) = setup();
    let p = problem(&stream, 4);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        s.fail("cuLaunchKernel", 0, CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
        let e = k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap_err();
        assert_eq!(driver_code(&e), Some(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.0), "{e}");
        s.fail("cuMemsetD8Async", 0, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(cap.memset_u8(&y, 0).is_err());
        // The capture is still good for what follows.
        k.empty_captured(&cap).unwrap();
        cap.end().unwrap()
    };
    // The split-K op zero-fills its counters before its launch (a memset node of the bound
    // workspace, harmless on its own); the failed launch adds no kernel node, nor does the failed
    // memset: only the empty kernel follows.
    assert_eq!(graph.node_kinds().unwrap(), vec![NodeKind::Memset, NodeKind::Kernel], "only the counters' zero-fill and the empty kernel may be in the graph");
    assert_eq!(s.stat("nodes_recorded"), 2);
    // And a too-small captured workspace launches nothing at all.
    let mut small = Workspace::new(&stream, 256).unwrap();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut small).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        let e = k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap_err();
        assert!(matches!(e, Error::WorkspaceTooSmall { needed, capacity: 256 } if needed == SHAPE.workspace_bytes().unwrap()), "{e}");
        cap.end().unwrap()
    };
    assert_eq!(graph.node_kinds().unwrap(), vec![]);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// An allocation on the thread of a THREAD_LOCAL capture is one the driver forbids there (it would
/// invalidate the capture): graphsafe refuses it first (`StreamCapturing`, no `cuMemAlloc`), and
/// the capture ends normally. (It used to reach the driver, which invalidated the capture.)
#[test]
fn an_allocation_inside_a_thread_local_capture_is_refused_and_the_capture_survives() {
    let (_g, s) = exclusive();
    let (ctx, mut stream, k) = setup();
    let p = problem(&stream, 5);
    {
        let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let allocs = s.calls("cuMemAlloc");
        let e = DeviceBuffer::alloc(&ctx, 4096).unwrap_err();
        assert!(matches!(e, Error::StreamCapturing { .. }), "{e}");
        assert_eq!(s.calls("cuMemAlloc"), allocs, "the refused allocation reached the driver");
        assert_eq!(cap.end().expect("the capture survived").node_kinds().unwrap(), vec![]);
    }
    assert!(!stream.is_capturing().unwrap());
    // A relaxed capture allows it (CUDA's rule), and records nothing for it.
    {
        let cap = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        let b = DeviceBuffer::alloc(&ctx, 4096).unwrap();
        drop(b);
        assert_eq!(cap.end().unwrap().node_kinds().unwrap(), vec![]);
    }
    let mut ws = Workspace::new(&stream, 0).unwrap();
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

#[test]
fn replay_after_grow_and_allocator_churn_is_bit_identical_for_1000_replays() {
    let (_g, s) = exclusive();
    let (_ctx, mut stream, k) = setup();
    let p = problem(&stream, 7);
    let mut ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    let captured_ptr = ws.device_ptr();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
        k.split_k_gemv_captured(&a, &x, &y, SHAPE, &w, &cap).unwrap();
        cap.end().unwrap()
    };
    assert_eq!(graph.node_kinds().unwrap(), vec![NodeKind::Memset, NodeKind::Kernel], "the counters' zero-fill, then the kernel");
    let exec = graph.instantiate().unwrap();
    exec.upload(&stream).unwrap();
    drop(graph);
    let mut freed = Vec::new();
    for step in 1..=3u64 {
        let before = ws.capacity() as usize;
        assert!(ws.ensure_size(SHAPE.workspace_bytes().unwrap() * (1 + step), &stream).unwrap());
        assert_ne!(ws.device_ptr(), captured_ptr);
        if step > 1 {
            freed.push(before);
        }
    }
    assert_eq!(ws.retired_count(), 3);
    let _held = churn(&stream, &freed, 8);
    k.split_k_gemv(&p.a, &p.x, &p.y, SHAPE, &mut ws, &stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected, "eager on the grown workspace");
    let kernels_before = s.stat("kernels_run");
    for i in 0..1000 {
        p.y.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert!(p.y.to_host_vec::<f32>(&stream).unwrap() == p.expected, "replay {i} differs from the reference");
    }
    assert_eq!(s.stat("kernels_run") - kernels_before, 1000, "every replay ran the emulated kernel");
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

#[test]
fn the_unguarded_raw_path_over_a_freed_workspace_is_caught() {
    let (_g, s) = exclusive();
    let (_ctx, mut stream, k) = setup();
    let p = problem(&stream, 8);
    let ws_bytes = SHAPE.workspace_bytes().unwrap().next_multiple_of(256) as usize;
    let ws = DeviceBuffer::alloc_zeroed(&stream, ws_bytes).unwrap();
    let ws_ptr = ws.device_ptr();
    let exec = {
        let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        // SAFETY: deliberately violated below, inside the stand-in's host memory: the point.
        unsafe { split_k_gemv_raw(&k, p.a.device_ptr(), p.x.device_ptr(), p.y.device_ptr(), SHAPE, ws_ptr, &cap).unwrap() };
        cap.end().unwrap().instantiate().unwrap()
    };
    exec.launch(&stream).unwrap();
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected, "sanity: the graph works while the workspace lives");
    assert_eq!(s.violations(), 0);

    drop(ws); // the "resize" without the guard: the graph still holds the raw address
    let _held = churn(&stream, &[ws_bytes], 4);
    let e = exec.launch(&stream).unwrap_err();
    assert_eq!(driver_code(&e), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS.0), "{e}");
    assert!(s.violations() >= 1);
    let v = s.last_violation();
    assert!(v.contains("gs_splitk_gemv partials") && v.contains("not in any live allocation"), "{v}");
}

#[test]
fn a_workspace_that_is_not_zero_filled_gives_a_wrong_answer() {
    // The counter-proof for invariant 3 on the stand-in: fresh device memory is 0xA5, so split-K
    // counters that nobody zeroed make no CTA reduce. Workspace zero-fills; a raw allocation not.
    let (_g, s) = exclusive();
    let (ctx, stream, k) = setup();
    let p = problem(&stream, 9);
    let raw = DeviceBuffer::alloc(&ctx, SHAPE.workspace_bytes().unwrap() as usize).unwrap();
    p.y.memset_u8(0, &stream).unwrap();
    // SAFETY: every address is a live allocation of the right size; only the contents are wrong.
    unsafe { split_k_gemv_raw(&k, p.a.device_ptr(), p.x.device_ptr(), p.y.device_ptr(), SHAPE, raw.device_ptr(), &stream).unwrap() };
    let got = p.y.to_host_vec::<f32>(&stream).unwrap();
    assert!(got.iter().all(|&v| v == 0.0), "dirty counters: no CTA may reduce, y stays as it was");
    assert_ne!(got, p.expected);
    // The same raw launch over a Workspace's memory: its zero-fill alone makes it right (the
    // guarded op would zero the counters itself).
    let ws = Workspace::new(&stream, SHAPE.workspace_bytes().unwrap()).unwrap();
    // SAFETY: as above, over the workspace's live buffer.
    unsafe { split_k_gemv_raw(&k, p.a.device_ptr(), p.x.device_ptr(), p.y.device_ptr(), SHAPE, ws.device_ptr(), &stream).unwrap() };
    assert_eq!(p.y.to_host_vec::<f32>(&stream).unwrap(), p.expected);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// Two split-K shapes sharing one workspace pre-grown for the larger (what the planner is for):
/// the smaller shape's counters lie inside the larger one's partials, so after the larger ran
/// they hold its fp32 sums, and no CTA of the smaller shape would ever see itself last. The op
/// zeroes its counters before every launch (a memset node when captured), as invariant 3 asks of
/// kernels keeping semaphores in a shared workspace; the kernel's own reset at the end only
/// cleans up after itself. (Before, the smaller shape left y untouched.)
#[test]
fn split_k_shapes_sharing_one_workspace_match_the_reference() {
    let (_g, s) = exclusive();
    let (_ctx, mut stream, k) = setup();
    let big = SplitKShape { m: 256, k: 1024, splits: 8 };
    let small = SplitKShape { m: 256, k: 1024, splits: 2 };
    assert!(small.workspace_bytes().unwrap() <= big.workspace_bytes().unwrap() / 2, "the small shape's counters must lie in the big one's partials");
    let (pb, ps) = (split_k_problem(&stream, big, 21), split_k_problem(&stream, small, 22));
    let mut ws = Workspace::new(&stream, big.workspace_bytes().unwrap()).unwrap();
    for _ in 0..2 {
        k.split_k_gemv(&pb.a, &pb.x, &pb.y, big, &mut ws, &stream).unwrap();
        ps.y.memset_u8(0, &stream).unwrap();
        k.split_k_gemv(&ps.a, &ps.x, &ps.y, small, &mut ws, &stream).unwrap();
        assert_eq!(ps.y.to_host_vec::<f32>(&stream).unwrap(), ps.expected, "eager: the small shape after the big one");
    }
    // Captured, both into one graph over the one workspace, replayed.
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (ba, bx, by) = (cap.bind_buffer(&pb.a).unwrap(), cap.bind_buffer(&pb.x).unwrap(), cap.bind_buffer(&pb.y).unwrap());
        let (sa, sx, sy) = (cap.bind_buffer(&ps.a).unwrap(), cap.bind_buffer(&ps.x).unwrap(), cap.bind_buffer(&ps.y).unwrap());
        k.split_k_gemv_captured(&ba, &bx, &by, big, &w, &cap).unwrap();
        cap.memset_u8(&sy, 0).unwrap();
        k.split_k_gemv_captured(&sa, &sx, &sy, small, &w, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
        assert_eq!(ps.y.to_host_vec::<f32>(&stream).unwrap(), ps.expected, "replayed: the small shape after the big one");
        assert_eq!(pb.y.to_host_vec::<f32>(&stream).unwrap(), pb.expected, "replayed: the big shape");
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

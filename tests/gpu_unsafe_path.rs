//! The counter-proof for tests/gpu_core.rs: the unguarded path (a raw workspace pointer baked into
//! a graph, the buffer then freed and the allocator's blocks reused) really does go wrong, and the
//! test notices. This is why replay-after-grow can fail when the guard is missing.
//! Its own executable: a replay into freed memory may leave the context unusable.

mod common;

use common::{gpu, split_k_gemv_raw, split_k_problem, SplitKProblem};
use graphsafe::driver::{DeviceBuffer, DevicePtr};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::{SplitKShape, TestKernels};

const SHAPE: SplitKShape = SplitKShape { m: 1000, k: 4096, splits: 16 };

#[test]
fn replaying_a_graph_whose_workspace_was_freed_is_detected() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let k = TestKernels::load(&ctx).unwrap();
    let SplitKProblem { a, x, y, expected } = split_k_problem(&stream, SHAPE, 31);
    let ws_bytes = SHAPE.workspace_bytes().unwrap().next_multiple_of(256) as usize;
    let ws = DeviceBuffer::alloc_zeroed(&stream, ws_bytes).unwrap();
    let ws_ptr: DevicePtr = ws.device_ptr();

    let exec = {
        let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        // The unguarded path: a raw address, not bound to the capture.
        // SAFETY: deliberately violated below (that is the point of this test); nothing outside
        // this process's own allocations is touched.
        unsafe { split_k_gemv_raw(&k, a.device_ptr(), x.device_ptr(), y.device_ptr(), SHAPE, ws_ptr, &cap).unwrap() };
        cap.end().unwrap().instantiate().unwrap()
    };
    exec.launch(&stream).unwrap();
    assert_eq!(y.to_host_vec::<f32>(&stream).unwrap(), expected, "sanity: the graph works while the workspace lives");

    drop(ws); // the "resize": the block goes back to the allocator while the graph still points at it
    let mut reused = false;
    let mut held = Vec::new();
    for _ in 0..16 {
        let b = DeviceBuffer::alloc(&ctx, ws_bytes).unwrap();
        b.memset_u32(0x0101_0101, &stream).unwrap(); // the counters now read 0x01010101
        reused |= b.device_ptr() == ws_ptr;
        held.push(b);
    }
    stream.synchronize().unwrap();
    eprintln!("freed workspace block handed out again: {reused}");

    let mut detected = 0;
    for _ in 0..20 {
        if y.memset_u8(0, &stream).is_err() || exec.launch(&stream).is_err() {
            detected += 1;
            break;
        }
        match y.to_host_vec::<f32>(&stream) {
            Ok(got) if got == expected => {}
            _ => detected += 1,
        }
    }
    assert!(detected > 0, "20 replays over a freed, reused workspace all gave the right answer: the test cannot tell");
    eprintln!("replays over the freed workspace that went wrong: {detected} of 20");
}

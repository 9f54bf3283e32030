//! The core pattern: pre-grow a workspace, capture a kernel that keeps semaphores in it, replay the
//! graph, and grow the workspace afterwards without breaking the graph. Needs a GPU.
//!
//! `cargo run --release --example capture_replay`

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::workspace::Workspace;

fn main() -> graphsafe::Result<()> {
    let ctx = Context::new(0)?;
    let mut stream = Stream::new(&ctx)?;
    let kernels = TestKernels::load(&ctx)?;
    let shape = SplitKShape { m: 1024, k: 1024, splits: 8 };
    let a = DeviceBuffer::from_host(&stream, &vec![1.0f32; 1024 * 1024])?;
    let x = DeviceBuffer::from_host(&stream, &vec![0.5f32; 1024])?;
    let y = DeviceBuffer::alloc_zeroed(&stream, 1024 * 4)?;

    // 1. Size before capture, so nothing needs to grow inside it.
    let mut ws = Workspace::new(&stream, shape.workspace_bytes()?)?;
    // 2. Capture: the workspace is borrowed until the capture returns, so it cannot grow in
    //    between, and the views bound here cannot leave it or reach another capture.
    let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| {
        let w = cap.bind_workspace(&mut ws)?;
        let (ca, cx, cy) = (cap.bind_buffer(&a)?, cap.bind_buffer(&x)?, cap.bind_buffer(&y)?);
        kernels.split_k_gemv_captured(&ca, &cx, &cy, shape, &w, cap)
    })?;
    let exec = graph.instantiate()?;
    // 3. Grow later (retires the captured buffer; the graph keeps it alive) and replay.
    ws.ensure_size(64 << 20, &stream)?;
    exec.launch(&stream)?;
    let out = y.to_host_vec::<f32>(&stream)?;
    println!("y[0] = {} (expected 512), workspace now {} bytes, {} retired", out[0], ws.capacity(), ws.retired_count());
    Ok(())
}

//! A cuDNN GEMM inside a CUDA graph, the graph-safe way: plan every problem the engine will
//! capture, pre-grow the shared workspace once, capture, replay.
//!
//! Run: `cargo run --release --example cudnn_matmul` (needs a GPU and cuDNN 9; says so otherwise).

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::cudnn::{self, Cudnn, MatmulArgs, MatmulProblem};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;

fn main() -> graphsafe::Result<()> {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("no GPU: {e}");
            return Ok(());
        }
    };
    let dnn = match Cudnn::new(&ctx) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no cuDNN: {e}");
            return Ok(());
        }
    };
    println!("cuDNN {} from {}", dnn.version(), dnn.library());
    let mut stream = Stream::new(&ctx)?;
    // A linear layer y = x·Wᵀ with W stored [N, K] (B = Wᵀ is column-major), for every batch size
    // the engine captures.
    let (n, k) = (4096, 4096);
    let batches = [1usize, 8, 32, 128];
    let problems: Vec<MatmulProblem> = batches.iter().map(|&m| MatmulProblem::new(m, n, k, DType::Bf16, DType::Bf16).with_b_col_major()).collect();
    // Size before capture: every plan is built now; one pre-grow covers them all.
    let bytes = cudnn::plan_workspace(&dnn, &problems)?;
    let mut ws = Workspace::new(&stream, bytes)?;
    println!("{} plans, workspace {} bytes", dnn.plan_count(), ws.capacity());

    let one = (0x3f80u16).to_le_bytes(); // bf16 1.0
    let x = DeviceBuffer::from_host(&stream, &one.repeat(128 * k))?;
    let w = DeviceBuffer::from_host(&stream, &one.repeat(n * k))?;
    let y = DeviceBuffer::alloc_zeroed(&stream, 128 * n * 2)?;
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
        let wsc = cap.bind_workspace(&mut ws)?;
        for &m in &batches {
            let args = MatmulArgs::new(
                Tensor::contiguous(&x, DType::Bf16, &[m, k]),
                Tensor::strided(&w, 0, DType::Bf16, &[k, n], &[1, k]),
                Tensor::contiguous(&y, DType::Bf16, &[m, n]),
            );
            // Every buffer bound to the capture: the graph keeps x, W and y alive.
            let info = cudnn::matmul_captured(&dnn, &args.bind(&mut cap)?, &wsc, &cap)?;
            println!("captured m={m}: engine {} workspace {} B", info.engine, info.workspace_bytes);
        }
        cap.end()?.instantiate()?
    };
    exec.launch(&stream)?;
    let out = y.to_host_vec::<u16>(&stream)?;
    let v = f32::from_bits((out[0] as u32) << 16);
    println!("y[0,0] = {v} (expected {k})");
    assert_eq!(v, k as f32);
    Ok(())
}

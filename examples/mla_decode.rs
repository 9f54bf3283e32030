//! An MLA decode step as an engine runs it: plan the workspace for the largest shape, pre-grow,
//! capture the decode with buffers bound to the capture, replay. Needs an H100/H200 (sm_90) or a
//! B200 (sm_100).
//!
//! `cargo run --release --example mla_decode`

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{decode_captured, MlaArch, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;

fn main() -> graphsafe::Result<()> {
    let ctx = Context::new(0)?;
    let mut stream = Stream::new(&ctx)?;
    let (batch, heads, page, max_seq) = (4usize, 128usize, 64usize, 2048usize);
    let max_pages = max_seq / page;
    let pages = batch * max_pages;
    let q = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 576 * 2)?;
    let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
    let seq_lens = DeviceBuffer::from_host(&stream, &[2048i32, 1, 100, 1500])?;
    let pt: Vec<i32> = (0..pages as i32).collect();
    let page_table = DeviceBuffer::from_host(&stream, &pt)?;
    let out = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 512 * 2)?;

    let args = MlaDecodeArgs::new(
        Tensor::strided(&q, 0, DType::Bf16, &[batch, heads, 512], &[heads * 576, 576, 1]),
        Tensor::strided(&q, 1024, DType::Bf16, &[batch, heads, 64], &[heads * 576, 576, 1]),
        Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
        Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
        Tensor::contiguous(&page_table, DType::I32, &[batch, max_pages]),
        Tensor::contiguous(&out, DType::Bf16, &[batch, heads, 512]),
    )
    .with_sm_scale(1.0 / 192f32.sqrt())
    .with_max_seq_len(max_seq as u32);
    // 1. Size before capture.
    let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
    let plan = args.plan(arch, ctx.sm_count(), ctx.raw())?;
    let mut ws = Workspace::new(&stream, plan.workspace_bytes)?;
    // 2. Capture with every buffer bound (the graph keeps them alive).
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
        let w = cap.bind_workspace(&mut ws)?;
        let ca = args.bind(&mut cap)?;
        decode_captured(&ca, &w, &cap)?;
        cap.end()?.instantiate()?
    };
    // 3. Replay every step.
    for _ in 0..3 {
        exec.launch(&stream)?;
    }
    stream.synchronize()?;
    println!("{arch:?}: {} splits, {} workspace bytes, replayed 3 times", plan.num_splits, plan.workspace_bytes);
    Ok(())
}

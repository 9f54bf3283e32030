//! An MLA decode step over an fp8 KV cache, as an engine with vLLM's fp8 cache runs it: the cache
//! is e4m3 `[pages, page, 576]` with one f32 scale in device memory, the decode is captured with
//! the scale bound to the capture (the graph keeps it alive), and the engine rewrites the scale
//! between replays: every replay reads it when it runs. Needs an H100/H200 (sm_90: the fp8 cache
//! formats run on graphsafe's own Hopper kernel; sm_100's fp8 path takes fp8 queries instead).
//!
//! `cargo run --release --example mla_decode_fp8`

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{decode, decode_captured, KvFormat, MlaArch, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;

fn main() -> graphsafe::Result<()> {
    let ctx = Context::new(0)?;
    if MlaArch::for_compute_capability(ctx.compute_capability())? != MlaArch::Sm90 {
        println!("the fp8 KV-cache formats run on sm_90 (H100/H200); this GPU is sm_{}{}", ctx.compute_capability().0, ctx.compute_capability().1);
        return Ok(());
    }
    let mut stream = Stream::new(&ctx)?;
    let (batch, heads, page, max_seq) = (4usize, 32usize, 64usize, 2048usize);
    let max_pages = max_seq / page;
    let pages = batch * max_pages;
    // Queries bf16 (here 0.25 everywhere), the cache e4m3 (code 0x38 = 1.0 everywhere).
    let q = DeviceBuffer::from_host(&stream, &vec![half::bf16::from_f32(0.25).to_bits(); batch * heads * 576])?;
    let kv = DeviceBuffer::from_host(&stream, &vec![0x38u8; pages * page * 576])?;
    let scale = DeviceBuffer::from_host(&stream, &[0.5f32])?;
    let seq_lens = DeviceBuffer::from_host(&stream, &[2048i32, 1, 100, 1500])?;
    let pt: Vec<i32> = (0..pages as i32).collect();
    let page_table = DeviceBuffer::from_host(&stream, &pt)?;
    let out = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 512 * 2)?;

    let args = MlaDecodeArgs::new(
        Tensor::strided(&q, 0, DType::Bf16, &[batch, heads, 512], &[heads * 576, 576, 1]),
        Tensor::strided(&q, 1024, DType::Bf16, &[batch, heads, 64], &[heads * 576, 576, 1]),
        Tensor::contiguous(&kv, DType::Fp8E4m3, &[pages, page, 576]),
        Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
        Tensor::contiguous(&page_table, DType::I32, &[batch, max_pages]),
        Tensor::contiguous(&out, DType::Bf16, &[batch, heads, 512]),
    )
    .with_kv_format(KvFormat::Fp8PerTensor { scale: Tensor::contiguous(&scale, DType::F32, &[1]) })
    .with_sm_scale(1.0 / 192f32.sqrt())
    .with_max_seq_len(max_seq as u32);
    // 1. Size before capture (the workspace does not depend on the cache format).
    let plan = args.plan(MlaArch::Sm90, ctx.sm_count(), ctx.raw())?;
    let mut ws = Workspace::new(&stream, plan.workspace_bytes)?;
    // An eager call first: every K = V = 0.5 * 1.0, so every output value is 0.5.
    decode(&args, &mut ws, &stream)?;
    let first = half::bf16::from_bits(out.to_host_vec::<u16>(&stream)?[0]).to_f32();
    // 2. Capture with every buffer bound, the scale too.
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
        let w = cap.bind_workspace(&mut ws)?;
        let ca = args.bind(&mut cap)?; // the scale too: every replay reads it
        decode_captured(&ca, &w, &cap)?;
        cap.end()?.instantiate()?
    };
    // 3. Replay; the engine rescales its cache between steps by rewriting the scale.
    let mut seen = Vec::new();
    for s in [0.5f32, 2.0, 0.125] {
        scale.copy_from_host(&[s], &stream)?;
        exec.launch(&stream)?;
        seen.push(half::bf16::from_bits(out.to_host_vec::<u16>(&stream)?[0]).to_f32());
    }
    println!(
        "sm_90, fp8 per-tensor cache: {} splits, {} workspace bytes; eager out[0] = {first}; replays with scales 0.5, 2, 0.125: {seen:?}",
        plan.num_splits, plan.workspace_bytes
    );
    Ok(())
}

//! A multi-token MLA decode step (MTP / speculative decoding) as an engine runs it at tensor
//! parallelism 8: 16 of DeepSeek's 128 heads per GPU, two query tokens per request attended
//! causally (token t of s_q sees keys 0..=len - s_q + t), out and lse in FlashMLA's layouts. Plan
//! the workspace once for every batch and length the engine captures, capture, grow the workspace
//! anyway (the graph keeps its own), replay. Needs an H100/H200 (sm_90).
//!
//! `cargo run --release --example mla_decode_tokens`

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{self, decode_captured, MlaArch, MlaDecodeArgs, MlaLimits};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;

fn main() -> graphsafe::Result<()> {
    let ctx = Context::new(0)?;
    let mut stream = Stream::new(&ctx)?;
    let (batch, s_q, heads, page, max_seq) = (8usize, 2usize, 16usize, 64usize, 4096usize);
    let max_pages = max_seq / page;
    let pages = batch * max_pages;
    // q as FlashMLA takes it, [batch, s_q, heads, 576]: latent and rope of a head side by side.
    let q = DeviceBuffer::alloc_zeroed(&stream, batch * s_q * heads * 576 * 2)?;
    let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
    let seq_lens = DeviceBuffer::from_host(&stream, &[4096i32, 1, 2, 300, 64, 65, 0, 4000])?;
    let pt: Vec<i32> = (0..pages as i32).collect();
    let page_table = DeviceBuffer::from_host(&stream, &pt)?;
    let out = DeviceBuffer::alloc_zeroed(&stream, batch * s_q * heads * 512 * 2)?;
    let lse = DeviceBuffer::alloc_zeroed(&stream, batch * heads * s_q * 4)?;

    let q_strides = [s_q * heads * 576, heads * 576, 576, 1];
    let args = MlaDecodeArgs::new(
        Tensor::strided(&q, 0, DType::Bf16, &[batch, s_q, heads, 512], &q_strides),
        Tensor::strided(&q, 1024, DType::Bf16, &[batch, s_q, heads, 64], &q_strides),
        Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
        Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
        Tensor::contiguous(&page_table, DType::I32, &[batch, max_pages]),
        Tensor::contiguous(&out, DType::Bf16, &[batch, s_q, heads, 512]),
    )
    .with_lse(Tensor::contiguous(&lse, DType::F32, &[batch, heads, s_q]))
    .with_causal(true)
    .with_max_seq_len(max_seq as u32);

    // 1. Size before capture: the most any batch up to 8, length up to 4096 and token count up to
    //    2 needs on this GPU (the engine may capture several of those graphs over one workspace).
    let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
    let limits = MlaLimits::new(heads as u32, batch as u32, max_seq as u32, ctx.sm_count()).with_s_q(s_q as u32);
    let worst = mla::worst_case(arch, &limits)?;
    let mut ws = Workspace::new(&stream, worst.workspace_bytes)?;
    // 2. Capture with every buffer bound (the graph keeps them alive).
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
        let w = cap.bind_workspace(&mut ws)?;
        let ca = args.bind(&mut cap)?;
        decode_captured(&ca, &w, &cap)?;
        cap.end()?.instantiate()?
    };
    // 3. Growing the workspace now retires the captured buffer; the graph still holds it.
    ws.ensure_size(2 * worst.workspace_bytes + (1 << 20), &stream)?;
    for _ in 0..3 {
        exec.launch(&stream)?;
    }
    // Request 6 is empty and request 1 has one key, so its first token sees none: zeros, lse +inf.
    let l = lse.to_host_vec::<f32>(&stream)?;
    assert!(l[6 * heads * s_q..7 * heads * s_q].iter().all(|v| *v == f32::INFINITY));
    assert!((0..heads).all(|h| l[(heads + h) * s_q] == f32::INFINITY && l[(heads + h) * s_q + 1].is_finite()));
    println!("{arch:?}: {heads} heads x {s_q} tokens, pre-grown to {} bytes (worst: batch {}, {} tokens); replayed 3 times", worst.workspace_bytes, worst.batch, worst.s_q);
    Ok(())
}

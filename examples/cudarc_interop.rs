//! An engine that manages its GPU with cudarc runs graphsafe's kernels on its own memory: the KV
//! cache, the activations and the weights are cudarc slices; graphsafe adopts the engine's context
//! and stream, captures one decode step (MLA attention, then an NVFP4 W4A16 projection of its
//! output) into a graph, and the graph keeps every cudarc slice alive after the engine drops its
//! handles and the workspace grew after the capture. Replays are compared with the eager step bit
//! for bit. Needs an H100/H200 (sm_90).
//!
//! `cargo run --release --features cudarc-13000 --example cudarc_interop [replays]` (default 200);
//! tests/consumers/cudarc-candle builds it as an engine on candle's cudarc features would.
//!
//! Unlike cudarc's own graphs (`CudaStream::begin_capture`/`end_capture`), which hold only the
//! stream, a graphsafe graph holds every buffer it bakes in, cudarc's included.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{decode, decode_captured, MlaArch, MlaDecodeArgs};
use graphsafe::ops::nvfp4::{self, Nvfp4Matrix, Nvfp4QuantizeArgs, W4a16GemmArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use std::sync::Arc;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Deterministic bf16 bits of values in [-1, 1).
fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            half::bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0).to_bits()
        })
        .collect()
}

/// What the engine owns, all allocated through cudarc on its stream.
struct Engine {
    q_nope: Arc<CudaSlice<u16>>,
    q_pe: Arc<CudaSlice<u16>>,
    kv_cache: Arc<CudaSlice<u16>>,
    seq_lens: Arc<CudaSlice<i32>>,
    page_table: Arc<CudaSlice<i32>>,
    attn_out: Arc<CudaSlice<u16>>,
    w_bf16: Arc<CudaSlice<u16>>,
    w_packed: Arc<CudaSlice<u8>>,
    w_scales: Arc<CudaSlice<u8>>,
    w_scale: Arc<CudaSlice<f32>>,
    alpha: Arc<CudaSlice<f32>>,
    proj_out: Arc<CudaSlice<u16>>,
}

fn main() -> Res<()> {
    // graphsafe opens the driver without panicking when there is none; cudarc would panic, so ask
    // graphsafe first.
    if graphsafe::driver::device_count()? == 0 {
        return Err("no CUDA device".into());
    }
    // 1. The engine's cudarc context and stream, adopted (graphsafe holds the Arcs).
    let cctx = CudaContext::new(0)?;
    let cs: Arc<CudaStream> = cctx.new_stream()?;
    let ctx = Context::from_cudarc(&cctx)?;
    // SAFETY: while graphsafe captures on `cs` below, this program issues no cudarc work to it.
    let mut stream = unsafe { Stream::from_cudarc(&ctx, &cs) }?;
    println!("one driver for both crates: {}", graphsafe::driver::cudarc::shares_driver()?);
    // The sm90 back-ends of both ops, on whichever GPUs the arch table runs them.
    let cc = ctx.compute_capability();
    let row = graphsafe::arch::target_for_cc(cc);
    if row.and_then(|t| t.mla()) != Some(MlaArch::Sm90) || row.and_then(|t| t.nvfp4()) != Some(nvfp4::Nvfp4Arch::Sm90) {
        return Err(format!("this example runs the sm90 kernels ({}); the GPU is {}", MlaArch::Sm90.gpus(), graphsafe::arch::cc_name(cc)).into());
    }

    // 2. The engine's memory: a paged KV cache (DeepSeek-V3 shapes: 128 heads, 576 = 512 + 64),
    //    queries, and a bf16 projection weight [n, 512]; outputs allocated zeroed.
    let (batch, heads, page, n) = (2usize, 128usize, 64usize, 2048usize);
    let seq: Vec<i32> = vec![2048, 700];
    let max_seq = 2048usize;
    let max_pages = max_seq / page;
    let pages = batch * max_pages;
    let page_table: Vec<i32> = (0..pages as i32).map(|i| (i * 7 + 3) % pages as i32).collect();
    let m = batch * heads;
    let scale_bytes = nvfp4::scale_bytes(n as i64, 512)? as usize;
    let e = Engine {
        q_nope: Arc::new(cs.clone_htod(&random_bf16(batch * heads * 512, 1))?),
        q_pe: Arc::new(cs.clone_htod(&random_bf16(batch * heads * 64, 2))?),
        kv_cache: Arc::new(cs.clone_htod(&random_bf16(pages * page * 576, 3))?),
        seq_lens: Arc::new(cs.clone_htod(&seq)?),
        page_table: Arc::new(cs.clone_htod(&page_table)?),
        attn_out: Arc::new(cs.alloc_zeros::<u16>(m * 512)?),
        w_bf16: Arc::new(cs.clone_htod(&random_bf16(n * 512, 4))?),
        w_packed: Arc::new(cs.alloc_zeros::<u8>(n * 256)?),
        w_scales: Arc::new(cs.alloc_zeros::<u8>(scale_bytes)?),
        w_scale: Arc::new(cs.alloc_zeros::<f32>(1)?),
        alpha: Arc::new(cs.clone_htod(&[1.0f32])?),
        proj_out: Arc::new(cs.alloc_zeros::<u16>(m * n)?),
    };

    // 3. Hand the slices to graphsafe: each DeviceBuffer holds a share of its slice.
    let buf = |s: &Arc<CudaSlice<u16>>| DeviceBuffer::from_cudarc(&ctx, s.clone());
    let (q_nope, q_pe, kv_cache, attn_out, w_bf16, proj_out) = (buf(&e.q_nope)?, buf(&e.q_pe)?, buf(&e.kv_cache)?, buf(&e.attn_out)?, buf(&e.w_bf16)?, buf(&e.proj_out)?);
    let seq_lens = DeviceBuffer::from_cudarc(&ctx, e.seq_lens.clone())?;
    let pt = DeviceBuffer::from_cudarc(&ctx, e.page_table.clone())?;
    let w_packed = DeviceBuffer::from_cudarc(&ctx, e.w_packed.clone())?;
    let w_scales = DeviceBuffer::from_cudarc(&ctx, e.w_scales.clone())?;
    let w_scale = DeviceBuffer::from_cudarc(&ctx, e.w_scale.clone())?;
    let alpha = DeviceBuffer::from_cudarc(&ctx, e.alpha.clone())?;

    // 4. Setup, eager: quantize the engine's weight to NVFP4 (into its own slices), repack it for
    //    the W4A16 kernel, then one eager step, whose outputs are the reference for every replay.
    let w_t = Tensor::contiguous(&w_bf16, DType::Bf16, &[n, 512]);
    nvfp4::global_scale(&w_t, &w_scale, &stream)?;
    let w_nvfp4 = Nvfp4Matrix::new(&w_packed, &w_scales, &w_scale, n, 512);
    nvfp4::quantize(&Nvfp4QuantizeArgs::new(w_t.clone(), &w_scale, w_nvfp4.clone()), &stream)?;
    let weight = nvfp4::prepare_weight(&w_nvfp4, &stream)?;
    let args = MlaDecodeArgs::new(
        Tensor::contiguous(&q_nope, DType::Bf16, &[batch, heads, 512]),
        Tensor::contiguous(&q_pe, DType::Bf16, &[batch, heads, 64]),
        Tensor::contiguous(&kv_cache, DType::Bf16, &[pages, page, 576]),
        Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
        Tensor::contiguous(&pt, DType::I32, &[batch, max_pages]),
        Tensor::contiguous(&attn_out, DType::Bf16, &[batch, heads, 512]),
    )
    .with_sm_scale(1.0 / 192f32.sqrt())
    .with_max_seq_len(max_seq as u32);
    let a = Tensor::contiguous(&attn_out, DType::Bf16, &[m, 512]);
    let d = Tensor::contiguous(&proj_out, DType::Bf16, &[m, n]);
    let mut ws = Workspace::new(&stream, 0)?;
    let mla_plan = decode(&args, &mut ws, &stream)?;
    let gemm_plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a.clone(), &weight, &alpha, d.clone()), &mut ws, &stream)?;
    // The engine reads graphsafe's result through cudarc (same stream: ordered after it).
    let eager: Vec<u16> = cs.clone_dtoh(&*e.proj_out)?;
    println!("eager step: {mla_plan:?}; W4A16 {m}x{n}x512, workspace {} bytes", ws.capacity());
    let _ = gemm_plan;

    // 5. Capture the step: attention, projection, and a copy of the projection into a read-back
    //    buffer graphsafe owns. Every buffer bound here is held by the graph.
    let readback = DeviceBuffer::alloc(&ctx, proj_out.len())?;
    let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| {
        let w = cap.bind_workspace(&mut ws)?;
        let (out_c, proj_c, rb_c, alpha_c) = (cap.bind_buffer(&attn_out)?, cap.bind_buffer(&proj_out)?, cap.bind_buffer(&readback)?, cap.bind_buffer(&alpha)?);
        let ca = args.bind(cap)?;
        cap.memset_u8(&proj_c, 0)?;
        decode_captured(&ca, &w, cap)?;
        let cw = weight.bind(cap)?;
        nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(out_c, DType::Bf16, &[m, 512]), cw.clone(), alpha_c.clone(), Tensor::contiguous(proj_c.clone(), DType::Bf16, &[m, n])), &w, cap)?;
        cap.copy(&rb_c, &proj_c)
    })?;
    let exec = graph.instantiate()?;
    println!("captured: the graph keeps {} allocations alive", graph.kept_alive());
    drop(graph);
    // The workspace grows past what the graph baked in: a new buffer; the graph keeps the old one.
    let captured_capacity = ws.capacity();
    if !ws.ensure_size(2 * captured_capacity + (1 << 20), &stream)? {
        return Err("the workspace did not grow".into());
    }
    println!("workspace grown from {captured_capacity} to {} bytes after the capture", ws.capacity());

    // 6. The engine frees its own handles (cudarc's and graphsafe's) and allocates other data of
    //    the same sizes from the same cudarc pool: none of it can land on the graph's memory.
    drop((args, a, d, w_t, w_nvfp4));
    drop((q_nope, q_pe, kv_cache, seq_lens, pt, attn_out, w_bf16, w_packed, w_scales, w_scale, alpha, proj_out, weight, ws));
    drop(e);
    let churn: Vec<CudaSlice<u8>> = (0..4).map(|i| cs.clone_htod(&vec![0xA5u8 ^ i; pages * page * 576 * 2])).collect::<Result<_, _>>()?;

    // 7. Replay.
    let replays: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("replays: a count, not {a:?}"))?,
        None => 200,
    };
    for i in 0..replays {
        readback.memset_u8(0xFF, &stream)?;
        exec.launch(&stream)?;
        if readback.to_host_vec::<u16>(&stream)? != eager {
            return Err(format!("replay {i} differs from the eager step").into());
        }
    }
    println!("{replays}/{replays} replays bit-identical to the eager step after the engine dropped its handles ({} churn slices live)", churn.len());
    Ok(())
}

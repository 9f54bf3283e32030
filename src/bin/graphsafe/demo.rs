//! `graphsafe demo`: the README's main command.
//!
//! 1. Plans the MLA workspace of a DeepSeek-V3-shaped decode step (128 heads, latent 512 + rope
//!    64, contexts up to 163,840 tokens, the batch sizes an engine captures) for the GPU it finds,
//!    or for a B200 (148 SMs) when there is none, and says which.
//! 2. With a GPU, runs the graph-safety scenario on real memory (see `live`), then an MLA decode
//!    step (`mla_live`).
//! 3. With a GPU and cuDNN, captures the cuDNN GEMMs around MLA, planned before capture (`cudnn_live`).
//! 4. With a GPU, an NVFP4 layer: quantize a weight on the GPU, then (Hopper) the W4A16 GEMM
//!    captured and replayed against eager (`nvfp4_live`).

use graphsafe::driver;
use graphsafe::ops::mla::{sm100, LATENT_DIM, NUM_HEADS, ROPE_DIM};
use graphsafe::ops::tensor::DType;

/// DeepSeek-V3's longest context (max_position_embeddings).
const MAX_SEQ_LEN: i64 = 163_840;
/// KV-cache page size the plan assumes (DeepSeek-V3 engines commonly use 64-token pages).
const PLAN_PAGE_SIZE: i64 = 64;
/// Batch sizes a serving engine typically captures graphs for.
const CAPTURE_BATCHES: &[i64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256];
pub fn run() -> i32 {
    // The plan's target when no Blackwell GPU is present: the reference GPU of the arch table's
    // row for CUTLASS's MLA kernel (a B200).
    let (ref_gpu, ref_sms) = graphsafe::arch::TARGETS
        .iter()
        .find(|t| t.mla() == Some(graphsafe::arch::MlaArch::Sm100))
        .map_or(("B200", 148), |t| (t.reference_gpu, i64::from(t.sm_count)));
    let gpu = driver::device_count().ok().filter(|&n| n > 0).and_then(|_| driver::Device::get(0).ok()?.info().ok());
    let (sm_count, target) = match &gpu {
        Some(d) if graphsafe::arch::target_for_cc(d.compute_capability).and_then(|t| t.mla()) == Some(graphsafe::arch::MlaArch::Sm100) => {
            (d.sm_count as i64, format!("GPU 0: {}, {} SMs", d.name, d.sm_count))
        }
        Some(d) => (
            ref_sms,
            format!(
                "a {ref_gpu} ({ref_sms} SMs): GPU 0 is {} (sm_{}{}), and the CUTLASS MLA kernel runs on {}",
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                graphsafe::arch::MlaArch::Sm100.targets()
            ),
        ),
        None => (ref_sms, format!("a {ref_gpu} ({ref_sms} SMs): no GPU found here")),
    };
    println!("graphsafe demo: DeepSeek-V3 decode step, MLA {NUM_HEADS} heads x ({LATENT_DIM} latent + {ROPE_DIM} rope), contexts up to {MAX_SEQ_LEN}");
    println!("workspace plan for {target}");
    let dtype = DType::Bf16;
    println!("{:>8} {:>7} {:>16}", "batch", "splits", "workspace bytes");
    for &b in CAPTURE_BATCHES {
        match sm100::plan(&sm100::Shape::new(dtype, b, MAX_SEQ_LEN, PLAN_PAGE_SIZE, sm_count), None) {
            Ok(p) => println!("{:>8} {:>7} {:>16}", b, p.num_splits, p.workspace_bytes),
            Err(e) => {
                eprintln!("error: {e}");
                return 1;
            }
        }
    }
    let max_batch = *CAPTURE_BATCHES.last().expect("non-empty");
    match sm100::worst_case(&sm100::Shape::new(dtype, max_batch, MAX_SEQ_LEN, PLAN_PAGE_SIZE, sm_count), None) {
        Ok(w) => println!(
            "pre-grow the workspace to {} bytes before capture: the worst case over batch 1..={max_batch}, seq len 1..={MAX_SEQ_LEN} (batch {}, seq len {}, {} splits)",
            w.workspace_bytes, w.batch, w.max_seq_len, w.num_splits
        ),
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    }
    let code = live::run(gpu.is_some());
    if code != 0 {
        return code;
    }
    let code = mla_live::run(gpu.is_some());
    if code != 0 {
        return code;
    }
    let code = cudnn_live::run(gpu.is_some());
    if code != 0 {
        return code;
    }
    nvfp4_live::run(gpu.is_some())
}

mod live {
    //! Capture a split-K kernel whose semaphores live in the workspace, grow the workspace past
    //! it three times, churn the allocator over the retired blocks, replay, and compare.
    use graphsafe::driver::{Context, DeviceBuffer, MemInfo, Stream};
    use graphsafe::graph::{CaptureMode, NodeKind};
    use graphsafe::ops::testing::{SplitKShape, TestKernels};
    use graphsafe::workspace::Workspace;

    const SHAPE: SplitKShape = SplitKShape { m: 4096, k: 4096, splits: 16 };
    const REPLAYS: usize = 200;

    pub fn run(has_gpu: bool) -> i32 {
        if !has_gpu {
            println!("live capture/replay: skipped (no CUDA driver or GPU on this machine)");
            return 0;
        }
        match scenario() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("live capture/replay FAILED: {e}");
                1
            }
        }
    }

    fn ensure(ok: bool, what: &str) -> Result<(), String> {
        if ok {
            println!("  ok: {what}");
            Ok(())
        } else {
            Err(what.to_string())
        }
    }

    fn scenario() -> Result<(), String> {
        let e = |e: graphsafe::Error| e.to_string();
        let ctx = Context::new(0).map_err(e)?;
        let mut stream = Stream::new(&ctx).map_err(e)?;
        let kernels = match TestKernels::load(&ctx) {
            Ok(k) => k,
            Err(err @ graphsafe::Error::ArchUnsupported { .. }) => {
                println!("live capture/replay: skipped ({err})");
                return Ok(());
            }
            Err(err) => return Err(err.to_string()),
        };
        println!("live capture/replay on {} (split-K GEMV {}x{}, {} splits, semaphores in the workspace):", ctx.device().info().map_err(e)?.name, SHAPE.m, SHAPE.k, SHAPE.splits);
        let (m, k) = (SHAPE.m as usize, SHAPE.k as usize);
        let a_host: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
        let x_host: Vec<f32> = (0..k).map(|i| ((i * 104_729) % 997) as f32 / 498.0 - 1.0).collect();
        let free_start = MemInfo::query(&ctx).map_err(e)?.free;
        {
            let a = DeviceBuffer::from_host(&stream, &a_host).map_err(e)?;
            let x = DeviceBuffer::from_host(&stream, &x_host).map_err(e)?;
            let y = DeviceBuffer::alloc_zeroed(&stream, m * 4).map_err(e)?;
            let ws_bytes = SHAPE.workspace_bytes().map_err(e)?;
            let mut ws = Workspace::new(&stream, ws_bytes).map_err(e)?;
            ensure(ws.to_host_vec(&stream).map_err(e)?.iter().all(|&b| b == 0), "new workspace reads all-zero")?;
            kernels.split_k_gemv(&a, &x, &y, SHAPE, &mut ws, &stream).map_err(e)?;
            let eager = y.to_host_vec::<f32>(&stream).map_err(e)?;

            let graph = {
                let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).map_err(e)?;
                let w = cap.bind_workspace(&mut ws).map_err(e)?;
                let (ca, cx, cy) = (cap.bind_buffer(&a).map_err(e)?, cap.bind_buffer(&x).map_err(e)?, cap.bind_buffer(&y).map_err(e)?);
                cap.memset_u8(&cy, 0).map_err(e)?;
                let too_small = SplitKShape { splits: SHAPE.splits * 2, ..SHAPE };
                let refused = matches!(
                    kernels.split_k_gemv_captured(&ca, &cx, &cy, too_small, &w, &cap),
                    Err(graphsafe::Error::WorkspaceTooSmall { .. })
                );
                ensure(refused, "a kernel needing more than the captured workspace is refused (WorkspaceTooSmall), not grown")?;
                kernels.split_k_gemv_captured(&ca, &cx, &cy, SHAPE, &w, &cap).map_err(e)?;
                cap.end().map_err(e)?
            };
            let kinds = graph.node_kinds().map_err(e)?;
            // y's memset, the op's zero-fill of its counters, the kernel.
            ensure(kinds == [NodeKind::Memset, NodeKind::Memset, NodeKind::Kernel], "the captured memsets and kernel are graph nodes (nothing escaped to another stream)")?;
            let exec = graph.instantiate().map_err(e)?;
            for step in 1..=3u64 {
                ws.ensure_size(ws_bytes * (1 + step), &stream).map_err(e)?;
            }
            ensure(ws.retired_count() == 3, "the workspace grew 3 times by retiring, never resizing")?;
            let mut churn = Vec::new();
            for _ in 0..8 {
                let b = DeviceBuffer::alloc(&ctx, ws_bytes as usize * 3).map_err(e)?;
                b.memset_u32(0xDEAD_BEEF, &stream).map_err(e)?;
                churn.push(b);
            }
            let mut identical = 0;
            for _ in 0..REPLAYS {
                exec.launch(&stream).map_err(e)?;
                identical += (y.to_host_vec::<f32>(&stream).map_err(e)? == eager) as usize;
            }
            ensure(identical == REPLAYS, &format!("{identical}/{REPLAYS} replays after growth and allocator churn are bit-identical to eager"))?;
        }
        ctx.synchronize().map_err(e)?;
        let free_end = MemInfo::query(&ctx).map_err(e)?.free;
        ensure(free_start.abs_diff(free_end) <= 2 << 20, &format!(
            "with the graph gone every retired buffer is freed (free memory {} MiB -> {} MiB)",
            free_start >> 20, free_end >> 20
        ))?;
        Ok(())
    }
}

mod mla_live {
    //! One DeepSeek-V3-shaped MLA decode step on the GPU found: eager, then captured with a
    //! pre-grown workspace, replayed, and compared bit for bit with eager.
    use graphsafe::driver::{Context, DeviceBuffer, Stream};
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::mla::{decode, decode_captured, MlaArch, MlaDecodeArgs, NUM_HEADS};
    use graphsafe::ops::tensor::{DType, Tensor};
    use graphsafe::workspace::Workspace;

    const SEQ_LENS: [i32; 8] = [4096, 17, 1000, 2048, 1, 3333, 640, 129];
    const PAGE: usize = 64;

    pub fn run(has_gpu: bool) -> i32 {
        if !has_gpu {
            println!("live MLA decode: skipped (no CUDA driver or GPU on this machine)");
            return 0;
        }
        match step() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("live MLA decode FAILED: {e}");
                1
            }
        }
    }

    fn step() -> Result<(), String> {
        let e = |e: graphsafe::Error| e.to_string();
        let ctx = Context::new(0).map_err(e)?;
        let mut stream = Stream::new(&ctx).map_err(e)?;
        match MlaArch::for_compute_capability(ctx.device().compute_capability().map_err(e)?) {
            Ok(arch) => println!("live MLA decode ({arch:?} back-end): batch {}, {NUM_HEADS} heads, seq lens {SEQ_LENS:?}, page {PAGE}", SEQ_LENS.len()),
            Err(err) => {
                println!("live MLA decode: skipped ({err})");
                return Ok(());
            }
        }
        let b = SEQ_LENS.len();
        let max_seq = *SEQ_LENS.iter().max().expect("non-empty") as usize;
        let max_pages = max_seq.div_ceil(PAGE);
        let pages = b * max_pages;
        let bits = |n: usize, seed: usize| -> Vec<u16> {
            (0..n).map(|i| half::bf16::from_f32((((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.5).to_bits()).collect()
        };
        let q_nope = DeviceBuffer::from_host(&stream, &bits(b * NUM_HEADS * 512, 1)).map_err(e)?;
        let q_pe = DeviceBuffer::from_host(&stream, &bits(b * NUM_HEADS * 64, 2)).map_err(e)?;
        let kv = DeviceBuffer::from_host(&stream, &bits(pages * PAGE * 576, 3)).map_err(e)?;
        let seq_lens = DeviceBuffer::from_host(&stream, &SEQ_LENS).map_err(e)?;
        let pt: Vec<i32> = (0..b * max_pages).map(|i| ((i % max_pages) * b + i / max_pages) as i32).collect();
        let page_table = DeviceBuffer::from_host(&stream, &pt).map_err(e)?;
        let out = DeviceBuffer::alloc_zeroed(&stream, b * NUM_HEADS * 512 * 2).map_err(e)?;
        let lse = DeviceBuffer::alloc_zeroed(&stream, b * NUM_HEADS * 4).map_err(e)?;
        let args = MlaDecodeArgs::new(
            Tensor::contiguous(&q_nope, DType::Bf16, &[b, NUM_HEADS, 512]),
            Tensor::contiguous(&q_pe, DType::Bf16, &[b, NUM_HEADS, 64]),
            Tensor::contiguous(&kv, DType::Bf16, &[pages, PAGE, 576]),
            Tensor::contiguous(&seq_lens, DType::I32, &[b]),
            Tensor::contiguous(&page_table, DType::I32, &[b, max_pages]),
            Tensor::contiguous(&out, DType::Bf16, &[b, NUM_HEADS, 512]),
        )
        .with_lse(Tensor::contiguous(&lse, DType::F32, &[b, NUM_HEADS]))
        .with_sm_scale(1.0 / 192f32.sqrt())
        .with_max_seq_len(max_seq as u32);
        // Size before capture: the plan for the largest shape this "engine" captures.
        let arch = MlaArch::for_compute_capability(ctx.device().compute_capability().map_err(e)?).map_err(e)?;
        let plan = args.plan(arch, ctx.device().sm_count().map_err(e)?, ctx.raw()).map_err(e)?;
        let mut ws = Workspace::new(&stream, plan.workspace_bytes).map_err(e)?;
        decode(&args, &mut ws, &stream).map_err(e)?;
        let eager_out = out.to_host_vec::<u16>(&stream).map_err(e)?;
        let eager_lse = lse.to_host_vec::<u32>(&stream).map_err(e)?;
        println!("  ok: eager decode, {} KV splits, {} workspace bytes (pre-grown)", plan.num_splits, plan.workspace_bytes);
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).map_err(e)?;
            let w = cap.bind_workspace(&mut ws).map_err(e)?;
            let ca = args.bind(&mut cap).map_err(e)?;
            decode_captured(&ca, &w, &cap).map_err(e)?;
            cap.end().map_err(e)?.instantiate().map_err(e)?
        };
        ws.ensure_size(ws.capacity() * 4 + (64 << 20), &stream).map_err(e)?;
        let mut same = 0;
        for _ in 0..50 {
            out.memset_u8(0, &stream).map_err(e)?;
            exec.launch(&stream).map_err(e)?;
            same += (out.to_host_vec::<u16>(&stream).map_err(e)? == eager_out && lse.to_host_vec::<u32>(&stream).map_err(e)? == eager_lse) as usize;
        }
        if same != 50 {
            return Err(format!("only {same}/50 replays equal eager"));
        }
        println!("  ok: 50/50 replays of the captured decode (workspace grown past it afterwards) are bit-identical to eager");
        Ok(())
    }
}


mod cudnn_live {
    //! A cuDNN GEMM in the decode step: the linear layers around MLA (DeepSeek-V3: hidden 7168 →
    //! q_lora 1536 and kv_lora 512 + rope 64) for every captured batch size, planned before capture,
    //! one pre-grow, captured, the workspace grown past the graph, replayed, compared with eager.
    use graphsafe::driver::{Context, DeviceBuffer, Stream};
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::cudnn::{self, Cudnn, MatmulArgs, MatmulProblem};
    use graphsafe::ops::tensor::{DType, Tensor};
    use graphsafe::workspace::Workspace;

    const HIDDEN: usize = 7168;
    const OUTS: [usize; 2] = [1536, 576];
    const BATCHES: [usize; 4] = [1, 16, 64, 256];

    pub fn run(has_gpu: bool) -> i32 {
        if !has_gpu {
            println!("live cuDNN GEMM: skipped (no CUDA driver or GPU on this machine)");
            return 0;
        }
        match step() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("live cuDNN GEMM FAILED: {e}");
                1
            }
        }
    }

    fn step() -> Result<(), String> {
        let e = |e: graphsafe::Error| e.to_string();
        let ctx = Context::new(0).map_err(e)?;
        let dnn = match Cudnn::new(&ctx) {
            Ok(d) => d,
            Err(err) => {
                println!("live cuDNN GEMM: skipped ({err})");
                return Ok(());
            }
        };
        let mut stream = Stream::new(&ctx).map_err(e)?;
        let problems: Vec<MatmulProblem> = BATCHES
            .iter()
            .flat_map(|&m| OUTS.iter().map(move |&n| MatmulProblem::new(m, n, HIDDEN, DType::Bf16, DType::Bf16).with_b_col_major()))
            .collect();
        let bytes = cudnn::plan_workspace(&dnn, &problems).map_err(e)?;
        let mut ws = Workspace::new(&stream, bytes).map_err(e)?;
        println!(
            "live cuDNN GEMM (cuDNN {}): {} problems (batch {BATCHES:?} x out {OUTS:?}, K {HIDDEN}) planned before capture; workspace pre-grown to {bytes} bytes",
            dnn.version(),
            problems.len()
        );
        let mmax = *BATCHES.iter().max().expect("non-empty");
        let bits = |n: usize, seed: usize| -> Vec<u16> {
            (0..n).map(|i| (((((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.25).to_bits() >> 16) as u16).collect()
        };
        let x = DeviceBuffer::from_host(&stream, &bits(mmax * HIDDEN, 1)).map_err(e)?;
        let ws_bufs: Vec<DeviceBuffer> = OUTS.iter().enumerate().map(|(i, &n)| DeviceBuffer::from_host(&stream, &bits(n * HIDDEN, 2 + i))).collect::<Result<_, _>>().map_err(e)?;
        let outs: Vec<DeviceBuffer> = problems.iter().map(|p| DeviceBuffer::alloc_zeroed(&stream, p.m * p.n * 2)).collect::<Result<_, _>>().map_err(e)?;
        let w_of = |p: &MatmulProblem| &ws_bufs[OUTS.iter().position(|&n| n == p.n).expect("planned")];
        let mut eager = Vec::new();
        for (p, y) in problems.iter().zip(&outs) {
            let args = MatmulArgs::new(
                Tensor::contiguous(&x, DType::Bf16, &[p.m, HIDDEN]),
                Tensor::strided(w_of(p), 0, DType::Bf16, &[HIDDEN, p.n], &[1, HIDDEN]),
                Tensor::contiguous(y, DType::Bf16, &[p.m, p.n]),
            );
            cudnn::matmul(&dnn, &args, &mut ws, &stream).map_err(e)?;
            eager.push(y.to_host_vec::<u16>(&stream).map_err(e)?);
        }
        if ws.retired_count() != 0 {
            return Err("the planned workspace was too small for an eager execute".into());
        }
        println!("  ok: {} eager GEMMs ran within the planned workspace (no growth)", problems.len());
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).map_err(e)?;
            let w = cap.bind_workspace(&mut ws).map_err(e)?;
            let xc = cap.bind_buffer(&x).map_err(e)?;
            for (p, y) in problems.iter().zip(&outs) {
                let args = MatmulArgs::new(
                    Tensor::contiguous(xc.clone(), DType::Bf16, &[p.m, HIDDEN]),
                    Tensor::strided(cap.bind_buffer(w_of(p)).map_err(e)?, 0, DType::Bf16, &[HIDDEN, p.n], &[1, HIDDEN]),
                    Tensor::contiguous(cap.bind_buffer(y).map_err(e)?, DType::Bf16, &[p.m, p.n]),
                );
                cudnn::matmul_captured(&dnn, &args, &w, &cap).map_err(e)?;
            }
            cap.end().map_err(e)?.instantiate().map_err(e)?
        };
        ws.ensure_size(ws.capacity() * 4 + (64 << 20), &stream).map_err(e)?;
        let mut same = 0;
        for _ in 0..50 {
            for y in &outs {
                y.memset_u8(0, &stream).map_err(e)?;
            }
            exec.launch(&stream).map_err(e)?;
            let mut all = true;
            for (y, ey) in outs.iter().zip(&eager) {
                all &= y.to_host_vec::<u16>(&stream).map_err(e)? == *ey;
            }
            same += all as usize;
        }
        if same != 50 {
            return Err(format!("only {same}/50 replays equal eager"));
        }
        println!("  ok: 50/50 replays of the captured GEMMs (workspace grown past them afterwards) are bit-identical to eager");
        Ok(())
    }
}

mod nvfp4_live {
    //! An NVFP4 linear layer (DeepSeek-V3's q_a projection, 7168 -> 1536) on the GPU found.
    use graphsafe::driver::{Context, DeviceBuffer, Stream};
    use graphsafe::graph::CaptureMode;
    use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Nvfp4Matrix, Nvfp4QuantizeArgs, W4a16GemmArgs};
    use graphsafe::ops::tensor::{DType, Tensor};
    use graphsafe::workspace::Workspace;

    const N: usize = 1536;
    const K: usize = 7168;
    const BATCHES: [usize; 4] = [1, 16, 64, 256];

    pub fn run(has_gpu: bool) -> i32 {
        if !has_gpu {
            println!("live NVFP4 layer: skipped (no CUDA driver or GPU on this machine)");
            return 0;
        }
        match layer() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("live NVFP4 layer FAILED: {e}");
                1
            }
        }
    }

    fn layer() -> Result<(), String> {
        let e = |e: graphsafe::Error| e.to_string();
        let ctx = Context::new(0).map_err(e)?;
        let mut stream = Stream::new(&ctx).map_err(e)?;
        let arch = match Nvfp4Arch::for_compute_capability(ctx.compute_capability()) {
            Ok(a) => a,
            Err(err) => {
                println!("live NVFP4 layer: skipped ({err})");
                return Ok(());
            }
        };
        // Quantize a bf16 weight on the GPU with a global scale computed on the GPU.
        let w_bits: Vec<u16> = (0..N * K).map(|i| half::bf16::from_f32(((i * 7919 % 4001) as f32 / 2000.0 - 1.0) * 0.05).to_bits()).collect();
        let wb = DeviceBuffer::from_host(&stream, &w_bits).map_err(e)?;
        let gs = DeviceBuffer::alloc_zeroed(&stream, 4).map_err(e)?;
        let wt = Tensor::contiguous(&wb, DType::Bf16, &[N, K]);
        nvfp4::global_scale(&wt, &gs, &stream).map_err(e)?;
        let packed = DeviceBuffer::alloc(&ctx, N * K / 2).map_err(e)?;
        let scales = DeviceBuffer::alloc(&ctx, nvfp4::scale_bytes(N as i64, K as i64).map_err(e)? as usize).map_err(e)?;
        let w = Nvfp4Matrix::new(&packed, &scales, &gs, N, K);
        nvfp4::quantize(&Nvfp4QuantizeArgs::new(wt.clone(), &gs, w.clone()), &stream).map_err(e)?;
        println!("live NVFP4 layer ({arch:?}): weight [{N}, {K}] quantized on the GPU ({} bytes -> {} + {} scale bytes)", N * K * 2, N * K / 2, scales.len());
        if arch != Nvfp4Arch::Sm90 {
            println!("  (the Blackwell GEMM path is exercised by tests/gpu_nvfp4.rs on Blackwell GPUs)");
            return Ok(());
        }
        let prepared = nvfp4::prepare_weight(&w, &stream).map_err(e)?;
        // Size before capture: the largest workspace over the batch sizes captured.
        let mut bytes = 0;
        for &m in &BATCHES {
            bytes = bytes.max(nvfp4::plan(arch, m as i64, N as i64, K as i64, DType::Bf16, ctx.sm_count() as i64).map_err(e)?.workspace_bytes);
        }
        let mut ws = Workspace::new(&stream, bytes).map_err(e)?;
        let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).map_err(e)?;
        for &m in &BATCHES {
            let a_bits: Vec<u16> = (0..m * K).map(|i| half::bf16::from_f32((i * 104_729 % 2003) as f32 / 1001.0 - 1.0).to_bits()).collect();
            let a = DeviceBuffer::from_host(&stream, &a_bits).map_err(e)?;
            let d = DeviceBuffer::alloc_zeroed(&stream, m * N * 2).map_err(e)?;
            let (at, dt) = (Tensor::contiguous(&a, DType::Bf16, &[m, K]), Tensor::contiguous(&d, DType::Bf16, &[m, N]));
            nvfp4::w4a16_gemm(&W4a16GemmArgs::new(at.clone(), &prepared, &alpha, dt.clone()), &mut ws, &stream).map_err(e)?;
            let eager = d.to_host_vec::<u16>(&stream).map_err(e)?;
            let exec = {
                let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).map_err(e)?;
                let w = cap.bind_workspace(&mut ws).map_err(e)?;
                let (ca, cal, cd) = (cap.bind_buffer(&a).map_err(e)?, cap.bind_buffer(&alpha).map_err(e)?, cap.bind_buffer(&d).map_err(e)?);
                let cw = prepared.bind(&mut cap).map_err(e)?;
                nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca, DType::Bf16, &[m, K]), cw.clone(), cal.clone(), Tensor::contiguous(cd, DType::Bf16, &[m, N])), &w, &cap).map_err(e)?;
                cap.end().map_err(e)?.instantiate().map_err(e)?
            };
            let mut same = 0;
            for _ in 0..10 {
                d.memset_u8(0, &stream).map_err(e)?;
                exec.launch(&stream).map_err(e)?;
                same += (d.to_host_vec::<u16>(&stream).map_err(e)? == eager) as usize;
            }
            if same != 10 {
                return Err(format!("batch {m}: {same}/10 replays equal eager"));
            }
        }
        println!("  ok: W4A16 for batches {BATCHES:?}: workspace pre-grown once to {bytes} bytes, 10/10 replays per batch bit-identical to eager");
        Ok(())
    }
}

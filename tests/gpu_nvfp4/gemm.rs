//! The GEMMs: Hopper's W4A16 against a dequantize-then-f64 reference (tile grid, stream-K,
//! cluster splits, ragged shapes), captured replay equal to eager with alpha read at replay time;
//! the Blackwell GEMM where it runs.

use super::*;

#[test]
fn w4a16_matches_the_dequantized_reference() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let alpha = DeviceBuffer::from_host(&stream, &[0.5f32]).unwrap();
    let mut worst = 0f64;
    let mut bad = Vec::new();
    for &(n, k) in &[(256usize, 512usize), (1024, 4096), (4096, 1024)] {
        for &m in &[1usize, 5, 16, 64, 300] {
            let p = w4a16_problem(&stream, m, n, k, (m * n + k) as u64);
            let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
            let plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
            let got = d.to_host_vec::<u16>(&stream).unwrap();
            let e = max_rel_err(&got, &p.reference, 0.5);
            let worst_at = got.iter().zip(&p.reference).enumerate().max_by(|x, y| {
                let ex = (bf16::from_bits(*x.1 .0).to_f64() - x.1 .1 * 0.5).abs();
                let ey = (bf16::from_bits(*y.1 .0).to_f64() - y.1 .1 * 0.5).abs();
                ex.total_cmp(&ey)
            }).map(|(i, (g, r))| (i / n, i % n, bf16::from_bits(*g).to_f64(), r * 0.5)).unwrap();
            eprintln!("m={m} n={n} k={k} workspace={}: normalized error {e:.2e}, worst at (row, col, got, want) {worst_at:?}", plan.workspace_bytes);
            if e > 1e-2 {
                bad.push(format!("m={m} n={n} k={k}: {e:.3e}"));
            }
            worst = worst.max(e);
        }
    }
    assert!(bad.is_empty(), "W4A16 errors above 1e-2: {bad:?}");
    eprintln!("W4A16: 15 shapes, worst normalized error {worst:.2e}");
}

#[test]
fn w4a16_stream_k_matches_the_reference_and_replays() {
    // The stream-K schedule in three of its configurations (m = 1: BM 8; m = 13: BM 16, which
    // w4a16_stream_k_captured_replay_equals_eager, at m = 2, does not reach; m = 40: BM 64 at two
    // CTAs per SM, whose CTAs walk at most two segments) with a k that is not a
    // multiple of 64 (every tile's last k-block half empty): CTA ranges across tile boundaries,
    // partial tiles through the workspace and the fixup kernel, against the f64 reference and
    // through a captured replay.
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let (n, k) = (8192usize, 24544usize);
    let alpha = DeviceBuffer::from_host(&stream, &[0.5f32]).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for &(m, bm) in &[(1usize, 8u32), (13, 16), (40, 64)] {
        let p = w4a16_problem(&stream, m, n, k, 91 + m as u64);
        let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
        let plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
        assert!(plan.workspace_bytes > 0, "m={m}: expected the stream-K schedule with partial tiles, got {plan:?}");
        let s = plan.schedule.expect("a Hopper plan");
        assert!(s.stream_k && s.rows_per_cta == bm, "m={m}: {s:?}");
        let got = d.to_host_vec::<u16>(&stream).unwrap();
        let e = max_rel_err(&got, &p.reference, 0.5);
        eprintln!("stream-K m={m} n={n} k={k} workspace={}: normalized error {e:.2e}", plan.workspace_bytes);
        assert!(e < 1e-2, "m={m}: normalized error {e:.3e}");
        alpha.copy_from_host(&[1.0f32], &stream).unwrap();
        nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
        let eager = d.to_host_vec::<u16>(&stream).unwrap();
        check_captured_replay(&mut stream, &p, &alpha, &d, &mut ws, &plan, &eager, Replays { count: 3, fill: 0x5A, grow: true });
        alpha.copy_from_host(&[0.5f32], &stream).unwrap();
    }
}

#[test]
fn w4a16_captured_replay_equals_eager_and_reads_alpha_at_replay() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let p = w4a16_problem(&stream, 16, 1024, 4096, 77);
    let (m, n, k) = (p.m, p.n, p.k);
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
    let eager = d.to_host_vec::<u16>(&stream).unwrap();
    // Growing the workspace after capture retires the captured buffer: the graph keeps it.
    check_captured_replay(&mut stream, &p, &alpha, &d, &mut ws, &plan, &eager, Replays { count: 10, fill: 0, grow: true });
}

#[test]
fn blackwell_gemm_runs_there_and_skips_elsewhere() {
    let Some((ctx, stream)) = gpu() else { return };
    let cc = ctx.compute_capability();
    if graphsafe::arch::require_fp4_tensor_cores("nvfp4 gemm", cc).is_err() {
        let (sm100, sm120) = (graphsafe::arch::Nvfp4Arch::Sm100, graphsafe::arch::Nvfp4Arch::Sm120);
        eprintln!("SKIP: the CUTLASS NVFP4 GEMM needs {} or {}; this GPU is sm_{}{}", sm100.gpus(), sm120.gpus(), cc.0, cc.1);
        // The Hopper path refuses it by name rather than launching the wrong kernel.
        let z = DeviceBuffer::alloc_zeroed(&stream, 1 << 16).unwrap();
        let m = Nvfp4Matrix::new(&z, &z, &z, 32, 64);
        let mut ws = Workspace::new(&stream, 0).unwrap();
        let r = nvfp4::gemm(&Nvfp4GemmArgs::new(m.clone(), m, &z, Tensor::contiguous(&z, DType::Bf16, &[32, 32])), &mut ws, &stream);
        assert!(matches!(r, Err(graphsafe::Error::ArchUnsupported { .. })), "{r:?}");
        return;
    }
    let (m, n, k) = (64usize, 256usize, 512usize);
    let (af, wf) = (to_bits(&random_f32(m * k, 1), DType::Bf16).1, to_bits(&random_f32(n * k, 2), DType::Bf16).1);
    let (ga, gw) = (r::global_scale(&af), r::global_scale(&wf));
    let ((pa, sa), (pw, sw)) = (r::quantize(&af, m, k, ga).unwrap(), r::quantize(&wf, n, k, gw).unwrap());
    let up = |v: &[u8]| DeviceBuffer::from_host(&stream, v).unwrap();
    let (bpa, bsa, bpw, bsw) = (up(&pa), up(&sa), up(&pw), up(&sw));
    let (bga, bgw) = (DeviceBuffer::from_host(&stream, &[ga]).unwrap(), DeviceBuffer::from_host(&stream, &[gw]).unwrap());
    let alpha = DeviceBuffer::from_host(&stream, &[1.0 / (ga * gw)]).unwrap();
    let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let args = Nvfp4GemmArgs::new(Nvfp4Matrix::new(&bpa, &bsa, &bga, m, k), Nvfp4Matrix::new(&bpw, &bsw, &bgw, n, k), &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n]));
    nvfp4::gemm(&args, &mut ws, &stream).unwrap();
    let (adq, wdq) = (r::dequantize(&pa, &sa, m, k, 1.0).unwrap(), r::dequantize(&pw, &sw, n, k, 1.0).unwrap());
    let want: Vec<f64> = (0..m * n).map(|i| (0..k).map(|t| adq[(i / n) * k + t] as f64 * wdq[(i % n) * k + t] as f64).sum::<f64>()).collect();
    let e = max_rel_err(&d.to_host_vec::<u16>(&stream).unwrap(), &want, 1.0 / (ga as f64 * gw as f64));
    assert!(e <= 1e-2, "error {e}");
}

/// Both schedules on this GPU's SM count: stream-K for m <= 32 with enough chunks (CTA ranges that
/// split tiles, with the fixup kernel; ranges of whole tiles, without it) and the tile grid
/// otherwise (cluster split-K, lowered to what the device holds; ragged n and k; more CTA slots
/// than chunks). Every shape
/// within the error bound, every output element written (the output is poisoned first), two eager
/// runs bit-identical (the fixup adds shared tiles in a fixed order).
#[test]
fn w4a16_cluster_splits_and_ragged_shapes_match_the_reference() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let alpha = DeviceBuffer::from_host(&stream, &[1.5f32]).unwrap();
    let mut bad = Vec::new();
    let mut cases = 0;
    // (m, n, k) on a 132-SM H200: stream-K (m <= 32 and >= 40 chunks per CTA slot: 4 slots per SM
    // for m <= 8, 3 for m <= 16, 2 for m <= 32) over 528 CTAs with shared tiles (m 1), over 528
    // CTAs that own whole tiles (528 | 528 tiles: no fixup; m 3), over 396 CTAs (m 9) and 264 (m
    // 17) with shared tiles; then the tile grid with cluster splits (m <= 32 with fewer chunks,
    // and m 33, 70, 128; 256-row tiles split 4 and 2 ways at m 200 and 256; partial tiles whose
    // activation rows past m are left unloaded: m 129 (192-row tiles, 3 of 3 boxes, 8 splits), 300
    // (2 of 3 boxes in the second 192-row tile, 4 splits; and unsplit at n 8192), 1030 (1 of 4
    // boxes in the fifth 256-row tile)), ragged n and k, more CTA slots than chunks.
    // (tests/w4a16_plan.rs checks these schedules on the CPU.)
    let shapes = [
        (1usize, 16384usize, 10752usize),
        (9, 16384, 8192),
        (3, 67584, 2560),
        (17, 8448, 10240),
        (1, 8192, 2048),
        (3, 7168, 1792),
        (16, 16384, 768),
        (9, 2944, 1600),
        (1, 28672, 512),
        (20, 33792, 128),
        (1, 256, 256),
        (24, 32000, 96),
        (33, 640, 1344),
        (128, 8192, 1024),
        (70, 352, 416),
        (200, 4096, 2048),
        (256, 8192, 1024),
        (129, 2048, 2048),
        (300, 2048, 1024),
        (300, 8192, 1024),
        (1030, 3328, 512),
    ];
    // One workspace for every shape: each stream-K shape finds it dirty with the previous shapes'
    // partial tiles (the GEMM must write every slot it reads).
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let mut first: Option<(W4a16, Vec<u16>)> = None;
    for &(m, n, k) in &shapes {
        let p = w4a16_problem(&stream, m, n, k, (m * 131 + n * 7 + k) as u64);
        let plan = nvfp4::plan(nvfp4::Nvfp4Arch::Sm90, m as i64, n as i64, k as i64, DType::Bf16, ctx.sm_count() as i64).unwrap();
        let at = Tensor::contiguous(&p.a, DType::Bf16, &[m, k]);
        let mut outs = Vec::new();
        for _ in 0..2 {
            let d = DeviceBuffer::alloc(&ctx, m * n * 2).unwrap();
            d.memset_u8(0x7F, &stream).unwrap(); // poison: every element must be written
            nvfp4::w4a16_gemm(&W4a16GemmArgs::new(at.clone(), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
            outs.push(d.to_host_vec::<u16>(&stream).unwrap());
        }
        assert_eq!(outs[0], outs[1], "{m}x{n}x{k}: two eager runs differ");
        let e = max_rel_err(&outs[0], &p.reference, 1.5);
        eprintln!("m={m} n={n} k={k} workspace={}: normalized error {e:.2e}", plan.workspace_bytes);
        if e > 1e-2 || e.is_nan() {
            bad.push(format!("m={m} n={n} k={k}: {e:.3e}"));
        }
        cases += 1;
        if first.is_none() {
            first = Some((p, outs.swap_remove(0)));
        }
    }
    assert!(bad.is_empty(), "W4A16 errors above 1e-2: {bad:?}");
    // The first (stream-K) shape again, on the workspace every other shape has since dirtied.
    let (p, want) = first.unwrap();
    let d = DeviceBuffer::alloc(&ctx, p.m * p.n * 2).unwrap();
    d.memset_u8(0x7F, &stream).unwrap();
    nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[p.m, p.k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[p.m, p.n])), &mut ws, &stream).unwrap();
    assert_eq!(d.to_host_vec::<u16>(&stream).unwrap(), want, "a dirty shared workspace changed the stream-K result");
    eprintln!("{cases} split/ragged shapes within 1e-2; stream-K unchanged on a dirty workspace");
}

/// Stream-K captured: the GEMM and its fixup kernel in one graph with the workspace bound;
/// replays equal eager bit for bit, alpha is read at replay, and a too-small captured workspace is
/// refused with nothing captured.
#[test]
fn w4a16_stream_k_captured_replay_equals_eager() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let (m, n, k) = (2usize, 16384usize, 10752usize); // stream-K with shared tiles on 132 SMs
    let p = w4a16_problem(&stream, m, n, k, 91);
    let plan = nvfp4::plan(nvfp4::Nvfp4Arch::Sm90, m as i64, n as i64, k as i64, DType::Bf16, ctx.sm_count() as i64).unwrap();
    eprintln!("m={m} n={n} k={k}: workspace {} bytes", plan.workspace_bytes);
    // Else this tests the tile grid, and the too-small-workspace refusal below is skipped.
    assert!(plan.workspace_bytes > 0, "({m}, {n}, {k}) does not run stream-K with shared tiles on {} SMs", ctx.sm_count());
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[m, n])), &mut ws, &stream).unwrap();
    let eager = d.to_host_vec::<u16>(&stream).unwrap();
    assert!(max_rel_err(&eager, &p.reference, 1.0) <= 1e-2);
    check_captured_replay(&mut stream, &p, &alpha, &d, &mut ws, &plan, &eager, Replays { count: 5, fill: 0x7F, grow: false });
}

/// A single row's stride is never used, so any value passes the op's checks; the kernels are
/// handed the row length instead, which their own checks take (before, an eager W4A16 with m = 1
/// and a row stride below k grew its workspace and was then refused by the kernel glue). The
/// results equal those of the contiguous tensors bit for bit.
#[test]
fn a_single_row_takes_any_row_stride() {
    let Some((ctx, stream)) = gpu() else { return };
    let (k, n) = (512usize, 256usize);
    // Quantize (every arch): a row of x with row stride 3.
    let (bits, xf) = to_bits(&random_f32(k, 77), DType::Bf16);
    let xb = DeviceBuffer::from_host(&stream, &bits).unwrap();
    let gs = DeviceBuffer::from_host(&stream, &[r::global_scale(&xf)]).unwrap();
    let quantized = |x: &Tensor<&DeviceBuffer>| {
        let (p, s) = (DeviceBuffer::alloc_zeroed(&stream, k / 2).unwrap(), DeviceBuffer::alloc_zeroed(&stream, r::scale_bytes(1, k)).unwrap());
        nvfp4::quantize(&Nvfp4QuantizeArgs::new(x.clone(), &gs, Nvfp4Matrix::new(&p, &s, &gs, 1, k)), &stream).unwrap();
        (p.to_host_vec::<u8>(&stream).unwrap(), s.to_host_vec::<u8>(&stream).unwrap())
    };
    assert_eq!(quantized(&Tensor::strided(&xb, 0, DType::Bf16, &[1, k], &[3, 1])), quantized(&Tensor::contiguous(&xb, DType::Bf16, &[1, k])));
    if !hopper(&ctx) {
        return;
    }
    // W4A16: a and d single rows with row strides 3 and 5.
    let p = w4a16_problem(&stream, 1, n, k, 78);
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let run = |a: Tensor<&DeviceBuffer>, d_strides: [usize; 2], ws: &mut Workspace| {
        let d = DeviceBuffer::alloc_zeroed(&stream, n * 2).unwrap();
        nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a.clone(), &p.w, &alpha, Tensor::strided(&d, 0, DType::Bf16, &[1, n], &d_strides)), ws, &stream).unwrap();
        d.to_host_vec::<u16>(&stream).unwrap()
    };
    let want = run(Tensor::contiguous(&p.a, DType::Bf16, &[1, k]), [n, 1], &mut ws);
    assert_eq!(run(Tensor::strided(&p.a, 0, DType::Bf16, &[1, k], &[3, 1]), [5, 1], &mut ws), want);
    assert!(max_rel_err(&want, &p.reference, 1.0) < 1e-2);
}

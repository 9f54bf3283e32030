//! Invariant 13: kernels launched programmatically dependent read nothing stale, whatever the
//! kernel before them wrote.

use super::*;

/// Programmatic dependent launch: a GEMM whose activations were written by the kernel just before
/// it (a dequantize, or the previous GEMM's output), with no synchronisation in between, reads the
/// finished values; eager and captured (where the launches become programmatic graph edges).
#[test]
fn w4a16_reads_what_the_previous_kernel_just_wrote() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let (m, k, n1, n2) = (4usize, 2048usize, 1024usize, 3072usize);
    let g1 = w4a16_problem(&stream, m, n1, k, 5);
    let g2 = w4a16_problem(&stream, m, n2, n1, 6); // its A is replaced by g1's output below
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    // A of the first GEMM is the dequantized NVFP4 of random data, written by a kernel.
    let (_, af) = to_bits(&random_f32(m * k, 9), DType::Bf16);
    let ga = r::global_scale(&af);
    let (pa, sa) = r::quantize(&af, m, k, ga).unwrap();
    let adq = r::dequantize(&pa, &sa, m, k, ga).unwrap();
    let (bpa, bsa, bga) = (DeviceBuffer::from_host(&stream, &pa).unwrap(), DeviceBuffer::from_host(&stream, &sa).unwrap(), DeviceBuffer::from_host(&stream, &[ga]).unwrap());
    let qa = Nvfp4Matrix::new(&bpa, &bsa, &bga, m, k);
    let a1 = DeviceBuffer::alloc_zeroed(&stream, m * k * 2).unwrap();
    let d1 = DeviceBuffer::alloc_zeroed(&stream, m * n1 * 2).unwrap();
    let d2 = DeviceBuffer::alloc_zeroed(&stream, m * n2 * 2).unwrap();
    let (a1t, d1t, d2t) = (Tensor::contiguous(&a1, DType::Bf16, &[m, k]), Tensor::contiguous(&d1, DType::Bf16, &[m, n1]), Tensor::contiguous(&d2, DType::Bf16, &[m, n2]));
    let check = |d1h: &[u16], d2h: &[u16], what: &str| {
        // d1 = dequantized A x W1; d2 = d1 (as the GPU wrote it) x W2.
        let want1: Vec<f64> = (0..m * n1).map(|i| (0..k).map(|t| bf16::from_f32(adq[(i / n1) * k + t]).to_f64() * g1w(&g1, i % n1, t)).sum()).collect();
        let e1 = max_rel_err(d1h, &want1, 1.0);
        let want2: Vec<f64> = (0..m * n2).map(|i| (0..n1).map(|t| bf16::from_bits(d1h[(i / n2) * n1 + t]).to_f64() * g1w(&g2, i % n2, t)).sum()).collect();
        let e2 = max_rel_err(d2h, &want2, 1.0);
        eprintln!("{what}: errors {e1:.2e} (first GEMM), {e2:.2e} (second, on the first's output)");
        assert!(e1 <= 1e-2 && e2 <= 1e-2, "{what}: {e1} {e2}");
    };
    for round in 0..3 {
        d1.memset_u8(0, &stream).unwrap();
        nvfp4::dequantize(&qa, &a1t, &stream).unwrap();
        nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a1t.clone(), &g1.w, &alpha, d1t.clone()), &mut ws, &stream).unwrap();
        nvfp4::w4a16_gemm(&W4a16GemmArgs::new(d1t.clone(), &g2.w, &alpha, d2t.clone()), &mut ws, &stream).unwrap();
        check(&d1.to_host_vec::<u16>(&stream).unwrap(), &d2.to_host_vec::<u16>(&stream).unwrap(), &format!("eager round {round}"));
    }
    let eager2 = d2.to_host_vec::<u16>(&stream).unwrap();
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (ca1, cd1, cd2, cal) = (cap.bind_buffer(&a1).unwrap(), cap.bind_buffer(&d1).unwrap(), cap.bind_buffer(&d2).unwrap(), cap.bind_buffer(&alpha).unwrap());
        let (cpa, csa, cga) = (cap.bind_buffer(&bpa).unwrap(), cap.bind_buffer(&bsa).unwrap(), cap.bind_buffer(&bga).unwrap());
        let (w1, w2) = (g1.w.bind(&mut cap).unwrap(), g2.w.bind(&mut cap).unwrap());
        let _ = (cpa, csa, cga);
        cap.memset_u8(&cd1, 0).unwrap();
        nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca1, DType::Bf16, &[m, k]), w1.clone(), cal.clone(), Tensor::contiguous(cd1.clone(), DType::Bf16, &[m, n1])), &w, &cap).unwrap();
        nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(cd1, DType::Bf16, &[m, n1]), w2.clone(), cal.clone(), Tensor::contiguous(cd2, DType::Bf16, &[m, n2])), &w, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    for _ in 0..5 {
        d2.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(d2.to_host_vec::<u16>(&stream).unwrap(), eager2, "replay differs from eager");
    }
}

/// Weight (n, t) of a W4A16 test problem, dequantized (the reference's operand).
fn g1w(p: &W4a16, row: usize, t: usize) -> f64 {
    p.wdq[row * p.k + t] as f64
}

/// Programmatic dependent launch of the quantize kernel: it reads inputs and a global scale that
/// the kernels just before it wrote, with no synchronisation in between, and lets the next kernel
/// launch early. Eager: dequantize -> global scale -> quantize (x dirtied first, outputs dirtied),
/// bit-identical to the host reference every round. Captured: the W4A16 GEMM writes D and the
/// quantize of D follows it in the graph (a programmatic edge), bit-identical to the host
/// quantize of the eager D on every replay.
#[test]
fn quantize_reads_what_the_previous_kernel_just_wrote() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let (m, k) = (512usize, 4096usize);
    let (_, xf) = to_bits(&random_f32(m * k, 21), DType::Bf16);
    let g0 = r::global_scale(&xf);
    let (p0, s0) = r::quantize(&xf, m, k, g0).unwrap();
    let x = r::dequantize(&p0, &s0, m, k, g0).unwrap(); // what the device dequantize writes, as f32
    let gx = r::global_scale(&x);
    let (want_p, want_s) = r::quantize(&x, m, k, gx).unwrap();
    let (bp0, bs0, bg0) = (DeviceBuffer::from_host(&stream, &p0).unwrap(), DeviceBuffer::from_host(&stream, &s0).unwrap(), DeviceBuffer::from_host(&stream, &[g0]).unwrap());
    let q0 = Nvfp4Matrix::new(&bp0, &bs0, &bg0, m, k);
    let xb = DeviceBuffer::alloc_zeroed(&stream, m * k * 2).unwrap();
    let xt = Tensor::contiguous(&xb, DType::Bf16, &[m, k]);
    let gs = DeviceBuffer::alloc_zeroed(&stream, 4).unwrap();
    let (p1, s1) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap());
    let q1 = Nvfp4Matrix::new(&p1, &s1, &gs, m, k);
    for round in 0..3u8 {
        xb.memset_u8(0x11 + round, &stream).unwrap();
        gs.memset_u8(0, &stream).unwrap();
        p1.memset_u8(0xAB, &stream).unwrap();
        s1.memset_u8(0xCD, &stream).unwrap();
        nvfp4::dequantize(&q0, &xt, &stream).unwrap();
        nvfp4::global_scale(&xt, &gs, &stream).unwrap();
        nvfp4::quantize(&Nvfp4QuantizeArgs::new(xt.clone(), &gs, q1.clone()), &stream).unwrap();
        assert_eq!(p1.to_host_vec::<u8>(&stream).unwrap(), want_p, "eager round {round}: codes");
        assert_eq!(s1.to_host_vec::<u8>(&stream).unwrap(), want_s, "eager round {round}: scales");
    }
    if !hopper(&ctx) {
        return;
    }
    // A GEMM output quantized in the same graph.
    let g = w4a16_problem(&stream, 16, 2048, 1024, 23);
    let (gm, gn) = (g.m, g.n);
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let d = DeviceBuffer::alloc_zeroed(&stream, gm * gn * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    nvfp4::w4a16_gemm(&W4a16GemmArgs::new(Tensor::contiguous(&g.a, DType::Bf16, &[gm, g.k]), &g.w, &alpha, Tensor::contiguous(&d, DType::Bf16, &[gm, gn])), &mut ws, &stream).unwrap();
    let df: Vec<f32> = d.to_host_vec::<u16>(&stream).unwrap().iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let gd = r::global_scale(&df);
    let (want_p, want_s) = r::quantize(&df, gm, gn, gd).unwrap();
    let gdb = DeviceBuffer::from_host(&stream, &[gd]).unwrap();
    let (p2, s2) = (DeviceBuffer::alloc(&ctx, gm * gn / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(gm, gn)).unwrap());
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (ca, cal, cd, cg) = (cap.bind_buffer(&g.a).unwrap(), cap.bind_buffer(&alpha).unwrap(), cap.bind_buffer(&d).unwrap(), cap.bind_buffer(&gdb).unwrap());
        let (cp, cs) = (cap.bind_buffer(&p2).unwrap(), cap.bind_buffer(&s2).unwrap());
        let cw = g.w.bind(&mut cap).unwrap();
        let dt = Tensor::contiguous(cd, DType::Bf16, &[gm, gn]);
        nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca, DType::Bf16, &[gm, g.k]), cw.clone(), cal.clone(), dt.clone()), &w, &cap).unwrap();
        nvfp4::quantize_captured(&Nvfp4QuantizeArgs::new(dt.clone(), cg.clone(), Nvfp4Matrix::new(cp, cs, cg.clone(), gm, gn)), &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    for replay in 0..5 {
        d.memset_u8(0x7F, &stream).unwrap(); // the GEMM must rewrite D before the quantize reads it
        p2.memset_u8(0xAB, &stream).unwrap();
        s2.memset_u8(0xCD, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(p2.to_host_vec::<u8>(&stream).unwrap(), want_p, "replay {replay}: codes");
        assert_eq!(s2.to_host_vec::<u8>(&stream).unwrap(), want_s, "replay {replay}: scales");
    }
    eprintln!("quantize after its producer: 3 eager rounds and 5 replays bit-identical");
}

/// A stream-K W4A16 GEMM in which no tile is shared (k <= 64: a chunk is a whole tile) while the
/// CTA count does not divide the tiles. The plan once launched the fixup kernel here with nothing
/// to add (and sized a workspace for it); it now derives that no tile is shared and launches the
/// GEMM alone, with no workspace. The kernel after it in the programmatic chain (a quantize of D)
/// must see the finished D. D is filled with NaN before each GEMM, so a read of D too early shows
/// in the quantized codes.
#[test]
fn quantize_after_a_stream_k_gemm_with_no_shared_tile_sees_the_finished_d() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    // BM = 8 runs 4 CTAs a SM; stream-K needs >= 40 chunks a CTA; one tile more than 160 a SM
    // leaves the grid (4 a SM) not dividing the tiles.
    let sm = ctx.sm_count() as usize;
    let (m, k, tiles) = (1usize, 64usize, 160 * sm + 1);
    let n = tiles * 128;
    let g = w4a16_problem(&stream, m, n, k, 31);
    let plan = nvfp4::plan(nvfp4::Nvfp4Arch::Sm90, m as i64, n as i64, k as i64, DType::Bf16, sm as i64).unwrap();
    assert_eq!(plan.workspace_bytes, 0, "({m}, {n}, {k}) shares no tile on {sm} SMs, yet its plan sizes a fixup workspace: {plan:?}");
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let (at, dt) = (Tensor::contiguous(&g.a, DType::Bf16, &[m, k]), Tensor::contiguous(&d, DType::Bf16, &[m, n]));
    nvfp4::w4a16_gemm(&W4a16GemmArgs::new(at.clone(), &g.w, &alpha, dt.clone()), &mut ws, &stream).unwrap();
    let dh = d.to_host_vec::<u16>(&stream).unwrap();
    let e = max_rel_err(&dh, &g.reference, 1.0);
    assert!(e <= 1e-2, "GEMM normalized error {e:.3e}");
    // D quantized as [tiles, 128] (the same bytes), against the host quantize of the finished D.
    let df: Vec<f32> = dh.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let gd = r::global_scale(&df);
    let (want_p, want_s) = r::quantize(&df, tiles, 128, gd).unwrap();
    let gdb = DeviceBuffer::from_host(&stream, &[gd]).unwrap();
    let (qp, qs) = (DeviceBuffer::alloc(&ctx, n / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(tiles, 128)).unwrap());
    let q = Nvfp4Matrix::new(&qp, &qs, &gdb, tiles, 128);
    let d2t = Tensor::contiguous(&d, DType::Bf16, &[tiles, 128]);
    for round in 0..5 {
        d.memset_u8(0xFF, &stream).unwrap(); // bf16 NaN everywhere
        qp.memset_u8(0xAB, &stream).unwrap();
        nvfp4::w4a16_gemm(&W4a16GemmArgs::new(at.clone(), &g.w, &alpha, dt.clone()), &mut ws, &stream).unwrap();
        nvfp4::quantize(&Nvfp4QuantizeArgs::new(d2t.clone(), &gdb, q.clone()), &stream).unwrap();
        assert_eq!(d.to_host_vec::<u16>(&stream).unwrap(), dh, "eager round {round}: D");
        assert_eq!(qp.to_host_vec::<u8>(&stream).unwrap(), want_p, "eager round {round}: codes of D");
        assert_eq!(qs.to_host_vec::<u8>(&stream).unwrap(), want_s, "eager round {round}: scales of D");
    }
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let (ca, cal, cd, cg) = (cap.bind_buffer(&g.a).unwrap(), cap.bind_buffer(&alpha).unwrap(), cap.bind_buffer(&d).unwrap(), cap.bind_buffer(&gdb).unwrap());
        let (cp, cs) = (cap.bind_buffer(&qp).unwrap(), cap.bind_buffer(&qs).unwrap());
        let cw = g.w.bind(&mut cap).unwrap();
        nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca, DType::Bf16, &[m, k]), cw.clone(), cal.clone(), Tensor::contiguous(cd.clone(), DType::Bf16, &[m, n])), &w, &cap).unwrap();
        nvfp4::quantize_captured(&Nvfp4QuantizeArgs::new(Tensor::contiguous(cd, DType::Bf16, &[tiles, 128]), cg.clone(), Nvfp4Matrix::new(
            cp,
            cs,
            cg.clone(),
            tiles,
            128,
        )), &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    for replay in 0..5 {
        d.memset_u8(0xFF, &stream).unwrap();
        qp.memset_u8(0xAB, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(qp.to_host_vec::<u8>(&stream).unwrap(), want_p, "replay {replay}: codes of D");
        assert_eq!(qs.to_host_vec::<u8>(&stream).unwrap(), want_s, "replay {replay}: scales of D");
    }
    eprintln!("stream-K with no shared tile (m={m} n={n} k={k}, no fixup, no workspace): 5 eager rounds and 5 replays, D quantized after it bit-identical");
}

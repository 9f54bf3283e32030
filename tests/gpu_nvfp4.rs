//! NVFP4 on the GPU: quantize/dequantize/global scale bit-identical to the host reference on random
//! and adversarial inputs; the Hopper W4A16 GEMM against a dequantize-then-f64 reference; captured
//! replay equal to eager (and alpha read at replay time); the Blackwell GEMM skips elsewhere.

mod common;

use common::{gpu, random_f32};
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::nvfp4::{self, reference as r, Nvfp4Matrix};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::{bf16, f16};

fn to_bits(x: &[f32], dt: DType) -> (Vec<u16>, Vec<f32>) {
    match dt {
        DType::Fp16 => x.iter().map(|&v| { let h = f16::from_f32(v); (h.to_bits(), h.to_f32()) }).unzip(),
        _ => x.iter().map(|&v| { let h = bf16::from_f32(v); (h.to_bits(), h.to_f32()) }).unzip(),
    }
}

/// Random values at several magnitudes, plus adversarial rows.
fn inputs(m: usize, k: usize, seed: u64, dt: DType) -> Vec<f32> {
    let big = if dt == DType::Fp16 { 65504.0f32 } else { 3.0e38 };
    let tiny = if dt == DType::Fp16 { 6.0e-8f32 } else { 1.0e-39 };
    let mut x = random_f32(m * k, seed);
    for (i, v) in x.iter_mut().enumerate() {
        let row = i / k;
        *v *= [1.0, 100.0, 1e-3, 7.0][row % 4];
        match row % 9 {
            5 => *v = 0.0,                                                  // all-zero row
            6 => *v = tiny * ((i % 7) as f32),                              // denormals
            7 => *v = if i % 2 == 0 { big } else { -big },                  // +-max
            8 => *v = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0][i % 8] * if i % 3 == 0 { -1.0 } else { 1.0 }, // e2m1 ties
            _ => {}
        }
    }
    if m * k > 40 {
        x[3] = f32::NAN;
        x[k + 17] = f32::INFINITY;
        x[k + 20] = -f32::INFINITY;
    }
    x
}

#[test]
fn quantize_and_dequantize_are_bit_identical_to_the_host_reference() {
    let Some((ctx, stream)) = gpu() else { return };
    let mut cases = 0;
    for dt in [DType::Bf16, DType::Fp16] {
        for &(m, k) in &[(1usize, 32usize), (7, 64), (9, 96), (128, 256), (300, 1024), (1000, 4096)] {
            for finite in [true, false] {
                let mut x = inputs(m, k, (m * 31 + k) as u64, dt);
                if finite {
                    x.iter_mut().filter(|v| !v.is_finite()).for_each(|v| *v = 1.5);
                }
                let (bits, xf) = to_bits(&x, dt);
                let xb = DeviceBuffer::from_host(&stream, &bits).unwrap();
                let xt = Tensor::contiguous(&xb, dt, &[m, k]);
                // Global scale on the device equals the host's, bit for bit.
                let gs_dev = DeviceBuffer::alloc_zeroed(&stream, 4).unwrap();
                nvfp4::global_scale(&xt, &gs_dev, &stream).unwrap();
                let gs = gs_dev.to_host_vec::<f32>(&stream).unwrap()[0];
                assert_eq!(gs.to_bits(), r::global_scale(&xf).to_bits(), "{dt} {m}x{k} finite={finite}");
                let q = Nvfp4Matrix {
                    packed: &DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(),
                    scales: &{
                        let s = DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap();
                        s.memset_u8(0xAB, &stream).unwrap(); // dirty: padding must be written as 0
                        s
                    },
                    global_scale: &gs_dev,
                    rows: m,
                    k,
                };
                nvfp4::quantize(&xt, &gs_dev, &q, &stream).unwrap();
                let (want_p, want_s) = r::quantize(&xf, m, k, gs).unwrap();
                assert_eq!(q.packed.to_host_vec::<u8>(&stream).unwrap(), want_p, "{dt} {m}x{k} packed");
                assert_eq!(q.scales.to_host_vec::<u8>(&stream).unwrap(), want_s, "{dt} {m}x{k} scales");
                let out = DeviceBuffer::alloc(&ctx, m * k * 2).unwrap();
                nvfp4::dequantize(&q, &Tensor::contiguous(&out, dt, &[m, k]), &stream).unwrap();
                let (want_d, _) = to_bits(&r::dequantize(&want_p, &want_s, m, k, gs).unwrap(), dt);
                assert_eq!(out.to_host_vec::<u16>(&stream).unwrap(), want_d, "{dt} {m}x{k} dequantized");
                cases += 1;
            }
        }
    }
    eprintln!("{cases} quantize cases bit-identical");
}

/// Inputs large enough for the two-blocks-a-thread quantize (the walk every large activation or
/// weight takes), bit-identical to the host reference in every code and scale byte: rows of
/// k / 16 = 2 mod 4 blocks (a group's padding blocks), k above 8,192, padding rows, one non-finite
/// block mid-tensor (the exact slow path), and strided inputs whose gaps hold NaN (the kernel
/// must read none of them).
#[test]
fn quantize_of_large_and_strided_inputs_is_bit_identical() {
    let Some((ctx, stream)) = gpu() else { return };
    let mut cases = 0;
    for dt in [DType::Bf16, DType::Fp16] {
        for &(m, k, ld) in &[(1000usize, 8224usize, 8224usize), (2100, 4096, 4096), (1100, 4160, 4200), (600, 16416, 16424)] {
            let mut x = inputs(m, k, (m * 17 + k) as u64, dt);
            x.iter_mut().filter(|v| !v.is_finite()).for_each(|v| *v = -2.75);
            x[(m / 2) * k + 5] = f32::NAN; // one non-finite block mid-tensor takes the exact slow path
            let (bits, xf) = to_bits(&x, dt);
            let nan = if dt == DType::Fp16 { 0x7E00u16 } else { 0x7FC0u16 };
            let mut strided = vec![nan; m * ld];
            for r in 0..m {
                strided[r * ld..r * ld + k].copy_from_slice(&bits[r * k..(r + 1) * k]);
            }
            let xb = DeviceBuffer::from_host(&stream, &strided).unwrap();
            let xt = Tensor::strided(&xb, 0, dt, &[m, k], &[ld, 1]);
            let gs = r::global_scale(&xf);
            let gs_dev = DeviceBuffer::from_host(&stream, &[gs]).unwrap();
            let (p, sc) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap());
            p.memset_u8(0xAB, &stream).unwrap();
            sc.memset_u8(0xAB, &stream).unwrap(); // dirty: padding must be written as 0
            let q = Nvfp4Matrix { packed: &p, scales: &sc, global_scale: &gs_dev, rows: m, k };
            nvfp4::quantize(&xt, &gs_dev, &q, &stream).unwrap();
            let (want_p, want_s) = r::quantize(&xf, m, k, gs).unwrap();
            let (got_p, got_s) = (p.to_host_vec::<u8>(&stream).unwrap(), sc.to_host_vec::<u8>(&stream).unwrap());
            let first = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
            assert_eq!(first(&got_p, &want_p), None, "{dt} {m}x{k} ld {ld}: first differing code byte");
            assert_eq!(first(&got_s, &want_s), None, "{dt} {m}x{k} ld {ld}: first differing scale byte");
            cases += 1;
        }
    }
    eprintln!("{cases} large or strided quantize cases bit-identical");
}

struct W4a16 {
    a: DeviceBuffer,
    w: nvfp4::PreparedWeight,
    wdq: Vec<f32>,
    reference: Vec<f64>,
    m: usize,
    n: usize,
    k: usize,
}

fn w4a16_problem(stream: &Stream, m: usize, n: usize, k: usize, seed: u64) -> W4a16 {
    let ctx = stream.context();
    let wf = random_f32(n * k, seed);
    let (_, wf) = to_bits(&wf, DType::Bf16);
    let gs = r::global_scale(&wf);
    let (p, s) = r::quantize(&wf, n, k, gs).unwrap();
    let wdq = r::dequantize(&p, &s, n, k, gs).unwrap();
    let (abits, af) = to_bits(&random_f32(m * k, seed + 1), DType::Bf16);
    let packed = DeviceBuffer::from_host(stream, &p).unwrap();
    let scales = DeviceBuffer::from_host(stream, &s).unwrap();
    let gsb = DeviceBuffer::from_host(stream, &[gs]).unwrap();
    let w = nvfp4::prepare_weight(&Nvfp4Matrix { packed: &packed, scales: &scales, global_scale: &gsb, rows: n, k }, stream).unwrap();
    let _ = ctx;
    // The f64 reference, rows spread over the host's cores.
    let mut reference = vec![0f64; m * n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(m);
    let rows_per = m.div_ceil(threads);
    std::thread::scope(|sc| {
        for (chunk, out) in reference.chunks_mut(rows_per * n).enumerate() {
            let (af, wdq) = (&af, &wdq);
            sc.spawn(move || {
                for (r, row) in out.chunks_mut(n).enumerate() {
                    let i = chunk * rows_per + r;
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = (0..k).map(|t| af[i * k + t] as f64 * wdq[j * k + t] as f64).sum();
                    }
                }
            });
        }
    });
    W4a16 { a: DeviceBuffer::from_host(stream, &abits).unwrap(), w, wdq, reference, m, n, k }
}

fn max_rel_err(got: &[u16], want: &[f64], alpha: f64) -> f64 {
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs() * alpha)).max(1e-9);
    got.iter().zip(want).fold(0f64, |e, (&g, &w)| e.max((bf16::from_bits(g).to_f64() - w * alpha).abs())) / scale
}

fn hopper(ctx: &std::sync::Arc<graphsafe::driver::Context>) -> bool {
    let cc = ctx.compute_capability();
    if cc != (9, 0) {
        eprintln!("SKIP: the W4A16 kernel needs sm_90 (H100/H200); this GPU is sm_{}{}", cc.0, cc.1);
        return false;
    }
    true
}

/// How [`check_captured_replay`] replays: `count` times, each after filling D with `fill`, after
/// growing the workspace first when `grow`.
struct Replays {
    count: usize,
    fill: u8,
    grow: bool,
}

/// Captures `p`'s GEMM (D = alpha A W^T into `d`, workspace `ws`), whose eager run planned `plan`
/// and wrote `eager`, and checks the graph: the captured call plans the same; every replay gives
/// `eager` bit for bit; alpha is read at replay (doubling it doubles every output exactly); a
/// captured GEMM with too small a workspace is refused, nothing captured.
#[allow(clippy::too_many_arguments)]
fn check_captured_replay(stream: &mut Stream, p: &W4a16, alpha: &DeviceBuffer, d: &DeviceBuffer, ws: &mut Workspace, plan: &nvfp4::Nvfp4Plan, eager: &[u16], replays: Replays) {
    let (m, n, k) = (p.m, p.n, p.k);
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(ws).unwrap();
        let ca = Tensor::contiguous(&p.a, DType::Bf16, &[m, k]).bind(&mut cap).unwrap();
        let cd = Tensor::contiguous(d, DType::Bf16, &[m, n]).bind(&mut cap).unwrap();
        let (cal, cw) = (cap.bind_buffer(alpha).unwrap(), p.w.bind(&mut cap).unwrap());
        let cplan = nvfp4::w4a16_gemm_captured(&ca, &cw, &cal, &cd, &w, &cap).unwrap();
        assert_eq!(&cplan, plan);
        cap.end().unwrap().instantiate().unwrap()
    };
    if replays.grow {
        ws.ensure_size(ws.capacity() * 2 + (1 << 20), stream).unwrap();
    }
    for _ in 0..replays.count {
        d.memset_u8(replays.fill, stream).unwrap();
        exec.launch(stream).unwrap();
        assert_eq!(d.to_host_vec::<u16>(stream).unwrap(), eager);
    }
    alpha.copy_from_host(&[2.0f32], stream).unwrap();
    exec.launch(stream).unwrap();
    let doubled: Vec<u16> = eager.iter().map(|&b| bf16::from_f32(bf16::from_bits(b).to_f32() * 2.0).to_bits()).collect();
    assert_eq!(d.to_host_vec::<u16>(stream).unwrap(), doubled);
    if plan.workspace_bytes > 0 {
        let mut small = Workspace::new(stream, plan.workspace_bytes - 256).unwrap();
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut small).unwrap();
        let (ca, cal, cd) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(alpha).unwrap(), cap.bind_buffer(d).unwrap());
        let cw = p.w.bind(&mut cap).unwrap();
        let r = nvfp4::w4a16_gemm_captured(&Tensor::contiguous(ca, DType::Bf16, &[m, k]), &cw, &cal, &Tensor::contiguous(cd, DType::Bf16, &[m, n]), &w, &cap);
        assert!(matches!(r, Err(graphsafe::Error::WorkspaceTooSmall { .. })), "{r:?}");
        assert!(cap.end().unwrap().node_kinds().unwrap().is_empty());
    }
}

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
            let plan = nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
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
        let plan = nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
        assert!(plan.workspace_bytes > 0, "m={m}: expected the stream-K schedule with partial tiles, got {plan:?}");
        let s = plan.schedule.expect("a Hopper plan");
        assert!(s.stream_k && s.rows_per_cta == bm, "m={m}: {s:?}");
        let got = d.to_host_vec::<u16>(&stream).unwrap();
        let e = max_rel_err(&got, &p.reference, 0.5);
        eprintln!("stream-K m={m} n={n} k={k} workspace={}: normalized error {e:.2e}", plan.workspace_bytes);
        assert!(e < 1e-2, "m={m}: normalized error {e:.3e}");
        alpha.copy_from_host(&[1.0f32], &stream).unwrap();
        nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
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
    let plan = nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
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
        let m = Nvfp4Matrix { packed: &z, scales: &z, global_scale: &z, rows: 32, k: 64 };
        let mut ws = Workspace::new(&stream, 0).unwrap();
        let r = nvfp4::gemm(&m, &m, &z, &Tensor::contiguous(&z, DType::Bf16, &[32, 32]), &mut ws, &stream);
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
    nvfp4::gemm(
        &Nvfp4Matrix { packed: &bpa, scales: &bsa, global_scale: &bga, rows: m, k },
        &Nvfp4Matrix { packed: &bpw, scales: &bsw, global_scale: &bgw, rows: n, k },
        &alpha,
        &Tensor::contiguous(&d, DType::Bf16, &[m, n]),
        &mut ws,
        &stream,
    )
    .unwrap();
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
            nvfp4::w4a16_gemm(&at, &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
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
    nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[p.m, p.k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[p.m, p.n]), &mut ws, &stream).unwrap();
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
    nvfp4::w4a16_gemm(&Tensor::contiguous(&p.a, DType::Bf16, &[m, k]), &p.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[m, n]), &mut ws, &stream).unwrap();
    let eager = d.to_host_vec::<u16>(&stream).unwrap();
    assert!(max_rel_err(&eager, &p.reference, 1.0) <= 1e-2);
    check_captured_replay(&mut stream, &p, &alpha, &d, &mut ws, &plan, &eager, Replays { count: 5, fill: 0x7F, grow: false });
}

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
    let qa = Nvfp4Matrix { packed: &bpa, scales: &bsa, global_scale: &bga, rows: m, k };
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
        nvfp4::w4a16_gemm(&a1t, &g1.w, &alpha, &d1t, &mut ws, &stream).unwrap();
        nvfp4::w4a16_gemm(&d1t, &g2.w, &alpha, &d2t, &mut ws, &stream).unwrap();
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
        nvfp4::w4a16_gemm_captured(&Tensor::contiguous(ca1, DType::Bf16, &[m, k]), &w1, &cal, &Tensor::contiguous(cd1.clone(), DType::Bf16, &[m, n1]), &w, &cap).unwrap();
        nvfp4::w4a16_gemm_captured(&Tensor::contiguous(cd1, DType::Bf16, &[m, n1]), &w2, &cal, &Tensor::contiguous(cd2, DType::Bf16, &[m, n2]), &w, &cap).unwrap();
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
    let q0 = Nvfp4Matrix { packed: &bp0, scales: &bs0, global_scale: &bg0, rows: m, k };
    let xb = DeviceBuffer::alloc_zeroed(&stream, m * k * 2).unwrap();
    let xt = Tensor::contiguous(&xb, DType::Bf16, &[m, k]);
    let gs = DeviceBuffer::alloc_zeroed(&stream, 4).unwrap();
    let (p1, s1) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap());
    let q1 = Nvfp4Matrix { packed: &p1, scales: &s1, global_scale: &gs, rows: m, k };
    for round in 0..3u8 {
        xb.memset_u8(0x11 + round, &stream).unwrap();
        gs.memset_u8(0, &stream).unwrap();
        p1.memset_u8(0xAB, &stream).unwrap();
        s1.memset_u8(0xCD, &stream).unwrap();
        nvfp4::dequantize(&q0, &xt, &stream).unwrap();
        nvfp4::global_scale(&xt, &gs, &stream).unwrap();
        nvfp4::quantize(&xt, &gs, &q1, &stream).unwrap();
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
    nvfp4::w4a16_gemm(&Tensor::contiguous(&g.a, DType::Bf16, &[gm, g.k]), &g.w, &alpha, &Tensor::contiguous(&d, DType::Bf16, &[gm, gn]), &mut ws, &stream).unwrap();
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
        nvfp4::w4a16_gemm_captured(&Tensor::contiguous(ca, DType::Bf16, &[gm, g.k]), &cw, &cal, &dt, &w, &cap).unwrap();
        nvfp4::quantize_captured(&dt, &cg, &Nvfp4Matrix { packed: cp, scales: cs, global_scale: cg.clone(), rows: gm, k: gn }, &cap).unwrap();
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
    nvfp4::w4a16_gemm(&at, &g.w, &alpha, &dt, &mut ws, &stream).unwrap();
    let dh = d.to_host_vec::<u16>(&stream).unwrap();
    let e = max_rel_err(&dh, &g.reference, 1.0);
    assert!(e <= 1e-2, "GEMM normalized error {e:.3e}");
    // D quantized as [tiles, 128] (the same bytes), against the host quantize of the finished D.
    let df: Vec<f32> = dh.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let gd = r::global_scale(&df);
    let (want_p, want_s) = r::quantize(&df, tiles, 128, gd).unwrap();
    let gdb = DeviceBuffer::from_host(&stream, &[gd]).unwrap();
    let (qp, qs) = (DeviceBuffer::alloc(&ctx, n / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(tiles, 128)).unwrap());
    let q = Nvfp4Matrix { packed: &qp, scales: &qs, global_scale: &gdb, rows: tiles, k: 128 };
    let d2t = Tensor::contiguous(&d, DType::Bf16, &[tiles, 128]);
    for round in 0..5 {
        d.memset_u8(0xFF, &stream).unwrap(); // bf16 NaN everywhere
        qp.memset_u8(0xAB, &stream).unwrap();
        nvfp4::w4a16_gemm(&at, &g.w, &alpha, &dt, &mut ws, &stream).unwrap();
        nvfp4::quantize(&d2t, &gdb, &q, &stream).unwrap();
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
        nvfp4::w4a16_gemm_captured(&Tensor::contiguous(ca, DType::Bf16, &[m, k]), &cw, &cal, &Tensor::contiguous(cd.clone(), DType::Bf16, &[m, n]), &w, &cap).unwrap();
        nvfp4::quantize_captured(&Tensor::contiguous(cd, DType::Bf16, &[tiles, 128]), &cg, &Nvfp4Matrix { packed: cp, scales: cs, global_scale: cg.clone(), rows: tiles, k: 128 }, &cap).unwrap();
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
        nvfp4::quantize(x, &gs, &Nvfp4Matrix { packed: &p, scales: &s, global_scale: &gs, rows: 1, k }, &stream).unwrap();
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
        nvfp4::w4a16_gemm(&a, &p.w, &alpha, &Tensor::strided(&d, 0, DType::Bf16, &[1, n], &d_strides), ws, &stream).unwrap();
        d.to_host_vec::<u16>(&stream).unwrap()
    };
    let want = run(Tensor::contiguous(&p.a, DType::Bf16, &[1, k]), [n, 1], &mut ws);
    assert_eq!(run(Tensor::strided(&p.a, 0, DType::Bf16, &[1, k], &[3, 1]), [5, 1], &mut ws), want);
    assert!(max_rel_err(&want, &p.reference, 1.0) < 1e-2);
}

//! NVFP4 on the GPU: quantize/dequantize/global scale bit-identical to the host reference on random
//! and adversarial inputs; the Hopper W4A16 GEMM against a dequantize-then-f64 reference; captured
//! replay equal to eager (and alpha read at replay time); the Blackwell GEMM skips elsewhere.

mod common;
#[path = "gpu_nvfp4/quantize.rs"]
mod quantize;
#[path = "gpu_nvfp4/gemm.rs"]
mod gemm;
#[path = "gpu_nvfp4/dependent_launch.rs"]
mod dependent_launch;

use common::{gpu, random_f32};
use graphsafe::arch::{Backend, Nvfp4Arch};
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::nvfp4::{self, reference as r, Nvfp4GemmArgs, Nvfp4Matrix, Nvfp4QuantizeArgs, W4a16GemmArgs};
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
    let w = nvfp4::prepare_weight(&Nvfp4Matrix::new(&packed, &scales, &gsb, n, k), stream).unwrap();
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
    common::runs_backends(cc, &[Backend::Nvfp4(Nvfp4Arch::Sm90)], "the W4A16 kernel")
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
        let cplan = nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(ca.clone(), cw.clone(), cal.clone(), cd.clone()), &w, &cap).unwrap();
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
        let r = nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca, DType::Bf16, &[m, k]), cw.clone(), cal.clone(), Tensor::contiguous(cd, DType::Bf16, &[m, n])), &w, &cap);
        assert!(matches!(r, Err(graphsafe::Error::WorkspaceTooSmall { .. })), "{r:?}");
        assert!(cap.end().unwrap().node_kinds().unwrap().is_empty());
    }
}

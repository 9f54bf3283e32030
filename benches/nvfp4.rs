//! NVFP4 on the GPU it finds: quantize bandwidth, and (Hopper) the W4A16 GEMM against cuBLASLt's
//! bf16 GEMM of the same shape in the same process (cuBLASLt opened at run time, here only), for
//! M ∈ {1, 4, 16, 64, 192, 256, 300, 4096} (192 and 300: between the tile heights, where waves
//! and padding show) and (N, K) ∈ {(8192, 8192), (28672, 8192), (8192, 28672)}.
//!
//! Honest inputs: every operand random (constant data inflates tensor-core throughput), and each
//! contender's weight rotated over enough copies (≥ 256 MB together, at least 2) that neither is
//! served from the 50 MB L2 — the 8192² NVFP4 weight alone would fit. Timing: each contender's
//! calls over the rotation are captured into one CUDA graph (no host overhead in the numbers, the
//! GPU's own launch gaps included, the same for both), graphs replayed alternately batch by
//! batch, medians. The copy rate (a 1 GiB device-to-device copy, read + write bytes) is measured
//! in the same run; the table gives our weight stream in GB/s and as a fraction of it.
//! Prints a table and one `BENCH_JSON` line. Run: `cargo bench --bench nvfp4`.
//!
//! Environment: `NVFP4_BENCH_ONLY=quant,w4a16` picks parts; `NVFP4_BENCH_SHAPES=1x8192x8192,...`
//! (m x n x k) picks GEMM shapes, `NVFP4_BENCH_QSHAPES=4096x8192,...` (m x k) quantize shapes;
//! `NVFP4_BENCH_QUICK=1` replays each graph once (for ncu).

#[path = "common/cublaslt.rs"]
mod cublaslt;
#[path = "common/random.rs"]
mod random;
#[path = "common/timing.rs"]
mod timing;

use cublaslt::{Lt, LtGemm};
use graphsafe::driver::{Context, DeviceBuffer, Event, Stream};
use graphsafe::graph::{CaptureMode, GraphExec};
use graphsafe::ops::nvfp4::{self, Nvfp4Matrix, Nvfp4QuantizeArgs, PreparedWeight, W4a16GemmArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use std::sync::Arc;
use random::{random_bytes, random_u64s};
use timing::median;

/// Bytes the rotation of one contender's weights must cover (5× the H200's L2).
const ROTATE_BYTES: usize = 256 << 20;

/// Random bf16 bits, uniform in (-1, 1).
fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    random_u64s(n.div_ceil(2), seed)
        .flat_map(|w| {
            let f = |x: u32| half::bf16::from_f32((x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0).to_bits();
            [f(w as u32), f((w >> 32) as u32)]
        })
        .take(n)
        .collect()
}

/// µs per replay of each graph, replayed alternately `batches` times (after one warm-up each).
fn replay_times(ctx: &Arc<Context>, stream: &Stream, graphs: &[&GraphExec], batches: usize) -> Vec<f64> {
    for g in graphs {
        g.launch(stream).unwrap();
    }
    stream.synchronize().unwrap();
    let (s, e) = (Event::new(ctx, true).unwrap(), Event::new(ctx, true).unwrap());
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); graphs.len()];
    for _ in 0..batches {
        for (i, g) in graphs.iter().enumerate() {
            s.record(stream).unwrap();
            g.launch(stream).unwrap();
            e.record(stream).unwrap();
            e.synchronize().unwrap();
            t[i].push(e.elapsed_ms(&s).unwrap() as f64 * 1e3);
        }
    }
    t.into_iter().map(median).collect()
}

/// "a x b[,c x d...]" as lists of `dims` numbers each; panics with `what` on anything else.
fn parse_shapes(list: &str, what: &str, dims: usize) -> Vec<Vec<usize>> {
    list.split(',')
        .map(|s| {
            let v: Vec<usize> = s.split('x').map(|x| x.trim().parse().expect(what)).collect();
            assert_eq!(v.len(), dims, "{what}");
            v
        })
        .collect()
}

fn want(list: &Option<String>, item: &str) -> bool {
    list.as_ref().is_none_or(|l| l.split(',').any(|x| x.trim() == item))
}

fn main() {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nvfp4 bench: no GPU ({e})");
            std::process::exit(if std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1") { 1 } else { 0 });
        }
    };
    let mut stream = Stream::new(&ctx).unwrap();
    let info = ctx.device().info().unwrap();
    let only = std::env::var("NVFP4_BENCH_ONLY").ok();
    let shapes_env = std::env::var("NVFP4_BENCH_SHAPES").ok();
    let quick = std::env::var("NVFP4_BENCH_QUICK").as_deref() == Ok("1");
    let batches = |n: usize| if quick { 1 } else { n };
    let mut json = Vec::new();

    // The copy rate HBM gives a plain device-to-device copy in this run: the ceiling.
    let copy_gbs = {
        let n = 1usize << 30;
        let (src, dst) = (DeviceBuffer::alloc_zeroed(&stream, n).unwrap(), DeviceBuffer::alloc(&ctx, n).unwrap());
        let (s, e) = (Event::new(&ctx, true).unwrap(), Event::new(&ctx, true).unwrap());
        let mut v = Vec::new();
        for i in 0..(if quick { 2 } else { 13 }) {
            s.record(&stream).unwrap();
            dst.copy_from_device(&src, &stream).unwrap();
            e.record(&stream).unwrap();
            e.synchronize().unwrap();
            if i > 0 {
                v.push(e.elapsed_ms(&s).unwrap() as f64 * 1e3);
            }
        }
        2.0 * n as f64 / median(v) / 1e3
    };
    println!("NVFP4 on {} ({} SMs); device-to-device copy {:.0} GB/s (read + write)", info.name, info.sm_count, copy_gbs);
    json.push(format!("{{\"kind\":\"copy\",\"gb_s\":{copy_gbs:.1}}}"));

    if want(&only, "quant") {
        // Quantize: read bf16, write codes and scales. Random inputs, rotated (inputs and outputs)
        // over copies covering >= 256 MB where that takes at most 64 copies, so large shapes are
        // read from HBM as an engine's fresh activations would be, not from L2 left by the last
        // call; a graph of enough calls that one replay runs >= 400 us, so the host's graph-launch
        // latency (between the start event and the first kernel) is not charged to the kernel.
        println!("{:>8} {:>8} {:>10} {:>9} {:>8} {:>7} {:>6} {:>8} {:>7}", "m", "k", "quant us", "GB/s", "of copy", "copies", "calls", "copy us", "copy/q");
        let mut qshapes = vec![(1usize, 8192usize), (16, 8192), (4096, 8192), (4096, 28672), (16384, 8192)];
        if let Ok(list) = std::env::var("NVFP4_BENCH_QSHAPES") {
            qshapes = parse_shapes(&list, "NVFP4_BENCH_QSHAPES: m x k", 2).iter().map(|v| (v[0], v[1])).collect();
        }
        for &(m, k) in &qshapes {
            let sb = nvfp4::scale_bytes(m as i64, k as i64).unwrap() as usize;
            let bytes = m * k * 2 + m * k / 2 + sb;
            let copies = ROTATE_BYTES.div_ceil(bytes).clamp(2, 64);
            let mut sets = Vec::new();
            for c in 0..copies {
                let x = DeviceBuffer::from_host(&stream, &random_bf16(m * k, (m * k + c) as u64)).unwrap();
                let gs = DeviceBuffer::alloc_zeroed(&stream, 4).unwrap();
                nvfp4::global_scale(&Tensor::contiguous(&x, DType::Bf16, &[m, k]), &gs, &stream).unwrap();
                let (p, s) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, sb).unwrap());
                sets.push((x, gs, p, s));
            }
            let per_call_guess_us = (bytes as f64 / 3.0e6).max(2.0);
            let calls = ((400.0 / per_call_guess_us).ceil() as usize).div_ceil(copies).max(1) * copies;
            let exec = {
                let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
                let mut bound = Vec::new();
                for (x, gs, p, s) in &sets {
                    bound.push((cap.bind_buffer(x).unwrap(), cap.bind_buffer(gs).unwrap(), cap.bind_buffer(p).unwrap(), cap.bind_buffer(s).unwrap()));
                }
                for i in 0..calls {
                    let (cx, cg, cp, cs) = &bound[i % copies];
                    let q = Nvfp4Matrix::new(cp.clone(), cs.clone(), cg.clone(), m, k);
                    nvfp4::quantize_captured(&Nvfp4QuantizeArgs::new(Tensor::contiguous(cx.clone(), DType::Bf16, &[m, k]), cg.clone(), q.clone()), &cap).unwrap();
                }
                cap.end().unwrap().instantiate().unwrap()
            };
            // A device-to-device copy moving the same bytes (half read, half written), captured and
            // rotated the same way: what HBM gives one op of this size, launch ramp and tail included.
            let half = (bytes / 2).div_ceil(16) * 16;
            let cbufs: Vec<(DeviceBuffer, DeviceBuffer)> =
                (0..copies).map(|_| (DeviceBuffer::alloc_zeroed(&stream, half).unwrap(), DeviceBuffer::alloc(&ctx, half).unwrap())).collect();
            let copy_exec = {
                let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
                let mut bound = Vec::new();
                for (a, b) in &cbufs {
                    bound.push((cap.bind_buffer(a).unwrap(), cap.bind_buffer(b).unwrap()));
                }
                for i in 0..calls {
                    let (src, dst) = &bound[i % copies];
                    cap.copy(dst, src).unwrap();
                }
                cap.end().unwrap().instantiate().unwrap()
            };
            let t = replay_times(&ctx, &stream, &[&exec, &copy_exec], batches(15));
            let (us, cus) = (t[0] / calls as f64, t[1] / calls as f64);
            let gbs = bytes as f64 / us / 1e3;
            println!("{m:>8} {k:>8} {us:>10.2} {gbs:>9.0} {:>8.2} {copies:>7} {calls:>6} {cus:>8.2} {:>7.2}", gbs / copy_gbs, cus / us);
            json.push(format!(
                "{{\"kind\":\"quantize\",\"m\":{m},\"k\":{k},\"us\":{us:.3},\"gb_s\":{gbs:.1},\"of_copy\":{:.3},\"copies\":{copies},\"calls\":{calls},\"same_bytes_copy_us\":{cus:.3}}}",
                gbs / copy_gbs
            ));
        }
    }

    if !want(&only, "w4a16") {
        println!("BENCH_JSON {{\"bench\":\"nvfp4\",\"device\":\"{}\",\"rows\":[{}]}}", info.name, json.join(","));
        return;
    }
    // Any GPU the arch table runs the W4A16 back-end on, not one named here.
    let cc = ctx.compute_capability();
    if graphsafe::arch::target_for_cc(cc).and_then(|t| t.nvfp4()) != Some(nvfp4::Nvfp4Arch::Sm90) {
        println!("W4A16: skipped (needs {}; this GPU is {})", nvfp4::Nvfp4Arch::Sm90.gpus(), graphsafe::arch::cc_name(cc));
        println!("BENCH_JSON {{\"bench\":\"nvfp4\",\"device\":\"{}\",\"rows\":[{}]}}", info.name, json.join(","));
        return;
    }
    let lt = if quick { None } else { Lt::open().map_err(|e| eprintln!("cuBLASLt unavailable ({e}): W4A16 without a baseline")).ok() };
    println!(
        "{:>5} {:>6} {:>6} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8}",
        "m", "n", "k", "w4a16 us", "W GB/s", "of copy", "cublas us", "W GB/s", "TFLOP/s", "speedup"
    );
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for &(n, k) in &[(8192usize, 8192usize), (28672, 8192), (8192, 28672)] {
        for &m in &[1usize, 4, 16, 64, 192, 256, 300, 4096] {
            shapes.push((m, n, k));
        }
    }
    if let Some(list) = &shapes_env {
        shapes = parse_shapes(list, "NVFP4_BENCH_SHAPES: m x n x k", 3).iter().map(|v| (v[0], v[1], v[2])).collect();
    }
    let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let mut cur_nk = (0usize, 0usize);
    let mut weights: Vec<PreparedWeight> = Vec::new();
    let mut wbf: Vec<DeviceBuffer> = Vec::new();
    let mut prepared_bytes = 0usize;
    for &(m, n, k) in &shapes {
        if cur_nk != (n, k) {
            // Random NVFP4 weight: random codes (both signs), random scales in [2^-3, 1.75], then prepared.
            weights.clear();
            wbf.clear();
            let packed = DeviceBuffer::from_host(&stream, &random_bytes(n * k / 2, (n + k) as u64)).unwrap();
            let sb = nvfp4::scale_bytes(n as i64, k as i64).unwrap() as usize;
            let sc: Vec<u8> = random_bytes(sb, (n * k) as u64).iter().map(|b| 0x20 + (b % 0x1E)).collect();
            let scales = DeviceBuffer::from_host(&stream, &sc).unwrap();
            let gs = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
            let plan = nvfp4::plan(nvfp4::Nvfp4Arch::Sm90, 1, n as i64, k as i64, DType::Bf16, ctx.sm_count() as i64).unwrap();
            prepared_bytes = plan.prepared_weight_bytes.unwrap() as usize;
            let copies = ROTATE_BYTES.div_ceil(prepared_bytes).max(2);
            for _ in 0..copies {
                weights.push(nvfp4::prepare_weight(&Nvfp4Matrix::new(&packed, &scales, &gs, n, k), &stream).unwrap());
            }
            if lt.is_some() {
                let first = DeviceBuffer::from_host(&stream, &random_bf16(n * k, (3 * n + k) as u64)).unwrap();
                let copies = ROTATE_BYTES.div_ceil(n * k * 2).max(2);
                for _ in 1..copies {
                    let b = DeviceBuffer::alloc(&ctx, n * k * 2).unwrap();
                    b.copy_from_device(&first, &stream).unwrap();
                    wbf.push(b);
                }
                wbf.push(first);
            }
            stream.synchronize().unwrap();
            cur_nk = (n, k);
        }
        // Size before capture (0 bytes for the cluster-reduced kernel; kept for any version that needs one).
        let need = nvfp4::plan(nvfp4::Nvfp4Arch::Sm90, m as i64, n as i64, k as i64, DType::Bf16, ctx.sm_count() as i64).unwrap().workspace_bytes;
        ws.ensure_size(need, &stream).unwrap();
        let a = DeviceBuffer::from_host(&stream, &random_bf16(m * k, (m * 7 + k) as u64)).unwrap();
        let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2).unwrap();
        // Calls per graph: the rotation, repeated so a replay runs well past launch overhead.
        let per_call_guess_us = (prepared_bytes as f64 / 3.0e3).max(2.0 * (m * n * k) as f64 / 6.0e8);
        let reps = ((400.0 / (per_call_guess_us * weights.len() as f64)).ceil() as usize).clamp(1, 20);
        let ours_calls = weights.len() * reps;
        let ours = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut ws).unwrap();
            let (ca, cal, cd) = (cap.bind_buffer(&a).unwrap(), cap.bind_buffer(&alpha).unwrap(), cap.bind_buffer(&d).unwrap());
            let cws: Vec<_> = weights.iter().map(|x| x.bind(&mut cap).unwrap()).collect();
            for _ in 0..reps {
                for cw in &cws {
                    nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(Tensor::contiguous(ca.clone(), DType::Bf16, &[m, k]), cw.clone(), cal.clone(), Tensor::contiguous(cd.clone(), DType::Bf16, &[m, n])), &w, &cap).unwrap();
                }
            }
            cap.end().unwrap().instantiate().unwrap()
        };
        let b = if m >= 256 { 7 } else { 15 };
        let (us, cb, cb_calls) = match &lt {
            Some(l) => {
                let g = LtGemm::new(l, m, n, k, &stream);
                let cb_reps = ((400.0 / ((n * k * 2) as f64 / 4.0e3 * wbf.len() as f64)).ceil() as usize).clamp(1, 20);
                let theirs = {
                    let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
                    for _ in 0..cb_reps {
                        for wb in &wbf {
                            // SAFETY: cuBLASLt launches into this capture only; nothing else captures the bench stream.
                            g.run_raw(&a, wb, &d, unsafe { cap.stream().raw_unshared() });
                        }
                    }
                    cap.end().unwrap().instantiate().unwrap()
                };
                let t = replay_times(&ctx, &stream, &[&ours, &theirs], batches(b));
                (t[0] / ours_calls as f64, t[1] / (cb_reps * wbf.len()) as f64, cb_reps * wbf.len())
            }
            None => (replay_times(&ctx, &stream, &[&ours], batches(b))[0] / ours_calls as f64, f64::NAN, 0),
        };
        let flops = 2.0 * (m * n * k) as f64;
        let wgbs = prepared_bytes as f64 / us / 1e3;
        let cb_wgbs = (n * k * 2) as f64 / cb / 1e3;
        println!(
            "{m:>5} {n:>6} {k:>6} {us:>9.1} {wgbs:>9.0} {:>7.2} {cb:>9.1} {cb_wgbs:>9.0} {:>8.0} {:>8.2}",
            wgbs / copy_gbs,
            flops / us / 1e6,
            cb / us
        );
        json.push(format!(
            "{{\"kind\":\"w4a16\",\"m\":{m},\"n\":{n},\"k\":{k},\"us\":{us:.2},\"weight_gb_s\":{wgbs:.1},\"of_copy\":{:.3},\"cublas_bf16_us\":{cb:.2},\"speedup\":{:.3},\"calls\":[{ours_calls},{cb_calls}]}}",
            wgbs / copy_gbs,
            cb / us
        ));
    }
    println!("BENCH_JSON {{\"bench\":\"nvfp4\",\"device\":\"{}\",\"copy_gb_s\":{copy_gbs:.1},\"rows\":[{}]}}", info.name, json.join(","));
}

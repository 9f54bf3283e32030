//! cuDNN matmul through graphsafe against cuBLASLt, bf16 in / fp32 compute / bf16 out, in one
//! process on one GPU: `C[M, N] = X[M, K] · Wᵀ` with W stored [N, K] row-major (an LLM linear layer;
//! cuBLASLt's "TN"), M ∈ {1, 16, 256, 4096}, N = K = 8192.
//!
//! Per M: GPU time per GEMM (median of 15 event-timed batches each, batches alternating between the
//! contenders) for graphsafe's heuristic plan, its autotuned plan, and cuBLASLt's first heuristic
//! algorithm (32 MiB workspace); the outputs are compared with each other. Host time per execute
//! with a cached plan (median of 3000 calls, M = 1): graphsafe's safe `matmul`, a bare
//! `cudnnBackendExecute` with a prebuilt variant pack (the floor), and `cublasLtMatmul`.
//! cuBLASLt is opened at run time here only (`libcublasLt.so.13`, then `.so.12`); the crate never
//! depends on it. Prints a table and one `BENCH_JSON {...}` line. Run: `cargo bench --bench cudnn`.

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::ops::cudnn::{self, matmul::RawExecutor, Cudnn, MatmulArgs, MatmulProblem};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::sys::DeviceSpan;
use graphsafe::workspace::Workspace;

use std::time::Instant;

const N: usize = 8192;
const K: usize = 8192;
const MS: [usize; 4] = [1, 16, 256, 4096];


#[path = "common/cublaslt.rs"]
mod cublaslt;
#[path = "common/timing.rs"]
mod timing;
use cublaslt::{Lt, LtGemm};
use timing::{gpu_times, median};

// ---- measurement ----------------------------------------------------------------------------


/// Host µs per call, single calls alternating between contenders; the queue is drained now and then.
fn host_times(stream: &Stream, calls: usize, runs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let mut t: Vec<Vec<f64>> = vec![Vec::with_capacity(calls); runs.len()];
    for i in 0..calls {
        for (j, r) in runs.iter_mut().enumerate() {
            let t0 = Instant::now();
            r();
            t[j].push(t0.elapsed().as_secs_f64() * 1e6);
        }
        // Drain the queue often: a full launch queue blocks the caller and times the GPU, not the host.
        if i % 4 == 3 {
            stream.synchronize().unwrap();
        }
    }
    stream.synchronize().unwrap();
    t.into_iter().map(median).collect()
}

fn bf16_to_f32(v: &[u16]) -> Vec<f32> {
    v.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect()
}

fn main() {
    let require = std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1");
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cudnn bench: no GPU ({e})");
            std::process::exit(if require { 1 } else { 0 });
        }
    };
    let dnn = match Cudnn::new(&ctx) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cudnn bench: no cuDNN ({e})");
            std::process::exit(if require { 1 } else { 0 });
        }
    };
    let lt = match Lt::open() {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("cudnn bench: no cuBLASLt ({e}); cuDNN only");
            None
        }
    };
    let stream = Stream::new(&ctx).unwrap();
    let info = ctx.device().info().unwrap();
    let mmax = *MS.iter().max().unwrap();
    // Inputs: small random bf16 values (exact in bf16), from a cheap generator.
    let gen = |n: usize, seed: u32| -> Vec<u16> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = ((s >> 8) % 17) as f32 / 16.0 - 0.5;
                (v.to_bits() >> 16) as u16
            })
            .collect()
    };
    let x = DeviceBuffer::from_host(&stream, &gen(mmax * K, 1)).unwrap();
    let w = DeviceBuffer::from_host(&stream, &gen(N * K, 2)).unwrap();
    let d_dnn = DeviceBuffer::alloc_zeroed(&stream, mmax * N * 2).unwrap();
    let d_lt = DeviceBuffer::alloc_zeroed(&stream, mmax * N * 2).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();

    println!("cuDNN {} ({}) vs cuBLASLt on {} ({} SMs); bf16 in, fp32 compute, bf16 out; N = K = {N}", dnn.version(), dnn.library(), info.name, info.sm_count);
    println!("{:>5} {:>10} {:>12} {:>10} {:>12} {:>8} {:>8} {:>9} {:>9}", "M", "heur us", "cublasLt us", "tuned us", "cublasLt us", "heur x", "tuned x", "TFLOP/s", "max|diff|");
    let mut json_rows = Vec::new();
    for &m in &MS {
        let args = MatmulArgs::new(
            Tensor::contiguous(&x, DType::Bf16, &[m, K]),
            Tensor::strided(&w, 0, DType::Bf16, &[K, N], &[1, K]),
            Tensor::contiguous(&d_dnn, DType::Bf16, &[m, N]),
        );
        let heur = cudnn::matmul(&dnn, &args, &mut ws, &stream).unwrap();
        let flop = 2.0 * m as f64 * N as f64 * K as f64;
        let per = ((5e-3 / (flop / 600e12).max(2e-6)) as usize).clamp(2, 500);
        let ltg = lt.as_ref().map(|l| LtGemm::new(l, m, N, K, &stream));
        let mut run_dnn = || {
            cudnn::matmul(&dnn, &args, &mut ws, &stream).unwrap();
        };
        let mut run_lt = || {
            if let Some(g) = &ltg {
                g.run(&x, &w, &d_lt, &stream)
            }
        };
        for _ in 0..3 {
            run_dnn();
            run_lt();
        }
        let t = gpu_times(&stream, &ctx, per, 15, &mut [&mut run_dnn, &mut run_lt]);
        let (t_heur, t_lt) = (t[0], t[1]);
        // Autotune (8 candidates), then time the pinned plan against cuBLASLt again.
        let report = cudnn::autotune(&dnn, &args, &mut ws, &stream, 8).unwrap();
        let mut run_dnn = || {
            cudnn::matmul(&dnn, &args, &mut ws, &stream).unwrap();
        };
        let t2 = gpu_times(&stream, &ctx, per, 15, &mut [&mut run_dnn, &mut run_lt]);
        let (t_tuned, t_lt2) = (t2[0], t2[1]);
        // Each ratio uses the cuBLASLt time measured in the same alternation (clocks drift between rounds).
        let (t_lt, t_lt2) = if ltg.is_some() { (t_lt, t_lt2) } else { (f64::NAN, f64::NAN) };
        // Outputs agree?
        run_dnn();
        run_lt();
        let a = bf16_to_f32(&d_dnn.to_host_vec::<u16>(&stream).unwrap()[..m * N]);
        let b = bf16_to_f32(&d_lt.to_host_vec::<u16>(&stream).unwrap()[..m * N]);
        let diff = if ltg.is_some() { a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max) } else { f32::NAN };
        let best = t_heur.min(t_tuned);
        println!(
            "{m:>5} {t_heur:>10.2} {t_lt:>12.2} {t_tuned:>10.2} {t_lt2:>12.2} {:>8.3} {:>8.3} {:>9.1} {diff:>9.3}",
            t_lt / t_heur,
            t_lt2 / t_tuned,
            flop / best / 1e6
        );
        for (pi, us) in &report.candidates {
            eprintln!("    M={m} candidate engine {:>3} {:?}#{} ws {} B: {us:.2} us", pi.engine, pi.source, pi.rank, pi.workspace_bytes);
        }
        json_rows.push(format!(
            "{{\"m\":{m},\"n\":{N},\"k\":{K},\"cudnn_heuristic_us\":{t_heur:.3},\"cudnn_autotuned_us\":{t_tuned:.3},\"cublaslt_us\":{t_lt:.3},\"cublaslt_us_second_round\":{t_lt2:.3},\"heuristic_vs_cublas\":{:.4},\"autotuned_vs_cublas\":{:.4},\"heuristic_engine\":{},\"autotuned_engine\":{},\"workspace_bytes\":{},\"max_abs_diff_vs_cublas\":{diff}}}",
            t_lt / t_heur,
            t_lt2 / t_tuned,
            heur.engine,
            report.chosen.engine,
            report.chosen.workspace_bytes
        ));
    }

    // Host overhead per execute with a cached plan, M = 1 (the decode case).
    let m = 1;
    let args = MatmulArgs::new(
        Tensor::contiguous(&x, DType::Bf16, &[m, K]),
        Tensor::strided(&w, 0, DType::Bf16, &[K, N], &[1, K]),
        Tensor::contiguous(&d_dnn, DType::Bf16, &[m, N]),
    );
    let p = MatmulProblem::new(m, N, K, DType::Bf16, DType::Bf16).with_b_col_major();
    cudnn::matmul(&dnn, &args, &mut ws, &stream).unwrap();
    // SAFETY: the buffers and the workspace (not grown again: the safe path's plan fits) outlive
    // the executor's use below.
    let spans = unsafe {
        let span = |b: &DeviceBuffer| DeviceSpan::from_raw(b.device_ptr(), b.len() as u64);
        ([span(&x), span(&w), span(&d_dnn)], DeviceSpan::from_raw(ws.device_ptr(), ws.capacity()))
    };
    let raw = RawExecutor::new(&dnn, &p, spans.0, spans.1, &stream).unwrap();
    let ltg = lt.as_ref().map(|l| LtGemm::new(l, m, N, K, &stream));
    let mut safe = || {
        cudnn::matmul(&dnn, &args, &mut ws, &stream).unwrap();
    };
    let mut bare = || assert_eq!(raw.call(), 0);
    let mut cublas = || {
        if let Some(g) = &ltg {
            g.run(&x, &w, &d_lt, &stream)
        }
    };
    for _ in 0..300 {
        safe();
        bare();
        cublas();
    }
    stream.synchronize().unwrap();
    let h = host_times(&stream, 3000, &mut [&mut safe, &mut bare, &mut cublas]);
    println!("host us per execute, cached plan, M=1 (median of 3000): graphsafe matmul {:.3}, bare cudnnBackendExecute {:.3}, graphsafe overhead {:.3}, cublasLtMatmul {:.3}", h[0], h[1], h[0] - h[1], h[2]);
    println!(
        "BENCH_JSON {{\"bench\":\"cudnn\",\"device\":\"{}\",\"cudnn\":\"{}\",\"rows\":[{}],\"host_us\":{{\"graphsafe_matmul\":{:.4},\"bare_cudnn_execute\":{:.4},\"graphsafe_overhead\":{:.4},\"cublaslt_matmul\":{:.4}}}}}",
        info.name,
        dnn.version(),
        json_rows.join(","),
        h[0],
        h[1],
        h[0] - h[1],
        h[2]
    );
}

//! NVFP4 on the GPU it finds: quantize bandwidth, and (Hopper) the W4A16 GEMM against cuBLASLt's
//! bf16 GEMM of the same shape in the same process (cuBLASLt opened at run time, here only), for
//! M ∈ {1, 4, 16, 64, 256, 4096} and (N, K) ∈ {(8192, 8192), (28672, 8192), (8192, 28672)}.
//! Medians of event-timed calls after warm-up; graphsafe and cuBLASLt alternate batch by batch.
//! Prints a table and one `BENCH_JSON` line. Run: `cargo bench --bench nvfp4`.

#[path = "common/cublaslt.rs"]
mod cublaslt;
#[path = "common/timing.rs"]
mod timing;

use cublaslt::{Lt, LtGemm};
use timing::gpu_times;
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::ops::nvfp4::{self, Nvfp4Matrix};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;



fn main() {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nvfp4 bench: no GPU ({e})");
            std::process::exit(if std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1") { 1 } else { 0 });
        }
    };
    let stream = Stream::new(&ctx).unwrap();
    let info = ctx.device().info().unwrap();
    let mut json = Vec::new();

    // Quantize bandwidth: read bf16, write packed values and scales.
    println!("NVFP4 on {} ({} SMs)", info.name, info.sm_count);
    println!("{:>8} {:>8} {:>10} {:>9}", "m", "k", "quant us", "GB/s");
    for &(m, k) in &[(16usize, 8192usize), (4096, 8192), (4096, 28672), (16384, 8192)] {
        let x = DeviceBuffer::alloc_zeroed(&stream, m * k * 2).unwrap();
        x.memset_u32(0x3F80_BF00, &stream).unwrap();
        let gs = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
        let sb = nvfp4::scale_bytes(m as i64, k as i64).unwrap() as usize;
        let (p, s) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, sb).unwrap());
        let q = Nvfp4Matrix { packed: &p, scales: &s, global_scale: &gs, rows: m, k };
        let xt = Tensor::contiguous(&x, DType::Bf16, &[m, k]);
        let us = gpu_times(&stream, &ctx, 20, 15, &mut [&mut || nvfp4::quantize(&xt, &gs, &q, &stream).unwrap()])[0];
        let gbs = (m * k * 2 + m * k / 2 + sb) as f64 / us / 1e3;
        println!("{m:>8} {k:>8} {us:>10.2} {gbs:>9.0}");
        json.push(format!("{{\"kind\":\"quantize\",\"m\":{m},\"k\":{k},\"us\":{us:.3},\"gb_s\":{gbs:.1}}}"));
    }

    if ctx.compute_capability() != (9, 0) {
        println!("W4A16: skipped (needs sm_90; this GPU is sm_{}{})", ctx.compute_capability().0, ctx.compute_capability().1);
        println!("BENCH_JSON {{\"bench\":\"nvfp4\",\"device\":\"{}\",\"rows\":[{}]}}", info.name, json.join(","));
        return;
    }
    let lt = Lt::open().map_err(|e| eprintln!("cuBLASLt unavailable ({e}): W4A16 without a baseline")).ok();
    println!("{:>6} {:>6} {:>6} {:>11} {:>9} {:>11} {:>9} {:>8}", "m", "n", "k", "w4a16 us", "TFLOP/s", "cublas us", "TFLOP/s", "speedup");
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for &(n, k) in &[(8192usize, 8192usize), (28672, 8192), (8192, 28672)] {
        // A weight of ones at scale 1 (values do not change the timing); prepared once.
        let packed = DeviceBuffer::alloc(&ctx, n * k / 2).unwrap();
        packed.memset_u8(0x22, &stream).unwrap(); // e2m1 1.0 in both nibbles
        let scales = DeviceBuffer::alloc(&ctx, nvfp4::scale_bytes(n as i64, k as i64).unwrap() as usize).unwrap();
        scales.memset_u8(0x38, &stream).unwrap(); // fp8 1.0
        let gs = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
        let w = nvfp4::prepare_weight(&Nvfp4Matrix { packed: &packed, scales: &scales, global_scale: &gs, rows: n, k }, &stream).unwrap();
        drop((packed, scales));
        let wbf = DeviceBuffer::alloc(&ctx, n * k * 2).unwrap();
        wbf.memset_u32(0x3F80_3F80, &stream).unwrap();
        let alpha = DeviceBuffer::from_host(&stream, &[1.0f32]).unwrap();
        for &m in &[1usize, 4, 16, 64, 256, 4096] {
            let a = DeviceBuffer::alloc(&ctx, m * k * 2).unwrap();
            a.memset_u32(0x3C00_3C00, &stream).unwrap();
            let d = DeviceBuffer::alloc(&ctx, m * n * 2).unwrap();
            let (at, dt) = (Tensor::contiguous(&a, DType::Bf16, &[m, k]), Tensor::contiguous(&d, DType::Bf16, &[m, n]));
            let mut ours = || {
                nvfp4::w4a16_gemm(&at, &w, &alpha, &dt, &mut ws, &stream).unwrap();
            };
            let (per, batches) = if m >= 256 { (5, 9) } else { (20, 15) };
            let flops = 2.0 * (m * n * k) as f64;
            let times = match &lt {
                Some(l) => {
                    let g = LtGemm::new(l, m, n, k, &stream);
                    let mut theirs = || g.run(&a, &wbf, &d, &stream);
                    gpu_times(&stream, &ctx, per, batches, &mut [&mut ours, &mut theirs])
                }
                None => {
                    let mut t = gpu_times(&stream, &ctx, per, batches, &mut [&mut ours]);
                    t.push(f64::NAN);
                    t
                }
            };
            let (us, cb) = (times[0], times[1]);
            println!("{m:>6} {n:>6} {k:>6} {us:>11.1} {:>9.1} {cb:>11.1} {:>9.1} {:>8.2}", flops / us / 1e6, flops / cb / 1e6, cb / us);
            json.push(format!(
                "{{\"kind\":\"w4a16\",\"m\":{m},\"n\":{n},\"k\":{k},\"us\":{us:.2},\"cublas_bf16_us\":{cb:.2},\"speedup\":{:.3}}}",
                cb / us
            ));
        }
    }
    println!("BENCH_JSON {{\"bench\":\"nvfp4\",\"device\":\"{}\",\"rows\":[{}]}}", info.name, json.join(","));
}

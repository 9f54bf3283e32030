//! MLA decode throughput on the GPU it finds: bf16 KV, page 64, batch 64/128, seq 4096/8192,
//! 16/128 heads. Per configuration: median time per call (CUDA events, 10 warm-up calls, 50
//! timed), achieved bandwidth (KV + Q + O bytes / time) and TFLOP/s (B·S·H·2·(576+512) / time);
//! the baseline in the same run is a device-to-device copy (read + write bytes / time), the HBM
//! rate this GPU actually reaches. Prints a table and one `BENCH_JSON` line.

#[path = "common/timing.rs"]
mod timing;
use timing::median;
use graphsafe::driver::{Context, DeviceBuffer, Event, Stream};
use graphsafe::ops::mla::{decode, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;


fn time_us(ctx: &std::sync::Arc<Context>, stream: &Stream, warm: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    let (s, e) = (Event::new(ctx, true).unwrap(), Event::new(ctx, true).unwrap());
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        s.record(stream).unwrap();
        f();
        e.record(stream).unwrap();
        e.synchronize().unwrap();
        v.push(e.elapsed_ms(&s).unwrap() as f64 * 1e3);
    }
    median(v)
}

fn main() {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mla bench: no GPU ({e})");
            std::process::exit(if std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1") { 1 } else { 0 });
        }
    };
    let stream = Stream::new(&ctx).unwrap();
    let info = ctx.device().info().unwrap();

    // Baseline: what HBM delivers to a plain copy here.
    let n = 1usize << 30;
    let (src, dst) = (DeviceBuffer::alloc_zeroed(&stream, n).unwrap(), DeviceBuffer::alloc(&ctx, n).unwrap());
    let copy_us = time_us(&ctx, &stream, 3, 20, || dst.copy_from_device(&src, &stream).unwrap());
    let copy_gbs = 2.0 * n as f64 / copy_us / 1e3;
    drop((src, dst));

    let page = 64usize;
    let mut rows = Vec::new();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for &heads in &[16usize, 128] {
        for &batch in &[64usize, 128] {
            for &seq in &[4096usize, 8192] {
                let pages_per = seq / page;
                let pages = batch * pages_per;
                let kv = DeviceBuffer::alloc(&ctx, pages * page * 576 * 2).unwrap();
                kv.memset_u32(0x3c00_3c00, &stream).unwrap(); // bf16 ~1.0 (values do not change the timing)
                let q = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 576 * 2).unwrap();
                let out = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 512 * 2).unwrap();
                let lse = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 4).unwrap();
                let seq_lens = DeviceBuffer::from_host(&stream, &vec![seq as i32; batch]).unwrap();
                // Requests' pages interleaved across the cache, as a serving engine's allocator leaves them.
                let pt: Vec<i32> = (0..batch * pages_per).map(|i| ((i % pages_per) * batch + i / pages_per) as i32).collect();
                let page_table = DeviceBuffer::from_host(&stream, &pt).unwrap();
                let args = MlaDecodeArgs {
                    q_nope: Tensor::strided(&q, 0, DType::Bf16, &[batch, heads, 512], &[heads * 576, 576, 1]),
                    q_pe: Tensor::strided(&q, 1024, DType::Bf16, &[batch, heads, 64], &[heads * 576, 576, 1]),
                    kv_cache: Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
                    kv_format: graphsafe::ops::mla::KvFormat::Native,
                    seq_lens: Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
                    page_table: Tensor::contiguous(&page_table, DType::I32, &[batch, pages_per]),
                    out: Tensor::contiguous(&out, DType::Bf16, &[batch, heads, 512]),
                    lse: Some(Tensor::contiguous(&lse, DType::F32, &[batch, heads])),
                    sm_scale: 0.0723,
                    max_seq_len: seq as u32,
                    num_splits: None,
                };
                let plan = match decode(&args, &mut ws, &stream) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("mla bench: {e}");
                        std::process::exit(1);
                    }
                };
                let us = time_us(&ctx, &stream, 10, 50, || {
                    decode(&args, &mut ws, &stream).unwrap();
                });
                let bytes = (batch * seq * 576 * 2 + batch * heads * 576 * 2 + batch * heads * 512 * 2) as f64;
                let flops = (batch * seq * heads) as f64 * 2.0 * 1088.0;
                rows.push((heads, batch, seq, plan.num_splits, us, bytes / us / 1e3, flops / us / 1e6));
            }
        }
    }
    println!("MLA decode on {} ({} SMs), bf16, page {page}; copy baseline {copy_gbs:.0} GB/s", info.name, info.sm_count);
    println!("{:>6} {:>6} {:>6} {:>7} {:>10} {:>9} {:>8} {:>9}", "heads", "batch", "seq", "splits", "us/call", "GB/s", "of copy", "TFLOP/s");
    let mut json = Vec::new();
    for (h, b, s, sp, us, gbs, tf) in &rows {
        println!("{h:>6} {b:>6} {s:>6} {sp:>7} {us:>10.1} {gbs:>9.0} {:>8.2} {tf:>9.1}", gbs / copy_gbs);
        json.push(format!(
            "{{\"heads\":{h},\"batch\":{b},\"seq\":{s},\"splits\":{sp},\"us\":{us:.2},\"gb_s\":{gbs:.1},\"tflop_s\":{tf:.2},\"of_copy\":{:.3}}}",
            gbs / copy_gbs
        ));
    }
    println!("BENCH_JSON {{\"bench\":\"mla\",\"device\":\"{}\",\"copy_gb_s\":{copy_gbs:.1},\"rows\":[{}]}}", info.name, json.join(","));
}

//! MLA decode throughput on the GPU it finds: bf16 KV, page 64, batch 64/128, seq 4096/8192,
//! 16/128 heads. Per configuration: median time per call (CUDA events around 20 calls, 2 warm-up
//! samples, 30 timed), achieved bandwidth (KV + Q + O bytes / time) and TFLOP/s (B·S·H·2·(576+512) / time);
//! the baseline in the same run is a device-to-device copy (read + write bytes / time), the HBM
//! rate this GPU actually reaches. Then the fp8 KV caches (per-tensor and DeepSeek's 656-byte
//! token) against bf16 of the same shapes at 16, 32 and 128 heads. Prints the tables and one
//! `BENCH_JSON` line.

#[path = "common/timing.rs"]
mod timing;
use timing::median;
use graphsafe::driver::{Context, DeviceBuffer, Event, Stream};
use graphsafe::ops::mla::{decode, KvDtype, KvFormat, KvFormatKind, MlaDecodeArgs};
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

    let page = PAGE;
    let mut rows = Vec::new();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for &heads in &[16usize, 128] {
        for &batch in &[64usize, 128] {
            for &seq in &[4096usize, 8192] {
                let case = Case::new(&ctx, &stream, heads, batch, seq, KvFormatKind::Native);
                let args = case.args();
                let plan = plan_or_exit(&args, &mut ws, &stream);
                // Batched like the other tables: one call between two events also timed the
                // GPU's wait for the host to enqueue it (16 heads 64 x 4096: 0.74 of copy one call
                // a sample, 0.79-0.81 with 20, on the H200 in the same session).
                let us = time_batched(&ctx, &stream, || decode(&args, &mut ws, &stream).map(|_| ()).unwrap());
                rows.push((heads, batch, seq, plan.num_splits, us, case.bytes() / us / 1e3, case.flops() / us / 1e6));
            }
        }
    }
    let fp8 = fp8_rows(&ctx, &stream, &mut ws);
    let long = long_rows(&ctx, &stream, &mut ws);
    println!("MLA decode on {} ({} SMs), bf16, page {page}; copy baseline {copy_gbs:.0} GB/s; {FP8_CALLS} calls between two events, median of 30", info.name, info.sm_count);
    println!("{:>6} {:>6} {:>6} {:>7} {:>10} {:>9} {:>8} {:>9}", "heads", "batch", "seq", "splits", "us/call", "GB/s", "of copy", "TFLOP/s");
    let mut json = Vec::new();
    for (h, b, s, sp, us, gbs, tf) in &rows {
        println!("{h:>6} {b:>6} {s:>6} {sp:>7} {us:>10.1} {gbs:>9.0} {:>8.2} {tf:>9.1}", gbs / copy_gbs);
        json.push(format!(
            "{{\"heads\":{h},\"batch\":{b},\"seq\":{s},\"splits\":{sp},\"us\":{us:.2},\"gb_s\":{gbs:.1},\"tflop_s\":{tf:.2},\"of_copy\":{:.3}}}",
            gbs / copy_gbs
        ));
    }
    println!();
    println!("Long requests, bf16, page 64 ({FP8_CALLS} calls between two events, median of 30)");
    println!("{:>6} {:>6} {:>6} {:>7} {:>10} {:>9} {:>8} {:>9}", "heads", "batch", "seq", "splits", "us/call", "GB/s", "of copy", "TFLOP/s");
    let mut long_json = Vec::new();
    for (h, b, s, sp, us, gbs, tf) in &long {
        println!("{h:>6} {b:>6} {s:>6} {sp:>7} {us:>10.1} {gbs:>9.0} {:>8.2} {tf:>9.1}", gbs / copy_gbs);
        long_json.push(format!("{{\"heads\":{h},\"batch\":{b},\"seq\":{s},\"splits\":{sp},\"us\":{us:.2},\"gb_s\":{gbs:.1},\"tflop_s\":{tf:.2}}}"));
    }
    println!();
    println!("fp8 KV caches against bf16 of the same shape (page 64, {FP8_CALLS} calls between two events, median of 30; bf16/fp8 t = bf16 time / this time, > 1: faster)");
    println!("{:>6} {:>6} {:>6} {:>12} {:>10} {:>9} {:>8} {:>9} {:>11}", "heads", "batch", "seq", "kv", "us/call", "GB/s", "of copy", "TFLOP/s", "bf16/fp8 t");
    let mut fp8_json = Vec::new();
    for r in &fp8 {
        let bf16_us = fp8.iter().find(|b| (b.heads, b.batch, b.seq, b.kind) == (r.heads, r.batch, r.seq, KvFormatKind::Native)).map_or(f64::NAN, |b| b.us);
        let gbs = r.bytes / r.us / 1e3;
        let tf = (r.batch * r.seq * r.heads) as f64 * 2.0 * (576.0 + 512.0) / r.us / 1e6;
        println!("{:>6} {:>6} {:>6} {:>12} {:>10.1} {gbs:>9.0} {:>8.2} {tf:>9.1} {:>11.2}", r.heads, r.batch, r.seq, r.kind.to_string(), r.us, gbs / copy_gbs, bf16_us / r.us);
        fp8_json.push(format!(
            "{{\"heads\":{},\"batch\":{},\"seq\":{},\"kv\":\"{}\",\"us\":{:.2},\"gb_s\":{gbs:.1},\"of_copy\":{:.3},\"tflop_s\":{tf:.2},\"speedup_vs_bf16\":{:.3}}}",
            r.heads, r.batch, r.seq, r.kind, r.us, gbs / copy_gbs, bf16_us / r.us
        ));
    }
    println!(
        "BENCH_JSON {{\"bench\":\"mla\",\"device\":\"{}\",\"copy_gb_s\":{copy_gbs:.1},\"rows\":[{}],\"long_rows\":[{}],\"fp8_rows\":[{}]}}",
        info.name,
        json.join(","),
        long_json.join(","),
        fp8_json.join(",")
    );
}

/// Batch 16 x 16,384 and batch 1 x 65,536 at 128 heads (issue 12's compute-bound and long-request
/// shapes) and batch 1 x 65,536 at 16 heads: (heads, batch, seq, splits, us, GB/s, TFLOP/s).
fn long_rows(ctx: &std::sync::Arc<Context>, stream: &Stream, ws: &mut Workspace) -> Vec<(usize, usize, usize, u32, f64, f64, f64)> {
    let mut rows = Vec::new();
    for &(heads, batch, seq) in &[(128usize, 16usize, 16384usize), (128, 1, 65536), (16, 1, 65536)] {
        let case = Case::new(ctx, stream, heads, batch, seq, KvFormatKind::Native);
        let args = case.args();
        let plan = plan_or_exit(&args, ws, stream);
        let us = time_batched(ctx, stream, || decode(&args, ws, stream).map(|_| ()).unwrap());
        rows.push((heads, batch, seq, plan.num_splits, us, case.bytes() / us / 1e3, case.flops() / us / 1e6));
    }
    rows
}

/// Calls per timed sample of the long-request and fp8 tables: enough that the host's enqueueing
/// runs ahead of the GPU, so the events time the kernels, not the launch overhead.
const FP8_CALLS: usize = 20;

/// Median time per call over 30 samples of [`FP8_CALLS`] calls between two events.
fn time_batched(ctx: &std::sync::Arc<Context>, stream: &Stream, mut call: impl FnMut()) -> f64 {
    time_us(ctx, stream, 2, 30, || {
        for _ in 0..FP8_CALLS {
            call();
        }
    }) / FP8_CALLS as f64
}

struct Fp8Row {
    heads: usize,
    batch: usize,
    seq: usize,
    kind: KvFormatKind,
    us: f64,
    bytes: f64,
}

/// bf16, per-tensor fp8 and 656-byte fp8 caches of the same shapes (16 and 32 heads: the N kernel,
/// memory-bound; 128 heads: the M64 kernel, compute-bound), the three timed one after another in
/// the same process.
fn fp8_rows(ctx: &std::sync::Arc<Context>, stream: &Stream, ws: &mut Workspace) -> Vec<Fp8Row> {
    let mut rows = Vec::new();
    for &(heads, batch, seq) in &[(16usize, 64usize, 4096usize), (16, 128, 8192), (32, 64, 4096), (128, 64, 4096)] {
        for kind in KvFormatKind::ALL {
            let case = Case::new(ctx, stream, heads, batch, seq, kind);
            let args = case.args();
            plan_or_exit(&args, ws, stream);
            let us = time_batched(ctx, stream, || decode(&args, ws, stream).map(|_| ()).unwrap());
            rows.push(Fp8Row { heads, batch, seq, kind, us, bytes: case.bytes() });
        }
    }
    rows
}

/// Tokens per page of every case.
const PAGE: usize = 64;

/// One decode shape's device memory: q (nope and rope of a head side by side), out, lse, every
/// request at the full length, its pages interleaved across the cache as a serving engine's
/// allocator leaves them, the cache in `kind`'s format (values do not change the timing: bf16 ~1.0,
/// e4m3 1.5 and 0) and a per-tensor scale of 1.
struct Case {
    heads: usize,
    batch: usize,
    seq: usize,
    kind: KvFormatKind,
    q: DeviceBuffer,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    seq_lens: DeviceBuffer,
    page_table: DeviceBuffer,
    kv: DeviceBuffer,
    scale: DeviceBuffer,
}

impl Case {
    fn new(ctx: &std::sync::Arc<Context>, stream: &Stream, heads: usize, batch: usize, seq: usize, kind: KvFormatKind) -> Case {
        let pages_per = seq / PAGE;
        let pt: Vec<i32> = (0..batch * pages_per).map(|i| ((i % pages_per) * batch + i / pages_per) as i32).collect();
        let kv = DeviceBuffer::alloc(ctx, batch * seq * kind.token_bytes(KvDtype::Bf16)).unwrap();
        kv.memset_u32(0x3c00_3c00, stream).unwrap();
        Case {
            heads,
            batch,
            seq,
            kind,
            q: DeviceBuffer::alloc_zeroed(stream, batch * heads * 576 * 2).unwrap(),
            out: DeviceBuffer::alloc_zeroed(stream, batch * heads * 512 * 2).unwrap(),
            lse: DeviceBuffer::alloc_zeroed(stream, batch * heads * 4).unwrap(),
            seq_lens: DeviceBuffer::from_host(stream, &vec![seq as i32; batch]).unwrap(),
            page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
            kv,
            scale: DeviceBuffer::from_host(stream, &[1.0f32]).unwrap(),
        }
    }

    fn args(&self) -> MlaDecodeArgs<&DeviceBuffer> {
        let (batch, heads, pages_per) = (self.batch, self.heads, self.seq / PAGE);
        let pages = batch * pages_per;
        let (kv_dt, kv_row) = self.kind.cache_element(DType::Bf16);
        let kv_format = match self.kind {
            KvFormatKind::Native => KvFormat::Native,
            KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(&self.scale, DType::F32, &[1]) },
            KvFormatKind::Fp8DsMla => KvFormat::Fp8DsMla,
        };
        let kv_cache = Tensor::contiguous(&self.kv, kv_dt, &[pages, PAGE, kv_row]);
        MlaDecodeArgs {
            q_nope: Tensor::strided(&self.q, 0, DType::Bf16, &[batch, heads, 512], &[heads * 576, 576, 1]),
            q_pe: Tensor::strided(&self.q, 1024, DType::Bf16, &[batch, heads, 64], &[heads * 576, 576, 1]),
            kv_cache,
            kv_format,
            seq_lens: Tensor::contiguous(&self.seq_lens, DType::I32, &[batch]),
            page_table: Tensor::contiguous(&self.page_table, DType::I32, &[batch, pages_per]),
            out: Tensor::contiguous(&self.out, DType::Bf16, &[batch, heads, 512]),
            lse: Some(Tensor::contiguous(&self.lse, DType::F32, &[batch, heads])),
            sm_scale: 0.0723,
            max_seq_len: self.seq as u32,
            num_splits: None,
        }
    }

    /// KV + Q + O bytes of one call.
    fn bytes(&self) -> f64 {
        (self.batch * self.seq * self.kind.token_bytes(KvDtype::Bf16) + self.batch * self.heads * (576 + 512) * 2) as f64
    }

    /// B·S·H·2·(576 + 512).
    fn flops(&self) -> f64 {
        (self.batch * self.seq * self.heads) as f64 * 2.0 * 1088.0
    }
}

/// The first (untimed) call, which also grows the workspace; its plan, or the bench exits.
fn plan_or_exit(args: &MlaDecodeArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> graphsafe::ops::mla::MlaDecodePlan {
    decode(args, ws, stream).unwrap_or_else(|e| {
        eprintln!("mla bench: {e}");
        std::process::exit(1);
    })
}

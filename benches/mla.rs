//! MLA decode throughput on the GPU it finds: bf16 KV, page 64, batch 64/128, seq 4096/8192,
//! 16/128 heads, then batch 16 x 16,384 and batch 1 x 65,536, then two query tokens a request
//! (MTP / speculative decode, causal) at 16, 32, 64 and 128 heads, then the fp8 KV caches
//! (per-tensor and DeepSeek's 656-byte token) against bf16 of the same shapes at 16, 32, 64 (two
//! tokens) and 128 heads (batch 64 and 128, 4096 and 8192 tokens).
//!
//! Honest inputs, the FlashMLA anchor's (benches/anchors/flashmla): random queries and cache
//! (constant data inflates tensor-core throughput: 128 heads read 650-700 TFLOP/s on zeros where
//! the anchor's random inputs gave 520-575 on the same H200), every request at full length, its
//! pages in a random order over the cache. Timing as an engine runs decode, inside a CUDA graph:
//! [`CALLS`] calls captured into one graph, median of 30 event-timed replays after 3 warm-up ones;
//! beside it the same calls launched eagerly (median of 30 batches of [`CALLS`]), which adds the
//! host's enqueueing and the launch gaps a graph removes. Per row: µs per call, achieved bandwidth
//! (KV + Q + O bytes / time), TFLOP/s (B·S·H·2·(576+512) / time); the baseline in the same run is a
//! device-to-device copy (read + write bytes / time), the HBM rate this GPU actually reaches.
//! Prints the tables and one `BENCH_JSON` line. `GRAPHSAFE_MLA_BENCH=fp8` runs the fp8 table alone,
//! `GRAPHSAFE_MLA_BENCH=tokens` the two-token table alone. `GRAPHSAFE_MLA_BENCH_PAGES=n` (a design
//! probe) takes every page index modulo n: with a small n the cache the kernels read fits in L2, so
//! the rows time their math and shared-memory work with HBM out of the way (the GB/s and "of copy"
//! columns then count bytes read from L2). `GRAPHSAFE_MLA_BENCH_HEADS=128` (a comma list) keeps the
//! cases of those head counts alone, in every table: a shorter run where GPU time is scarce.

#[path = "common/random.rs"]
mod random;
#[path = "common/timing.rs"]
mod timing;
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::{decode, decode_captured, KvFormat, KvFormatKind, MlaDecodeArgs, MlaDecodePlan};
use graphsafe::ops::tensor::{DType, DeviceMemory, Tensor};
use graphsafe::workspace::Workspace;
use std::sync::Arc;
use random::{random_bytes, random_u64s};
use timing::gpu_times;

/// Calls per timed sample (one graph, or one eager batch): enough that a sample is long against
/// the events' resolution and, eagerly, that the host's enqueueing runs ahead of the GPU.
const CALLS: usize = 20;

/// Tokens per page of every case.
const PAGE: usize = 64;

/// The largest case's tokens (128 x 8,192): every case's cache is a prefix of one random cache.
const MAX_TOKENS: usize = 128 * 8192;

/// Median µs of `iters` event-timed calls of `f` after warm-up (one contender).
fn time_us(ctx: &Arc<Context>, stream: &Stream, iters: usize, mut f: impl FnMut()) -> f64 {
    gpu_times(stream, ctx, 1, iters, &mut [&mut f])[0]
}

/// One timed configuration.
struct Row {
    heads: usize,
    /// Query tokens per request (causal when more than one).
    s_q: usize,
    batch: usize,
    seq: usize,
    kind: KvFormatKind,
    splits: u32,
    /// µs per call replayed in a graph.
    us: f64,
    /// µs per call launched eagerly.
    eager_us: f64,
    bytes: f64,
}

impl Row {
    fn gbs(&self) -> f64 {
        self.bytes / self.us / 1e3
    }
    fn tflops(&self) -> f64 {
        (self.batch * self.seq * self.heads * self.s_q) as f64 * 2.0 * 1088.0 / self.us / 1e6
    }
    fn json(&self, copy_gbs: f64, extra: &str) -> String {
        format!(
            "{{\"heads\":{},\"s_q\":{},\"batch\":{},\"seq\":{},\"kv\":\"{}\",\"splits\":{},\"us\":{:.2},\"eager_us\":{:.2},\"gb_s\":{:.1},\"tflop_s\":{:.2},\"of_copy\":{:.3}{extra}}}",
            self.heads, self.s_q, self.batch, self.seq, self.kind, self.splits, self.us, self.eager_us, self.gbs(), self.tflops(), self.gbs() / copy_gbs
        )
    }
}

fn main() {
    let heads_only = heads_filter(); // a bad value stops the bench before anything runs
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mla bench: no GPU ({e})");
            std::process::exit(if std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1") { 1 } else { 0 });
        }
    };
    let mut stream = Stream::new(&ctx).unwrap();
    let info = ctx.device().info().unwrap();

    // Baseline: what HBM delivers to a plain copy here.
    let n = 1usize << 30;
    let (src, dst) = (DeviceBuffer::alloc_zeroed(&stream, n).unwrap(), DeviceBuffer::alloc(&ctx, n).unwrap());
    let copy_us = time_us(&ctx, &stream, 20, || dst.copy_from_device(&src, &stream).unwrap());
    let copy_gbs = 2.0 * n as f64 / copy_us / 1e3;
    drop((src, dst));

    let caches = Caches::new(&stream);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let wanted = |heads: usize| heads_only.as_ref().is_none_or(|h| h.contains(&heads));
    let mut run = |heads, s_q, batch, seq, kind| Case::new(&stream, &caches, heads, s_q, batch, seq, kind).time(&ctx, &mut stream, &mut ws);
    // GRAPHSAFE_MLA_BENCH=fp8 (or tokens) times that table alone (bf16 rows included), for quick A/B runs.
    let only = std::env::var("GRAPHSAFE_MLA_BENCH").ok();
    let fp8_only = only.as_deref() == Some("fp8");
    let tokens_only = only.as_deref() == Some("tokens");
    let skip_main = fp8_only || tokens_only;
    let mut main_rows = Vec::new();
    for &heads in if skip_main { &[][..] } else { &[16usize, 128][..] } {
        if !wanted(heads) {
            continue;
        }
        for &batch in &[64usize, 128] {
            for &seq in &[4096usize, 8192] {
                main_rows.push(run(heads, 1, batch, seq, KvFormatKind::Native));
            }
        }
    }
    let long_shapes: &[(usize, usize, usize)] = if skip_main { &[] } else { &[(128, 16, 16384), (128, 1, 65536), (16, 1, 65536)] };
    let long: Vec<Row> = long_shapes.iter().filter(|&&(h, _, _)| wanted(h)).map(|&(h, b, s)| run(h, 1, b, s, KvFormatKind::Native)).collect();
    let mut tokens = Vec::new();
    for &heads in if fp8_only { &[][..] } else { &[16usize, 32, 64, 128][..] } {
        if !wanted(heads) {
            continue;
        }
        for &(batch, seq) in &[(64usize, 4096usize), (128, 8192)] {
            tokens.push(run(heads, 2, batch, seq, KvFormatKind::Native));
        }
    }
    let mut fp8 = Vec::new();
    let fp8_shapes: &[(usize, usize, usize, usize)] = if tokens_only { &[] } else { &[(16, 1, 64, 4096), (16, 1, 128, 8192), (32, 1, 64, 4096), (64, 2, 64, 4096), (128, 1, 64, 4096), (128, 1, 128, 4096), (128, 1, 64, 8192), (128, 1, 128, 8192)] };
    for &(heads, s_q, batch, seq) in fp8_shapes.iter().filter(|&&(h, ..)| wanted(h)) {
        for kind in KvFormatKind::ALL {
            fp8.push(run(heads, s_q, batch, seq, kind));
        }
    }

    println!("MLA decode on {} ({} SMs), page {PAGE}, random inputs and page order; copy baseline {copy_gbs:.0} GB/s", info.name, info.sm_count);
    if let Some(h) = &heads_only {
        println!("only the cases of {h:?} heads (GRAPHSAFE_MLA_BENCH_HEADS)");
    }
    if let Some(n) = pages_modulo() {
        println!("DESIGN PROBE: page indices modulo {n} (GRAPHSAFE_MLA_BENCH_PAGES), the cache in L2: not a result to publish");
    }
    println!("us/call: {CALLS} calls in one graph, median of 30 replays; eager: the same calls launched one by one, median of 30 batches");
    let header = || println!("{:>6} {:>4} {:>6} {:>6} {:>12} {:>7} {:>9} {:>9} {:>9} {:>8} {:>9}", "heads", "s_q", "batch", "seq", "kv", "splits", "us/call", "eager us", "GB/s", "of copy", "TFLOP/s");
    let line = |r: &Row, extra: &str| {
        println!(
            "{:>6} {:>4} {:>6} {:>6} {:>12} {:>7} {:>9.1} {:>9.1} {:>9.0} {:>8.3} {:>9.1}{extra}",
            r.heads, r.s_q, r.batch, r.seq, r.kind.to_string(), r.splits, r.us, r.eager_us, r.gbs(), r.gbs() / copy_gbs, r.tflops()
        )
    };
    println!("\nbf16 cache");
    header();
    main_rows.iter().for_each(|r| line(r, ""));
    println!("\nLong requests, bf16 cache");
    header();
    long.iter().for_each(|r| line(r, ""));
    println!("\nTwo query tokens a request (causal), bf16 cache");
    header();
    tokens.iter().for_each(|r| line(r, ""));
    println!("\nfp8 caches against bf16 of the same shape (bf16/fp8 t = bf16 time / this time, > 1: faster)");
    println!("{:>6} {:>4} {:>6} {:>6} {:>12} {:>7} {:>9} {:>9} {:>9} {:>8} {:>9} {:>11}", "heads", "s_q", "batch", "seq", "kv", "splits", "us/call", "eager us", "GB/s", "of copy", "TFLOP/s", "bf16/fp8 t");
    let speedup = |r: &Row| fp8.iter().find(|b| (b.heads, b.s_q, b.batch, b.seq, b.kind) == (r.heads, r.s_q, r.batch, r.seq, KvFormatKind::Native)).map_or(f64::NAN, |b| b.us / r.us);
    fp8.iter().for_each(|r| line(r, &format!(" {:>11.2}", speedup(r))));

    let js = |rows: &[Row], with_speedup: bool| {
        rows.iter().map(|r| r.json(copy_gbs, &if with_speedup { format!(",\"speedup_vs_bf16\":{:.3}", speedup(r)) } else { String::new() })).collect::<Vec<_>>().join(",")
    };
    println!(
        "BENCH_JSON {{\"bench\":\"mla\",\"device\":\"{}\",\"timing\":\"graph\",{}\"copy_gb_s\":{copy_gbs:.1},\"rows\":[{}],\"long_rows\":[{}],\"token_rows\":[{}],\"fp8_rows\":[{}]}}",
        info.name,
        pages_modulo().map_or(String::new(), |n| format!("\"pages_modulo\":{n},")),
        js(&main_rows, false),
        js(&long, false),
        js(&tokens, false),
        js(&fp8, true)
    );
}


/// `GRAPHSAFE_MLA_BENCH_HEADS=a,b,..`: the head counts whose cases run (all when unset). A value
/// that is not a list of numbers stops the bench rather than timing every case unasked.
fn heads_filter() -> Option<Vec<usize>> {
    let v = std::env::var("GRAPHSAFE_MLA_BENCH_HEADS").ok()?;
    match v.split(',').map(|h| h.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>() {
        Ok(h) if !h.is_empty() => Some(h),
        _ => {
            eprintln!("GRAPHSAFE_MLA_BENCH_HEADS={v:?}: expected head counts separated by commas, e.g. 128 or 16,32");
            std::process::exit(2)
        }
    }
}

/// `GRAPHSAFE_MLA_BENCH_PAGES=n` (n > 0): every case's page indices are taken modulo n (a design
/// probe; the module docs say why).
fn pages_modulo() -> Option<i32> {
    std::env::var("GRAPHSAFE_MLA_BENCH_PAGES").ok().and_then(|v| v.parse::<i32>().ok()).filter(|&n| n > 0)
}

/// Random bf16 bits, about N(0, 0.1²) (a sum of four uniforms), clamped to [-1, 1] like the
/// anchor's `randn / 10`.
fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    random_u64s(n, seed)
        .map(|w| {
            let u = |i: u32| ((w >> (16 * i)) & 0xffff) as f32 / 65536.0 - 0.5;
            let x = (u(0) + u(1) + u(2) + u(3)) * (0.1 / (4.0f32 / 12.0).sqrt());
            half::bf16::from_f32(x.clamp(-1.0, 1.0)).to_bits()
        })
        .collect()
}

/// Random e4m3 codes of magnitude below 2 (bit 6, the exponent's top bit, cleared: never a NaN).
fn random_e4m3(n: usize, seed: u64) -> Vec<u8> {
    random_bytes(n, seed).into_iter().map(|b| b & 0xbf).collect()
}

/// One random cache per format, [`MAX_TOKENS`] tokens each; a case uses the first pages.
struct Caches {
    native: DeviceBuffer,
    per_tensor: DeviceBuffer,
    ds_mla: DeviceBuffer,
    /// The per-tensor format's scale (f32 [1]).
    scale: DeviceBuffer,
}

impl Caches {
    fn new(stream: &Stream) -> Caches {
        let native = DeviceBuffer::from_host(stream, &random_bf16(MAX_TOKENS * 576, 1)).unwrap();
        let per_tensor = DeviceBuffer::from_host(stream, &random_e4m3(MAX_TOKENS * 576, 2)).unwrap();
        // 656-byte tokens: 512 e4m3 latent values, 4 f32 scales (0.05..0.15), 64 bf16 rope values.
        let latent = random_e4m3(MAX_TOKENS * 512, 3);
        let rope = random_bf16(MAX_TOKENS * 64, 4);
        let scales: Vec<u64> = random_u64s(MAX_TOKENS, 5).collect();
        let mut ds = vec![0u8; MAX_TOKENS * 656];
        for (t, tok) in ds.chunks_exact_mut(656).enumerate() {
            tok[..512].copy_from_slice(&latent[t * 512..][..512]);
            for g in 0..4 {
                let s = 0.05 + 0.1 * ((scales[t] >> (16 * g)) & 0xffff) as f32 / 65536.0;
                tok[512 + 4 * g..][..4].copy_from_slice(&s.to_le_bytes());
            }
            for (d, r) in rope[t * 64..][..64].iter().enumerate() {
                tok[528 + 2 * d..][..2].copy_from_slice(&r.to_le_bytes());
            }
        }
        let ds_mla = DeviceBuffer::from_host(stream, &ds).unwrap();
        let scale = DeviceBuffer::from_host(stream, &[0.1f32]).unwrap();
        Caches { native, per_tensor, ds_mla, scale }
    }

    fn of(&self, kind: KvFormatKind) -> &DeviceBuffer {
        match kind {
            KvFormatKind::Native => &self.native,
            KvFormatKind::Fp8PerTensor => &self.per_tensor,
            KvFormatKind::Fp8DsMla => &self.ds_mla,
        }
    }
}

/// One decode shape: random q (nope and rope of a head side by side), out, lse, every request at
/// the full length, its pages a random permutation of the cache's first `batch * seq / PAGE`.
struct Case<'c> {
    heads: usize,
    s_q: usize,
    batch: usize,
    seq: usize,
    kind: KvFormatKind,
    caches: &'c Caches,
    q: DeviceBuffer,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    seq_lens: DeviceBuffer,
    page_table: DeviceBuffer,
}

impl<'c> Case<'c> {
    fn new(stream: &Stream, caches: &'c Caches, heads: usize, s_q: usize, batch: usize, seq: usize, kind: KvFormatKind) -> Case<'c> {
        let pages = batch * seq / PAGE;
        assert!(batch * seq <= MAX_TOKENS);
        // Fisher-Yates over the pages.
        let mut pt: Vec<i32> = (0..pages as i32).collect();
        for (i, r) in (1..pages).rev().zip(random_u64s(pages, (heads * 1_000_003 + batch * 1009 + seq) as u64)) {
            pt.swap(i, (r % (i as u64 + 1)) as usize);
        }
        if let Some(n) = pages_modulo() {
            pt.iter_mut().for_each(|p| *p %= n);
        }
        let rows = batch * s_q * heads;
        Case {
            heads,
            s_q,
            batch,
            seq,
            kind,
            caches,
            q: DeviceBuffer::from_host(stream, &random_bf16(rows * 576, 7 + seq as u64)).unwrap(),
            out: DeviceBuffer::alloc_zeroed(stream, rows * 512 * 2).unwrap(),
            lse: DeviceBuffer::alloc_zeroed(stream, rows * 4).unwrap(),
            seq_lens: DeviceBuffer::from_host(stream, &vec![seq as i32; batch]).unwrap(),
            page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
        }
    }

    /// The decode's arguments over memory `m` gives for each of this case's buffers (the buffers
    /// themselves for an eager call, their capture bindings for a captured one).
    fn args<'a, M: DeviceMemory + Clone>(&'a self, mut m: impl FnMut(&'a DeviceBuffer) -> M) -> MlaDecodeArgs<M> {
        let (batch, s_q, heads, pages_per) = (self.batch, self.s_q, self.heads, self.seq / PAGE);
        let pages = batch * pages_per;
        let (kv_dt, kv_row) = self.kind.cache_element(DType::Bf16);
        let kv_format = match self.kind {
            KvFormatKind::Native => KvFormat::Native,
            KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(m(&self.caches.scale), DType::F32, &[1]) },
            KvFormatKind::Fp8DsMla => KvFormat::Fp8DsMla,
        };
        let q = m(&self.q);
        let q_strides = [s_q * heads * 576, heads * 576, 576, 1];
        MlaDecodeArgs::new(
            Tensor::strided(q.clone(), 0, DType::Bf16, &[batch, s_q, heads, 512], &q_strides),
            Tensor::strided(q, 1024, DType::Bf16, &[batch, s_q, heads, 64], &q_strides),
            Tensor::contiguous(m(self.caches.of(self.kind)), kv_dt, &[pages, PAGE, kv_row]),
            Tensor::contiguous(m(&self.seq_lens), DType::I32, &[batch]),
            Tensor::contiguous(m(&self.page_table), DType::I32, &[batch, pages_per]),
            Tensor::contiguous(m(&self.out), DType::Bf16, &[batch, s_q, heads, 512]),
        )
        .with_kv_format(kv_format)
        .with_lse(Tensor::contiguous(m(&self.lse), DType::F32, &[batch, heads, s_q]))
        .with_causal(s_q > 1)
        .with_sm_scale(1.0 / 576f32.sqrt())
        .with_max_seq_len(self.seq as u32)
    }

    /// KV + Q + O bytes of one call.
    fn bytes(&self) -> f64 {
        (self.batch * self.seq * self.kind.token_bytes(DType::Bf16) + self.batch * self.s_q * self.heads * (576 + 512) * 2) as f64
    }

    /// Times the case captured and eagerly; the first (untimed) eager call grows the workspace.
    fn time(&self, ctx: &Arc<Context>, stream: &mut Stream, ws: &mut Workspace) -> Row {
        let eager = self.args(|b| b);
        let plan = plan_or_exit(&eager, ws, stream);
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(ws).unwrap();
            let ca = self.args(|b| cap.bind_buffer(b).unwrap());
            for _ in 0..CALLS {
                assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
            }
            drop(ca);
            cap.end().unwrap().instantiate().unwrap()
        };
        let us = time_us(ctx, stream, 30, || exec.launch(stream).unwrap()) / CALLS as f64;
        drop(exec);
        let eager_us = time_us(ctx, stream, 30, || {
            for _ in 0..CALLS {
                decode(&eager, ws, stream).unwrap();
            }
        }) / CALLS as f64;
        Row { heads: self.heads, s_q: self.s_q, batch: self.batch, seq: self.seq, kind: self.kind, splits: plan.num_splits, us, eager_us, bytes: self.bytes() }
    }
}

/// The first (untimed) call, which also grows the workspace; its plan, or the bench exits.
fn plan_or_exit(args: &MlaDecodeArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> MlaDecodePlan {
    decode(args, ws, stream).unwrap_or_else(|e| {
        eprintln!("mla bench: {e}");
        std::process::exit(1);
    })
}

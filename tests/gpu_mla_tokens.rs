//! MLA decode with `s_q` query tokens per request (MTP / speculative decode, causal or not) and any
//! head count, on the sm90 kernels: numerics against the f64 CPU reference (small shapes) and the
//! GPU reference run per token (large shapes), for bf16, fp16 and both fp8 caches; query rows that
//! attend no key give exact zeros and +inf; NaN in the cache slots past a request's length and
//! garbage page indices past its last page are never read (FlashMLA's test data); a captured
//! `s_q = 2` decode replays 1,000 times bit-identical to eager after its workspace grew and memory
//! was churned. Skips without a Hopper GPU (fails under GRAPHSAFE_REQUIRE_GPU=1 without any GPU).

mod common;
#[path = "gpu_mla_tokens/numerics.rs"]
mod numerics;
#[path = "gpu_mla_tokens/replay_and_schedule.rs"]
mod replay_and_schedule;

use common::mla::{hopper_gpu, lcg};
use common::{churn, random_f32};
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::reference::{cpu_decode, dequantize_ds_mla, dequantize_ds_mla_fp16_rounded, dequantize_fp8_per_tensor, GpuProblem, GpuReference, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, KvFormat, KvFormatKind, MlaDecodeArgs, DS_MLA_TOKEN_BYTES};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::{bf16, f16};

/// What a shape's cache holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cache {
    Native(DType),
    Fp8(KvFormatKind),
}

#[derive(Clone, Debug)]
struct Shape {
    cache: Cache,
    heads: usize,
    s_q: usize,
    causal: bool,
    page: usize,
    seq_lens: Vec<i32>,
    splits: Option<u32>,
    seed: u64,
}

impl Shape {
    fn q_dtype(&self) -> DType {
        match self.cache {
            Cache::Native(d) => d,
            Cache::Fp8(_) => DType::Bf16,
        }
    }
}

type Problem = common::mla::Problem<Shape>;

/// Where these decodes run.
const SM90: &str = "these decodes run on graphsafe's sm90 MLA kernel";

/// Rounds to the dtype: (device bits, the rounded values).
fn quantize(v: &[f32], dtype: DType) -> (Vec<u16>, Vec<f32>) {
    match dtype {
        DType::Fp16 => v.iter().map(|&x| { let h = f16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
        _ => v.iter().map(|&x| { let h = bf16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
    }
}

fn to_f32(bits: &[u16], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::Fp16 => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

/// FlashMLA's test data: each request's pages a random permutation, its last page's slots past
/// the length NaN (every other unused page too), and every page-table entry past its last page
/// 2,147,480,000.
fn build(stream: &Stream, s: &Shape) -> Problem {
    let batch = s.seq_lens.len();
    let max_seq = (*s.seq_lens.iter().max().unwrap()).max(1) as usize;
    let max_pages = max_seq.div_ceil(s.page) + 1;
    let used: usize = s.seq_lens.iter().map(|&l| (l.max(0) as usize).div_ceil(s.page)).sum();
    let pages = used + 2;
    let mut perm: Vec<i32> = (0..pages as i32).collect();
    let mut st = s.seed | 1;
    for i in (1..perm.len()).rev() {
        perm.swap(i, lcg(&mut st) as usize % (i + 1));
    }
    let mut pt = vec![2_147_480_000i32; batch * max_pages];
    let mut valid = vec![false; pages * s.page]; // token slots some request reads
    let mut next = 0;
    for b in 0..batch {
        let len = s.seq_lens[b].max(0) as usize;
        for p in 0..len.div_ceil(s.page) {
            pt[b * max_pages + p] = perm[next];
            for t in p * s.page..((p + 1) * s.page).min(len) {
                valid[perm[next] as usize * s.page + t % s.page] = true;
            }
            next += 1;
        }
    }
    let (h, sq) = (s.heads, s.s_q);
    let qd = s.q_dtype();
    let (qn_bits, qn) = quantize(&random_f32(batch * sq * h * 512, s.seed + 1), qd);
    let (qp_bits, qp) = quantize(&random_f32(batch * sq * h * 64, s.seed + 2), qd);
    let tokens = pages * s.page;
    let (kv_bytes, mut kv): (Vec<u8>, Vec<f32>) = match s.cache {
        Cache::Native(d) => {
            let (mut bits, vals) = quantize(&random_f32(tokens * 576, s.seed + 3), d);
            let nan = if d == DType::Fp16 { 0x7E00 } else { 0x7FC0 };
            for (t, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
                bits[t * 576..(t + 1) * 576].fill(nan);
            }
            (bits.iter().flat_map(|b| b.to_le_bytes()).collect(), vals)
        }
        Cache::Fp8(KvFormatKind::Fp8PerTensor) => {
            let mut st = s.seed + 3;
            let mut c: Vec<u8> = (0..tokens * 576).map(|_| (lcg(&mut st) & 0xFF) as u8).map(|c| if c & 0x7F == 0x7F { c ^ 1 } else { c }).collect();
            // e4m3's NaN code where nothing may be read (the kernel reads the code as finite, so
            // an unread slot must also be unused: the result would differ from the reference).
            for (t, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
                c[t * 576..(t + 1) * 576].fill(0x7F);
            }
            let kv = dequantize_fp8_per_tensor(&c, 0.75);
            (c, kv)
        }
        Cache::Fp8(_) => {
            let mut st = s.seed + 3;
            let rope = random_f32(tokens * 64, s.seed + 4);
            let mut bytes = Vec::with_capacity(tokens * DS_MLA_TOKEN_BYTES);
            for (t, &ok) in valid.iter().enumerate() {
                for _ in 0..512 {
                    let c = (lcg(&mut st) & 0xFF) as u8;
                    bytes.push(if c & 0x7F == 0x7F { c ^ 1 } else { c });
                }
                for _ in 0..4 {
                    let sc = if ok { 0.01 + (lcg(&mut st) % 1024) as f32 / 8192.0 } else { f32::NAN };
                    bytes.extend_from_slice(&sc.to_le_bytes());
                }
                for r in 0..64 {
                    let v = if ok { bf16::from_f32(rope[t * 64 + r]) } else { bf16::NAN };
                    bytes.extend_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            // Up to 32 rows the kernel computes with fp16-rounded keys (the reference's documentation).
            let kv = if s.s_q * s.heads <= 32 { dequantize_ds_mla_fp16_rounded(&bytes) } else { dequantize_ds_mla(&bytes) }.unwrap();
            (bytes, kv)
        }
    };
    for (t, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
        kv[t * 576..(t + 1) * 576].fill(f32::NAN);
    }
    Problem {
        shape: s.clone(),
        batch,
        max_seq,
        max_pages,
        pages,
        q_nope: DeviceBuffer::from_host(stream, &qn_bits).unwrap(),
        q_pe: DeviceBuffer::from_host(stream, &qp_bits).unwrap(),
        kv: DeviceBuffer::from_host(stream, &kv_bytes).unwrap(),
        scale: DeviceBuffer::from_host(stream, &[0.75f32]).unwrap(),
        seq_lens: DeviceBuffer::from_host(stream, &s.seq_lens).unwrap(),
        page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
        out: DeviceBuffer::alloc_zeroed(stream, batch * sq * h * 512 * 2).unwrap(),
        lse: DeviceBuffer::alloc_zeroed(stream, batch * h * sq * 4).unwrap(),
        host: (qn, qp, kv, pt),
        sm_scale: 1.0 / (576f32).sqrt(),
    }
}

fn args(p: &Problem) -> MlaDecodeArgs<&DeviceBuffer> {
    let s = &p.shape;
    let (b, sq, h) = (p.batch, s.s_q, s.heads);
    let dt = if s.q_dtype() == DType::Fp16 { DType::Fp16 } else { DType::Bf16 };
    let (cache, format) = match s.cache {
        Cache::Native(_) => (Tensor::contiguous(&p.kv, dt, &[p.pages, s.page, 576]), KvFormat::Native),
        Cache::Fp8(KvFormatKind::Fp8PerTensor) => {
            (Tensor::contiguous(&p.kv, DType::Fp8E4m3, &[p.pages, s.page, 576]), KvFormat::Fp8PerTensor { scale: Tensor::contiguous(&p.scale, DType::F32, &[1]) })
        }
        Cache::Fp8(_) => (Tensor::contiguous(&p.kv, DType::U8, &[p.pages, s.page, DS_MLA_TOKEN_BYTES]), KvFormat::Fp8DsMla),
    };
    MlaDecodeArgs::new(
        Tensor::contiguous(&p.q_nope, dt, &[b, sq, h, 512]),
        Tensor::contiguous(&p.q_pe, dt, &[b, sq, h, 64]),
        cache,
        Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        Tensor::contiguous(&p.page_table, DType::I32, &[b, p.max_pages]),
        Tensor::contiguous(&p.out, dt, &[b, sq, h, 512]),
    )
    .with_kv_format(format)
    .with_lse(Tensor::contiguous(&p.lse, DType::F32, &[b, h, sq]))
    .with_causal(s.causal)
    .with_sm_scale(p.sm_scale)
    .with_max_seq_len(p.max_seq as u32)
    .with_num_splits(s.splits)
}

/// Keys query token `t` of a request of length `len` attends.
fn keys(s: &Shape, len: i32, t: usize) -> i64 {
    let len = len.max(0) as i64;
    if s.causal {
        len - (s.s_q - 1 - t) as i64
    } else {
        len
    }
}

/// The GPU reference (one query token of `heads` heads per request) run on the problem expanded
/// to batch x s_q requests, token t of request b reading b's page-table row with its own length:
/// out [B, s_q, H, 512], lse [B, H, s_q].
fn gpu_reference(stream: &Stream, reference: &GpuReference, p: &Problem) -> (Vec<f32>, Vec<f32>) {
    let s = &p.shape;
    let (b, sq, h) = (p.batch, s.s_q, s.heads);
    let lens: Vec<i32> = (0..b * sq).map(|j| keys(s, s.seq_lens[j / sq], j % sq).max(0) as i32).collect();
    let table: Vec<i32> = (0..b * sq).flat_map(|j| p.host.3[(j / sq) * p.max_pages..(j / sq + 1) * p.max_pages].to_vec()).collect();
    let (lens_d, table_d) = (DeviceBuffer::from_host(stream, &lens).unwrap(), DeviceBuffer::from_host(stream, &table).unwrap());
    let gp = GpuProblem {
        dtype: s.q_dtype(),
        q_nope: &p.q_nope, // [B, s_q, H, 512] contiguous is [B x s_q, H, 512]
        q_pe: &p.q_pe,
        kv: &p.kv,
        seq_lens: &lens_d,
        page_table: &table_d,
        page_table_stride: p.max_pages,
        page_size: s.page,
        batch: b * sq,
        num_heads: h,
        max_seq_len: p.max_seq,
        sm_scale: p.sm_scale,
    };
    let (out, lse_bt) = reference.run(&gp, stream).unwrap();
    // lse [B x s_q, H] -> [B, H, s_q]
    let lse = (0..b * h * sq).map(|i| lse_bt[((i / (h * sq)) * sq + i % sq) * h + (i / sq) % h]).collect();
    (out, lse)
}

/// Compares a decode's (out, lse) with a reference's: query rows that attend no key must be exact
/// zeros and +inf; the others within the tolerances (output relative to the largest reference
/// magnitude, lse absolute, or relative beyond |lse| = 100).
fn check(s: &Shape, out: &[f32], lse: &[f32], r_out: &[f32], r_lse: &[f32], tol_out: f64) -> (f64, f64) {
    let (sq, h) = (s.s_q, s.heads);
    let scale = r_out.iter().filter(|v| v.is_finite()).fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-6);
    let (mut eo, mut el) = (0f64, 0f64);
    for (b, &len) in s.seq_lens.iter().enumerate() {
        for t in 0..sq {
            for hh in 0..h {
                let row = ((b * sq + t) * h + hh) * 512;
                let li = (b * h + hh) * sq + t;
                if keys(s, len, t) <= 0 {
                    assert!(out[row..row + 512].iter().all(|&v| v == 0.0), "{s:?}: request {b} token {t} head {hh} attends no key: zeros");
                    assert_eq!(lse[li], f32::INFINITY, "{s:?}: request {b} token {t} head {hh} attends no key: +inf");
                    assert_eq!(r_lse[li], f32::INFINITY, "the reference agrees");
                    continue;
                }
                for d in 0..512 {
                    let (a, r) = (out[row + d] as f64, r_out[row + d] as f64);
                    assert!(a.is_finite(), "{s:?}: request {b} token {t} head {hh} dim {d}: {a} (a NaN slot was read)");
                    eo = eo.max((a - r).abs() / scale);
                }
                el = el.max((lse[li] as f64 - r_lse[li] as f64).abs() / (r_lse[li].abs() as f64 / 100.0).max(1.0));
            }
        }
    }
    assert!(eo <= tol_out, "{s:?}: output error {eo:.3e}");
    assert!(el <= 1e-3, "{s:?}: lse error {el:.3e}");
    (eo, el)
}

fn run(stream: &Stream, ws: &mut Workspace, p: &Problem) -> (Vec<f32>, Vec<f32>, u32) {
    let plan = decode(&args(p), ws, stream).unwrap();
    assert_eq!((plan.s_q as usize, plan.num_heads as usize), (p.shape.s_q, p.shape.heads));
    let out = to_f32(&p.out.to_host_vec::<u16>(stream).unwrap(), p.shape.q_dtype());
    (out, p.lse.to_host_vec::<f32>(stream).unwrap(), plan.num_splits)
}

//! MLA decode over fp8 KV caches on the sm90 kernels (16 and 32 heads: the N8 kernel for both
//! formats; 48..128 heads: the per-tensor format the seesaw RS kernel, the 656-byte one the seesaw
//! kernel, its producer converting into the stages, its paired row groups as 2-CTA clusters):
//! numerics against the f64
//! CPU reference of the dequantised cache over 46 shapes, every e4m3 code dequantised exactly,
//! captured replay bit-identical to eager (and reading the per-tensor scale at replay), and a
//! capture with too small a workspace refused with nothing captured. Skips without a Hopper GPU
//! (fails instead under GRAPHSAFE_REQUIRE_GPU=1 when there is no GPU at all).

mod common;
#[path = "gpu_mla_fp8/numerics.rs"]
mod numerics;
#[path = "gpu_mla_fp8/device_data.rs"]
mod device_data;

use common::mla::{hopper_gpu, lcg};
use common::random_f32;
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::{CaptureMode, CapturedBuffer};
use graphsafe::ops::mla::reference::{cpu_decode, dequantize_ds_mla, dequantize_ds_mla_fp16_rounded, dequantize_fp8_per_tensor, e4m3_value, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, KvFormat, KvFormatKind, MlaDecodeArgs, DS_MLA_TOKEN_BYTES};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::bf16;

#[derive(Clone, Debug)]
struct Shape {
    kind: KvFormatKind,
    heads: usize,
    page: usize,
    seq_lens: Vec<i32>,
    splits: Option<u32>,
    /// Per-tensor: the scale. 656-byte format: the largest group scale (each is drawn in
    /// [scale / 16, scale]).
    scale: f32,
    seed: u64,
}

type Problem = common::mla::Problem<Shape>;

/// Where these decodes run.
const SM90: &str = "the fp8 KV caches run on the sm90 MLA kernel";

/// Random e4m3 codes, never e4m3's NaN (0x7F, 0xFF): caches written by saturating conversions hold
/// none, and the kernel reads them as a finite value.
fn codes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n).map(|_| (lcg(&mut s) & 0xFF) as u8).map(|c| if c & 0x7F == 0x7F { c ^ 1 } else { c }).collect()
}

fn build(stream: &Stream, s: &Shape) -> Problem {
    let batch = s.seq_lens.len();
    let max_seq = *s.seq_lens.iter().max().unwrap() as usize;
    let max_pages = max_seq.div_ceil(s.page) + 1;
    let used: usize = s.seq_lens.iter().map(|&l| (l.max(0) as usize).div_ceil(s.page)).sum();
    let pages = used + 2;
    let mut perm: Vec<i32> = (0..pages as i32).collect();
    let mut st = s.seed | 1;
    for i in (1..perm.len()).rev() {
        perm.swap(i, lcg(&mut st) as usize % (i + 1));
    }
    let mut pt = vec![perm[pages - 1]; batch * max_pages];
    let mut next = 0;
    for b in 0..batch {
        for p in 0..(s.seq_lens[b].max(0) as usize).div_ceil(s.page) {
            pt[b * max_pages + p] = perm[next];
            next += 1;
        }
    }
    let h = s.heads;
    let q = |n, seed| -> (Vec<u16>, Vec<f32>) { random_f32(n, seed).into_iter().map(bf16::from_f32).map(|v| (v.to_bits(), v.to_f32())).unzip() };
    let (qn_bits, qn) = q(batch * h * 512, s.seed + 1);
    let (qp_bits, qp) = q(batch * h * 64, s.seed + 2);
    let tokens = pages * s.page;
    let (kv_bytes, kv) = match s.kind {
        KvFormatKind::Fp8PerTensor => {
            let c = codes(tokens * 576, s.seed + 3);
            let kv = dequantize_fp8_per_tensor(&c, s.scale);
            (c, kv)
        }
        KvFormatKind::Fp8DsMla => {
            let c = codes(tokens * 512, s.seed + 3);
            let rope = random_f32(tokens * 64, s.seed + 4);
            let mut st = s.seed + 5;
            let mut bytes = Vec::with_capacity(tokens * DS_MLA_TOKEN_BYTES);
            for t in 0..tokens {
                bytes.extend_from_slice(&c[t * 512..(t + 1) * 512]);
                for _ in 0..4 {
                    let u = (lcg(&mut st) % 1024) as f32 / 1024.0;
                    bytes.extend_from_slice(&(s.scale * (1.0 / 16.0 + u * 15.0 / 16.0)).to_le_bytes());
                }
                for r in 0..64 {
                    bytes.extend_from_slice(&bf16::from_f32(rope[t * 64 + r]).to_bits().to_le_bytes());
                }
            }
            let kv = ds_mla_reference_keys(s.heads, &bytes);
            (bytes, kv)
        }
        KvFormatKind::Native => unreachable!("fp8 tests"),
    };
    Problem {
        shape: s.clone(),
        batch,
        max_seq,
        max_pages,
        pages,
        q_nope: DeviceBuffer::from_host(stream, &qn_bits).unwrap(),
        q_pe: DeviceBuffer::from_host(stream, &qp_bits).unwrap(),
        kv: DeviceBuffer::from_host(stream, &kv_bytes).unwrap(),
        scale: DeviceBuffer::from_host(stream, &[s.scale]).unwrap(),
        seq_lens: DeviceBuffer::from_host(stream, &s.seq_lens).unwrap(),
        page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
        out: DeviceBuffer::alloc_zeroed(stream, batch * h * 512 * 2).unwrap(),
        lse: DeviceBuffer::alloc_zeroed(stream, batch * h * 4).unwrap(),
        host: (qn, qp, kv, pt),
        sm_scale: 1.0 / (576f32).sqrt(),
    }
}

fn args(p: &Problem) -> MlaDecodeArgs<&DeviceBuffer> {
    let (b, h) = (p.batch, p.shape.heads);
    let (kv_dt, kv_row) = p.shape.kind.cache_element(DType::Bf16);
    let kv_cache = Tensor::contiguous(&p.kv, kv_dt, &[p.pages, p.shape.page, kv_row]);
    let kv_format = match p.shape.kind {
        KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(&p.scale, DType::F32, &[1]) },
        _ => KvFormat::Fp8DsMla,
    };
    MlaDecodeArgs::new(
        Tensor::contiguous(&p.q_nope, DType::Bf16, &[b, h, 512]),
        Tensor::contiguous(&p.q_pe, DType::Bf16, &[b, h, 64]),
        kv_cache,
        Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        Tensor::contiguous(&p.page_table, DType::I32, &[b, p.max_pages]),
        Tensor::contiguous(&p.out, DType::Bf16, &[b, h, 512]),
    )
    .with_kv_format(kv_format)
    .with_lse(Tensor::contiguous(&p.lse, DType::F32, &[b, h]))
    .with_sm_scale(p.sm_scale)
    .with_max_seq_len(p.max_seq as u32)
    .with_num_splits(p.shape.splits)
}

/// The same arguments over buffers bound to `cap` (the graph keeps them alive, the scale too).
fn captured_args<'c>(cap: &mut graphsafe::graph::Capture<'_, 'c>, a: &MlaDecodeArgs<&DeviceBuffer>) -> MlaDecodeArgs<CapturedBuffer<'c>> {
    a.bind(cap).unwrap()
}

fn bf16_out(p: &Problem, stream: &Stream) -> Vec<f32> {
    p.out.to_host_vec::<u16>(stream).unwrap().into_iter().map(|b| bf16::from_bits(b).to_f32()).collect()
}

/// The keys the kernel computes with for a 656-byte cache: up to 32 rows fp16-rounded (the
/// reference's documentation), else bf16(scale · e4m3).
fn ds_mla_reference_keys(heads: usize, bytes: &[u8]) -> Vec<f32> {
    if heads <= 32 { dequantize_ds_mla_fp16_rounded(bytes) } else { dequantize_ds_mla(bytes) }.unwrap()
}

/// Replaces a 656-byte problem's cache with `bytes` (whole tokens, edited on the host) on the
/// device and in the host reference.
fn replace_ds_mla_cache(p: &mut Problem, stream: &Stream, bytes: &[u8]) {
    p.kv = DeviceBuffer::from_host(stream, bytes).unwrap();
    p.host.2 = ds_mla_reference_keys(p.shape.heads, bytes);
}

/// Errors of a one-token decode's `out` and `lse` against the f64 CPU reference over `p.host`:
/// the output's largest error relative to the largest reference value of the whole batch, or of
/// each request (`per_request`); the LSE's absolute error, relative beyond |lse| = 100 (f32 sums of
/// 576 products of that size). A request the reference finds empty must have LSE +inf.
fn reference_errors(p: &Problem, out: &[f32], lse: &[f32], per_request: bool) -> (f64, f64) {
    let s = &p.shape;
    let (qn, qp, kv, pt) = &p.host;
    let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: s.heads, s_q: 1, causal: false, sm_scale: p.sm_scale };
    let (r_out, r_lse) = cpu_decode(&hp).unwrap();
    let chunk = if per_request { s.heads * 512 } else { r_out.len() };
    let eo = out.chunks(chunk).zip(r_out.chunks(chunk)).fold(0f64, |worst, (o, r)| {
        let top = r.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
        worst.max(o.iter().zip(r).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs())) / top)
    });
    let mut el = 0f64;
    for (&a, &r) in lse.iter().zip(&r_lse) {
        if r == f32::INFINITY {
            assert_eq!(a, f32::INFINITY, "{s:?}: an empty request's lse");
        } else {
            el = el.max((a as f64 - r as f64).abs() / (r.abs() as f64 / 100.0).max(1.0));
        }
    }
    (eo, el)
}

/// Rewrites, on the device, token 0 of the first page of each request in `requests`: `edit` gets
/// that token's bytes (576 for the per-tensor format, 656 for DeepSeek's).
fn edit_first_token(p: &mut Problem, stream: &Stream, requests: &[usize], edit: impl Fn(&mut [u8])) {
    let token = p.shape.kind.token_bytes(DType::Bf16);
    let mut bytes = p.kv.to_host_vec::<u8>(stream).unwrap();
    for &b in requests {
        let row = p.host.3[b * p.max_pages] as usize * p.shape.page;
        edit(&mut bytes[row * token..(row + 1) * token]);
    }
    p.kv = DeviceBuffer::from_host(stream, &bytes).unwrap();
}

/// The four f32 group scales of a 656-byte token.
fn set_group_scales(t: &mut [u8], scales: [f32; 4]) {
    for (g, v) in scales.iter().enumerate() {
        t[512 + 4 * g..516 + 4 * g].copy_from_slice(&v.to_le_bytes());
    }
}

fn shapes() -> Vec<Shape> {
    use KvFormatKind::{Fp8DsMla as Ds, Fp8PerTensor as Pt};
    let s = |kind, heads, page, seq_lens: Vec<i32>, splits, scale, seed| Shape { kind, heads, page, seq_lens, splits, scale, seed };
    let mut v = Vec::new();
    for (i, kind) in [Pt, Ds].into_iter().enumerate() {
        let k = 100 * i as u64;
        v.extend([
            s(kind, 16, 64, vec![1], None, 1.0 / 64.0, k + 1),
            s(kind, 32, 128, vec![1, 2, 3], None, 1.0 / 64.0, k + 2),
            s(kind, 16, 64, vec![63, 64, 65], None, 1.0 / 32.0, k + 3),
            s(kind, 32, 64, vec![127, 128, 129], Some(2), 1.0 / 32.0, k + 4),
            s(kind, 16, 128, vec![4096], None, 1.0 / 64.0, k + 5),
            s(kind, 32, 64, vec![4096; 4], None, 1.0 / 64.0, k + 6),
            s(kind, 16, 64, vec![700, 1, 0, 2048, 33, -5], None, 1.0 / 64.0, k + 7),
            s(kind, 32, 128, vec![1000, 999, 998], Some(1), 1.0 / 64.0, k + 8),
            s(kind, 16, 64, vec![16_384], Some(64), 1.0 / 64.0, k + 9),
            // Logits of tens (a peaked softmax) and a tiny scale (values near 2^-15).
            s(kind, 16, 64, vec![640; 3], None, 0.25, k + 10),
            s(kind, 32, 128, vec![300, 5000], Some(7), 1.0 / 4096.0, k + 11),
            s(kind, 16, 64, (1..=12).map(|i| i * 97).collect(), None, 1.0 / 64.0, k + 12),
            // A negative scale: the softmax's maximum must be taken of the scaled scores.
            s(kind, 32, 64, vec![500, 77], None, -1.0 / 32.0, k + 13),
            // 48..128 heads: the seesaw kernels (64-head groups; 48 and 96 leave a group part-empty).
            s(kind, 64, 64, vec![1], None, 1.0 / 64.0, k + 21),
            s(kind, 128, 128, vec![63, 64, 65], None, 1.0 / 32.0, k + 22),
            s(kind, 48, 64, vec![700, 0, 129], None, 1.0 / 64.0, k + 23),
            s(kind, 128, 64, vec![4096, 1000], Some(3), 1.0 / 64.0, k + 24),
            s(kind, 96, 128, vec![300, 5000], Some(7), 1.0 / 4096.0, k + 25),
            s(kind, 128, 64, vec![640; 2], None, 0.25, k + 26),
            s(kind, 64, 64, vec![500, 77], None, -1.0 / 32.0, k + 27),
            // One request in many splits (no work schedule): 4 tiles a split.
            s(kind, 128, 64, vec![16_384], Some(64), 1.0 / 64.0, k + 28),
            // 128 heads (the 656-byte format as CTA pairs sharing each tile's conversion): empty
            // and one-token requests (both CTAs of a pair must agree on them and leave together),
            // and an odd tile count in a split of a batch.
            s(kind, 128, 64, vec![0, 700, 1, -5], None, 1.0 / 64.0, k + 29),
            s(kind, 128, 128, vec![1, 0, 1300], Some(2), 1.0 / 64.0, k + 30),
        ]);
    }
    v
}

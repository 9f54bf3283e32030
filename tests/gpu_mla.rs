//! MLA decode on the GPU: numerics against the references over 30+ shapes, captured replay equal
//! to eager, and the sm100 tests (which skip on Hopper, naming the arch).

mod common;
#[path = "gpu_mla/numerics.rs"]
mod numerics;
#[path = "gpu_mla/device_data.rs"]
mod device_data;

use common::{gpu, random_f32};
use graphsafe::arch::{Backend, MlaArch};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::{Capture, CaptureMode, CapturedBuffer};
use graphsafe::ops::mla::reference::{cpu_decode, GpuProblem, GpuReference, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::{bf16, f16};
use std::sync::Arc;

#[derive(Clone, Debug)]
struct Shape {
    dtype: DType,
    heads: usize,
    page: usize,
    seq_lens: Vec<i32>,
    splits: Option<u32>,
    seed: u64,
}

/// Rounds to the dtype and returns (device bytes as u16, the rounded values as f32).
fn quantize(v: &[f32], dtype: DType) -> (Vec<u16>, Vec<f32>) {
    match dtype {
        DType::Bf16 => v.iter().map(|&x| { let h = bf16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
        DType::Fp16 => v.iter().map(|&x| { let h = f16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
        other => unreachable!("sm90 tests use bf16/fp16, not {other}"),
    }
}

fn to_f32(bits: &[u16], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::Fp16 => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
        _ => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
    }
}

type HostCopy = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<i32>);

struct Problem {
    shape: Shape,
    batch: usize,
    max_seq: usize,
    max_pages: usize,
    pages: usize,
    q_nope: DeviceBuffer,
    q_pe: DeviceBuffer,
    kv: DeviceBuffer,
    seq_lens: DeviceBuffer,
    page_table: DeviceBuffer,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    host: Option<HostCopy>, // q_nope, q_pe, kv, page_table (small shapes)
    sm_scale: f32,
}

fn build(stream: &Stream, s: &Shape) -> Problem {
    let batch = s.seq_lens.len();
    let max_seq = *s.seq_lens.iter().max().unwrap() as usize;
    let max_pages = max_seq.div_ceil(s.page) + 1; // one spare column: rows are not tight
    let used: usize = s.seq_lens.iter().map(|&l| (l as usize).div_ceil(s.page)).sum();
    let pages = used + 3;
    // Non-contiguous page table: a shuffled permutation of the pages.
    let mut perm: Vec<i32> = (0..pages as i32).collect();
    let mut st = s.seed | 1;
    for i in (1..perm.len()).rev() {
        st = st.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        perm.swap(i, (st >> 33) as usize % (i + 1));
    }
    let mut pt = vec![-1i32; batch * max_pages];
    let mut next = 0;
    for b in 0..batch {
        for p in 0..(s.seq_lens[b] as usize).div_ceil(s.page) {
            pt[b * max_pages + p] = perm[next];
            next += 1;
        }
    }
    // Unused entries point at a valid page too: kernels may prefetch, never use, them.
    for v in pt.iter_mut().filter(|v| **v < 0) {
        *v = perm[pages - 1];
    }
    let h = s.heads;
    let (qn_bits, qn) = quantize(&random_f32(batch * h * 512, s.seed + 1), s.dtype);
    let (qp_bits, qp) = quantize(&random_f32(batch * h * 64, s.seed + 2), s.dtype);
    let (kv_bits, kv) = quantize(&random_f32(pages * s.page * 576, s.seed + 3), s.dtype);
    let small = batch * max_seq * h <= 1 << 16;
    Problem {
        shape: s.clone(),
        batch,
        max_seq,
        max_pages,
        pages,
        q_nope: DeviceBuffer::from_host(stream, &qn_bits).unwrap(),
        q_pe: DeviceBuffer::from_host(stream, &qp_bits).unwrap(),
        kv: DeviceBuffer::from_host(stream, &kv_bits).unwrap(),
        seq_lens: DeviceBuffer::from_host(stream, &s.seq_lens).unwrap(),
        page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
        out: DeviceBuffer::alloc_zeroed(stream, batch * h * 512 * 2).unwrap(),
        lse: DeviceBuffer::alloc_zeroed(stream, batch * h * 4).unwrap(),
        host: small.then_some((qn, qp, kv, pt)),
        sm_scale: 1.0 / (576f32).sqrt(),
    }
}

fn args(p: &Problem) -> MlaDecodeArgs<&DeviceBuffer> {
    let dt = if p.shape.dtype == DType::Fp16 { DType::Fp16 } else { DType::Bf16 };
    let (b, h) = (p.batch, p.shape.heads);
    MlaDecodeArgs::new(
        Tensor::contiguous(&p.q_nope, dt, &[b, h, 512]),
        Tensor::contiguous(&p.q_pe, dt, &[b, h, 64]),
        Tensor::contiguous(&p.kv, dt, &[p.pages, p.shape.page, 576]),
        Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        Tensor::contiguous(&p.page_table, DType::I32, &[b, p.max_pages]),
        Tensor::contiguous(&p.out, dt, &[b, h, 512]),
    )
    .with_lse(Tensor::contiguous(&p.lse, DType::F32, &[b, h]))
    .with_sm_scale(p.sm_scale)
    .with_max_seq_len(p.max_seq as u32)
    .with_num_splits(p.shape.splits)
}

/// max |a - r| / max |r|, and max |lse_a - lse_r|.
fn errors(out: &[f32], lse: &[f32], r_out: &[f32], r_lse: &[f32]) -> (f64, f64) {
    let scale = r_out.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-6);
    let e_out = out.iter().zip(r_out).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs())) / scale;
    let e_lse = lse.iter().zip(r_lse).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs()));
    (e_out, e_lse)
}

/// The same arguments over buffers bound to `cap` (the graph keeps them alive).
fn captured_args<'c>(cap: &mut Capture<'_, 'c>, a: &MlaDecodeArgs<&DeviceBuffer>) -> MlaDecodeArgs<CapturedBuffer<'c>> {
    a.bind(cap).unwrap()
}

fn hopper(ctx: &Arc<Context>) -> bool {
    let cc = ctx.device().compute_capability().unwrap();
    common::runs_backends(cc, &[Backend::Mla(MlaArch::Sm90)], "the sm90 MLA kernel")
}

fn shapes() -> Vec<Shape> {
    let s = |dtype, heads, page, seq_lens: Vec<i32>, splits, seed| Shape { dtype, heads, page, seq_lens, splits, seed };
    use DType::{Bf16, Fp16};
    let mut v = vec![
        s(Bf16, 128, 64, vec![1], None, 1),
        s(Bf16, 128, 64, vec![65_536], None, 2),
        s(Fp16, 128, 128, vec![65_536], Some(64), 3),
        s(Bf16, 16, 64, vec![1], Some(1), 4),
        s(Fp16, 16, 128, vec![1], None, 5),
    ];
    for (i, len) in [63, 64, 65, 127, 128, 129].into_iter().enumerate() {
        v.push(s(Bf16, 128, 64, vec![len], None, 10 + i as u64));
        v.push(s(Fp16, 16, 128, vec![len; 3], None, 20 + i as u64));
    }
    v.extend([
        s(Bf16, 128, 64, vec![1, 700, 64, 4095, 33, 2048, 129, 1], None, 30),
        s(Fp16, 128, 128, vec![5000, 1, 300, 8192], None, 31),
        s(Bf16, 16, 64, vec![4096; 64], None, 32),
        s(Bf16, 128, 64, vec![4096; 64], None, 33),
        s(Fp16, 64, 64, vec![100, 2000, 3000, 17], Some(7), 34),
        s(Bf16, 32, 128, vec![1000, 999, 998], Some(1), 35),
        s(Bf16, 48, 64, vec![640; 5], None, 36),
        s(Bf16, 128, 128, vec![12_345, 1], Some(32), 37),
        s(Fp16, 112, 64, vec![77; 9], None, 38),
        s(Bf16, 128, 64, (1..=40).map(|i| i * 97).collect(), None, 39),
        s(Fp16, 16, 64, vec![8192; 128], None, 40),
        s(Bf16, 128, 64, vec![3, 64, 65], Some(2), 41),
        s(Bf16, 80, 128, vec![256; 2], Some(2), 42),
        // The combine's two layouts (combine.cuh): a warp a head (batch x heads >= 1024 and at
        // most 8 splits), odd and even split counts, bf16 and fp16; 16 warps a head with 8 splits.
        s(Bf16, 128, 64, vec![2000; 8], Some(5), 43),
        s(Fp16, 64, 64, vec![1500, 7, 1500, 900, 1500, 1500, 64, 1500, 1500, 1500, 1, 1500, 1500, 1500, 1500, 333], Some(3), 44),
        s(Bf16, 48, 64, vec![1300; 22], Some(8), 45),
        s(Bf16, 16, 64, vec![900, 5], Some(8), 46),
    ]);
    v
}

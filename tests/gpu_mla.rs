//! MLA decode on the GPU: numerics against the references over 30+ shapes, captured replay equal
//! to eager, and the sm100 tests (which skip on Hopper, naming the arch).

mod common;

use common::{gpu, random_f32};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::{Capture, CaptureMode, CapturedBuffer};
use graphsafe::ops::mla::reference::{cpu_decode, GpuProblem, GpuReference, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, KvDtype, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::{bf16, f16};
use std::sync::Arc;

#[derive(Clone, Debug)]
struct Shape {
    dtype: KvDtype,
    heads: usize,
    page: usize,
    seq_lens: Vec<i32>,
    splits: Option<u32>,
    seed: u64,
}

/// Rounds to the dtype and returns (device bytes as u16, the rounded values as f32).
fn quantize(v: &[f32], dtype: KvDtype) -> (Vec<u16>, Vec<f32>) {
    match dtype {
        KvDtype::Bf16 => v.iter().map(|&x| { let h = bf16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
        KvDtype::Fp16 => v.iter().map(|&x| { let h = f16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip(),
        KvDtype::Fp8E4m3 => unreachable!("sm90 tests use bf16/fp16"),
    }
}

fn to_f32(bits: &[u16], dtype: KvDtype) -> Vec<f32> {
    match dtype {
        KvDtype::Fp16 => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
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
    let dt = if p.shape.dtype == KvDtype::Fp16 { DType::Fp16 } else { DType::Bf16 };
    let (b, h) = (p.batch, p.shape.heads);
    MlaDecodeArgs {
        q_nope: Tensor::contiguous(&p.q_nope, dt, &[b, h, 512]),
        q_pe: Tensor::contiguous(&p.q_pe, dt, &[b, h, 64]),
        kv_cache: Tensor::contiguous(&p.kv, dt, &[p.pages, p.shape.page, 576]),
        seq_lens: Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        page_table: Tensor::contiguous(&p.page_table, DType::I32, &[b, p.max_pages]),
        out: Tensor::contiguous(&p.out, dt, &[b, h, 512]),
        lse: Some(Tensor::contiguous(&p.lse, DType::F32, &[b, h])),
        sm_scale: p.sm_scale,
        max_seq_len: p.max_seq as u32,
        num_splits: p.shape.splits,
    }
}

/// max |a - r| / max |r|, and max |lse_a - lse_r|.
fn errors(out: &[f32], lse: &[f32], r_out: &[f32], r_lse: &[f32]) -> (f64, f64) {
    let scale = r_out.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-6);
    let e_out = out.iter().zip(r_out).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs())) / scale;
    let e_lse = lse.iter().zip(r_lse).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs()));
    (e_out, e_lse)
}

/// The same arguments over buffers bound to `cap` (the graph keeps them alive).
fn captured_args<'c>(cap: &mut Capture<'_, 'c>, p: &Problem, a: &MlaDecodeArgs<&DeviceBuffer>) -> MlaDecodeArgs<CapturedBuffer<'c>> {
    let mut b = |buf: &DeviceBuffer| cap.bind_buffer(buf).unwrap();
    MlaDecodeArgs {
        q_nope: a.q_nope.clone().with_mem(b(&p.q_nope)),
        q_pe: a.q_pe.clone().with_mem(b(&p.q_pe)),
        kv_cache: a.kv_cache.clone().with_mem(b(&p.kv)),
        seq_lens: a.seq_lens.clone().with_mem(b(&p.seq_lens)),
        page_table: a.page_table.clone().with_mem(b(&p.page_table)),
        out: a.out.clone().with_mem(b(&p.out)),
        lse: a.lse.clone().map(|t| t.with_mem(b(&p.lse))),
        sm_scale: a.sm_scale,
        max_seq_len: a.max_seq_len,
        num_splits: a.num_splits,
    }
}

fn hopper(ctx: &Arc<Context>) -> bool {
    let cc = ctx.device().compute_capability().unwrap();
    if cc != (9, 0) {
        eprintln!("SKIP: the sm90 MLA kernel needs sm_90 (H100/H200); this GPU is sm_{}{}", cc.0, cc.1);
        return false;
    }
    true
}

fn shapes() -> Vec<Shape> {
    let s = |dtype, heads, page, seq_lens: Vec<i32>, splits, seed| Shape { dtype, heads, page, seq_lens, splits, seed };
    use KvDtype::{Bf16, Fp16};
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
    ]);
    v
}

#[test]
fn sm90_matches_the_reference_over_30_shapes() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let reference = GpuReference::load(&ctx).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let all = shapes();
    assert!(all.len() >= 30);
    let mut worst = (0f64, 0f64);
    for s in &all {
        let p = build(&stream, s);
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        let out = to_f32(&p.out.to_host_vec::<u16>(&stream).unwrap(), s.dtype);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let gp = GpuProblem {
            dtype: s.dtype,
            q_nope: &p.q_nope,
            q_pe: &p.q_pe,
            kv: &p.kv,
            seq_lens: &p.seq_lens,
            page_table: &p.page_table,
            page_table_stride: p.max_pages,
            page_size: s.page,
            batch: p.batch,
            num_heads: s.heads,
            max_seq_len: p.max_seq,
            sm_scale: p.sm_scale,
        };
        let (r_out, r_lse) = reference.run(&gp, &stream).unwrap();
        let (eo, el) = errors(&out, &lse, &r_out, &r_lse);
        eprintln!("{:?} h={} page={} B={} max_seq={} splits={}: out {eo:.2e} lse {el:.2e}", s.dtype, s.heads, s.page, p.batch, p.max_seq, plan.num_splits);
        assert!(eo <= 2e-2, "{s:?}: output error {eo}");
        assert!(el <= 1e-3, "{s:?}: lse error {el}");
        worst = (worst.0.max(eo), worst.1.max(el));
        if let Some((qn, qp, kv, pt)) = &p.host {
            // The GPU reference itself against the f64 CPU reference.
            let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: s.heads, sm_scale: p.sm_scale };
            let (c_out, c_lse) = cpu_decode(&hp);
            let (ro, rl) = errors(&r_out, &r_lse, &c_out, &c_lse);
            assert!(ro <= 1e-4 && rl <= 1e-4, "{s:?}: GPU reference vs CPU reference {ro} {rl}");
            let (eo, el) = errors(&out, &lse, &c_out, &c_lse);
            assert!(eo <= 2e-2 && el <= 1e-3, "{s:?}: vs CPU reference {eo} {el}");
        }
    }
    eprintln!("{} shapes, worst output error {:.3e}, worst lse error {:.3e}", all.len(), worst.0, worst.1);
}

#[test]
fn sm90_captured_replay_equals_eager_bit_for_bit() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for s in [
        Shape { dtype: KvDtype::Bf16, heads: 128, page: 64, seq_lens: vec![4000, 1, 77, 2048], splits: None, seed: 50 },
        Shape { dtype: KvDtype::Fp16, heads: 16, page: 128, seq_lens: vec![9000], splits: Some(40), seed: 51 },
    ] {
        let p = build(&stream, &s);
        let a = args(&p);
        let plan = decode(&a, &mut ws, &stream).unwrap();
        let eager_out = p.out.to_host_vec::<u16>(&stream).unwrap();
        let eager_lse = p.lse.to_host_vec::<u32>(&stream).unwrap();
        // Pre-grown by the eager call; capture with exactly that workspace.
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut ws).unwrap();
            let ca = captured_args(&mut cap, &p, &a);
            assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
            cap.end().unwrap().instantiate().unwrap()
        };
        ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap(); // retire the captured workspace
        for _ in 0..20 {
            p.out.memset_u8(0, &stream).unwrap();
            p.lse.memset_u8(0, &stream).unwrap();
            exec.launch(&stream).unwrap();
            assert_eq!(p.out.to_host_vec::<u16>(&stream).unwrap(), eager_out, "{s:?}");
            assert_eq!(p.lse.to_host_vec::<u32>(&stream).unwrap(), eager_lse, "{s:?}");
        }
    }
}

#[test]
fn sm90_capture_with_too_small_a_workspace_is_refused() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let s = Shape { dtype: KvDtype::Bf16, heads: 128, page: 64, seq_lens: vec![8192], splits: Some(32), seed: 60 };
    let p = build(&stream, &s);
    let a = args(&p);
    let needed = a.plan(graphsafe::ops::mla::MlaArch::Sm90, 132, std::ptr::null_mut()).unwrap().workspace_bytes;
    assert!(needed > 0);
    let mut ws = Workspace::new(&stream, needed - 256).unwrap();
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let w = cap.bind_workspace(&mut ws).unwrap();
    let ca = captured_args(&mut cap, &p, &a);
    match decode_captured(&ca, &w, &cap) {
        Err(graphsafe::Error::WorkspaceTooSmall { needed: n, capacity }) => assert_eq!((n, capacity), (needed, needed - 256)),
        other => panic!("expected WorkspaceTooSmall, got {other:?}"),
    }
    let g = cap.end().unwrap();
    assert!(g.node_kinds().unwrap().is_empty());
}

#[test]
fn sm100_decode_runs_on_blackwell_and_skips_elsewhere() {
    let Some((ctx, stream)) = gpu() else { return };
    let cc = ctx.device().compute_capability().unwrap();
    if cc != (10, 0) || !graphsafe::build_info::has_arch("sm_100a") {
        eprintln!("SKIP: the CUTLASS MLA kernel needs sm_100 (B200/GB200) and a build with sm_100a; this GPU is sm_{}{}", cc.0, cc.1);
        return;
    }
    let reference = GpuReference::load(&ctx).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for s in [
        Shape { dtype: KvDtype::Bf16, heads: 128, page: 128, seq_lens: vec![4096, 1, 300], splits: None, seed: 70 },
        Shape { dtype: KvDtype::Fp16, heads: 128, page: 64, seq_lens: vec![65_536], splits: None, seed: 71 },
    ] {
        let p = build(&stream, &s);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let out = to_f32(&p.out.to_host_vec::<u16>(&stream).unwrap(), s.dtype);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let gp = GpuProblem { dtype: s.dtype, q_nope: &p.q_nope, q_pe: &p.q_pe, kv: &p.kv, seq_lens: &p.seq_lens, page_table: &p.page_table, page_table_stride: p.max_pages, page_size: s.page, batch: p.batch, num_heads: 128, max_seq_len: p.max_seq, sm_scale: p.sm_scale };
        let (r_out, r_lse) = reference.run(&gp, &stream).unwrap();
        let (eo, el) = errors(&out, &lse, &r_out, &r_lse);
        assert!(eo <= 2e-2 && el <= 1e-3, "{s:?}: {eo} {el}");
    }
}

//! cuDNN GEMM on the GPU: numerics against a host f64 reference over 20+ shapes for each dtype,
//! the plan's workspace size is exactly what execute uses, captured replay equals eager, the
//! retire/zero invariants with cuDNN plans, capture without a plan, NVFP4 on non-Blackwell.
//!
//! Skips without a GPU (GRAPHSAFE_REQUIRE_GPU=1 fails instead) or without cuDNN
//! (GRAPHSAFE_REQUIRE_CUDNN=1 fails instead).

mod common;
#[path = "gpu_cudnn/numerics.rs"]
mod numerics;

use common::gpu;
use numerics::*;
use graphsafe::driver::{Context, DeviceBuffer, MemInfo, Stream};
use graphsafe::graph::{Capture, CaptureMode, CapturedBuffer};
use graphsafe::ops::cudnn::{self, Cudnn, MatmulArgs, MatmulProblem, Nvfp4MatmulArgs, Nvfp4Problem};
use graphsafe::sys::DeviceSpan;
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use std::sync::Arc;

fn dnn(ctx: &Arc<Context>) -> Option<Arc<Cudnn>> {
    match Cudnn::new(ctx) {
        Ok(d) => {
            eprintln!("cuDNN {} from {}", d.version(), d.library());
            Some(d)
        }
        Err(e) if std::env::var("GRAPHSAFE_REQUIRE_CUDNN").as_deref() == Ok("1") => panic!("GRAPHSAFE_REQUIRE_CUDNN=1 but: {e}"),
        Err(e) => {
            eprintln!("SKIP: no usable cuDNN ({e})");
            None
        }
    }
}

/// One test problem: its layout, buffers and host values.
struct Case {
    p: MatmulProblem,
    a: DeviceBuffer,
    b: DeviceBuffer,
    c: DeviceBuffer,
    ha: Vec<f64>,
    hb: Vec<f64>,
}

/// Elements an operand spans: 1 + Σ (dim-1)·stride.
fn span(batch: usize, rows: usize, cols: usize, s: [usize; 3]) -> usize {
    1 + (batch - 1) * s[0] + (rows - 1) * s[1] + (cols - 1) * s[2]
}

fn build(stream: &Stream, p: MatmulProblem, seed: u64) -> Case {
    let a_elems = span(p.a.batch, p.m, p.k, p.a.strides);
    let b_elems = span(p.b.batch, p.k, p.n, p.b.strides);
    let c_elems = span(p.c.batch, p.m, p.n, p.c.strides);
    let (ab, ha) = random_operand(a_elems, p.a.dtype, seed);
    let (bb, hb) = random_operand(b_elems, p.b.dtype, seed + 1000);
    let c = DeviceBuffer::alloc(stream.context(), c_elems * p.c.dtype.size()).unwrap();
    c.memset_u8(0xFF, stream).unwrap(); // NaN everywhere: an element left unwritten shows
    Case { p, a: DeviceBuffer::from_host(stream, &ab).unwrap(), b: DeviceBuffer::from_host(stream, &bb).unwrap(), c, ha, hb }
}

impl Case {
    fn tensor(mem: &DeviceBuffer, dtype: DType, batch: usize, rows: usize, cols: usize, s: [usize; 3]) -> Tensor<&DeviceBuffer> {
        Tensor::strided(mem, 0, dtype, &[batch, rows, cols], &s)
    }
    fn args(&self) -> MatmulArgs<&DeviceBuffer> {
        let p = &self.p;
        MatmulArgs::new(
            Self::tensor(&self.a, p.a.dtype, p.a.batch, p.m, p.k, p.a.strides),
            Self::tensor(&self.b, p.b.dtype, p.b.batch, p.k, p.n, p.b.strides),
            Self::tensor(&self.c, p.c.dtype, p.c.batch, p.m, p.n, p.c.strides),
        )
    }
    fn captured<'c>(&self, cap: &mut Capture<'_, 'c>) -> MatmulArgs<CapturedBuffer<'c>> {
        self.args().bind(cap).unwrap()
    }
    /// Worst |got - ref| / allowed over every element of C (≤ 1 passes).
    fn check(&self, got: &[f64]) -> f64 {
        let p = &self.p;
        let rel = match p.c.dtype {
            DType::Bf16 => 2f64.powi(-8),
            DType::Fp16 => 2f64.powi(-10),
            _ => 1e-6,
        };
        // fp32 accumulation costs a few ulps of Σ|a·b|; Hopper's fp8 tensor cores accumulate with
        // about 14 significant bits between promotions (cuDNN's fp8 engines do not all promote
        // often: the "fast accumulation" of cuBLASLt), so fp8 gets 2^-11 of Σ|a·b|.
        // fp16 output: cuDNN 9.14's cuBLASLt-backed engine 0 splits K (e.g. K = 4100) and rounds the
        // partial sums to fp16 before reducing them (seen on the H200: 6x the fp32-accumulation
        // bound), which costs up to 2^-11 of Σ|a·b|. bf16 met the strict bound on every shape.
        let acc_tol = match (p.a.dtype, p.c.dtype) {
            (DType::Fp8E4m3, _) => 2f64.powi(-11),
            (_, DType::Fp16) => 2f64.powi(-11),
            _ => 2e-6,
        };
        let mut worst = 0f64;
        for bt in 0..p.batch {
            let (ba, bb) = (if p.a.batch == 1 { 0 } else { bt }, if p.b.batch == 1 { 0 } else { bt });
            for i in 0..p.m {
                for j in 0..p.n {
                    let (mut acc, mut mag) = (0f64, 0f64);
                    for l in 0..p.k {
                        let x = self.ha[ba * p.a.strides[0] + i * p.a.strides[1] + l * p.a.strides[2]];
                        let y = self.hb[bb * p.b.strides[0] + l * p.b.strides[1] + j * p.b.strides[2]];
                        acc += x * y;
                        mag += (x * y).abs();
                    }
                    let g = got[bt * p.c.strides[0] + i * p.c.strides[1] + j * p.c.strides[2]];
                    // Output rounding + fp32 accumulation (a few ulps of the magnitude summed).
                    let allowed = rel * acc.abs() + acc_tol * mag + 1e-30;
                    let e = (g - acc).abs() / allowed;
                    worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
                }
            }
        }
        worst
    }
}

/// (M, N, K, batch, layout) for the 16-bit dtypes; layout: 0 = A row, B row; 1 = B col-major
/// (weights [N, K]); 2 = A col-major; 3 = padded leading dims; 4 = batched with broadcast B;
/// 5 = C col-major.
fn shapes() -> Vec<(usize, usize, usize, usize, u8)> {
    vec![
        (1, 256, 512, 1, 0),
        (1, 4096, 4096, 1, 1),
        (1, 8192, 1024, 1, 1),
        (16, 1000, 320, 1, 0),
        (7, 129, 100, 1, 0),   // odd N, K not a multiple of 64
        (33, 130, 4100, 1, 1), // K not a multiple of 64
        (64, 512, 4160, 1, 1),
        (256, 256, 256, 1, 2),
        (128, 8, 1024, 1, 0),
        (200, 384, 2048, 1, 1),
        (3, 2048, 2048, 1, 1),
        (512, 512, 64, 1, 0),
        (48, 320, 640, 1, 3),
        (4096, 64, 64, 1, 0),
        (31, 96, 8192, 1, 1),
        (33, 64, 96, 4, 0),
        (16, 128, 256, 3, 4),
        (96, 200, 128, 2, 1),
        (64, 96, 160, 1, 5),
        (2, 24, 40, 1, 0),
    ]
}

fn problem_of(m: usize, n: usize, k: usize, batch: usize, layout: u8, input: DType, output: DType) -> MatmulProblem {
    let p = MatmulProblem::new(m, n, k, input, output);
    let p = if batch > 1 { p.with_batch(batch) } else { p };
    match layout {
        1 => p.with_b_col_major(),
        2 => p.with_a_col_major(),
        3 => {
            let mut q = p;
            q.a.strides[1] += 64;
            q.b.strides[1] += 8;
            q.c.strides[1] += 16;
            q
        }
        4 => p.with_broadcast_b(),
        5 => p.with_c_col_major(),
        _ => p,
    }
}

#[test]
fn matmul_matches_the_host_reference_over_20_shapes_in_bf16_and_fp16() {
    let Some((ctx, stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let mut ran = 0;
    for dt in [DType::Bf16, DType::Fp16] {
        for (i, &(m, n, k, batch, layout)) in shapes().iter().enumerate() {
            let p = problem_of(m, n, k, batch, layout, dt, dt);
            let case = build(&stream, p, 100 + i as u64);
            let info = cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap_or_else(|e| panic!("{}: {e} ({})", p.label(), dnn.last_error_text()));
            let got = read_out(&case.c, dt, &stream);
            let err = case.check(&got);
            eprintln!("{:<70} engine {:>3} ws {:>9} B  err/allowed {err:.3}", p.label(), info.engine, info.workspace_bytes);
            assert!(err <= 1.0, "{}: error {err} x the tolerance", p.label());
            ran += 1;
        }
    }
    // Mixed output dtypes: fp32 accumulation written as f32, and bf16 in / fp16 out.
    for (i, (inp, out)) in [(DType::Bf16, DType::F32), (DType::Fp16, DType::F32), (DType::Bf16, DType::Fp16)].into_iter().enumerate() {
        let p = problem_of(64, 256, 512, 1, 1, inp, out);
        let case = build(&stream, p, 300 + i as u64);
        match cudnn::matmul(&dnn, &case.args(), &mut ws, &stream) {
            Ok(info) => {
                let err = case.check(&read_out(&case.c, out, &stream));
                eprintln!("{:<70} engine {:>3} err/allowed {err:.3}", p.label(), info.engine);
                assert!(err <= 1.0, "{}: error {err}", p.label());
                ran += 1;
            }
            Err(Error::Cudnn { status, .. }) => eprintln!("{}: not supported by this cuDNN (status {status})", p.label()),
            Err(e) => panic!("{}: {e}", p.label()),
        }
    }
    eprintln!("{ran} problems matched the reference; {} plans cached", dnn.plan_count());
    assert!(ran >= 40);
}

#[test]
fn fp8_e4m3_matmul_matches_the_reference_where_supported() {
    let Some((ctx, stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let shapes = [(1, 256, 512, 1), (16, 1024, 1024, 1), (64, 512, 4096, 1), (128, 256, 256, 1), (32, 128, 256, 2), (256, 2048, 512, 1)];
    let mut ran = 0;
    for out in [DType::Bf16, DType::Fp16] {
        for (i, &(m, n, k, batch)) in shapes.iter().enumerate() {
            let p = problem_of(m, n, k, batch, 1, DType::Fp8E4m3, out);
            let case = build(&stream, p, 500 + i as u64);
            match cudnn::matmul(&dnn, &case.args(), &mut ws, &stream) {
                Ok(info) => {
                    let err = case.check(&read_out(&case.c, out, &stream));
                    eprintln!("{:<70} engine {:>3} ws {:>9} B err/allowed {err:.3}", p.label(), info.engine, info.workspace_bytes);
                    assert!(err <= 1.0, "{}: error {err}", p.label());
                    ran += 1;
                }
                Err(Error::Cudnn { status, .. }) if ran == 0 => {
                    eprintln!("SKIP: fp8 matmul not supported by cuDNN {} on this GPU (status {status}: {})", dnn.version(), dnn.last_error_text());
                    return;
                }
                Err(e) => panic!("{}: {e} ({})", p.label(), dnn.last_error_text()),
            }
        }
    }
    eprintln!("{ran} fp8 problems matched the reference");
}

/// A problem whose plan needs a workspace (split-K engines keep partial sums and semaphores there).
fn problem_with_workspace(dnn: &Cudnn) -> (MatmulProblem, u64) {
    let candidates = [
        problem_of(16, 256, 16384, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(1, 512, 32768, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(8, 128, 65536, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(64, 1024, 8192, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(1, 8192, 8192, 1, 1, DType::Bf16, DType::Bf16),
    ];
    let mut best = (candidates[0], 0);
    for p in candidates {
        let w = cudnn::workspace_size(dnn, &p).unwrap();
        eprintln!("{}: plan workspace {w} B", p.label());
        if w > best.1 {
            best = (p, w);
        }
    }
    best
}

#[test]
fn the_planned_workspace_is_exactly_what_execute_uses() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let (p, needed) = problem_with_workspace(&dnn);
    // The planning call over several problems returns the largest.
    let others = [problem_of(1, 256, 512, 1, 0, DType::Bf16, DType::Bf16), problem_of(7, 129, 100, 1, 0, DType::Fp16, DType::Fp16)];
    let all = [others[0], p, others[1]];
    assert_eq!(cudnn::plan_workspace(&dnn, &all).unwrap(), needed.max(cudnn::plan_workspace(&dnn, &others).unwrap()));
    let case = build(&stream, p, 700);

    // Eager on a workspace of exactly the plan's size (rounded only to the 256-byte granule).
    let mut ws = Workspace::new(&stream, needed).unwrap();
    let cap_before = ws.capacity();
    let info = cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap();
    assert_eq!(info.workspace_bytes, needed);
    assert_eq!(ws.capacity(), cap_before, "execute must not grow a workspace that holds the plan's size");
    let eager = case.c.to_host_vec::<u8>(&stream).unwrap();
    assert!(case.check(&read_out(&case.c, DType::Bf16, &stream)) <= 1.0);

    // A raw allocation of exactly `needed` bytes (compute-sanitizer's memcheck flags any byte past it).
    if needed > 0 {
        let exact = DeviceBuffer::alloc_zeroed(&stream, needed as usize).unwrap();
        case.c.memset_u8(0, &stream).unwrap();
        // SAFETY: used only below, on buffers that live until the synchronize in to_host_vec.
        let span = |b: &DeviceBuffer, len: usize| unsafe { DeviceSpan::from_raw(b.device_ptr(), len as u64) };
        let ptrs = [span(&case.a, case.a.len()), span(&case.b, case.b.len()), span(&case.c, case.c.len())];
        let i2 = cudnn::matmul::matmul_raw(&dnn, &p, ptrs, span(&exact, needed as usize), &stream).unwrap();
        assert_eq!(i2, info);
        assert_eq!(case.c.to_host_vec::<u8>(&stream).unwrap(), eager, "exact-size workspace gave other bits");
        // And one byte less is refused before anything runs.
        let r = cudnn::matmul::matmul_raw(&dnn, &p, ptrs, span(&exact, needed as usize - 1), &stream);
        assert_eq!(r, Err(Error::WorkspaceTooSmall { needed, capacity: needed - 1 }));
    } else {
        eprintln!("NOTE: every candidate plan needs 0 workspace bytes on this GPU/cuDNN");
    }

    // Captured with the exactly-sized workspace: works, replays equal eager.
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let ca = case.captured(&mut cap);
        assert_eq!(cudnn::matmul_captured(&dnn, &ca, &w, &cap).unwrap(), info);
        cap.end().unwrap().instantiate().unwrap()
    };
    case.c.memset_u8(0, &stream).unwrap();
    exec.launch(&stream).unwrap();
    assert_eq!(case.c.to_host_vec::<u8>(&stream).unwrap(), eager);

    // Captured with less than the plan needs: refused, nothing captured, nothing grown.
    if needed > 0 {
        let below = (needed - 1) / 256 * 256; // the largest capacity a workspace can have below `needed`
        let mut small = Workspace::new(&stream, below).unwrap();
        assert_eq!(small.capacity(), below);
        let graph = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut small).unwrap();
            let ca = case.captured(&mut cap);
            match cudnn::matmul_captured(&dnn, &ca, &w, &cap) {
                Err(Error::WorkspaceTooSmall { needed: n, capacity }) => assert_eq!((n, capacity), (needed, below)),
                other => panic!("expected WorkspaceTooSmall, got {other:?}"),
            }
            cap.end().unwrap()
        };
        assert!(graph.node_kinds().unwrap().is_empty(), "something was captured");
        assert_eq!(small.capacity(), below, "the workspace must not grow");
    }
}

#[test]
fn captured_replay_equals_eager_bit_for_bit() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let problems = [
        problem_of(1, 4096, 4096, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(16, 1000, 320, 1, 0, DType::Fp16, DType::Fp16),
        problem_of(33, 64, 96, 4, 0, DType::Bf16, DType::Bf16),
        problem_of(16, 256, 16384, 1, 1, DType::Bf16, DType::Bf16),
        problem_of(16, 128, 256, 3, 4, DType::Fp16, DType::Fp16),
    ];
    // Size before capture: one planning call, one pre-grow.
    let bytes = cudnn::plan_workspace(&dnn, &problems).unwrap();
    let mut ws = Workspace::new(&stream, bytes).unwrap();
    let cases: Vec<Case> = problems.iter().enumerate().map(|(i, &p)| build(&stream, p, 800 + i as u64)).collect();
    let mut eager = Vec::new();
    for c in &cases {
        cudnn::matmul(&dnn, &c.args(), &mut ws, &stream).unwrap();
        eager.push(c.c.to_host_vec::<u8>(&stream).unwrap());
    }
    assert_eq!(ws.retired_count(), 0, "the pre-grown workspace was enough");
    // All five in one graph, sharing the workspace.
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        for c in &cases {
            let ca = c.captured(&mut cap);
            cudnn::matmul_captured(&dnn, &ca, &w, &cap).unwrap();
        }
        cap.end().unwrap().instantiate().unwrap()
    };
    ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap(); // retire the captured buffer
    for r in 0..20 {
        for c in &cases {
            c.c.memset_u8(0, &stream).unwrap();
        }
        exec.launch(&stream).unwrap();
        for (c, e) in cases.iter().zip(&eager) {
            assert!(c.c.to_host_vec::<u8>(&stream).unwrap() == *e, "replay {r}: {} differs from eager", c.p.label());
        }
    }
}

#[test]
fn retire_and_zero_invariants_hold_with_cudnn_plans() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let (p, needed) = problem_with_workspace(&dnn);
    let case = build(&stream, p, 900);
    // Zero: a fresh workspace on a dirty recycled block gives the right answer on first use.
    let dirty = DeviceBuffer::alloc(&ctx, needed.next_multiple_of(256).max(256) as usize).unwrap();
    dirty.memset_u8(0x5A, &stream).unwrap();
    stream.synchronize().unwrap();
    drop(dirty);
    let mut ws = Workspace::new(&stream, needed).unwrap();
    assert!(ws.to_host_vec(&stream).unwrap().iter().all(|&b| b == 0));
    cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap();
    let eager = case.c.to_host_vec::<u8>(&stream).unwrap();
    assert!(case.check(&read_out(&case.c, DType::Bf16, &stream)) <= 1.0);

    // Replay after grow and allocator churn.
    let captured_ptr = ws.device_ptr();
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let ca = case.captured(&mut cap);
        cudnn::matmul_captured(&dnn, &ca, &w, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    let mut freed = Vec::new();
    for step in 1..=3u64 {
        let before = ws.capacity() as usize;
        assert!(ws.ensure_size(needed.max(256) * (1 + step) + (1 << 20), &stream).unwrap());
        assert_ne!(ws.device_ptr(), captured_ptr);
        if step > 1 {
            freed.push(before);
        }
    }
    assert_eq!(ws.retired_count(), 3);
    let mut held = Vec::new();
    for _ in 0..8 {
        for &s in freed.iter().chain([needed.max(256) as usize].iter()) {
            let b = DeviceBuffer::alloc(&ctx, s.next_multiple_of(4)).unwrap();
            b.memset_u32(0xDEAD_BEEF, &stream).unwrap();
            held.push(b);
        }
    }
    stream.synchronize().unwrap();
    cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap();
    assert_eq!(case.c.to_host_vec::<u8>(&stream).unwrap(), eager, "eager on the grown workspace");
    for i in 0..200 {
        case.c.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert!(case.c.to_host_vec::<u8>(&stream).unwrap() == eager, "replay {i} differs from eager");
    }
    drop(held);
    drop(exec);

    // Release: a big captured workspace is held while an executable lives, freed when it goes.
    stream.synchronize().unwrap();
    let start = MemInfo::query(&ctx).unwrap().free;
    const BIG: u64 = 256 << 20;
    let mut big = Workspace::new(&stream, BIG).unwrap();
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut big).unwrap();
        let ca = case.captured(&mut cap);
        cudnn::matmul_captured(&dnn, &ca, &w, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    big.ensure_size(2 * BIG, &stream).unwrap(); // retires the captured 256 MiB
    drop(big);
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let held = MemInfo::query(&ctx).unwrap().free;
    assert!(start - held >= BIG - (2 << 20), "the retired captured workspace must be held: {start} -> {held}");
    drop(exec);
    let end = MemInfo::query(&ctx).unwrap().free;
    assert!(start.abs_diff(end) <= 2 << 20, "free memory {start} -> {end}: retired workspace not released");
}

#[test]
fn a_capture_without_a_plan_built_before_is_refused_and_captures_nothing() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let p = problem_of(5, 72, 136, 1, 0, DType::Fp16, DType::Fp16); // planned nowhere else
    let case = build(&stream, p, 950);
    let mut ws = Workspace::new(&stream, 1 << 20).unwrap();
    let graph = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let ca = case.captured(&mut cap);
        match cudnn::matmul_captured(&dnn, &ca, &w, &cap) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "plan"),
            other => panic!("expected InvalidArgument(plan), got {other:?}"),
        }
        cap.end().unwrap()
    };
    assert!(graph.node_kinds().unwrap().is_empty());
    // After planning, the same capture works.
    let needed = cudnn::workspace_size(&dnn, &p).unwrap();
    ws.ensure_size(needed, &stream).unwrap();
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let w = cap.bind_workspace(&mut ws).unwrap();
    let ca = case.captured(&mut cap);
    cudnn::matmul_captured(&dnn, &ca, &w, &cap).unwrap();
    assert!(!cap.end().unwrap().node_kinds().unwrap().is_empty());
}

#[test]
fn autotune_pins_the_fastest_candidate_and_keeps_the_replaced_plan() {
    let Some((ctx, stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let p = problem_of(256, 2048, 2048, 1, 1, DType::Bf16, DType::Bf16);
    let case = build(&stream, p, 990);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let first = cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap();
    let count = dnn.plan_count();
    let report = cudnn::autotune(&dnn, &case.args(), &mut ws, &stream, 6).unwrap();
    for (info, us) in &report.candidates {
        eprintln!("candidate engine {:>3} ({:?} #{}) ws {:>9} B: {us:.1} us", info.engine, info.source, info.rank, info.workspace_bytes);
    }
    assert!(!report.candidates.is_empty());
    let best = report.candidates.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    assert!(report.candidates.iter().any(|(i, t)| *i == report.chosen && *t == best));
    assert_eq!(dnn.plan_count(), count + 1, "the replaced plan is retired, not freed");
    let after = cudnn::matmul(&dnn, &case.args(), &mut ws, &stream).unwrap();
    assert!(after.autotuned && !first.autotuned);
    assert!(case.check(&read_out(&case.c, DType::Bf16, &stream)) <= 1.0);
}

#[test]
fn nvfp4_on_a_non_blackwell_gpu_is_arch_unsupported() {
    let Some((ctx, stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let cc = ctx.compute_capability();
    let p = Nvfp4Problem::new(128, 256, 512, DType::Bf16);
    let buf = |n: usize| DeviceBuffer::alloc_zeroed(&stream, n).unwrap();
    let (a, sa, b, sb, alpha, c) = (buf(p.a_bytes()), buf(p.a_scale_bytes()), buf(p.b_bytes()), buf(p.b_scale_bytes()), buf(4), buf(128 * 256 * 2));
    let args = Nvfp4MatmulArgs::new(p, &a, &sa, &b, &sb, &alpha, Tensor::contiguous(&c, DType::Bf16, &[128, 256]));
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let r = cudnn::nvfp4_matmul(&dnn, &args, &mut ws, &stream);
    if graphsafe::arch::require_fp4_tensor_cores("cudnn nvfp4 matmul", cc).is_ok() {
        eprintln!("Blackwell sm_{}{}: nvfp4 matmul -> {r:?}", cc.0, cc.1);
        return;
    }
    match r {
        Err(Error::ArchUnsupported { need, have, .. }) => {
            assert!(need.contains("Blackwell"), "{need}");
            assert_eq!(have, format!("sm_{}{}", cc.0, cc.1));
        }
        other => panic!("expected ArchUnsupported on sm_{}{}, got {other:?}", cc.0, cc.1),
    }
    assert_eq!(ws.capacity(), 0, "nothing planned, nothing grown");
    // The graph itself is well-formed for this cuDNN (no engine is asked for).
    match cudnn::nvfp4::finalize_graph(&dnn, &p) {
        Ok(()) => eprintln!("nvfp4 operation graph finalizes on cuDNN {}", dnn.version()),
        Err(e) => eprintln!("NOTE: nvfp4 operation graph does not finalize on sm_{}{} with cuDNN {}: {e} ({})", cc.0, cc.1, dnn.version(), dnn.last_error_text()),
    }
}

/// The benches' raw cuDNN floor on a stream the engine owns (adopted): once the engine begins a
/// capture of its own on it, `call` must refuse (u32::MAX, nothing recorded), as replays and eager
/// ops do on adopted streams; the engine's graph would keep neither the plan nor the handle. On the
/// old code `call` checked only graphsafe's own capture marker and recorded the execute into the
/// engine's graph. After the engine's capture ends, `call` runs again.
#[test]
fn a_raw_executor_refuses_a_capture_its_adopted_streams_owner_began() {
    use graphsafe::ops::cudnn::matmul::RawExecutor;
    use graphsafe::sys::cuda as c;
    let Some((ctx, _stream)) = gpu() else { return };
    let Some(dnn) = dnn(&ctx) else { return };
    let api = graphsafe::sys::driver::api().unwrap();
    let raw = {
        ctx.with_current(|| {
            let mut raw: c::CUstream = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; flags 1 (non-blocking).
            assert_eq!(unsafe { (api.cuStreamCreate().unwrap().f)(&mut raw, 1) }, c::CUresult::CUDA_SUCCESS);
            raw
        }).unwrap()
    };
    // SAFETY: a live stream of ctx that nothing else wraps; destroyed below, after the wrapper.
    let adopted = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    let p = problem_of(64, 256, 512, 1, 0, DType::Bf16, DType::Bf16);
    let case = build(&adopted, p, 900);
    let mut ws = Workspace::new(&adopted, 0).unwrap();
    cudnn::matmul(&dnn, &case.args(), &mut ws, &adopted).unwrap(); // the plan cached, the workspace sized
    // SAFETY: the buffers and the workspace (not grown again) outlive the executor.
    let (ptrs, wspan) = unsafe {
        let span = |b: &DeviceBuffer| DeviceSpan::from_raw(b.device_ptr(), b.len() as u64);
        ([span(&case.a), span(&case.b), span(&case.c)], DeviceSpan::from_raw(ws.device_ptr(), ws.capacity()))
    };
    let exec = RawExecutor::new(&dnn, &p, ptrs, wspan, &adopted).unwrap();
    assert_eq!(exec.call(), 0);
    let graph = {
        ctx.with_current(|| {
            // SAFETY: a live stream of ctx; a valid mode.
            let r = unsafe { (api.cuStreamBeginCapture().unwrap().f)(raw, c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) };
            assert_eq!(r, c::CUresult::CUDA_SUCCESS);
            let refused = exec.call();
            let mut g = std::ptr::null_mut();
            // SAFETY: the capture begun above; out-pointer to a local.
            assert_eq!(unsafe { (api.cuStreamEndCapture().unwrap().f)(raw, &mut g) }, c::CUresult::CUDA_SUCCESS);
            assert_eq!(refused, u32::MAX, "an execute went into the engine's own capture");
            g
        }).unwrap()
    };
    let mut nodes = 0usize;
    // SAFETY: the graph the end returned; a null node array asks for the count only.
    assert_eq!(unsafe { (api.cuGraphGetNodes().unwrap().f)(graph, std::ptr::null_mut(), &mut nodes) }, c::CUresult::CUDA_SUCCESS);
    // SAFETY: the graph the end returned, destroyed once.
    unsafe { (api.cuGraphDestroy().unwrap().f)(graph) };
    assert_eq!(nodes, 0, "the engine's graph recorded the refused execute");
    assert_eq!(exec.call(), 0, "the executor refuses after the engine's capture ended");
    drop(exec);
    adopted.synchronize().unwrap();
    drop((case, ws, adopted));
    ctx.with_current(|| {
        // SAFETY: no wrapper is left; nothing is queued on it.
        assert_eq!(unsafe { (api.cuStreamDestroy().unwrap().f)(raw) }, c::CUresult::CUDA_SUCCESS);
    }).unwrap()
}

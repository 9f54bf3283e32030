//! Caller values at the edges of their types — 0, 1, powers of two ± 1, `usize::MAX`, `i32::MIN` —
//! fed to every host-side check and planner (no GPU needed). Nothing may panic (this file runs in
//! debug builds, so an unchecked overflow panics), and nothing that would make a kernel address
//! memory outside its buffer may be accepted (hole 9 of the soundness issue: a wrapped bounds check
//! accepted a stride of `usize::MAX - 65535` and handed the kernel a stride of -65536).

use graphsafe::ops::cudnn::{MatmulArgs, MatmulProblem, Nvfp4MatmulArgs, Nvfp4Problem};
use graphsafe::ops::mla::{MlaArch, MlaDecodeArgs};
use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Nvfp4Matrix};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::sys::cuda as c;
use std::panic::{catch_unwind, AssertUnwindSafe};

mod common;
use common::Fake;

const CTX: usize = 0x1000;

fn mem(i: u64, len: usize) -> Fake {
    Fake { ptr: 0x10_0000_0000 * (i + 1), len, ctx: CTX }
}

/// A deterministic stream of edge and random values.
struct Edges {
    state: u64,
}

impl Edges {
    const USIZE: &'static [usize] = &[
        0,
        1,
        2,
        3,
        15,
        16,
        17,
        63,
        64,
        127,
        128,
        512,
        576,
        4096,
        65_535,
        65_536,
        (1 << 31) - 1,
        1 << 31,
        (1 << 32) - 1,
        1 << 32,
        (1 << 62) + 1,
        (1 << 63) - 1,
        1 << 63,
        usize::MAX - 65_535,
        usize::MAX / 2,
        usize::MAX - 1,
        usize::MAX,
    ];

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.state >> 11
    }

    fn usize(&mut self) -> usize {
        match self.next() % 4 {
            0 => (self.next() as usize) % 5000,
            1 => self.next() as usize,
            _ => Self::USIZE[(self.next() as usize) % Self::USIZE.len()],
        }
    }

    fn i64(&mut self) -> i64 {
        const I: &[i64] = &[i64::MIN, i32::MIN as i64, -1, 0, 1, 2, 16, 64, 128, 132, 148, 4096, 65_535, 65_536, i32::MAX as i64, 1 << 32, i64::MAX];
        match self.next() % 3 {
            0 => (self.next() % 70_000) as i64,
            _ => I[(self.next() as usize) % I.len()],
        }
    }

    fn shape(&mut self, n: usize) -> Vec<usize> {
        (0..n).map(|_| self.usize()).collect()
    }
}

#[track_caller]
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            panic!("{what} panicked on caller input: {msg}");
        }
    }
}

/// The largest byte offset (exclusive) a tensor's elements reach, exactly, or None if unbounded.
fn true_extent(t: &Tensor<Fake>) -> Option<u128> {
    if t.shape.contains(&0) {
        return Some(0);
    }
    let mut last: u128 = 0;
    for (d, s) in t.shape.iter().zip(&t.strides) {
        last += (*d as u128 - 1) * *s as u128;
    }
    Some(t.offset as u128 + (last + 1) * t.dtype.size() as u128)
}

fn within(t: &Tensor<Fake>) -> bool {
    true_extent(t).is_some_and(|e| e <= t.mem.len as u128) && t.strides.iter().all(|&s| s <= i64::MAX as usize)
}

fn good_mla(heads: usize, page: usize) -> MlaDecodeArgs<Fake> {
    let (b, max_pages) = (2usize, 8usize);
    MlaDecodeArgs::new(
        Tensor::contiguous(mem(0, b * heads * 512 * 2), DType::Bf16, &[b, heads, 512]),
        Tensor::contiguous(mem(1, b * heads * 64 * 2), DType::Bf16, &[b, heads, 64]),
        Tensor::contiguous(mem(2, 64 * page * 576 * 2), DType::Bf16, &[64, page, 576]),
        Tensor::contiguous(mem(3, b * 4), DType::I32, &[b]),
        Tensor::contiguous(mem(4, b * max_pages * 4), DType::I32, &[b, max_pages]),
        Tensor::contiguous(mem(5, b * heads * 512 * 2), DType::Bf16, &[b, heads, 512]),
    )
    .with_lse(Tensor::contiguous(mem(6, b * heads * 4), DType::F32, &[b, heads]))
    .with_sm_scale(0.07)
    .with_max_seq_len((max_pages * page) as u32)
}

#[test]
fn the_wrapped_stride_of_the_issue_is_refused() {
    // out [2, 128, 512] over 256 KiB with strides [usize::MAX - 65535, 512, 1]: the last element
    // lands at usize::MAX, where `last + 1` used to wrap to 0 and pass.
    let mut a = good_mla(128, 64);
    a.out = Tensor::strided(mem(5, 256 << 10), 0, DType::Bf16, &[2, 128, 512], &[usize::MAX - 65_535, 512, 1]);
    for arch in [MlaArch::Sm90, MlaArch::Sm100] {
        let r = no_panic("MlaDecodeArgs::plan", || a.plan(arch, 132, CTX as c::CUcontext));
        assert!(r.is_err(), "{arch:?} accepted a stride that wraps: {r:?}");
    }
    // cuDNN: strides [usize::MAX, 1].
    let m = MatmulArgs::new(
        Tensor::strided(mem(0, 1 << 20), 0, DType::Bf16, &[64, 64], &[usize::MAX, 1]),
        Tensor::contiguous(mem(1, 1 << 20), DType::Bf16, &[64, 64]),
        Tensor::contiguous(mem(2, 1 << 20), DType::Bf16, &[64, 64]),
    );
    assert!(no_panic("MatmulArgs::problem", || m.problem(CTX as c::CUcontext)).is_err());
}

#[test]
fn mla_validation_never_panics_and_never_accepts_an_out_of_bounds_tensor() {
    let mut e = Edges { state: 1 };
    let mut accepted = 0;
    for case in 0..20_000 {
        let mut a = good_mla([16, 64, 128][case % 3], [64, 128][case % 2]);
        // Mutate one tensor's offset, shape or strides, or a scalar, to an edge value.
        let pick = e.next() % 8;
        let t = match pick {
            0 => &mut a.q_nope,
            1 => &mut a.q_pe,
            2 => &mut a.kv_cache,
            3 => &mut a.seq_lens,
            4 => &mut a.page_table,
            5 => &mut a.out,
            _ => a.lse.as_mut().unwrap(),
        };
        match e.next() % 4 {
            0 => t.offset = e.usize(),
            1 => {
                let n = t.shape.len();
                t.shape = e.shape(n);
            }
            2 => {
                let n = t.strides.len();
                t.strides = e.shape(n);
            }
            _ => {
                a.max_seq_len = e.usize() as u32;
                a.num_splits = Some(e.usize() as u32);
            }
        }
        for arch in [MlaArch::Sm90, MlaArch::Sm100] {
            let ok = no_panic("MlaDecodeArgs::plan", || a.plan(arch, e.usize().min(u32::MAX as usize) as u32, CTX as c::CUcontext)).is_ok();
            if ok {
                accepted += 1;
                let all = [&a.q_nope, &a.q_pe, &a.kv_cache, &a.seq_lens, &a.page_table, &a.out, a.lse.as_ref().unwrap()];
                for t in all {
                    assert!(within(t), "case {case}: {arch:?} accepted {:?} strides {:?} offset {} over {} bytes", t.shape, t.strides, t.offset, t.mem.len);
                }
            }
        }
    }
    assert!(accepted > 0, "the generator never produced a valid case: it tests nothing");
}

#[test]
fn cudnn_validation_never_panics_and_never_accepts_an_out_of_bounds_tensor() {
    let mut e = Edges { state: 2 };
    let mut accepted = 0;
    for case in 0..20_000 {
        let (m, n, k) = (1 + (e.next() % 64) as usize, 1 + (e.next() % 64) as usize, 1 + (e.next() % 64) as usize);
        let mut ts = [
            Tensor::contiguous(mem(0, 1 << 20), DType::Bf16, &[m, k]),
            Tensor::contiguous(mem(1, 1 << 20), DType::Bf16, &[k, n]),
            Tensor::contiguous(mem(2, 1 << 20), DType::Bf16, &[m, n]),
        ];
        let rank = 2;
        let t = &mut ts[(e.next() % 3) as usize];
        match e.next() % 3 {
            0 => t.offset = e.usize(),
            1 => t.shape = e.shape(rank),
            _ => t.strides = e.shape(rank),
        }
        let args = MatmulArgs::new(ts[0].clone(), ts[1].clone(), ts[2].clone());
        if no_panic("MatmulArgs::problem", || args.problem(CTX as c::CUcontext)).is_ok() {
            accepted += 1;
            for t in [&args.a, &args.b, &args.c] {
                assert!(within(t), "case {case}: accepted {:?} strides {:?} offset {}", t.shape, t.strides, t.offset);
            }
        }
        let p = MatmulProblem::new(e.usize(), e.usize(), e.usize(), DType::Bf16, DType::F32).with_batch(e.usize());
        no_panic("MatmulProblem::validate", || p.validate().map(drop).unwrap_or(()));
        no_panic("MatmulProblem::label", || p.label());
        let q = Nvfp4Problem::new(e.usize(), e.usize(), e.usize(), DType::Bf16).with_batch(e.usize());
        if no_panic("Nvfp4Problem::validate", || q.validate()).is_ok() {
            no_panic("Nvfp4Problem sizes", || (q.a_bytes(), q.b_bytes(), q.a_scale_bytes(), q.b_scale_bytes()));
        }
        let n = Nvfp4MatmulArgs::new(
            q,
            mem(0, e.usize()),
            mem(1, e.usize()),
            mem(2, e.usize()),
            mem(3, e.usize()),
            mem(4, 4),
            Tensor::contiguous(mem(5, e.usize()), DType::Bf16, &[e.usize(), e.usize()]),
        );
        no_panic("Nvfp4MatmulArgs::validate", || n.validate(CTX as c::CUcontext).map(drop).unwrap_or(()));
    }
    assert!(accepted > 0);
}

#[test]
fn nvfp4_planning_and_validation_never_panic() {
    let mut e = Edges { state: 3 };
    for _ in 0..20_000 {
        let (m, n, k, sm) = (e.i64(), e.i64(), e.i64(), e.i64());
        for arch in [Nvfp4Arch::Sm90, Nvfp4Arch::Sm100, Nvfp4Arch::Sm120] {
            no_panic("nvfp4::plan", || nvfp4::plan(arch, m, n, k, DType::Bf16, sm).map(drop).unwrap_or(()));
        }
        if let Ok(bytes) = no_panic("nvfp4::scale_bytes", || nvfp4::scale_bytes(m, k)) {
            // Rows rounded up to 128, k/16 scales rounded up to 4, exactly (no wrapped product).
            assert_eq!(bytes as u128, (m as u128).div_ceil(128) * 128 * (k as u128 / 16).div_ceil(4) * 4, "scale_bytes({m}, {k})");
        }
        let rows = e.usize();
        let kk = e.usize();
        let mat = Nvfp4Matrix::new(mem(0, e.usize()), mem(1, e.usize()), mem(2, e.usize()), rows, kk);
        no_panic("Nvfp4Matrix::validate", || mat.validate("w", CTX as c::CUcontext).map(drop).unwrap_or(()));
    }
}

#[test]
fn mla_planners_never_panic() {
    use graphsafe::ops::mla::{sm100, sm90};
    let mut e = Edges { state: 4 };
    for _ in 0..5_000 {
        let (b, s, sm, req, h, page, q) = (e.i64(), e.i64(), e.i64(), e.i64(), e.i64(), e.i64(), e.i64());
        // Bounded inputs only for the worst-case scans (their time grows with the batch).
        let shape = |dtype| sm100::Shape::new(dtype, b, s, page, sm).with_heads(h).with_s_q(q);
        no_panic("sm100::plan", || sm100::plan(&shape(DType::Bf16), Some(req)).map(drop).unwrap_or(()));
        no_panic("sm100::plan (default splits)", || sm100::plan(&shape(DType::Fp8E4m3), None).map(drop).unwrap_or(()));
        no_panic("sm100::workspace_bytes", || sm100::workspace_bytes(&shape(DType::Bf16), req).map(drop).unwrap_or(()));
        no_panic("sm100::layout", || sm100::layout(&shape(DType::Fp16), req).map(drop).unwrap_or(()));
        no_panic("sm90::plan", || sm90::plan(DType::Bf16, h, q, b, s, sm, Some(req)).map(drop).unwrap_or(()));
        no_panic("sm90::plan (default splits)", || sm90::plan(DType::Fp16, h, q, b, s, sm, None).map(drop).unwrap_or(()));
        no_panic("sm90::workspace_bytes", || sm90::workspace_bytes(b, h, q, req).map(drop).unwrap_or(()));
    }
}

#[test]
fn the_c_abi_planners_never_panic_or_return_an_undocumented_status() {
    use graphsafe::capi::*;
    let mut e = Edges { state: 5 };
    let documented = |r: i32| (-15..=0).contains(&r) && r != GRAPHSAFE_ERROR_PANIC;
    for _ in 0..5_000 {
        let v: Vec<i32> = (0..8).map(|_| e.i64().clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect();
        let mut plan = GraphsafeMlaPlan::default();
        let mut bytes = 0u64;
        let mut nplan = GraphsafeNvfp4Plan::default();
        // SAFETY: every output points to a local of the right type.
        let rs = unsafe {
            [
                graphsafe_mla_plan([90, 100, v[0]][(e.next() % 3) as usize], v[1] & 3, [16, 128, v[2]][(e.next() % 3) as usize], v[3], v[4], [64, 128, v[7]][(e.next() % 3) as usize], v[5], v[6], &mut plan),
                graphsafe_nvfp4_scale_bytes(v[0], v[1], &mut bytes),
                graphsafe_nvfp4_plan([90, 100, 120, v[7]][(e.next() % 4) as usize], v[2], v[3], v[4], 0, v[5], &mut nplan),
            ]
        };
        for r in rs {
            assert!(documented(r), "status {r} for {v:?}");
        }
    }
}

/// The public host references (what tests and users compare kernels with) refuse input that does
/// not fit the shapes they are given, and treat device data (lengths, page indices) as the kernels
/// do, instead of panicking. (Before: an assert, an out-of-bounds index, a division by a page size
/// of 0, a negative page index cast to usize.)
#[test]
fn the_host_references_never_panic_on_caller_input() {
    use graphsafe::ops::mla::reference::{cpu_decode, dequantize_ds_mla, HostProblem};
    use graphsafe::ops::nvfp4::reference as r;
    // NVFP4: short buffers, k not a multiple of 32, products that overflow.
    let x = vec![0.5f32; 4096];
    let (p, s) = no_panic("quantize", || r::quantize(&x, 2, 2048, 1.0)).expect("a valid shape");
    let back = no_panic("dequantize", || r::dequantize(&p, &s, 2, 2048, 1.0)).expect("a valid shape");
    assert!(back.len() == x.len() && back.iter().all(|v| (v - 0.5).abs() < 0.05), "the round trip of 0.5");
    assert!(no_panic("quantize of too few values", || r::quantize(&x, 3, 2048, 1.0)).is_err());
    assert!(no_panic("quantize, k = 48", || r::quantize(&x, 1, 48, 1.0)).is_err());
    assert!(no_panic("dequantize of nothing", || r::dequantize(&[], &[], 1, 32, 1.0)).is_err());
    assert!(no_panic("dequantize, short scales", || r::dequantize(&p, &s[..s.len() - 1], 2, 2048, 1.0)).is_err());
    let mut e = Edges { state: 7 };
    for _ in 0..2000 {
        let (m, k) = (e.usize(), e.usize());
        let _ = no_panic("quantize", || r::quantize(&x, m, k, 1.0));
        let _ = no_panic("dequantize", || r::dequantize(&p, &s, m, k, 1.0));
        let _ = no_panic("scale_bytes", || r::scale_bytes(m, k));
    }
    // MLA: one request of 3 tokens on 2 pages of 2, then broken variants of it.
    let (q_nope, q_pe, kv) = (vec![0.01f32; 512], vec![0.02f32; 64], vec![0.5f32; 2 * 2 * 576]);
    let good = HostProblem { q_nope: &q_nope, q_pe: &q_pe, kv: &kv, seq_lens: &[3], page_table: &[1, 0], page_table_stride: 2, page_size: 2, num_heads: 1, s_q: 1, causal: false, sm_scale: 0.1 };
    let (out, lse) = cpu_decode(&good).expect("a valid problem");
    assert!((out[0] - 0.5).abs() < 1e-6 && lse[0].is_finite(), "{} {}", out[0], lse[0]);
    let page_size_zero = HostProblem { page_size: 0, ..good };
    assert!(no_panic("cpu_decode, page size 0", || cpu_decode(&page_size_zero)).is_err());
    let short_q = HostProblem { num_heads: 2, ..good };
    assert!(no_panic("cpu_decode, q for fewer heads", || cpu_decode(&short_q)).is_err());
    let short_table = HostProblem { page_table_stride: 3, ..good };
    assert!(no_panic("cpu_decode, page table shorter than its stride", || cpu_decode(&short_table)).is_err());
    let partial_page = HostProblem { kv: &kv[..kv.len() - 1], ..good };
    assert!(no_panic("cpu_decode, a partial page", || cpu_decode(&partial_page)).is_err());
    // Device data as the kernels read it: pages clamped into the cache, lengths to the table.
    for (pages, len) in [([-5, 99], 3), ([i32::MIN, i32::MAX], 4), ([0, 1], i32::MAX), ([1, 1], i32::MIN)] {
        let d = HostProblem { seq_lens: &[len], page_table: &pages, ..good };
        let (out, lse) = no_panic("cpu_decode of device data", || cpu_decode(&d)).expect("device data is clamped, not refused");
        if len > 0 {
            assert!((out[0] - 0.5).abs() < 1e-6 && lse[0].is_finite(), "{pages:?} {len}: {} {}", out[0], lse[0]);
        } else {
            assert!(out.iter().all(|&v| v == 0.0) && lse[0] == f32::INFINITY, "an empty request: zeros and +inf");
        }
    }
    assert!(no_panic("dequantize_ds_mla, a partial token", || dequantize_ds_mla(&[0u8; 657])).is_err());
}

/// The split-K test kernel's shape is caller input too: its fields are public `u32`s, and
/// `splits · m · 4` does not fit in 64 bits at their edges. Its workspace size is checked
/// arithmetic (no panic in debug, no wrapped size in release), and a shape whose size overflows is
/// refused, naming it.
#[test]
fn split_k_shapes_at_the_edges_of_u32_never_panic() {
    use graphsafe::ops::testing::SplitKShape;
    let edges = [0u32, 1, 2, 127, 128, 129, 65_535, 65_536, i32::MAX as u32, i32::MAX as u32 + 1, u32::MAX - 1, u32::MAX];
    for &m in &edges {
        for &k in &edges {
            for &splits in &edges {
                let shape = SplitKShape { m, k, splits };
                let bytes = no_panic(&format!("{shape:?}.workspace_bytes()"), || shape.workspace_bytes());
                // The exact size, in 128 bits: partials, rounded to 256 B, then one counter per 128 rows.
                let exact = (splits as u128 * m as u128 * 4).next_multiple_of(256) + m.div_ceil(128) as u128 * 4;
                match bytes {
                    Ok(b) => assert_eq!(b as u128, exact, "{shape:?}"),
                    Err(graphsafe::Error::InvalidArgument { what, .. }) => {
                        assert!(exact > u64::MAX as u128, "{shape:?}: refused a size that fits ({exact})");
                        assert_eq!(what, "shape");
                    }
                    Err(e) => panic!("{shape:?}: {e}"),
                }
            }
        }
    }
}

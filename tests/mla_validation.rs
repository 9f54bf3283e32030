//! Every validation rule of the MLA decode op, fed its bad value, on the CPU (no GPU: the checks
//! run on descriptors of device memory). One good argument set is mutated one field at a time.

use graphsafe::arch::{self, Op};
use graphsafe::ops::mla::{sm100, KvFormat, KvFormatKind, MlaArch, MlaDecodeArgs, MlaLimits, DS_MLA_TOKEN_BYTES};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::sys::cuda as c;
use graphsafe::Error;

mod common;
use common::Fake;

#[path = "mla_validation/fp8_caches.rs"]
mod fp8_caches;


const CTX: usize = 0x1000;
const B: usize = 4;
const PAGES: usize = 64;

fn mem(len: usize, i: u64) -> Fake {
    Fake { ptr: 0x10_0000_0000 * (i + 1), len, ctx: CTX }
}

fn good(arch: MlaArch, heads: usize, page: usize, dtype: DType) -> MlaDecodeArgs<Fake> {
    let e = dtype.size();
    let out_dt = if dtype == DType::Fp16 { DType::Fp16 } else { DType::Bf16 };
    let max_pages = 8;
    let _ = arch;
    MlaDecodeArgs::new(
        Tensor::contiguous(mem(B * heads * 512 * e, 0), dtype, &[B, heads, 512]),
        Tensor::contiguous(mem(B * heads * 64 * e, 1), dtype, &[B, heads, 64]),
        Tensor::contiguous(mem(PAGES * page * 576 * e, 2), dtype, &[PAGES, page, 576]),
        Tensor::contiguous(mem(B * 4, 3), DType::I32, &[B]),
        Tensor::contiguous(mem(B * max_pages * 4, 4), DType::I32, &[B, max_pages]),
        Tensor::contiguous(mem(B * heads * 512 * 2, 5), out_dt, &[B, heads, 512]),
    )
    .with_lse(Tensor::contiguous(mem(B * heads * 4, 6), DType::F32, &[B, heads]))
    .with_sm_scale(0.0723)
    .with_max_seq_len((max_pages * page) as u32)
}

fn plan(a: &MlaDecodeArgs<Fake>, arch: MlaArch) -> graphsafe::Result<graphsafe::ops::mla::MlaDecodePlan> {
    a.plan(arch, 132, CTX as c::CUcontext)
}

#[track_caller]
fn rejects(a: &MlaDecodeArgs<Fake>, arch: MlaArch, what: &str) {
    match plan(a, arch) {
        Err(Error::InvalidArgument { what: w, expected, got }) => {
            assert!(w.starts_with(what), "expected an error about {what}, got one about {w} (expected {expected}, got {got})");
        }
        other => panic!("expected InvalidArgument about {what}, got {other:?}"),
    }
}

#[test]
fn the_good_arguments_plan_on_both_back_ends() {
    let p = plan(&good(MlaArch::Sm90, 16, 64, DType::Bf16), MlaArch::Sm90).unwrap();
    assert_eq!((p.batch, p.num_heads, p.page_size), (4, 16, 64));
    let p = plan(&good(MlaArch::Sm100, 128, 128, DType::Fp8E4m3), MlaArch::Sm100).unwrap();
    // One split: no CUTLASS workspace, only the region the sanitized lengths and pages live in.
    let sanitize = graphsafe::ops::mla::sm100::sanitize_layout(B as i64, 8 * 128, 128, 1).unwrap();
    assert_eq!((p.num_splits, p.workspace_bytes), (1, sanitize.bytes));
    let p = plan(&good(MlaArch::Sm100, 128, 32, DType::Fp16), MlaArch::Sm100).unwrap();
    assert_eq!(p.page_size, 32);
}

#[test]
fn dtypes() {
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.dtype = DType::F32;
    rejects(&a, MlaArch::Sm90, "q_nope.dtype");
    // fp8 only on sm100.
    rejects(&good(MlaArch::Sm90, 128, 64, DType::Fp8E4m3), MlaArch::Sm90, "q_nope.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_pe.dtype = DType::Fp16;
    rejects(&a, MlaArch::Sm90, "q_pe.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.dtype = DType::Fp16;
    rejects(&a, MlaArch::Sm90, "kv_cache.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.seq_lens.dtype = DType::F32;
    rejects(&a, MlaArch::Sm90, "seq_lens.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.page_table.dtype = DType::Bf16;
    rejects(&a, MlaArch::Sm90, "page_table.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Fp16);
    a.out.dtype = DType::Bf16;
    rejects(&a, MlaArch::Sm90, "out.dtype");
    let mut a = good(MlaArch::Sm100, 128, 128, DType::Fp8E4m3);
    a.out.dtype = DType::Fp8E4m3;
    rejects(&a, MlaArch::Sm100, "out.dtype");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.lse.as_mut().unwrap().dtype = DType::Bf16;
    rejects(&a, MlaArch::Sm90, "lse.dtype");
}

#[test]
fn shapes() {
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.shape[2] = 576;
    rejects(&a, MlaArch::Sm90, "q_nope.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.shape = vec![4, 128];
    a.q_nope.strides = vec![128, 1];
    rejects(&a, MlaArch::Sm90, "q_nope.shape");
    // heads: any count up to 128 on both back-ends (sm100 pads fewer to 128 in its workspace,
    // which the plan counts: the sm100 planner's own answer for that many heads).
    for heads in [1, 3, 64, 127] {
        let p = plan(&good(MlaArch::Sm100, heads, 128, DType::Bf16), MlaArch::Sm100).unwrap();
        let shape = sm100::Shape::new(DType::Bf16, B as i64, 8 * 128, 128, 132).with_heads(heads as i64);
        let want = sm100::plan(&shape, None).unwrap();
        assert_eq!((p.num_heads as usize, p.num_splits, p.workspace_bytes), (heads, want.num_splits, want.workspace_bytes));
        assert!(want.adapted && want.workspace_bytes > sm100::plan(&sm100::Shape::new(DType::Bf16, B as i64, 8 * 128, 128, 132), None).unwrap().workspace_bytes);
    }
    rejects(&good(MlaArch::Sm100, 129, 128, DType::Bf16), MlaArch::Sm100, "q_nope.shape[1] (heads)");
    rejects(&good(MlaArch::Sm90, 144, 64, DType::Bf16), MlaArch::Sm90, "q_nope.shape[1] (heads)");
    rejects(&good(MlaArch::Sm90, 129, 64, DType::Bf16), MlaArch::Sm90, "q_nope.shape[1] (heads)");
    for heads in [1, 3, 9, 24, 63, 64, 126, 128] {
        assert_eq!(plan(&good(MlaArch::Sm90, heads, 64, DType::Bf16), MlaArch::Sm90).unwrap().num_heads as usize, heads);
    }
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.shape[0] = 0;
    rejects(&a, MlaArch::Sm90, "q_nope.shape[0]");
    let mut a = good(MlaArch::Sm90, 16, 64, DType::Bf16);
    a.q_nope.shape[0] = 65_536;
    rejects(&a, MlaArch::Sm90, "q_nope.shape[0]");
    // A cache of 2^31 tokens or more cannot be indexed.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.shape[0] = 1 << 25;
    rejects(&a, MlaArch::Sm90, "kv_cache.shape[0]");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_pe.shape[1] = 64;
    rejects(&a, MlaArch::Sm90, "q_pe.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.shape[2] = 512;
    rejects(&a, MlaArch::Sm90, "kv_cache.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.seq_lens.shape = vec![3];
    rejects(&a, MlaArch::Sm90, "seq_lens.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.page_table.shape[0] = 5;
    rejects(&a, MlaArch::Sm90, "page_table.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.out.shape[1] = 16;
    rejects(&a, MlaArch::Sm90, "out.shape");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.lse.as_mut().unwrap().shape = vec![4, 16];
    rejects(&a, MlaArch::Sm90, "lse.shape");
}

/// A decode of `s_q` query tokens a request: q and out `[B, s_q, H, D]`, lse `[B, H, s_q]`.
fn tokens(arch: MlaArch, heads: usize, s_q: usize) -> MlaDecodeArgs<Fake> {
    let a = good(arch, heads, 64, DType::Bf16);
    let rows = |i: u64, dim: usize, e: usize| Tensor::contiguous(mem(B * s_q * heads * dim * e, i), DType::Bf16, &[B, s_q, heads, dim]);
    MlaDecodeArgs::new(rows(0, 512, 2), rows(1, 64, 2), a.kv_cache, a.seq_lens, a.page_table, rows(5, 512, 2))
        .with_lse(Tensor::contiguous(mem(B * heads * s_q * 4, 6), DType::F32, &[B, heads, s_q]))
        .with_causal(true)
        .with_max_seq_len(a.max_seq_len)
}

#[test]
fn query_tokens_per_request_with_any_head_count() {
    for (heads, s_q) in [(1, 1), (3, 4), (9, 2), (63, 1), (128, 2), (128, 16), (16, 16)] {
        let p = plan(&tokens(MlaArch::Sm90, heads, s_q), MlaArch::Sm90).unwrap();
        assert_eq!((p.num_heads as usize, p.s_q as usize, p.batch as usize), (heads, s_q, B));
        // The plan is the planners' for that many rows (causal or not).
        let direct = graphsafe::ops::mla::sm90::plan(DType::Bf16, heads as i64, s_q as i64, B as i64, 8 * 64, 132, None).unwrap();
        assert_eq!((p.num_splits, p.workspace_bytes), (direct.num_splits, direct.workspace_bytes), "{heads} x {s_q}");
    }
    rejects(&tokens(MlaArch::Sm90, 16, 17), MlaArch::Sm90, "q_nope.shape[1] (s_q");
    rejects(&tokens(MlaArch::Sm90, 129, 2), MlaArch::Sm90, "q_nope.shape[2] (heads)");
    // sm_100 runs each token as a request of its own (B x s_q of them), any head count.
    for (heads, s_q) in [(128, 2), (16, 16), (1, 3)] {
        let mut a = tokens(MlaArch::Sm100, heads, s_q);
        a.kv_cache = Tensor::contiguous(mem(PAGES * 128 * 576 * 2, 2), DType::Bf16, &[PAGES, 128, 576]);
        a.max_seq_len = 8 * 128;
        let p = plan(&a, MlaArch::Sm100).unwrap();
        let shape = sm100::Shape::new(DType::Bf16, B as i64, 8 * 128, 128, 132).with_heads(heads as i64).with_s_q(s_q as i64);
        let want = sm100::plan(&shape, None).unwrap();
        assert_eq!((p.s_q as usize, p.num_splits, p.workspace_bytes), (s_q, want.num_splits, want.workspace_bytes), "{heads} x {s_q}");
        assert_eq!(want.kernel_batch as usize, B * s_q);
    }
    rejects(&tokens(MlaArch::Sm100, 16, 17), MlaArch::Sm100, "q_nope.shape[1] (s_q");
    // B x s_q kernel requests must fit CUTLASS's grid: 32767 x 2 does, 32768 x 2 does not.
    let many = |batch: usize| {
        let rows = |i: u64, dim: usize| Tensor::contiguous(mem(batch * 2 * 16 * dim * 2, i), DType::Bf16, &[batch, 2, 16, dim]);
        MlaDecodeArgs::new(
            rows(0, 512),
            rows(1, 64),
            Tensor::contiguous(mem(PAGES * 128 * 576 * 2, 2), DType::Bf16, &[PAGES, 128, 576]),
            Tensor::contiguous(mem(batch * 4, 3), DType::I32, &[batch]),
            Tensor::contiguous(mem(batch * 8 * 4, 4), DType::I32, &[batch, 8]),
            rows(5, 512),
        )
    };
    assert_eq!(plan(&many(32_767), MlaArch::Sm100).unwrap().batch, 32_767);
    rejects(&many(32_768), MlaArch::Sm100, "q_nope.shape (batch x s_q)");
    assert!(plan(&many(32_768), MlaArch::Sm90).is_ok(), "sm90 folds the tokens into its rows instead");
    // Every operand follows q's rank and shape; lse is [B, H, s_q] (FlashMLA's layout).
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.lse = Some(Tensor::contiguous(mem(B * 32 * 4, 6), DType::F32, &[B, 2, 16]));
    rejects(&a, MlaArch::Sm90, "lse.shape");
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.lse = Some(Tensor::contiguous(mem(B * 16 * 4, 6), DType::F32, &[B, 16]));
    rejects(&a, MlaArch::Sm90, "lse.shape");
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.out = Tensor::contiguous(mem(B * 16 * 512 * 2, 5), DType::Bf16, &[B, 16, 512]);
    rejects(&a, MlaArch::Sm90, "out.shape");
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.q_pe = Tensor::contiguous(mem(B * 3 * 16 * 64 * 2, 1), DType::Bf16, &[B, 3, 16, 64]);
    rejects(&a, MlaArch::Sm90, "q_pe.shape");
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.q_nope = Tensor::contiguous(mem(B * 2 * 16 * 512 * 2, 0), DType::Bf16, &[1, B, 2, 16, 512]);
    rejects(&a, MlaArch::Sm90, "q_nope.shape");
    // Output rows of two tokens may not share addresses (a token stride of 0).
    let mut a = tokens(MlaArch::Sm90, 16, 2);
    a.out.strides = vec![2 * 16 * 512, 0, 512, 1];
    rejects(&a, MlaArch::Sm90, "out");
}

/// FlashMLA's cache layout `[blocks, block_size, h_kv, 576]`: h_kv = 1 is MLA and plans like the
/// 3-D cache; any other h_kv is refused naming it.
/// What a refusal explains (`expected`), whatever it names.
#[track_caller]
fn explains<T: std::fmt::Debug>(r: graphsafe::Result<T>) -> String {
    match r {
        Err(Error::InvalidArgument { expected, .. }) => expected,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Each limit is one rule (src/ops/mla/plan.rs): the op refuses a value past it with the planners'
/// explanation, naming the tensor that carries the value instead of the scalar.
#[test]
fn the_op_explains_a_limit_as_the_planners_do() {
    let planner = |arch: MlaArch, l: MlaLimits| explains(graphsafe::ops::mla::plan(arch, &l));
    let seq = (8 * 64) as u32;
    assert_eq!(explains(plan(&good(MlaArch::Sm90, 129, 64, DType::Bf16), MlaArch::Sm90)), planner(MlaArch::Sm90, MlaLimits::new(129, 4, seq, 132)));
    assert_eq!(explains(plan(&good(MlaArch::Sm100, 129, 64, DType::Bf16), MlaArch::Sm100)), planner(MlaArch::Sm100, MlaLimits::new(129, 4, seq, 132)));
    let mut a = good(MlaArch::Sm90, 16, 64, DType::Bf16);
    a.q_nope.shape[0] = 65_536;
    assert_eq!(explains(plan(&a, MlaArch::Sm90)), planner(MlaArch::Sm90, MlaLimits::new(16, 65_536, seq, 132)));
    assert_eq!(explains(plan(&tokens(MlaArch::Sm90, 16, 17), MlaArch::Sm90)), planner(MlaArch::Sm90, MlaLimits::new(16, 4, seq, 132).with_s_q(17)));
    for (arch, page) in [(MlaArch::Sm90, 32), (MlaArch::Sm90, 256), (MlaArch::Sm100, 96), (MlaArch::Sm100, 256)] {
        let want = planner(arch, MlaLimits::new(128, 4, seq, 132).with_page_size(page as u32));
        assert_eq!(explains(plan(&good(arch, 128, page, DType::Bf16), arch)), want, "{arch:?} page {page}");
    }
}

#[test]
fn a_cache_with_a_kv_head_dimension_takes_only_one_head() {
    let three = plan(&tokens(MlaArch::Sm90, 16, 2), MlaArch::Sm90).unwrap();
    for h_kv in [1usize, 2, 3, 8] {
        let mut a = tokens(MlaArch::Sm90, 16, 2);
        a.kv_cache = Tensor::contiguous(mem(PAGES * 64 * h_kv * 576 * 2, 2), DType::Bf16, &[PAGES, 64, h_kv, 576]);
        if h_kv == 1 {
            assert_eq!(plan(&a, MlaArch::Sm90).unwrap(), three);
        } else {
            rejects(&a, MlaArch::Sm90, "kv_cache.shape[2] (h_kv");
        }
    }
}

#[test]
fn page_sizes_per_back_end() {
    rejects(&good(MlaArch::Sm90, 128, 32, DType::Bf16), MlaArch::Sm90, "kv_cache.shape[1]");
    rejects(&good(MlaArch::Sm90, 128, 256, DType::Bf16), MlaArch::Sm90, "kv_cache.shape[1]");
    rejects(&good(MlaArch::Sm100, 128, 96, DType::Bf16), MlaArch::Sm100, "kv_cache.shape[1]");
    rejects(&good(MlaArch::Sm100, 128, 256, DType::Bf16), MlaArch::Sm100, "kv_cache.shape[1]");
    for page in [1, 16, 64, 128] {
        plan(&good(MlaArch::Sm100, 128, page, DType::Bf16), MlaArch::Sm100).unwrap();
    }
}

#[test]
fn strides() {
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.strides[2] = 2;
    rejects(&a, MlaArch::Sm90, "q_nope.strides");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.strides[1] = 640; // padded rows are not supported
    rejects(&a, MlaArch::Sm90, "kv_cache.strides");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.page_table.strides[1] = 2;
    rejects(&a, MlaArch::Sm90, "page_table.strides");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.lse.as_mut().unwrap().strides = vec![256, 1];
    rejects(&a, MlaArch::Sm90, "lse.strides");
    // Overlapping page-table rows.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.page_table.strides[0] = 4;
    rejects(&a, MlaArch::Sm90, "page_table.strides[0]");
    // A head stride that breaks 16-byte alignment of rows.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.strides = vec![128 * 516, 516, 1];
    a.q_nope.mem.len = 4 * 128 * 516 * 2;
    rejects(&a, MlaArch::Sm90, "q_nope.strides[1]");
    // A padded (but aligned) head stride is fine.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_nope.strides = vec![128 * 576, 576, 1];
    a.q_nope.mem.len = 4 * 128 * 576 * 2;
    plan(&a, MlaArch::Sm90).unwrap();
}

#[test]
fn alignment() {
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.q_pe.offset = 8;
    a.q_pe.mem.len += 8;
    rejects(&a, MlaArch::Sm90, "q_pe.address");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.mem.ptr += 4;
    rejects(&a, MlaArch::Sm90, "kv_cache.address");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.out.offset = 2;
    a.out.mem.len += 2;
    rejects(&a, MlaArch::Sm90, "out.address");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.seq_lens.mem.ptr += 2;
    rejects(&a, MlaArch::Sm90, "seq_lens.address");
}

#[test]
fn bounds() {
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.kv_cache.mem.len -= 1;
    rejects(&a, MlaArch::Sm90, "kv_cache.extent");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.out.offset = 16;
    rejects(&a, MlaArch::Sm90, "out.extent");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.page_table.mem.len = 4;
    rejects(&a, MlaArch::Sm90, "page_table.extent");
    // seq_lens bound larger than the page table can address.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.max_seq_len = 8 * 64 + 1;
    rejects(&a, MlaArch::Sm90, "max_seq_len");
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.max_seq_len = 0;
    rejects(&a, MlaArch::Sm90, "max_seq_len");
}

#[test]
fn device_of_every_buffer() {
    for field in 0..7 {
        let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
        let t = match field {
            0 => &mut a.q_nope,
            1 => &mut a.q_pe,
            2 => &mut a.kv_cache,
            3 => &mut a.seq_lens,
            4 => &mut a.page_table,
            5 => &mut a.out,
            _ => a.lse.as_mut().unwrap(),
        };
        t.mem.ctx = 0x2000;
        let name = ["q_nope", "q_pe", "kv_cache", "seq_lens", "page_table", "out", "lse"][field];
        rejects(&a, MlaArch::Sm90, &format!("{name}.device"));
    }
}

#[test]
fn scale_and_splits() {
    for bad in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
        a.sm_scale = bad;
        rejects(&a, MlaArch::Sm90, "sm_scale");
    }
    // sm100: split-KV with batch > 1 is refused (the 4.2 kernel hangs).
    let mut a = good(MlaArch::Sm100, 128, 128, DType::Bf16);
    a.num_splits = Some(2);
    rejects(&a, MlaArch::Sm100, "num_splits");
    // sm90: at most one split per 64-token tile.
    let mut a = good(MlaArch::Sm90, 128, 64, DType::Bf16);
    a.num_splits = Some(9); // max_seq_len 512 = 8 tiles
    rejects(&a, MlaArch::Sm90, "num_splits");
    a.num_splits = Some(8);
    assert_eq!(plan(&a, MlaArch::Sm90).unwrap().num_splits, 8);
}

#[test]
fn arch_dispatch() {
    // A GPU no row runs on, and one whose row has no MLA kernel, from the table: a literal one
    // stops being refused the day its row or back-end is added.
    for cc in [arch::cc_without_row(), arch::cc_without(Op::Mla)] {
        assert!(matches!(MlaArch::for_compute_capability(cc), Err(Error::ArchUnsupported { .. })), "{cc:?}");
    }
    // Every GPU of a row with an MLA kernel gets that row's back-end when the build has the row,
    // and otherwise a refusal naming the row to build.
    for t in arch::TARGETS.iter().filter(|t| t.mla().is_some()) {
        for &cc in t.runs_on {
            match MlaArch::for_compute_capability(cc) {
                Ok(m) => assert!(arch::is_built(t) && t.mla() == Some(m), "{}: {m:?}", t.name),
                Err(Error::ArchUnsupported { need, .. }) => assert!(!arch::is_built(t) && need.contains(t.name), "{}: {need}", t.name),
                Err(e) => panic!("{}: {e}", t.name),
            }
        }
    }
}

#[test]
fn lengths_past_the_kernels_int32_limit_are_refused_by_the_planners() {
    // max_seq_len = 2^25 pages x 64 = 2^31 tokens: the kernels compute len + tile - 1 in int32.
    for arch in [MlaArch::Sm90, MlaArch::Sm100] {
        let mut a = good(arch, 128, 64, DType::Bf16);
        let max_pages = 1usize << 25;
        a.page_table = Tensor::contiguous(mem(B * max_pages * 4, 4), DType::I32, &[B, max_pages]);
        a.max_seq_len = (max_pages * 64) as u32;
        rejects(&a, arch, "max_seq_len");
    }
}

/// The outputs may not overlap the lengths or page indices the kernels index the cache with
/// (overwritten while other CTAs still read them, they could send a kernel out of bounds or hang
/// it), nor each other; inputs overlapping an output only change numbers and stay allowed.
#[test]
fn outputs_overlapping_what_the_kernels_trust_are_refused() {
    for arch in [MlaArch::Sm90, MlaArch::Sm100] {
        let (heads, page, dt) = if arch == MlaArch::Sm90 { (16, 64, DType::Bf16) } else { (128, 128, DType::Bf16) };
        let base = || good(arch, heads, page, dt);
        // `out` over the lengths: the same memory, at offset 0.
        let mut a = base();
        a.out = Tensor::contiguous(Fake { ptr: a.seq_lens.mem.ptr, len: 1 << 30, ctx: CTX }, a.out.dtype, &[B, heads, 512]);
        rejects(&a, arch, "out");
        // `lse` ending inside the page table.
        let mut a = base();
        let pt = a.page_table.mem.ptr;
        a.lse = Some(Tensor::contiguous(Fake { ptr: pt - 64, len: 1 << 20, ctx: CTX }, DType::F32, &[B, heads]));
        rejects(&a, arch, "lse");
        // `lse` inside `out`.
        let mut a = base();
        let o = a.out.mem.ptr;
        a.lse = Some(Tensor::contiguous(Fake { ptr: o + 256, len: 1 << 20, ctx: CTX }, DType::F32, &[B, heads]));
        rejects(&a, arch, "lse");
        // Right after the lengths (touching, not overlapping): fine.
        let mut a = base();
        let end = a.seq_lens.mem.ptr + (B * 4) as u64;
        let aligned = end.div_ceil(16) * 16;
        a.out = Tensor::contiguous(Fake { ptr: aligned, len: 1 << 30, ctx: CTX }, a.out.dtype, &[B, heads, 512]);
        plan(&a, arch).expect("an output right after the lengths");
        // An input overlapping an output: CTAs still reading it while others write would make
        // the result depend on timing (as for the per-tensor scale): refused, for each input.
        let mut a = base();
        a.q_pe = Tensor::contiguous(Fake { ptr: a.out.mem.ptr, len: 1 << 30, ctx: CTX }, dt, &[B, heads, 64]);
        rejects(&a, arch, "out");
        let mut a = base();
        let o = a.out.mem.ptr;
        a.q_nope = Tensor::contiguous(Fake { ptr: o + 1024, len: 1 << 30, ctx: CTX }, dt, &[B, heads, 512]);
        rejects(&a, arch, "out");
        let mut a = base();
        let kv = a.kv_cache.mem.ptr;
        a.lse = Some(Tensor::contiguous(Fake { ptr: kv + 4096, len: 1 << 20, ctx: CTX }, DType::F32, &[B, heads]));
        rejects(&a, arch, "lse");
    }
}

/// An `out` whose rows share addresses (a zero or too small head or batch stride): every CTA and
/// the combine would write the same bytes, the result depending on timing. Refused on both back
/// ends, whatever the split count; the good layouts and a padded one still plan.
#[test]
fn an_out_whose_rows_share_addresses_is_refused() {
    for arch in [MlaArch::Sm90, MlaArch::Sm100] {
        let (heads, page, dt) = if arch == MlaArch::Sm90 { (16, 64, DType::Bf16) } else { (128, 128, DType::Bf16) };
        let with_out = |strides: [usize; 3], len: usize| {
            let mut a = good(arch, heads, page, dt);
            a.out = Tensor { strides: strides.to_vec(), ..Tensor::contiguous(mem(len, 5), DType::Bf16, &[B, heads, 512]) };
            a.num_splits = Some(1);
            a
        };
        rejects(&with_out([0, 0, 1], 1024), arch, "out.strides");
        rejects(&with_out([heads * 512, 8, 1], B * heads * 512 * 2), arch, "out.strides");
        rejects(&with_out([512, 512, 1], (B + heads) * 512 * 2), arch, "out.strides");
        if arch == MlaArch::Sm90 {
            plan(&with_out([heads * 576, 576, 1], B * heads * 576 * 2), arch).expect("rows 576 elements apart");
        }
        plan(&with_out([heads * 512, 512, 1], B * heads * 512 * 2), arch).expect("dense rows");
    }
}

/// sm100 with split-KV: CUTLASS's split reduction writes `out` densely ([B, 128, 512], whatever
/// strides the op was given), so a strided `out` is refused whenever the plan splits: a head
/// stride below 512 would be written past the buffer's end, one above 512 over the caller's
/// columns past 512 (e.g. `out` a view of a [B, 128, 576] buffer). One split writes through the
/// strides and takes them. (Before, both planned with 8 splits.)
#[test]
fn sm100_refuses_a_strided_out_when_it_splits() {
    let one_request = |out_strides: [usize; 3], out_len: usize| {
        let mut a = good(MlaArch::Sm100, 128, 128, DType::Bf16);
        a.q_nope = Tensor::contiguous(mem(128 * 512 * 2, 0), DType::Bf16, &[1, 128, 512]);
        a.q_pe = Tensor::contiguous(mem(128 * 64 * 2, 1), DType::Bf16, &[1, 128, 64]);
        a.seq_lens = Tensor::contiguous(mem(4, 3), DType::I32, &[1]);
        a.page_table = Tensor::contiguous(mem(8 * 4, 4), DType::I32, &[1, 8]);
        a.out = Tensor::strided(mem(out_len, 5), 0, DType::Bf16, &[1, 128, 512], &out_strides);
        a.lse = Some(Tensor::contiguous(mem(128 * 4, 6), DType::F32, &[1, 128]));
        a
    };
    let dense = one_request([128 * 512, 512, 1], 128 * 512 * 2);
    assert!(plan(&dense, MlaArch::Sm100).unwrap().num_splits > 1, "the shape must split for this test");
    // A view of [1, 128, 576]: every head 576 elements apart.
    let wide = one_request([128 * 576, 576, 1], 128 * 576 * 2);
    rejects(&wide, MlaArch::Sm100, "out.strides");
    // Heads 8 elements apart (overlapping rows; the buffer holds only what the strides reach).
    let narrow = one_request([1024, 8, 1], (127 * 8 + 512) * 2);
    rejects(&narrow, MlaArch::Sm100, "out.strides");
    // One split: the kernel's own epilogue writes through the strides.
    let mut single = one_request([128 * 576, 576, 1], 128 * 576 * 2);
    single.num_splits = Some(1);
    assert_eq!(plan(&single, MlaArch::Sm100).unwrap().num_splits, 1);
    // Fewer heads: CUTLASS writes graphsafe's dense staging, the post-pass copies out through any
    // strides, so the split plan takes them.
    let mut padded = one_request([64 * 576, 576, 1], 64 * 576 * 2);
    padded.q_nope = Tensor::contiguous(mem(64 * 512 * 2, 0), DType::Bf16, &[1, 64, 512]);
    padded.q_pe = Tensor::contiguous(mem(64 * 64 * 2, 1), DType::Bf16, &[1, 64, 64]);
    padded.out = Tensor::strided(mem(64 * 576 * 2, 5), 0, DType::Bf16, &[1, 64, 512], &[64 * 576, 576, 1]);
    padded.lse = Some(Tensor::contiguous(mem(64 * 4, 6), DType::F32, &[1, 64]));
    assert!(plan(&padded, MlaArch::Sm100).unwrap().num_splits > 1);
    // sm90 writes through the strides with any split count.
    let mut sm90 = one_request([128 * 576, 576, 1], 128 * 576 * 2);
    sm90.kv_cache = Tensor::contiguous(mem(PAGES * 64 * 576 * 2, 2), DType::Bf16, &[PAGES, 64, 576]);
    sm90.page_table = Tensor::contiguous(mem(16 * 4, 4), DType::I32, &[1, 16]);
    assert!(plan(&sm90, MlaArch::Sm90).unwrap().num_splits > 1);
}

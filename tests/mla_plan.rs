//! CPU tests of the sm100 MLA planning glue against the closed form derived from CUTLASS 4.2.
//!
//! Derivation (CUTLASS 4.2.0, examples/77_blackwell_fmha):
//! * `kernel/sm100_fmha_mla_tma_warpspecialized.hpp`, `get_workspace_size`: with
//!   `is_fused_reduction == false` (graphsafe never fuses) and `split_kv > 1` the workspace is
//!   `(sizeof(ElementAcc) * D_latent + sizeof(ElementLSE)) * H * split_kv * B`; with one split, 0.
//!   ElementAcc = ElementLSE = float, D_latent = 512, H = 128: `2052 * 128 * splits * B` bytes.
//! * `kernel/sm100_fmha_mla_reduction.hpp`, `get_workspace_size`: 0. `device/sm100_mla.hpp` adds
//!   the two. The element type of q/KV does not enter.
//! * Split rule (graphsafe's, see src/ops/mla/sm100.rs): `T = ceil(seq / 128)`;
//!   `cap = 1` if `B > 1`, else `min(16, T, max(1, sm / 2))`; default `ceil(T / ceil(T / cap))`.
//!   The kernel gives split `i` the tiles `[i * ceil(T/s), min(T, (i+1) * ceil(T/s)))`.
//! * After CUTLASS's part (rounded up to 256), graphsafe's sanitize region
//!   (include/graphsafe_kernels/mla.h): i32 lengths [B], i32 kernel lengths [B], the i32 page
//!   table [B, T·128/page] and, with more than one split, an f32 LSE scratch [B, 128], each
//!   rounded up to 256. (That is a direct decode, one token of 128 heads; the shapes CUTLASS does
//!   not take are below.)

use graphsafe::ops::mla::sm100::{self, Scheduler, Shape};
use graphsafe::ops::mla::KV_DTYPES;
use graphsafe::ops::tensor::DType;
use graphsafe::Error;

fn closed_form_splits(b: i64, seq: i64, sm: i64) -> u32 {
    let t = (seq + 127) / 128;
    let cap = if b > 1 { 1 } else { 16.min(t).min((sm / 2).max(1)) };
    let per = (t + cap - 1) / cap;
    ((t + per - 1) / per) as u32
}

fn r256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

fn closed_form_sanitize(b: i64, seq: i64, page: i64, splits: u32) -> u64 {
    let (b, t) = (b as u64, (seq as u64).div_ceil(128));
    let lse = if splits > 1 { r256(4 * 128 * b) } else { 0 };
    2 * r256(4 * b) + r256(4 * b * t * (128 / page as u64)) + lse
}

fn closed_form_workspace(b: i64, seq: i64, page: i64, splits: u32) -> u64 {
    let cutlass = if splits > 1 { (4 * 512 + 4) * 128 * splits as u64 * b as u64 } else { 0 };
    r256(cutlass) + closed_form_sanitize(b, seq, page, splits)
}

const PAGES: &[i64] = &[1, 16, 64, 128];

const BATCHES: &[i64] = &[1, 2, 3, 8, 64, 128];
const SEQS: &[i64] = &[1, 127, 128, 129, 1000, 2047, 2048, 2049, 4096, 65_536, 163_840];
const SMS: &[i64] = &[1, 2, 3, 16, 20, 132, 148, 188];

#[test]
fn splits_and_workspace_match_closed_form_on_a_grid() {
    let mut checked = 0;
    for &b in BATCHES {
        for &seq in SEQS {
            for &sm in SMS {
                let splits = sm100::num_splits(b, seq, sm, None).unwrap();
                assert_eq!(splits, closed_form_splits(b, seq, sm), "splits for b={b} seq={seq} sm={sm}");
                for dtype in KV_DTYPES {
                    for &page in PAGES {
                        let ws = sm100::workspace_bytes(&Shape::new(dtype, b, seq, page, sm), splits as i64).unwrap();
                        assert_eq!(ws, closed_form_workspace(b, seq, page, splits), "workspace for {dtype} b={b} seq={seq} page={page} sm={sm}");
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 50, "grid too small: {checked}");
}

#[test]
fn workspace_for_explicit_splits_matches_closed_form() {
    for splits in 1..=16u32 {
        let ws = sm100::workspace_bytes(&Shape::new(DType::Bf16, 1, 4096, 64, 148), splits as i64).unwrap();
        assert_eq!(ws, closed_form_workspace(1, 4096, 64, splits));
    }
    for &b in &[2i64, 7] {
        assert_eq!(sm100::workspace_bytes(&Shape::new(DType::Bf16, b, 4096, 64, 148), 1).unwrap(), closed_form_workspace(b, 4096, 64, 1));
        // A count the safety rule refuses has no workspace to size: the decode would refuse it.
        assert!(matches!(sm100::workspace_bytes(&Shape::new(DType::Bf16, b, 4096, 64, 148), 2), Err(Error::InvalidArgument { .. })));
    }
}

#[test]
fn the_sanitize_layout_is_the_documented_one() {
    for &(b, seq, page, splits) in &[(1i64, 1i64, 1i64, 1i64), (1, 65_536, 64, 16), (300, 4097, 16, 1), (65_535, 128, 128, 1), (2, 129, 2, 1)] {
        let l = sm100::sanitize_layout(b, seq, page, splits).unwrap();
        let cols = (seq as u64).div_ceil(128) * (128 / page as u64);
        assert_eq!(l.columns as u64, cols);
        assert_eq!(l.lens_offset, 0);
        assert_eq!(l.kernel_lens_offset, r256(4 * b as u64));
        assert_eq!(l.page_table_offset, 2 * r256(4 * b as u64));
        assert_eq!(l.lse_offset, l.page_table_offset + r256(4 * b as u64 * cols));
        assert_eq!(l.bytes, closed_form_sanitize(b, seq, page, splits as u32));
        assert_eq!(l.bytes - l.lse_offset, if splits > 1 { r256(512 * b as u64) } else { 0 });
    }
    // CUTLASS indexes the page table with int32: batch x columns must fit.
    assert!(sm100::sanitize_layout(128, 2_147_483_520, 128, 1).is_ok());
    match sm100::sanitize_layout(129, 2_147_483_520, 128, 1) {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "batch x page-table columns"),
        other => panic!("{other:?}"),
    }
    for bad in [0i64, 3, 48, 256, -64] {
        match sm100::sanitize_layout(1, 100, bad, 1) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "page_size"),
            other => panic!("page {bad}: {other:?}"),
        }
    }
}

#[test]
fn default_rule_never_leaves_a_split_without_kv_tiles() {
    for seq in 1..=6000i64 {
        for &sm in &[2i64, 20, 148] {
            let s = sm100::num_splits(1, seq, sm, None).unwrap() as i64;
            let t = (seq + 127) / 128;
            let per = (t + s - 1) / s;
            assert!((s - 1) * per < t, "empty split: seq={seq} sm={sm} splits={s}");
            assert!(s <= 16 && s <= t && s <= (sm / 2).max(1));
        }
    }
}

#[test]
fn batch_above_one_always_gets_one_split_and_the_persistent_scheduler() {
    for &b in &BATCHES[1..] {
        let p = sm100::plan(&Shape::new(DType::Fp8E4m3, b, 163_840, 64, 148), None).unwrap();
        assert_eq!((p.num_splits, p.scheduler), (1, Scheduler::Persistent));
        assert_eq!(p.workspace_bytes, p.sanitize_bytes, "one split: only the sanitize region");
    }
    let p = sm100::plan(&Shape::new(DType::Bf16, 1, 65_536, 64, 148), None).unwrap();
    assert_eq!((p.num_splits, p.scheduler), (16, Scheduler::Individual));
}

#[test]
fn explicit_split_counts_are_checked_against_the_safety_rule() {
    assert_eq!(sm100::num_splits(1, 65_536, 148, Some(7)).unwrap(), 7);
    assert_eq!(sm100::num_splits(1, 65_536, 148, Some(16)).unwrap(), 16);
    assert_eq!(sm100::num_splits(4, 65_536, 148, Some(1)).unwrap(), 1);
    for (b, seq, sm, req) in [(1, 65_536, 148, 17), (2, 65_536, 148, 2), (1, 256, 148, 3), (1, 65_536, 8, 5), (1, 4096, 148, 0)] {
        match sm100::num_splits(b, seq, sm, Some(req)) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "num_splits"),
            other => panic!("b={b} seq={seq} sm={sm} req={req}: expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(sm100::max_safe_splits(1, 65_536, 148).unwrap(), 16);
    assert_eq!(sm100::max_safe_splits(1, 300, 148).unwrap(), 3);
    assert_eq!(sm100::max_safe_splits(1, 65_536, 9).unwrap(), 4);
    assert_eq!(sm100::max_safe_splits(2, 65_536, 148).unwrap(), 1);
}

#[test]
fn zero_or_negative_sizes_are_invalid_arguments_naming_the_argument() {
    type Case<'a> = (&'a str, Box<dyn Fn() -> graphsafe::Result<u32>>);
    let cases: [Case; 10] = [
        ("batch", Box::new(|| sm100::num_splits(65_536, 10, 10, None))),
        ("max_seq_len", Box::new(|| sm100::num_splits(1, 2_147_483_521, 10, None))),
        ("sm_count", Box::new(|| sm100::num_splits(1, 10, 1025, None))),
        ("max_batch", Box::new(|| sm100::worst_case(&Shape::new(DType::Bf16, 65_536, 10, 64, 10), None).map(|p| p.num_splits))),
        ("batch", Box::new(|| sm100::num_splits(0, 10, 10, None))),
        ("batch", Box::new(|| sm100::num_splits(-3, 10, 10, None))),
        ("max_seq_len", Box::new(|| sm100::num_splits(1, 0, 10, None))),
        ("sm_count", Box::new(|| sm100::num_splits(1, 10, -1, None))),
        ("num_splits", Box::new(|| sm100::workspace_bytes(&Shape::new(DType::Bf16, 1, 10, 64, 10), 0).map(|v| v as u32))),
        ("max_seq_len", Box::new(|| sm100::workspace_bytes(&Shape::new(DType::Bf16, 1, i64::MAX, 64, 10), 1).map(|v| v as u32))),
    ];
    for (name, f) in cases {
        match f() {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, name),
            other => panic!("{name}: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[test]
fn planner_equals_the_brute_force_maximum_over_every_shape() {
    for &(max_batch, max_seq, sm, page) in &[(4i64, 4096i64, 148i64, 64i64), (3, 2500, 20, 1), (2, 700, 3, 128), (1, 3000, 148, 16), (1, 33_000, 148, 128)] {
        let mut brute = 0u64;
        for b in 1..=max_batch {
            for seq in 1..=max_seq {
                let s = sm100::num_splits(b, seq, sm, None).unwrap();
                brute = brute.max(sm100::workspace_bytes(&Shape::new(DType::Bf16, b, seq, page, sm), s as i64).unwrap());
            }
        }
        let w = sm100::worst_case(&Shape::new(DType::Bf16, max_batch, max_seq, page, sm), None).unwrap();
        assert_eq!(w.workspace_bytes, brute, "max_batch={max_batch} max_seq={max_seq} sm={sm} page={page}");
        // The reported shape really needs that much.
        let again = sm100::plan(&Shape::new(DType::Bf16, w.batch as i64, w.max_seq_len as i64, page, sm), None).unwrap();
        assert_eq!(again.workspace_bytes, w.workspace_bytes);
    }
}

#[test]
fn worst_case_is_not_always_at_the_longest_sequence() {
    // 2048 tokens = 16 tiles → 16 splits; 2176 tokens = 17 tiles → 9 balanced splits. With
    // 128-token pages the page table grows by one column: not enough to make up 7 splits.
    let at_max = sm100::plan(&Shape::new(DType::Bf16, 1, 2176, 128, 148), None).unwrap();
    let w = sm100::worst_case(&Shape::new(DType::Bf16, 1, 2176, 128, 148), None).unwrap();
    assert_eq!(at_max.num_splits, 9);
    assert_eq!((w.num_splits, w.max_seq_len), (16, 2048));
    assert!(w.workspace_bytes > at_max.workspace_bytes);
}

#[test]
fn explicit_splits_enter_the_worst_case() {
    // The default would pick 16 at 65536 tokens; an engine that always asks for 4 needs less,
    // and one that asks for 16 at batch 1 needs exactly the batch-1 row.
    let w4 = sm100::worst_case(&Shape::new(DType::Bf16, 1, 65_536, 64, 148), Some(4)).unwrap();
    assert_eq!((w4.num_splits, w4.workspace_bytes), (4, closed_form_workspace(1, 65_536, 64, 4)));
    // One split is allowed for every batch: the largest batch needs the most.
    let w1 = sm100::worst_case(&Shape::new(DType::Bf16, 64, 65_536, 64, 148), Some(1)).unwrap();
    assert_eq!((w1.batch, w1.workspace_bytes), (64, closed_form_workspace(64, 65_536, 64, 1)));
    // More than one split only exists for batch 1; more than the cap for no shape at all.
    let w = sm100::worst_case(&Shape::new(DType::Bf16, 64, 65_536, 64, 148), Some(8)).unwrap();
    assert_eq!((w.batch, w.num_splits), (1, 8));
    match sm100::worst_case(&Shape::new(DType::Bf16, 64, 65_536, 64, 148), Some(17)) {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "num_splits"),
        other => panic!("{other:?}"),
    }
}

// ---- sm100: shapes CUTLASS does not take ---------------------------------------------------------
// CUTLASS runs one token of 128 heads a request (include/graphsafe_kernels/mla.h, "the shapes
// graphsafe adapts"): s_q tokens run as B' = B·s_q requests (the split rule sees B'), fewer heads
// are padded. An adapted decode's region adds, after the page table: the LSE staging [B', 128] f32
// (also the split scratch), the q staging [B', 128, 576] in q's element size and the out staging
// [B', 128, 512] 16-bit, each rounded up to 256.

fn closed_form_adapted(elem: u64, kb: u64, seq: i64, page: i64, splits: u32) -> u64 {
    let cutlass = if splits > 1 { (4 * 512 + 4) * 128 * splits as u64 * kb } else { 0 };
    let t = (seq as u64).div_ceil(128);
    r256(cutlass) + 2 * r256(4 * kb) + r256(4 * kb * t * (128 / page as u64)) + r256(512 * kb) + r256(kb * 128 * 576 * elem) + r256(kb * 128 * 512 * 2)
}

#[test]
fn padded_heads_and_expanded_tokens_match_the_closed_form() {
    let mut checked = 0;
    for &b in &[1i64, 2, 3, 64, 128] {
        for &(h, s_q) in &[(1i64, 1i64), (16, 1), (127, 1), (128, 2), (64, 4), (3, 16), (16, 2)] {
            for &seq in &[1i64, 129, 4096, 65_536] {
                for &page in &[16i64, 128] {
                    for dtype in KV_DTYPES {
                        let shape = Shape::new(dtype, b, seq, page, 148).with_heads(h).with_s_q(s_q);
                        let p = sm100::plan(&shape, None).unwrap();
                        let kb = (b * s_q) as u64;
                        assert_eq!((p.kernel_batch as u64, p.adapted), (kb, true), "{shape:?}");
                        // The split rule is CUTLASS's, for its B' requests: only one request of one
                        // token ever splits.
                        assert_eq!(p.num_splits, closed_form_splits(kb as i64, seq, 148), "{shape:?}");
                        let elem = dtype.size() as u64;
                        assert_eq!(p.workspace_bytes, closed_form_adapted(elem, kb, seq, page, p.num_splits), "{shape:?}");
                        // Padding costs the same whatever the head count: CUTLASS computes 128.
                        let h2 = shape.with_heads(if h == 1 { 2 } else { 1 });
                        if s_q > 1 || h2.num_heads != 128 {
                            assert_eq!(sm100::plan(&h2, None).unwrap().workspace_bytes, p.workspace_bytes, "{shape:?}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 800, "{checked}");
}

#[test]
fn the_adapted_region_is_the_documented_one() {
    for (dtype, b, h, s_q, seq, page, splits) in [(DType::Bf16, 3i64, 16i64, 2i64, 1000i64, 64i64, 1i64), (DType::Fp8E4m3, 1, 1, 1, 65_536, 128, 16), (DType::Fp16, 300, 128, 3, 129, 16, 1)] {
        let shape = Shape::new(dtype, b, seq, page, 148).with_heads(h).with_s_q(s_q);
        let l = sm100::layout(&shape, splits).unwrap();
        let (kb, e) = ((b * s_q) as u64, dtype.size() as u64);
        let cols = (seq as u64).div_ceil(128) * (128 / page as u64);
        assert_eq!((l.kernel_batch as u64, l.adapted, l.columns as u64), (kb, true, cols));
        assert_eq!(l.lens_offset, 0);
        assert_eq!(l.kernel_lens_offset, r256(4 * kb));
        assert_eq!(l.page_table_offset, 2 * r256(4 * kb));
        assert_eq!(l.lse_offset, l.page_table_offset + r256(4 * kb * cols));
        assert_eq!(l.q_offset, l.lse_offset + r256(512 * kb));
        assert_eq!(l.out_offset, l.q_offset + r256(kb * 128 * 576 * e));
        assert_eq!(l.bytes, l.out_offset + r256(kb * 128 * 512 * 2));
        // 16-byte aligned staging: CUTLASS builds tensor maps over it.
        assert!(l.q_offset % 256 == 0 && l.out_offset % 256 == 0);
    }
    // A direct decode (one token of 128 heads) has no staging: the parts after the page table are
    // empty, except the split scratch.
    let direct = sm100::layout(&Shape::new(DType::Bf16, 4, 1000, 64, 148), 1).unwrap();
    assert!(!direct.adapted);
    assert_eq!((direct.lse_offset, direct.q_offset, direct.out_offset), (direct.bytes, direct.bytes, direct.bytes));
    assert_eq!(direct, sm100::sanitize_layout(4, 1000, 64, 1).unwrap());
}

#[test]
fn expanded_tokens_past_cutlass_batch_limit_are_refused_by_name() {
    // 65535 = 3 x 5 x 17 x 257: 13107 requests of 5 tokens fit exactly, one more does not.
    let sh = |b: i64, s_q: i64| Shape::new(DType::Bf16, b, 128, 128, 148).with_heads(8).with_s_q(s_q);
    let fits = sh(13_107, 5);
    assert_eq!(sm100::plan(&fits, None).unwrap().kernel_batch, 65_535);
    for shape in [sh(13_108, 5), sh(65_535, 2)] {
        match sm100::plan(&shape, None) {
            Err(Error::InvalidArgument { what, got, .. }) => assert!(what == "batch x s_q" && got.contains(&(shape.batch * shape.s_q).to_string()), "{what}: {got}"),
            other => panic!("{shape:?}: {other:?}"),
        }
        assert!(sm100::worst_case(&shape, None).is_err());
    }
    // The page table's int32 indexing counts kernel requests too.
    // (128 requests of the longest length fill it exactly: 128 x 16777215 columns.)
    let wide = Shape::new(DType::Bf16, 128, 2_147_483_520, 128, 148).with_s_q(2);
    match sm100::plan(&wide, None) {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "batch x s_q x page-table columns"),
        other => panic!("{other:?}"),
    }
    assert!(sm100::plan(&wide.with_s_q(1), None).is_ok());
    for (shape, what) in [(fits.with_heads(0), "num_heads"), (fits.with_heads(129), "num_heads"), (fits.with_s_q(17), "s_q"), (fits.with_s_q(0), "s_q")] {
        match sm100::plan(&shape, None) {
            Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{shape:?}: {other:?}"),
        }
    }
}

/// The worst case over batches, token counts and lengths equals the brute-force maximum, with
/// padded heads and expanded tokens: fewer tokens can need more (one request of one token splits).
#[test]
fn adapted_worst_case_equals_the_brute_force_maximum() {
    for &(max_batch, h, s_q, max_seq, sm, page) in &[(3i64, 16i64, 2i64, 2500i64, 148i64, 64i64), (2, 128, 3, 1200, 20, 16), (1, 1, 4, 3000, 148, 128), (4, 127, 1, 900, 8, 1)] {
        let mut brute = 0u64;
        for b in 1..=max_batch {
            for s in 1..=s_q {
                for seq in 1..=max_seq {
                    let shape = Shape::new(DType::Bf16, b, seq, page, sm).with_heads(h).with_s_q(s);
                    brute = brute.max(sm100::plan(&shape, None).unwrap().workspace_bytes);
                }
            }
        }
        let limits = Shape::new(DType::Bf16, max_batch, max_seq, page, sm).with_heads(h).with_s_q(s_q);
        let w = sm100::worst_case(&limits, None).unwrap();
        assert_eq!(w.workspace_bytes, brute, "{limits:?}");
        let again = sm100::plan(&Shape::new(DType::Bf16, w.batch as i64, w.max_seq_len as i64, page, sm).with_heads(h).with_s_q(w.s_q as i64), None).unwrap();
        assert_eq!(again.workspace_bytes, w.workspace_bytes, "{limits:?}: the reported shape needs it");
    }
    // One request of 16 heads splits 16 ways at 65536 tokens: more than 2 such requests of 2 tokens.
    let limits = Shape::new(DType::Bf16, 1, 65_536, 128, 148).with_heads(16).with_s_q(2);
    let w = sm100::worst_case(&limits, None).unwrap();
    assert_eq!((w.s_q, w.num_splits), (1, 16));
}

// ---- graphsafe's sm90 kernel ------------------------------------------------------------------
// Closed form (cuda-src/mla/sm90/plan.cu): R = s_q·heads query rows; T = ceil(seq/64);
// C = B·ceil(R/64); cap = max(1, min(256, T, ceil(2·sm/C))); splits = the smallest s in 1..=cap
// minimising ceil(C·s/sm)·ceil(T/s). Workspace: for splits > 1 round256(4·B·s·R·512) +
// round256(4·B·s·R) (partials), then for B > 1 round256(4·B) + round256(4·B·s) (the schedule).

use graphsafe::ops::mla::sm90;

fn sm90_closed_form(b: i64, h: i64, s_q: i64, seq: i64, sm: i64) -> (u32, u64) {
    let cd = |a: i64, d: i64| (a + d - 1) / d;
    let t = cd(seq, 64);
    let c = b * cd(s_q * h, 64);
    let cap = cd(2 * sm, c).min(t).clamp(1, 256);
    let s = (1..=cap).min_by_key(|&s| (cd(c * s, sm) * cd(t, s), s)).unwrap();
    let r = |x: u64| x.div_ceil(256) * 256;
    let rows = (b * s * s_q * h) as u64;
    let partials = if s > 1 { r(rows * 512 * 4) + r(rows * 4) } else { 0 };
    let schedule = if b > 1 { r(4 * b as u64) + r(4 * (b * s) as u64) } else { 0 };
    (s as u32, partials + schedule)
}

#[test]
fn sm90_splits_and_workspace_match_closed_form_on_a_grid() {
    let mut n = 0;
    for &b in &[1i64, 2, 3, 8, 64, 128, 300] {
        for &(h, s_q) in &[(16i64, 1i64), (32, 1), (64, 1), (80, 1), (128, 1), (1, 1), (3, 4), (9, 2), (63, 1), (126, 1), (16, 2), (64, 2), (128, 2), (128, 16), (7, 16)] {
            for &seq in &[1i64, 63, 64, 65, 1000, 4096, 8192, 65_536] {
                for &sm in &[1i64, 8, 132] {
                    let p = sm90::plan(DType::Bf16, h, s_q, b, seq, sm, None).unwrap();
                    assert_eq!((p.num_splits, p.workspace_bytes), sm90_closed_form(b, h, s_q, seq, sm), "b={b} h={h} s_q={s_q} seq={seq} sm={sm}");
                    n += 1;
                }
            }
        }
    }
    assert!(n >= 2500);
}

#[test]
fn sm90_default_never_leaves_a_split_empty_at_the_longest_length() {
    for seq in (1..=20_000i64).step_by(37) {
        for &(b, h, s_q, sm) in &[(1i64, 16i64, 1i64, 132i64), (1, 128, 1, 132), (3, 64, 1, 20), (2, 16, 1, 8), (1, 3, 2, 132), (5, 128, 2, 132)] {
            let s = sm90::num_splits(b, h, s_q, seq, sm, None).unwrap() as i64;
            let t = (seq + 63) / 64;
            let per = (t + s - 1) / s;
            assert!((s - 1) * per < t, "seq={seq} b={b} h={h} s_q={s_q} sm={sm}: {s} splits leave one empty");
        }
    }
}

#[test]
fn sm90_rules_and_errors() {
    assert_eq!(sm90::num_splits(1, 128, 1, 4096, 132, Some(64)).unwrap(), 64);
    // Any head count 1..=128 and 1..=16 query tokens plan.
    for h in 1..=128 {
        for s_q in [1, 2, 5, 16] {
            assert!(sm90::num_splits(3, h, s_q, 1000, 132, None).is_ok(), "{h} heads x {s_q} tokens");
        }
    }
    for (b, h, s_q, seq, sm, req, what) in [
        (1, 128, 1, 4096, 132, Some(65), "num_splits"),
        (1, 128, 1, 64, 132, Some(2), "num_splits"),
        (1, 129, 1, 64, 132, None, "num_heads"),
        (1, 0, 1, 64, 132, None, "num_heads"),
        (1, 16, 0, 64, 132, None, "s_q"),
        (1, 16, 17, 64, 132, None, "s_q"),
        (0, 128, 1, 64, 132, None, "batch"),
        (1, 128, 1, 0, 132, None, "max_seq_len"),
        (1, 128, 1, 64, 0, None, "sm_count"),
    ] {
        match sm90::num_splits(b, h, s_q, seq, sm, req) {
            Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{b} {h} {s_q} {seq} {sm} {req:?}: {other:?}"),
        }
    }
    assert!(matches!(sm90::plan(DType::Fp8E4m3, 128, 1, 1, 64, 132, None), Err(Error::InvalidArgument { .. })));
}

/// The worst case equals the maximum over every batch, length and token count up to the limits:
/// fewer tokens can need more (more splits fit), so a capture of any s_q' <= s_q is covered.
#[test]
fn sm90_planner_equals_the_brute_force_maximum() {
    for &(max_batch, heads, s_q, max_seq, sm) in &[(4i64, 128i64, 1i64, 3000i64, 132i64), (3, 16, 1, 2000, 8), (2, 64, 1, 700, 132), (3, 64, 3, 1500, 132), (2, 9, 16, 900, 132), (2, 128, 2, 2100, 20)] {
        let mut brute = 0u64;
        for b in 1..=max_batch {
            for seq in 1..=max_seq {
                for s in 1..=s_q {
                    brute = brute.max(sm90::plan(DType::Fp16, heads, s, b, seq, sm, None).unwrap().workspace_bytes);
                }
            }
        }
        assert_eq!(sm90::worst_case(DType::Fp16, heads, s_q, max_batch, max_seq, sm, None).unwrap().workspace_bytes, brute, "{max_batch} {heads} {s_q} {max_seq} {sm}");
    }
}

/// Each MLA limit is one rule (src/ops/mla/plan.rs) over the glue header's constants: the planners
/// of both back-ends and the C ABI refuse a value past it with the same message, and the glue
/// draws the line where Rust does.
mod one_rule_per_limit {
    use graphsafe::capi::*;
    use graphsafe::ops::mla::{self, sm100, sm90, MlaArch, MlaLimits, MAX_BATCH, MAX_S_Q, NUM_HEADS};
    use graphsafe::ops::tensor::DType;
    use graphsafe::sys::kernels as k;
    use graphsafe::Error;

    const GS_OK: i32 = k::GsStatus::GS_OK.0 as i32;

    fn expected(r: graphsafe::Result<impl std::fmt::Debug>) -> (String, String) {
        match r {
            Err(Error::InvalidArgument { what, expected, .. }) => (what, expected),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    /// The C ABI's refusal of `l` and its last-error text.
    fn c_refusal(l: &GraphsafeMlaLimits) -> String {
        let mut out = GraphsafeMlaPlan::default();
        // SAFETY: a live limits value and a live out-value.
        let r = unsafe { graphsafe_mla_plan_limits(l, &mut out) };
        assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT, "{l:?}");
        // SAFETY: graphsafe_last_error's text is valid until this thread's next failing call.
        unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn the_planners_and_the_c_abi_refuse_with_one_message() {
        let arches = [(MlaArch::Sm90, GRAPHSAFE_ARCH_SM90), (MlaArch::Sm100, GRAPHSAFE_ARCH_SM100)];
        let over_heads = NUM_HEADS as u32 + 1;
        let over_s_q = MAX_S_Q as u32 + 1;
        let over_batch = MAX_BATCH as u32 + 1;
        for (arch, abi) in arches {
            let base = MlaLimits::new(16, 4, 4096, 132);
            let c = GraphsafeMlaLimits { arch: abi, dtype: GRAPHSAFE_DTYPE_BF16, num_heads: 16, s_q: 1, batch: 4, max_seq_len: 4096, page_size: 64, sm_count: 132, ..Default::default() };
            let cases = [
                (MlaLimits::new(over_heads, 4, 4096, 132), GraphsafeMlaLimits { num_heads: over_heads as i32, ..c }, "num_heads"),
                (MlaLimits::new(0, 4, 4096, 132), GraphsafeMlaLimits { num_heads: 0, ..c }, "num_heads"),
                (base.with_s_q(over_s_q), GraphsafeMlaLimits { s_q: over_s_q as i32, ..c }, "s_q"),
                (MlaLimits::new(16, over_batch, 4096, 132), GraphsafeMlaLimits { batch: over_batch as i32, ..c }, "batch"),
                (base.with_page_size(48), GraphsafeMlaLimits { page_size: 48, ..c }, "page_size"),
                (base.with_page_size(256), GraphsafeMlaLimits { page_size: 256, ..c }, "page_size"),
            ];
            for (rust, abi_limits, field) in cases {
                let err = mla::plan(arch, &rust).unwrap_err();
                let (what, says) = expected(Err::<(), _>(err.clone()));
                assert_eq!(what, field, "{arch:?} {rust:?}");
                let text = c_refusal(&abi_limits);
                assert!(text.contains(&err.to_string()), "{arch:?}: the C ABI said {text:?}, the planner {err}");
                // The worst case checks the same rules first (naming a batch bound `max_batch`).
                assert_eq!(expected(mla::worst_case(arch, &rust)).1, says);
            }
        }
        // The back-ends' own planners share the rule, message included.
        let plan_says = |l: MlaLimits| expected(mla::plan(MlaArch::Sm90, &l));
        assert_eq!(expected(sm90::num_splits(4, over_heads.into(), 1, 4096, 132, None)), plan_says(MlaLimits::new(over_heads, 4, 4096, 132)));
        assert_eq!(expected(sm90::workspace_bytes(4, 16, over_s_q.into(), 1)), plan_says(MlaLimits::new(16, 4, 4096, 132).with_s_q(over_s_q)));
        assert_eq!(expected(sm90::num_splits(over_batch.into(), 16, 1, 4096, 132, None)), plan_says(MlaLimits::new(16, over_batch, 4096, 132)));
        let shape = sm100::Shape::new(DType::Bf16, 4, 4096, 64, 148);
        let plan100 = |l: MlaLimits| expected(mla::plan(MlaArch::Sm100, &l));
        assert_eq!(expected(sm100::plan(&shape.with_heads(over_heads.into()), None)), plan100(MlaLimits::new(over_heads, 4, 4096, 148)));
        assert_eq!(expected(sm100::plan(&shape.with_s_q(over_s_q.into()), None)), plan100(MlaLimits::new(16, 4, 4096, 148).with_s_q(over_s_q)));
        assert_eq!(expected(sm100::check_page_size(96)), plan100(MlaLimits::new(16, 4, 4096, 148).with_page_size(96)));
    }

    #[test]
    fn page_sizes_are_the_headers_bounds() {
        let takes = |arch: MlaArch| -> Vec<u32> { (0..=1024).filter(|&p| mla::plan(arch, &MlaLimits::new(16, 4, 4096, 132).with_page_size(p)).is_ok()).collect() };
        assert_eq!(takes(MlaArch::Sm90), [k::GS_MLA_SM90_MIN_PAGE_SIZE, k::GS_MLA_SM90_MAX_PAGE_SIZE]);
        assert_eq!((k::GS_MLA_SM90_MIN_PAGE_SIZE, k::GS_MLA_SM90_MAX_PAGE_SIZE), (64, 128), "the sm90 kernels' loaders read pages of 64 or 128 tokens");
        let sm100: Vec<u32> = (0..=k::GS_MLA_SM100_MAX_PAGE_SIZE.ilog2()).map(|e| 1 << e).collect();
        assert_eq!(takes(MlaArch::Sm100), sm100);
        // The glue's layout takes exactly the page sizes Rust does.
        for p in 0..=1024 {
            let g = k::GsMlaSm100Shape { dtype: k::GsDtype::GS_DTYPE_BF16.0 as i32, batch: 4, num_heads: 16, s_q: 1, max_seq_len: 4096, page_size: p, sm_count: 148, num_splits: 1 };
            let mut l = k::GsMlaSanitizeLayout::default();
            // SAFETY: live shape and out-values.
            let glue = unsafe { k::gs_mla_sanitize_layout(&g, &mut l) };
            assert_eq!(glue == GS_OK, sm100::check_page_size(p.into()).is_ok(), "page size {p}: glue {glue}");
        }
    }

    #[test]
    fn the_sm90_split_cap_is_the_headers_and_the_glues() {
        assert_eq!(sm90::MAX_SPLITS, i64::from(k::GS_MLA_SM90_MAX_SPLITS));
        // Long enough for every split count to have a tile.
        let seq = (sm90::MAX_SPLITS + 1) * i64::from(sm90::TILE_S);
        assert_eq!(sm90::num_splits(1, 128, 1, seq, 132, Some(sm90::MAX_SPLITS)).unwrap() as i64, sm90::MAX_SPLITS);
        assert_eq!(expected(sm90::num_splits(1, 128, 1, seq, 132, Some(sm90::MAX_SPLITS + 1))).0, "num_splits");
        assert_eq!(expected(sm90::workspace_bytes(1, 128, 1, sm90::MAX_SPLITS + 1)).0, "num_splits");
        // The glue draws the same line when called directly.
        for (splits, ok) in [(sm90::MAX_SPLITS as i32, true), (sm90::MAX_SPLITS as i32 + 1, false)] {
            let (mut n, mut bytes) = (0, 0u64);
            // SAFETY: live out-values.
            let r = unsafe { k::gs_mla_sm90_num_splits(1, 128, 1, seq as i32, 132, splits, &mut n) };
            assert_eq!(r == GS_OK, ok, "{splits} splits");
            // SAFETY: as above.
            let r = unsafe { k::gs_mla_sm90_workspace_bytes(1, 128, 1, splits, &mut bytes) };
            assert_eq!(r == GS_OK, ok, "{splits} splits");
        }
        // The same for the batch limit, on both back-ends' planning glue.
        let mut n = 0;
        // SAFETY: live out-values.
        assert_eq!(unsafe { k::gs_mla_sm90_num_splits(MAX_BATCH as i32, 16, 1, 4096, 132, 0, &mut n) }, GS_OK);
        // SAFETY: as above.
        assert_ne!(unsafe { k::gs_mla_sm90_num_splits(MAX_BATCH as i32 + 1, 16, 1, 4096, 132, 0, &mut n) }, GS_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { k::gs_mla_sm100_num_splits(MAX_BATCH as i32, 4096, 148, 0, &mut n) }, GS_OK);
        // SAFETY: as above.
        assert_ne!(unsafe { k::gs_mla_sm100_num_splits(MAX_BATCH as i32 + 1, 4096, 148, 0, &mut n) }, GS_OK);
    }
}

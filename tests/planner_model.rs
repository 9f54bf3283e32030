//! Every planner output against an exact model, over generated and edge inputs.
//!
//! The model is written here from the documented rules, in u128 (so nothing in it can wrap), and
//! never calls the code under test:
//! * sm100 splits: graphsafe's safety rule (src/ops/mla/sm100.rs): `T = ceil(seq/128)`,
//!   `cap = 1` for batch > 1 else `min(16, T, max(1, sm/2))`, default `ceil(T / ceil(T / cap))`,
//!   an explicit count allowed in `1..=cap`;
//! * sm100 workspace: CUTLASS runs `B' = B·s_q` requests of 128 heads (include/graphsafe_kernels/mla.h,
//!   "the shapes graphsafe adapts"); CUTLASS 4.2's `get_workspace_size`
//!   (kernel/sm100_fmha_mla_tma_warpspecialized.hpp, non-fused): `(sizeof(float)·512 + sizeof(float))·128·splits·B'`
//!   for splits > 1, else 0; the reduction kernel adds 0; then graphsafe's region: lengths, page
//!   table, an LSE part `[B', 128]` f32 when adapted (heads < 128 or s_q > 1) or split, and when
//!   adapted the q staging `[B', 128, 576]` (q's element size) and out staging `[B', 128, 512]`
//!   (2 bytes), each part rounded up to 256;
//! * sm90: the rule and layout written in cuda-src/mla/sm90/plan.cu;
//! * NVFP4: the scale-factor size and the 128x4 swizzle in include/graphsafe_kernels/nvfp4.h;
//! * the limits the decode accepts (batch ≤ 65535, on sm100 also batch·s_q, max_seq_len ≤ 2^31 − 128, sm_count ≤ 1024,
//!   CUTLASS's int32 page-table and scale-factor indexing).
//!
//! Worst cases are compared with the maximum of the model over every shape of small domains
//! (every length, or every tile count, which the rules are functions of), and on large domains
//! (up to the limits) checked to be a real shape of the domain that no sampled or listed shape
//! needs more than: no pre-grow below a printed row.

use graphsafe::ops::mla::{sm100, sm90, MAX_BATCH, MAX_SEQ_LEN, MAX_SM_COUNT};
use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Tile};
use graphsafe::ops::tensor::DType;
use graphsafe::sys::kernels as k;
use graphsafe::Error;
#[path = "planner_model/worst_cases.rs"]
mod worst_cases;
#[path = "planner_model/nvfp4_sizes.rs"]
mod nvfp4_sizes;

// ---- deterministic inputs ---------------------------------------------------------------------

/// splitmix64: a fixed seed gives the same cases on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A value in lo..=hi: an edge value half the time (the ends, 0/1 away from powers of two),
    /// else log-uniform, so small and huge values are both common.
    fn pick(&mut self, lo: i64, hi: i64) -> i64 {
        let e = edges(lo, hi);
        if self.below(2) == 0 {
            return e[self.below(e.len() as u64) as usize];
        }
        let bits = 64 - ((hi - lo) as u64).leading_zeros() as u64;
        let span = 1u64 << self.below(bits + 1).min(63);
        lo + (self.next() % span.min((hi - lo) as u64 + 1)) as i64
    }
    /// Usually in range, sometimes just outside or far outside it.
    fn pick_or_out(&mut self, lo: i64, hi: i64) -> i64 {
        match self.below(40) {
            0 => lo - 1,
            1 => hi + 1,
            2 => [0, -1, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN][self.below(6) as usize],
            _ => self.pick(lo, hi),
        }
    }
}

/// 0, 1, powers of two ± 1 and the limits, clipped to lo..=hi.
fn edges(lo: i64, hi: i64) -> Vec<i64> {
    let mut v = vec![lo, lo + 1, hi, hi - 1, 0, 1, 2];
    for p in 1..63 {
        let x = 1i64 << p;
        v.extend([x - 1, x, x + 1]);
    }
    v.retain(|&x| (lo..=hi).contains(&x));
    v.sort();
    v.dedup();
    v
}

fn div_up(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

fn r256(x: u128) -> u128 {
    div_up(x, 256) * 256
}

fn invalid<T: std::fmt::Debug>(r: graphsafe::Result<T>, ctx: &str) {
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{ctx}: expected InvalidArgument, got {r:?}");
}

// ---- the sm100 model --------------------------------------------------------------------------

const I32_MAX: u128 = i32::MAX as u128;

fn limits_ok(b: i64, seq: i64, sm: i64) -> bool {
    (1..=65_535).contains(&b) && (1..=2_147_483_520).contains(&seq) && (1..=1024).contains(&sm)
}

/// Heads and tokens of an sm100 decode: (heads, s_q).
type Hq = (i64, i64);

/// CUTLASS runs one token of 128 heads a request: B' = batch × s_q requests (at most 65535), the
/// decode adapted (staging copies) unless it is exactly that.
fn m100_kernel_batch(b: i64, (h, s_q): Hq) -> Option<i64> {
    (heads_ok(h) && s_q_ok(s_q) && (1..=65_535).contains(&b) && b * s_q <= 65_535).then(|| b * s_q)
}

fn m100_adapted((h, s_q): Hq) -> bool {
    h != 128 || s_q != 1
}

fn m100_cap(b: i64, seq: i64, sm: i64) -> u128 {
    if b > 1 {
        return 1;
    }
    let t = div_up(seq as u128, 128);
    16u128.min(t).min((sm as u128 / 2).max(1))
}

/// The split count the rule gives for `kb` kernel requests, or None when it refuses the request.
fn m100_splits(kb: i64, seq: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let cap = m100_cap(kb, seq, sm);
    match req {
        Some(r) => (r >= 1 && r as u128 <= cap).then_some(r as u128),
        None => {
            let t = div_up(seq as u128, 128);
            Some(div_up(t, div_up(t, cap)))
        }
    }
}

/// (lens, kernel lens, page table, lse, q staging, out staging, bytes, columns) for `kb` kernel
/// requests of q elements of `elem` bytes, or None when kb × columns does not fit int32.
fn m100_layout(elem: u128, kb: i64, adapted: bool, seq: i64, page: i64, splits: u128) -> Option<[u128; 8]> {
    let kb = kb as u128;
    let cols = div_up(seq as u128, 128) * (128 / page as u128);
    if kb * cols > I32_MAX {
        return None;
    }
    let lens = 0;
    let klens = lens + r256(4 * kb);
    let pt = klens + r256(4 * kb);
    let lse = pt + r256(4 * kb * cols);
    let q = lse + if adapted || splits > 1 { r256(4 * 128 * kb) } else { 0 };
    let out = q + if adapted { r256(kb * 128 * 576 * elem) } else { 0 };
    let bytes = out + if adapted { r256(kb * 128 * 512 * 2) } else { 0 };
    Some([lens, klens, pt, lse, q, out, bytes, cols])
}

fn m100_workspace(elem: u128, kb: i64, adapted: bool, seq: i64, page: i64, splits: u128) -> Option<u128> {
    let cutlass = if splits > 1 { (4 * 512 + 4) * 128 * splits * kb as u128 } else { 0 };
    Some(r256(cutlass) + m100_layout(elem, kb, adapted, seq, page, splits)?[6])
}

fn page_ok(p: i64) -> bool {
    (1..=128).contains(&p) && p & (p - 1) == 0
}

fn elem_of(dtype: DType) -> u128 {
    if dtype == DType::Fp8E4m3 {
        1
    } else {
        2
    }
}

/// The whole model plan: (splits, workspace), or None when the planner must refuse.
fn m100_plan(dtype: DType, b: i64, hq: Hq, seq: i64, page: i64, sm: i64, req: Option<i64>) -> Option<(u128, u128)> {
    if !limits_ok(b, seq, sm) || !page_ok(page) {
        return None;
    }
    let kb = m100_kernel_batch(b, hq)?;
    let s = m100_splits(kb, seq, sm, req)?;
    Some((s, m100_workspace(elem_of(dtype), kb, m100_adapted(hq), seq, page, s)?))
}

fn shape(dtype: DType, b: i64, (h, s_q): Hq, seq: i64, page: i64, sm: i64) -> sm100::Shape {
    sm100::Shape::new(dtype, b, seq, page, sm).with_heads(h).with_s_q(s_q)
}

fn check_sm100(b: i64, hq: Hq, seq: i64, page: i64, sm: i64, req: Option<i64>) {
    let ctx = format!("sm100 b={b} (heads, s_q)={hq:?} seq={seq} page={page} sm={sm} req={req:?}");
    for dtype in [DType::Bf16, DType::Fp8E4m3] {
        let got = sm100::plan(&shape(dtype, b, hq, seq, page, sm), req);
        match m100_plan(dtype, b, hq, seq, page, sm, req) {
            None => invalid(got, &ctx),
            Some((s, ws)) => {
                let p = got.unwrap_or_else(|e| panic!("{ctx} {dtype}: {e}"));
                assert_eq!((p.num_splits as u128, p.workspace_bytes as u128), (s, ws), "{ctx} {dtype}");
                let kb = b * hq.1;
                assert_eq!((p.kernel_batch as i64, p.adapted), (kb, m100_adapted(hq)), "{ctx}");
                let sched = if s == 1 { sm100::Scheduler::Persistent } else { sm100::Scheduler::Individual };
                assert_eq!(p.scheduler, sched, "{ctx}");
                let l = sm100::layout(&shape(dtype, b, hq, seq, page, sm), s as i64).unwrap();
                let want = m100_layout(elem_of(dtype), kb, m100_adapted(hq), seq, page, s).unwrap();
                let got = [l.lens_offset, l.kernel_lens_offset, l.page_table_offset, l.lse_offset, l.q_offset, l.out_offset, l.bytes, l.columns as u64];
                assert_eq!(got.map(u128::from), want, "{ctx} {dtype}");
                assert_eq!((l.kernel_batch as i64, l.adapted), (kb, m100_adapted(hq)), "{ctx}");
                assert_eq!(p.sanitize_bytes as u128, want[6], "{ctx}");
                assert_eq!(sm100::max_safe_splits(kb, seq, sm).unwrap() as u128, m100_cap(kb, seq, sm), "{ctx}");
                // fp16 sizes as bf16 (both 2-byte queries; the element type does not enter
                // CUTLASS's formula).
                if dtype == DType::Bf16 {
                    let q = sm100::plan(&shape(DType::Fp16, b, hq, seq, page, sm), req).unwrap();
                    assert_eq!(q.workspace_bytes, p.workspace_bytes, "{ctx}");
                }
            }
        }
    }
}

// ---- the sm90 model ---------------------------------------------------------------------------

fn heads_ok(h: i64) -> bool {
    (1..=128).contains(&h)
}

fn s_q_ok(s_q: i64) -> bool {
    (1..=16).contains(&s_q)
}

/// `rows`: the s_q × heads query rows of a request (the kernels fold them into one set).
fn m90_splits(b: i64, rows: i64, seq: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let t = div_up(seq as u128, 64);
    let limit = 256u128.min(t);
    if let Some(r) = req {
        return (r >= 1 && r as u128 <= limit).then_some(r as u128);
    }
    let c = b as u128 * div_up(rows as u128, 64);
    let cap = limit.min(div_up(2 * sm as u128, c)).max(1);
    let cost = |s: u128| div_up(c * s, sm as u128) * div_up(t, s);
    // The smallest s with the least cost.
    (1..=cap).min_by_key(|&s| (cost(s), s))
}

fn m90_workspace(b: i64, rows: i64, s: u128) -> u128 {
    let partial_rows = b as u128 * s * rows as u128;
    let partials = if s > 1 { r256(partial_rows * 512 * 4) + r256(partial_rows * 4) } else { 0 };
    // A batch's work schedule: the lengths read once and the items' order.
    let schedule = if b > 1 { r256(4 * b as u128) + r256(4 * b as u128 * s) } else { 0 };
    partials + schedule
}

fn m90_plan(b: i64, (h, s_q): (i64, i64), seq: i64, sm: i64, req: Option<i64>) -> Option<(u128, u128)> {
    if !limits_ok(b, seq, sm) || !heads_ok(h) || !s_q_ok(s_q) {
        return None;
    }
    let s = m90_splits(b, h * s_q, seq, sm, req)?;
    Some((s, m90_workspace(b, h * s_q, s)))
}

fn check_sm90(b: i64, (h, s_q): (i64, i64), seq: i64, sm: i64, req: Option<i64>) {
    let ctx = format!("sm90 b={b} h={h} s_q={s_q} seq={seq} sm={sm} req={req:?}");
    let got = sm90::plan(DType::Bf16, h, s_q, b, seq, sm, req);
    match m90_plan(b, (h, s_q), seq, sm, req) {
        None => invalid(got, &ctx),
        Some((s, ws)) => {
            let p = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!((p.num_splits as u128, p.workspace_bytes as u128), (s, ws), "{ctx}");
        }
    }
}

// ---- per-shape plans: ≥ 10,000 generated cases plus every edge combination ----------------------

#[test]
fn every_plan_equals_the_exact_model() {
    let mut rng = Rng(0x6772_6170_6873_6166); // "graphsaf"
    let mut cases = 0;
    for _ in 0..6000 {
        let (b, seq, sm) = (rng.pick_or_out(1, MAX_BATCH), rng.pick_or_out(1, MAX_SEQ_LEN), rng.pick_or_out(1, MAX_SM_COUNT));
        let page = if rng.below(20) == 0 { rng.pick(-1, 300) } else { 1 << rng.below(8) };
        let req = match rng.below(3) {
            0 => None,
            1 => Some(rng.pick(1, 16)),
            _ => Some(rng.pick_or_out(1, 300)),
        };
        // Batch 1 is where the split rule lives: make it common.
        let b = if rng.below(3) == 0 { 1 } else { b };
        // CUTLASS's own shape half the time; else padded heads, expanded tokens, or both, and now
        // and then a count outside the limits.
        let hq = match rng.below(8) {
            0..=3 => (128, 1),
            4 => (rng.pick(1, 127), 1),
            5 => (128, rng.pick(2, 16)),
            6 => (rng.pick(1, 128), rng.pick(1, 16)),
            _ => (rng.pick_or_out(1, 128), rng.pick_or_out(1, 16)),
        };
        check_sm100(b, hq, seq, page, sm, req);
        cases += 1;
    }
    for _ in 0..5000 {
        let (b, seq, sm) = (rng.pick_or_out(1, MAX_BATCH), rng.pick_or_out(1, MAX_SEQ_LEN), rng.pick_or_out(1, MAX_SM_COUNT));
        let h = if rng.below(20) == 0 { rng.pick(-1, 200) } else { rng.pick(1, 128) };
        let s_q = if rng.below(20) == 0 { rng.pick(-1, 20) } else { [1, 1, 2, 3, 4, 16][rng.below(6) as usize] };
        let req = match rng.below(3) {
            0 => None,
            _ => Some(rng.pick_or_out(1, 300)),
        };
        // Small batches with few SMs reach every corner of the cost rule.
        let b = if rng.below(2) == 0 { rng.pick(1, 300) } else { b };
        check_sm90(b, (h, s_q), seq, sm, req);
        cases += 1;
    }
    // Every combination of edge values (the limits, 0, 1, powers of two ± 1).
    let seqs = [1i64, 2, 127, 128, 129, 2047, 2048, 2049, 65_535, 65_536, 65_537, 1 << 30, MAX_SEQ_LEN - 1, MAX_SEQ_LEN, MAX_SEQ_LEN + 1];
    let batches = [0i64, 1, 2, 3, 127, 128, 129, 65_534, 65_535, 65_536];
    let sms = [0i64, 1, 2, 3, 31, 32, 33, 132, 148, 1023, 1024, 1025];
    for &b in &batches {
        for &seq in &seqs {
            for &sm in &sms {
                for &page in &[1i64, 64, 128] {
                    check_sm100(b, (128, 1), seq, page, sm, None);
                    cases += 1;
                }
                check_sm100(b, (128, 1), seq, 64, sm, Some(16));
                // B' = b x s_q around the grid limit (65535 = 3 x 5 x 17 x 257), and padded heads.
                for hq in [(16, 1), (128, 2), (1, 16), (127, 3)] {
                    check_sm100(b, hq, seq, 128, sm, None);
                    check_sm100(b, hq, seq, 64, sm, Some(1));
                    cases += 2;
                }
                check_sm90(b, (16, 1), seq, sm, None);
                check_sm90(b, (128, 1), seq, sm, Some(256));
                check_sm90(b, (128, 16), seq, sm, None);
                cases += 1;
                cases += 3;
            }
        }
    }
    eprintln!("{cases} plans equal the model");
    assert!(cases >= 10_000, "{cases}");
}

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

// ---- worst cases ------------------------------------------------------------------------------

/// The model's maximum over every (batch, tokens, length) of the domain: for sm100 over every
/// length when the domain is small, else over every tile count (the rule and the layout are
/// functions of the tile count, the largest length of each count standing for it).
fn m100_worst(max_b: i64, (h, max_s_q): Hq, max_seq: i64, page: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let every_len = max_seq <= 4096;
    let lens: Vec<i64> = if every_len {
        (1..=max_seq).collect()
    } else {
        (1..=div_up(max_seq as u128, 128) as i64).map(|t| (t * 128).min(max_seq)).collect()
    };
    let mut worst = None;
    for b in 1..=max_b {
        for s_q in 1..=max_s_q {
            for &seq in &lens {
                if let Some((_, ws)) = m100_plan(DType::Bf16, b, (h, s_q), seq, page, sm, req) {
                    worst = worst.max(Some(ws));
                }
            }
        }
    }
    worst
}

/// sm90: every tile count (the rule's input) for every batch.
/// The most over every batch, tile count and token count (up to s_q) of the domain.
fn m90_worst(max_b: i64, (h, s_q): (i64, i64), max_seq: i64, sm: i64, req: Option<i64>) -> Option<u128> {
    let mut worst = None;
    for s in 1..=s_q {
        for b in 1..=max_b {
            for t in 1..=div_up(max_seq as u128, 64) as i64 {
                if let Some((_, ws)) = m90_plan(b, (h, s), (t * 64).min(max_seq), sm, req) {
                    worst = worst.max(Some(ws));
                }
            }
        }
    }
    worst
}

#[test]
fn worst_cases_equal_the_model_maximum_over_every_shape() {
    let mut rng = Rng(0x776f_7273_7463_6173); // "worstcas"
    let mut cases = 0;
    for i in 0..160 {
        let max_b = rng.pick(1, if i % 4 == 0 { 40 } else { 5 });
        let max_seq = if i % 3 == 0 { rng.pick(1, 4096) } else { rng.pick(1, 128 * 600) };
        let sm = rng.pick(1, 1024);
        let page = 1 << rng.below(8);
        let req = if rng.below(3) == 0 { Some(rng.pick(1, 17)) } else { None };
        let hq = [(128, 1), (128, 1), (16, 1), (128, 3), (7, 2), (64, 4)][rng.below(6) as usize];
        // The scan is max_b x s_q x lengths: keep it small when tokens multiply it.
        let max_seq = if hq.1 > 1 { max_seq.min(128 * 80) } else { max_seq };
        let ctx = format!("sm100 max_b={max_b} (heads, s_q)={hq:?} max_seq={max_seq} page={page} sm={sm} req={req:?}");
        let got = sm100::worst_case(&shape(DType::Bf16, max_b, hq, max_seq, page, sm), req);
        match m100_worst(max_b, hq, max_seq, page, sm, req) {
            None => invalid(got, &ctx),
            Some(ws) => {
                let w = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(w.workspace_bytes as u128, ws, "{ctx}");
                // The reported shape is a shape of the domain that needs exactly that much.
                assert!(w.batch as i64 <= max_b && w.max_seq_len as i64 <= max_seq && w.s_q as i64 <= hq.1, "{ctx}: {w:?}");
                assert_eq!(m100_plan(DType::Bf16, w.batch as i64, (hq.0, w.s_q as i64), w.max_seq_len as i64, page, sm, req).map(|p| p.1), Some(ws), "{ctx}");
            }
        }
        cases += 1;
    }
    for i in 0..120 {
        // Batches past 2·sm/ceil(h/64) never split: a few SMs let the scan cover such batches.
        let sm = if i % 2 == 0 { rng.pick(1, 12) } else { rng.pick(1, 300) };
        let max_b = if i % 2 == 0 { rng.pick(1, 40) } else { rng.pick(1, 4) };
        let max_seq = rng.pick(1, 64 * if i % 2 == 0 { 300 } else { 700 });
        let h = rng.pick(1, 128);
        let s_q = [1, 1, 2, 3][rng.below(4) as usize];
        let req = if rng.below(4) == 0 { Some(rng.pick(1, 300)) } else { None };
        let ctx = format!("sm90 max_b={max_b} h={h} s_q={s_q} max_seq={max_seq} sm={sm} req={req:?}");
        let got = sm90::worst_case(DType::Bf16, h, s_q, max_b, max_seq, sm, req);
        match m90_worst(max_b, (h, s_q), max_seq, sm, req) {
            None => invalid(got, &ctx),
            Some(ws) => {
                let w = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(w.workspace_bytes as u128, ws, "{ctx}");
                assert!(w.batch as i64 <= max_b && w.max_seq_len as i64 <= max_seq && w.s_q as i64 <= s_q, "{ctx}: {w:?}");
                assert_eq!(m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, req).map(|p| p.1), Some(ws), "{ctx}");
            }
        }
        cases += 1;
    }
    eprintln!("{cases} worst cases equal the model maximum");
}

#[test]
fn no_pre_grow_is_below_a_printed_row_up_to_the_limits() {
    // What `graphsafe plan mla` prints: a row per listed batch at the longest length, with the
    // same split request, and the pre-grow from worst_case. Large domains included: the rows and
    // a sample of other shapes of the domain are checked against the model, never above it.
    let mut rng = Rng(0x7072_6567_726f_7773); // "pregrows"
    let mut rows = 0;
    for i in 0..400 {
        let sm = rng.pick(1, 1024);
        let page = 1 << rng.below(8);
        let max_seq = rng.pick(1, MAX_SEQ_LEN);
        let (h, s_q) = [(128, 1), (128, 1), (32, 1), (128, 2), (16, 4), (1, 16)][rng.below(6) as usize];
        // Largest batch with batch × s_q × columns within int32 for this length and page size,
        // and batch × s_q within the grid.
        let cols = div_up(max_seq as u128, 128) * (128 / page as u128);
        let b_cap = ((I32_MAX / cols / s_q as u128) as i64).min(MAX_BATCH / s_q);
        if b_cap < 1 {
            continue;
        }
        let list: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.pick(1, b_cap)).collect();
        let max_b = *list.iter().max().unwrap();
        let req = match i % 3 {
            0 => None,
            1 => Some(1),
            _ => Some(rng.pick(1, 16)),
        };
        let w = match sm100::worst_case(&shape(DType::Fp16, max_b, (h, s_q), max_seq, page, sm), req) {
            Ok(w) => w,
            Err(e) => {
                // Only an explicit count no shape of the domain allows is refused.
                assert!(req.is_some_and(|r| r as u128 > m100_cap(1, max_seq, sm)), "sm100 {max_b} {h} {s_q} {max_seq} {page} {sm} {req:?}: {e}");
                continue;
            }
        };
        assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Fp16, w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, page, sm, req).map(|p| p.1));
        let mut shapes: Vec<(i64, i64, i64)> = list.iter().map(|&b| (b, s_q, max_seq)).collect();
        shapes.extend((0..25).map(|_| (rng.pick(1, max_b), rng.pick(1, s_q), rng.pick(1, max_seq))));
        for (b, s, seq) in shapes {
            if let Some((_, ws)) = m100_plan(DType::Fp16, b, (h, s), seq, page, sm, req) {
                assert!(ws <= w.workspace_bytes as u128, "sm100 row b={b} h={h} s_q={s} seq={seq} page={page} sm={sm} req={req:?}: {ws} > {}", w.workspace_bytes);
                rows += 1;
            }
        }
    }
    for i in 0..300 {
        let sm = rng.pick(1, 1024);
        let h = rng.pick(1, 128);
        let s_q = [1, 2, 16][rng.below(3) as usize];
        let max_seq = rng.pick(1, MAX_SEQ_LEN);
        let list: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.pick(1, MAX_BATCH)).collect();
        let max_b = *list.iter().max().unwrap();
        let req = if i % 2 == 0 { None } else { Some(rng.pick(1, 256)) };
        let w = match sm90::worst_case(DType::Bf16, h, s_q, max_b, max_seq, sm, req) {
            Ok(w) => w,
            Err(e) => {
                assert!(req.is_some_and(|r| r as u128 > div_up(max_seq as u128, 64).min(256)), "sm90: {e}");
                continue;
            }
        };
        assert_eq!(Some(w.workspace_bytes as u128), m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, req).map(|p| p.1));
        let mut shapes: Vec<(i64, i64)> = list.iter().map(|&b| (b, max_seq)).collect();
        shapes.extend((0..25).map(|_| (rng.pick(1, max_b.min(2 * sm)), rng.pick(1, max_seq.min(64 * 256)))));
        for (b, seq) in shapes {
            // Every token count up to s_q is covered: a capture of fewer tokens is a row too.
            if let Some((_, ws)) = m90_plan(b, (h, rng.pick(1, s_q)), seq, sm, req) {
                assert!(ws <= w.workspace_bytes as u128, "sm90 row b={b} h={h} seq={seq} sm={sm} req={req:?}: {ws} > {}", w.workspace_bytes);
                rows += 1;
            }
        }
    }
    eprintln!("{rows} rows, none above its pre-grow");
    assert!(rows >= 5000, "{rows}");
}

#[test]
fn worst_cases_at_the_limits_are_real_shapes() {
    // The largest accepted inputs (which used to take an hour): the answer is the model's plan
    // of a shape of the domain, and at least every row an engine would list.
    let w = sm100::worst_case(&shape(DType::Bf16, 128, (128, 1), MAX_SEQ_LEN, 128, 148), None).unwrap();
    assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Bf16, w.batch as i64, (128, 1), w.max_seq_len as i64, 128, 148, None).map(|p| p.1));
    for b in [1, 2, 64, 128] {
        assert!(m100_plan(DType::Bf16, b, (128, 1), MAX_SEQ_LEN, 128, 148, None).unwrap().1 <= w.workspace_bytes as u128);
    }
    let w = sm100::worst_case(&shape(DType::Bf16, MAX_BATCH, (128, 1), 4_194_176, 128, 148), None).unwrap();
    assert_eq!((w.batch as i64, w.max_seq_len), (MAX_BATCH, 4_194_176), "the page table dominates");
    // Padded and expanded at the limits: 32767 requests of 2 tokens of 16 heads (B' = 65534), and
    // B' = 64 requests of the longest length; the staging dominates the first, the page table the second.
    for (b, hq, seq) in [(32_767, (16, 2), 1000), (4, (1, 16), MAX_SEQ_LEN / 2)] {
        let w = sm100::worst_case(&shape(DType::Bf16, b, hq, seq, 128, 148), None).unwrap();
        assert_eq!((w.batch as i64, w.s_q as i64, w.max_seq_len as i64), (b, hq.1, seq), "{hq:?}");
        assert_eq!(Some(w.workspace_bytes as u128), m100_plan(DType::Bf16, b, hq, seq, 128, 148, None).map(|p| p.1));
    }
    // One more request of 2 tokens is past CUTLASS's batch limit: refused by name, for any page size.
    match sm100::worst_case(&shape(DType::Bf16, 32_768, (16, 2), 1000, 64, 148), None) {
        Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, "batch x s_q"),
        other => panic!("{other:?}"),
    }
    for (h, s_q) in [(16, 1), (64, 1), (128, 1), (1, 1), (128, 16), (3, 16)] {
        for sm in [1, 132, 1024] {
            let w = sm90::worst_case(DType::Bf16, h, s_q, MAX_BATCH, MAX_SEQ_LEN, sm, None).unwrap();
            assert_eq!(Some(w.workspace_bytes as u128), m90_plan(w.batch as i64, (h, w.s_q as i64), w.max_seq_len as i64, sm, None).map(|p| p.1));
            for b in [1, 2, sm, MAX_BATCH] {
                for seq in [64 * 256, MAX_SEQ_LEN] {
                    assert!(m90_plan(b.min(MAX_BATCH), (h, s_q), seq, sm, None).unwrap().1 <= w.workspace_bytes as u128, "h={h} sm={sm} b={b} seq={seq}");
                }
            }
        }
    }
}

/// The reduction worst_case relies on for sm90 (proved in cuda-src/mla/sm90/plan.cu): a split
/// count the default picks for T tiles it also picks for exactly that many tiles. Checked here
/// on the model, exhaustively over small rule parameters.
#[test]
fn every_sm90_split_count_is_picked_at_its_own_tile_count() {
    let mut checked = 0u64;
    for sm in (1..=24).chain([66, 132]) {
        for ctas in 1..2 * sm {
            for t in 1..=700 {
                // b = ctas, h = 64: C = ctas.
                let s = m90_splits(ctas, 64, t * 64, sm, None).unwrap();
                let again = m90_splits(ctas, 64, s as i64 * 64, sm, None).unwrap();
                assert_eq!(again, s, "sm={sm} C={ctas} T={t}");
                checked += 1;
            }
        }
    }
    assert!(checked > 100_000);
}

// ---- NVFP4 sizes ------------------------------------------------------------------------------

fn sf_model(rows: i64, kk: i64) -> u128 {
    div_up(rows as u128, 128) * 128 * div_up(kk as u128 / 16, 4) * 4
}

/// The documented swizzle: (m / 128)·(KB4·512) + (b / 4)·512 + (m % 32)·16 + ((m % 128) / 32)·4 + b % 4.
fn sf_offset_model(kk: i64, m: i64, b: i64) -> u128 {
    let kb4 = div_up(kk as u128 / 16, 4);
    let (m, b) = (m as u128, b as u128);
    (m / 128) * (kb4 * 512) + (b / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + b % 4
}

#[test]
fn nvfp4_sizes_equal_the_exact_model() {
    let mut rng = Rng(0x6e76_6670_3473_697a); // "nvfp4siz"
    let mut cases = 0;
    // The case: 18446744065119617024 (an int ceil_div wrapping) instead of 8589934592.
    assert_eq!(nvfp4::scale_bytes(2_147_483_521, 16).unwrap(), 8_589_934_592);
    for _ in 0..4000 {
        let rows = rng.pick_or_out(1, i32::MAX as i64);
        let kk = if rng.below(10) == 0 { rng.pick_or_out(1, i32::MAX as i64) } else { 16 * rng.pick(1, i32::MAX as i64 / 16) };
        let got = nvfp4::scale_bytes(rows, kk);
        if (1..=i32::MAX as i64).contains(&rows) && (1..=i32::MAX as i64).contains(&kk) && kk % 16 == 0 {
            assert_eq!(got.unwrap() as u128, sf_model(rows, kk), "rows={rows} k={kk}");
        } else {
            invalid(got, &format!("scale_bytes({rows}, {kk})"));
        }
        cases += 1;
    }
    // CUTLASS's own layout function against the documented formula, up to where its int32
    // offsets would wrap (the glue refuses past that).
    for _ in 0..3000 {
        let rows = rng.pick(1, i32::MAX as i64);
        let kk = 16 * rng.pick(1, i32::MAX as i64 / 16);
        let (pr, pb) = (div_up(rows as u128, 128) * 128, div_up(kk as u128 / 16, 4) * 4);
        let (row, block) = (rng.below(pr as u64) as i32, rng.below(pb as u64) as i32);
        let mut off = 0u64;
        // SAFETY: host function; off is a local.
        let st = unsafe { k::gs_nvfp4_cutlass_scale_offset(rows as i32, kk as i32, row, block, &mut off) };
        if sf_model(rows, kk) <= I32_MAX {
            assert_eq!(st, 0, "rows={rows} k={kk}");
            assert_eq!(off as u128, sf_offset_model(kk, row as i64, block as i64), "rows={rows} k={kk} ({row}, {block})");
        } else {
            assert_eq!(st, k::GsStatus::GS_ERR_INVALID_ARGUMENT.0 as i32, "rows={rows} k={kk}: an int32 layout would wrap");
        }
        cases += 1;
    }
    // The Blackwell plans: the production tile rule, CUTLASS's 0-byte workspace, and a refusal
    // where CUTLASS's int32 scale-factor indexing would wrap.
    for _ in 0..2000 {
        let m = rng.pick_or_out(1, i32::MAX as i64);
        let n = 32 * rng.pick(1, i32::MAX as i64 / 32);
        let kk = 32 * rng.pick(1, i32::MAX as i64 / 32);
        let arch = if rng.below(2) == 0 { Nvfp4Arch::Sm100 } else { Nvfp4Arch::Sm120 };
        let got = nvfp4::plan(arch, m, n, kk, DType::Bf16, 148);
        let ctx = format!("{arch:?} m={m} n={n} k={kk}");
        let ok = (1..=i32::MAX as i64).contains(&m) && sf_model(m, kk) <= I32_MAX && sf_model(n, kk) <= I32_MAX;
        if !ok {
            invalid(got, &ctx);
        } else {
            let p = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let t = |m, n, k, cm| Some(Tile { m, n, k, cluster_m: cm, cluster_n: 1 });
            let want = match arch {
                Nvfp4Arch::Sm100 if m <= 16 => t(128, 128, 256, 1),
                Nvfp4Arch::Sm100 if m <= 256 => t(256, 128, 256, 2),
                Nvfp4Arch::Sm100 => t(256, 256, 256, 2),
                _ if m <= 256 => t(128, 128, 128, 1),
                _ => t(256, 128, 128, 1),
            };
            assert_eq!((p.tile, p.workspace_bytes, p.prepared_weight_bytes), (want, 0, None), "{ctx}");
        }
        cases += 1;
    }
    eprintln!("{cases} NVFP4 sizes equal the model");
}

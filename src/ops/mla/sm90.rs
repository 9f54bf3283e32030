//! Planning for graphsafe's own Hopper (sm_90a) MLA decode kernel (`cuda-src/mla/sm90/`): split
//! count and workspace (fp32 partial O and LSE per split, a batch's work schedule). Host code; runs
//! without a GPU. The op and `graphsafe plan mla --arch sm_90` both use these functions.
//!
//! Limits: batch `1..=`[`super::MAX_BATCH`], max_seq_len `1..=`[`super::MAX_SEQ_LEN`], sm_count
//! `1..=`[`super::MAX_SM_COUNT`], heads `1..=`[`super::NUM_HEADS`], query tokens per request
//! `1..=`[`super::MAX_S_Q`]; beyond them every function here returns [`Error::InvalidArgument`]
//! naming the limit. The kernels fold a request's `s_q × heads` query rows into one set of rows,
//! so the plan depends on their product only.

use super::{check_limits, in_range, DType};
use crate::error::{Error, Result};
use crate::sys::glue::mla as glue;
use crate::sys::kernels as k;

/// KV tokens per tile of the sm90 kernel.
pub const TILE_S: u32 = k::GS_MLA_SM90_TILE_S;
/// The most KV splits the kernel takes (`GS_MLA_SM90_MAX_SPLITS`: the combine kernel's registers
/// are sized for it).
pub const MAX_SPLITS: i64 = k::GS_MLA_SM90_MAX_SPLITS as i64;

/// The heads and tokens rules are the decode's, shared by both back-ends.
pub use super::plan::{check_heads, check_s_q};

/// The plan for one decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// Element type.
    pub dtype: DType,
    /// Query heads.
    pub num_heads: u32,
    /// Query tokens per request.
    pub s_q: u32,
    /// Requests.
    pub batch: u32,
    /// Longest sequence.
    pub max_seq_len: u32,
    /// SMs of the GPU.
    pub sm_count: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Workspace bytes: partial O and LSE for more than one split, a batch's work schedule (its
    /// lengths and the order of its work items) for more than one request; 0 for one request in
    /// one split.
    pub workspace_bytes: u64,
}

/// KV splits: the default rule when `requested` is `None`, else `requested` after validation.
pub fn num_splits(batch: i64, num_heads: i64, s_q: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<u32> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    let (h, q) = (check_heads(num_heads)?, check_s_q(s_q)?);
    let req = match requested {
        None => 0,
        Some(r) => {
            let max = (max_seq_len as u64).div_ceil(TILE_S as u64).min(MAX_SPLITS as u64);
            if r < 1 || r as u64 > max {
                return Err(Error::invalid("num_splits", format!("1..={max} (one {TILE_S}-token tile per split at least)"), r));
            }
            r as i32
        }
    };
    Ok(glue::sm90_num_splits(b, h, q, s, m, req)? as u32)
}

/// Workspace bytes for (batch, heads, query tokens, splits).
pub fn workspace_bytes(batch: i64, num_heads: i64, s_q: i64, num_splits: i64) -> Result<u64> {
    let b = super::plan::check_batch("batch", batch)?;
    let (h, q) = (check_heads(num_heads)?, check_s_q(s_q)?);
    let n = in_range("num_splits", num_splits, MAX_SPLITS)?;
    glue::sm90_workspace_bytes(b, h, q, n)
}

/// Splits and workspace for one shape: `batch` requests of `s_q` query tokens of `num_heads`
/// heads each, up to `max_seq_len` keys.
pub fn plan(dtype: DType, num_heads: i64, s_q: i64, batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<Plan> {
    if dtype == DType::Fp8E4m3 {
        return Err(Error::invalid("dtype", "bf16 or fp16 (the sm90 kernel has no fp8 path)", dtype));
    }
    let n = num_splits(batch, num_heads, s_q, max_seq_len, sm_count, requested)?;
    Ok(Plan {
        dtype,
        num_heads: num_heads as u32,
        s_q: s_q as u32,
        batch: batch as u32,
        max_seq_len: max_seq_len as u32,
        sm_count: sm_count as u32,
        num_splits: n,
        workspace_bytes: workspace_bytes(batch, num_heads, s_q, n as i64)?,
    })
}

/// The worst case over batch `1..=max_batch`, sequence lengths `1..=max_seq_len` and query tokens
/// `1..=s_q` per request (of `num_heads` heads each), with the default split rule (`requested`
/// `None`) or one explicit count: pre-growing to its `workspace_bytes` before capture covers every
/// one of those shapes. (Every token count up to `s_q` is looked at: fewer query rows can mean
/// more splits, so the workspace is not monotone in `s_q`.)
///
/// Why it is exact and bounded (`cuda-src/mla/sm90/plan.cu` has the rule):
/// * the workspace grows with batch × splits (partials for splits > 1, the schedule for batch > 1);
///   the rule depends on the length only through its 64-token tile count `T`;
/// * an explicit count is allowed for a length iff it is at most `min(256, T)`, whatever the
///   batch, so `(max_batch, max_seq_len)` needs the most;
/// * with the default, a batch whose split cap `ceil(2·sm_count / C)` is below 2 (`C` = CTAs per
///   split, growing with batch) always gets one split, whose workspace (the schedule alone) grows
///   with the batch, so `(max_batch, max_seq_len)` covers those and only batches below
///   `2·sm_count` are looked at; and for one batch, every split count the rule picks for some `T` it also picks for
///   exactly that many tiles (the proof is in plan.cu), so the most splits over `T ≤ T_max` is
///   the most over `T ≤ min(T_max, 256, cap)`, scanned from the top until `T` is no larger than
///   the best found.
///
/// At most `2·sm_count` batches × 256 tile counts (each a 256-step rule): well under a second at
/// the limits, and milliseconds in practice. `tests/mla_plan.rs` and `tests/planner_model.rs`
/// check it against the maximum over every shape.
pub fn worst_case(dtype: DType, num_heads: i64, s_q: i64, max_batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<Plan> {
    let mut worst = worst_case_rows(dtype, num_heads, s_q, max_batch, max_seq_len, sm_count, requested)?;
    // Token counts below s_q: only the largest of each group count (CTAs per split) can need the
    // most, since the rule sees the rows only through that count and the workspace grows with them.
    let groups = |s: i64| (s * num_heads + 63) / 64;
    for s in (1..s_q).rev().filter(|&s| groups(s) != groups(s + 1)) {
        let p = worst_case_rows(dtype, num_heads, s, max_batch, max_seq_len, sm_count, requested)?;
        if p.workspace_bytes > worst.workspace_bytes {
            worst = p;
        }
    }
    Ok(worst)
}

/// [`worst_case`] for exactly `s_q` tokens.
fn worst_case_rows(dtype: DType, num_heads: i64, s_q: i64, max_batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<Plan> {
    let (_, _, sm) = check_limits(("max_batch", max_batch), ("max_seq_len", max_seq_len), sm_count)?;
    let top = plan(dtype, num_heads, s_q, max_batch, max_seq_len, sm_count, requested)?;
    if requested.is_some() {
        return Ok(top);
    }
    // Every value here was checked positive (and within the limits) by plan() above.
    let up = |a: i64, b: i64| (a as u64).div_ceil(b as u64) as i64;
    let groups = up(s_q * num_heads, 64);
    let tiles = up(max_seq_len, TILE_S as i64);
    let mut worst = top;
    for b in 1..=max_batch {
        let cap = up(2 * sm as i64, b * groups);
        if cap < 2 {
            break; // and so for every larger batch: one split, the schedule alone (`top` has the most)
        }
        let mut most: Option<Plan> = None;
        for t in (1..=cap.min(MAX_SPLITS).min(tiles)).rev() {
            if most.is_some_and(|p| p.num_splits as i64 >= t) {
                break; // the rule never picks more splits than tiles
            }
            let p = plan(dtype, num_heads, s_q, b, (t * TILE_S as i64).min(max_seq_len), sm_count, None)?;
            if most.is_none_or(|m| p.num_splits > m.num_splits) {
                most = Some(p);
            }
        }
        if let Some(p) = most.filter(|p| p.workspace_bytes > worst.workspace_bytes) {
            worst = p;
        }
    }
    Ok(worst)
}

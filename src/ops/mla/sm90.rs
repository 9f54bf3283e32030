//! Planning for graphsafe's own Hopper (sm_90a) MLA decode kernel (`cuda-src/mla/sm90/`): split
//! count and workspace (partial O in the output dtype and fp32 LSE per split). Host code; runs
//! without a GPU. The op and `graphsafe plan mla --arch sm_90` both use these functions.
//!
//! Limits: batch `1..=`[`super::MAX_BATCH`], max_seq_len `1..=`[`super::MAX_SEQ_LEN`], sm_count
//! `1..=`[`super::MAX_SM_COUNT`], heads a multiple of 16 up to 128; beyond them every function
//! here returns [`Error::InvalidArgument`] naming the limit.

use super::{check_limits, in_range, KvDtype, MAX_BATCH};
use crate::error::{Error, Result};
use crate::sys::glue::mla as glue;
use crate::sys::kernels as k;

/// KV tokens per tile of the sm90 kernel.
pub const TILE_S: u32 = k::GS_MLA_SM90_TILE_S;
/// The most KV splits the kernel takes.
pub const MAX_SPLITS: i64 = 256;

/// Heads the sm90 kernel accepts: a multiple of 16 up to 128.
pub fn check_heads(num_heads: i64) -> Result<i32> {
    if num_heads <= 0 || num_heads > 128 || num_heads % 16 != 0 {
        return Err(Error::invalid("num_heads", "a multiple of 16 in 16..=128", num_heads));
    }
    Ok(num_heads as i32)
}

/// The plan for one decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// Element type.
    pub dtype: KvDtype,
    /// Query heads.
    pub num_heads: u32,
    /// Requests.
    pub batch: u32,
    /// Longest sequence.
    pub max_seq_len: u32,
    /// SMs of the GPU.
    pub sm_count: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Workspace bytes (partial O and LSE; 0 for one split).
    pub workspace_bytes: u64,
}

/// KV splits: the default rule when `requested` is `None`, else `requested` after validation.
pub fn num_splits(batch: i64, num_heads: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<u32> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    let h = check_heads(num_heads)?;
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
    Ok(glue::sm90_num_splits(b, h, s, m, req)? as u32)
}

/// Workspace bytes for (batch, heads, splits).
pub fn workspace_bytes(batch: i64, num_heads: i64, num_splits: i64) -> Result<u64> {
    let b = in_range("batch", batch, MAX_BATCH)?;
    let h = check_heads(num_heads)?;
    let n = in_range("num_splits", num_splits, MAX_SPLITS)?;
    glue::sm90_workspace_bytes(b, h, n)
}

/// Splits and workspace for one shape.
pub fn plan(dtype: KvDtype, num_heads: i64, batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<Plan> {
    if dtype == KvDtype::Fp8E4m3 {
        return Err(Error::invalid("dtype", "bf16 or fp16 (the sm90 kernel has no fp8 path)", dtype));
    }
    let n = num_splits(batch, num_heads, max_seq_len, sm_count, requested)?;
    Ok(Plan {
        dtype,
        num_heads: num_heads as u32,
        batch: batch as u32,
        max_seq_len: max_seq_len as u32,
        sm_count: sm_count as u32,
        num_splits: n,
        workspace_bytes: workspace_bytes(batch, num_heads, n as i64)?,
    })
}

/// The worst case over batch `1..=max_batch` and sequence lengths `1..=max_seq_len`, with the
/// default split rule (`requested` `None`) or one explicit count: pre-growing to its
/// `workspace_bytes` before capture covers every one of those shapes.
///
/// Why it is exact and bounded (`cuda-src/mla/sm90/plan.cu` has the rule):
/// * the workspace is 0 for one split and grows with batch × splits otherwise; the rule depends
///   on the length only through its 64-token tile count `T`;
/// * an explicit count is allowed for a length iff it is at most `min(256, T)`, whatever the
///   batch, so `(max_batch, max_seq_len)` needs the most;
/// * with the default, a batch whose split cap `ceil(2·sm_count / C)` is below 2 (`C` = CTAs per
///   split, growing with batch) always gets one split, so only batches below `2·sm_count` are
///   looked at; and for one batch, every split count the rule picks for some `T` it also picks for
///   exactly that many tiles (the proof is in plan.cu), so the most splits over `T ≤ T_max` is
///   the most over `T ≤ min(T_max, 256, cap)`, scanned from the top until `T` is no larger than
///   the best found.
///
/// At most `2·sm_count` batches × 256 tile counts (each a 256-step rule): well under a second at
/// the limits, and milliseconds in practice. `tests/mla_plan.rs` and `tests/planner_model.rs`
/// check it against the maximum over every shape.
pub fn worst_case(dtype: KvDtype, num_heads: i64, max_batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<Plan> {
    let (_, _, sm) = check_limits(("max_batch", max_batch), ("max_seq_len", max_seq_len), sm_count)?;
    let top = plan(dtype, num_heads, max_batch, max_seq_len, sm_count, requested)?;
    if requested.is_some() {
        return Ok(top);
    }
    // Every value here was checked positive (and within the limits) by plan() above.
    let up = |a: i64, b: i64| (a as u64).div_ceil(b as u64) as i64;
    let groups = up(num_heads, 64);
    let tiles = up(max_seq_len, TILE_S as i64);
    let mut worst = top;
    for b in 1..=max_batch {
        let cap = up(2 * sm as i64, b * groups);
        if cap < 2 {
            break; // and so for every larger batch: one split, no workspace
        }
        let mut most: Option<Plan> = None;
        for t in (1..=cap.min(MAX_SPLITS).min(tiles)).rev() {
            if most.is_some_and(|p| p.num_splits as i64 >= t) {
                break; // the rule never picks more splits than tiles
            }
            let p = plan(dtype, num_heads, b, (t * TILE_S as i64).min(max_seq_len), sm_count, None)?;
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

//! Planning for CUTLASS 4.2's sm100 MLA decode kernel (`examples/77_blackwell_fmha`): how many KV
//! splits, which tile scheduler, how many workspace bytes, and the worst case an engine must
//! pre-grow before capture. All of it is host code and runs without a GPU.
//!
//! # The split rule, and why
//! CUTLASS 4.2's kernel hangs when a CTA of the *persistent* scheduler gets a split with no KV
//! tiles: its compute warps take an early return that only `arrive()`s on a named barrier and loop
//! to the next tile, so the load warp's `arrive_and_wait()` never completes (fixed upstream in
//! CUTLASS 4.3 by making that `arrive_and_wait()`; vLLM patched its own copy in PR 26026, after
//! first forcing one split for batch > 1 in PRs 24966/25509). Empty splits appear whenever a
//! request in the batch is shorter than the longest one. The fix is **not** in the 4.2 kernel we
//! include (`kernel/sm100_fmha_mla_tma_warpspecialized.hpp`, the `k_tile_count == 0` branch of
//! `compute()` still calls `arrive()`), so the rule is:
//!
//! * batch > 1: one split, persistent scheduler (one split can only be empty for a zero-length
//!   request, which the op refuses);
//! * batch = 1: at most `cap = min(16, ceil(seq/128), max(1, sm_count/2))` splits (the kernel runs
//!   2-SM clusters, so an SM pair is one slot, as FlashInfer PR 3888 budgets), on the *individual*
//!   scheduler, where a CTA handles exactly one tile and cannot loop into the hang. The default is
//!   the balanced count `ceil(T / ceil(T / cap))`, `T = ceil(seq/128)`: the same tiles per split
//!   as `cap`, no empty split, and a smaller workspace.
//!
//! The rule lives in the C glue (`cuda-src/mla/sm100/plan.cu`) so the C ABI and Rust share it.

use super::KvDtype;
use crate::error::{positive, Result};
use crate::sys::{check_glue, kernels as k};

/// KV-sequence tile of the kernel: splits are counted in these.
pub const TILE_S: u32 = k::GS_MLA_SM100_TILE_S;
/// The most splits the rule ever allows.
pub const MAX_SPLITS: u32 = k::GS_MLA_SM100_MAX_SPLITS;

/// Tile scheduler of the sm100 kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduler {
    /// CTA pairs loop over (batch, split) tiles; used only with one split.
    Persistent,
    /// One CTA pair per (batch, split) tile; used with more than one split.
    Individual,
}

/// The plan for one decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// Element type of q and the KV cache.
    pub dtype: KvDtype,
    /// Requests in the batch.
    pub batch: u32,
    /// Longest sequence in the batch (sizes splits and workspace).
    pub max_seq_len: u32,
    /// SMs of the target GPU.
    pub sm_count: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Tile scheduler the decode launches.
    pub scheduler: Scheduler,
    /// Workspace bytes: CUTLASS's `get_workspace_size` for these arguments.
    pub workspace_bytes: u64,
}

/// The largest split count the safety rule allows.
pub fn max_safe_splits(batch: i64, max_seq_len: i64, sm_count: i64) -> Result<u32> {
    let (b, s, m) = (positive("batch", batch)?, positive("max_seq_len", max_seq_len)?, positive("sm_count", sm_count)?);
    let mut out = 0i32;
    // SAFETY: plain host function; out is a valid pointer.
    check_glue(unsafe { k::gs_mla_sm100_max_safe_splits(b, s, m, &mut out) }, "gs_mla_sm100_max_safe_splits")?;
    Ok(out as u32)
}

/// KV splits for (batch, max_seq_len, sm_count): the default rule when `requested` is `None`,
/// else `requested` after checking it against the rule.
pub fn num_splits(batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<u32> {
    let (b, s, m) = (positive("batch", batch)?, positive("max_seq_len", max_seq_len)?, positive("sm_count", sm_count)?);
    let req = match requested {
        None => 0,
        Some(r) => {
            let cap = max_safe_splits(batch, max_seq_len, sm_count)?;
            if r < 1 || r > cap as i64 {
                return Err(crate::Error::invalid(
                    "num_splits",
                    format!(
                        "1..={cap} for batch {batch}, max_seq_len {max_seq_len}, {sm_count} SMs (split-KV with batch > 1 \
                         hangs the CUTLASS 4.2 kernel)"
                    ),
                    r,
                ));
            }
            r as i32
        }
    };
    let mut out = 0i32;
    // SAFETY: plain host function; out is a valid pointer.
    check_glue(unsafe { k::gs_mla_sm100_num_splits(b, s, m, req, &mut out) }, "gs_mla_sm100_num_splits")?;
    Ok(out as u32)
}

/// The scheduler the decode launches for a split count.
pub fn scheduler(num_splits: u32) -> Result<Scheduler> {
    let n = positive("num_splits", num_splits as i64)?;
    let mut out = 0i32;
    // SAFETY: plain host function; out is a valid pointer.
    check_glue(unsafe { k::gs_mla_sm100_scheduler(n, &mut out) }, "gs_mla_sm100_scheduler")?;
    Ok(if out as u32 == k::GsMlaScheduler::GS_MLA_SCHED_PERSISTENT.0 { Scheduler::Persistent } else { Scheduler::Individual })
}

/// Workspace bytes CUTLASS's `device::MLA::get_workspace_size` returns for these arguments.
pub fn workspace_bytes(dtype: KvDtype, batch: i64, max_seq_len: i64, sm_count: i64, num_splits: i64) -> Result<u64> {
    let (b, s, m) = (positive("batch", batch)?, positive("max_seq_len", max_seq_len)?, positive("sm_count", sm_count)?);
    let n = positive("num_splits", num_splits)?;
    let mut out = 0u64;
    check_glue(
        // SAFETY: plain host function; out is a valid pointer.
        unsafe { k::gs_mla_sm100_workspace_bytes(dtype.to_sys(), b, s, m, n, &mut out) },
        "gs_mla_sm100_workspace_bytes",
    )?;
    Ok(out)
}

/// Splits, scheduler and workspace for one decode shape.
pub fn plan(dtype: KvDtype, batch: i64, max_seq_len: i64, sm_count: i64, requested_splits: Option<i64>) -> Result<Plan> {
    let num_splits = num_splits(batch, max_seq_len, sm_count, requested_splits)?;
    Ok(Plan {
        dtype,
        batch: batch as u32,
        max_seq_len: max_seq_len as u32,
        sm_count: sm_count as u32,
        num_splits,
        scheduler: scheduler(num_splits)?,
        workspace_bytes: workspace_bytes(dtype, batch, max_seq_len, sm_count, num_splits as i64)?,
    })
}

/// The worst case over every shape an engine will capture: each batch size in `1..=max_batch` and
/// each sequence length in `1..=max_seq_len`, for one GPU. Pre-growing the workspace to
/// `plan.workspace_bytes` before capture is then enough for all of them.
///
/// The split rule and the workspace depend on the sequence length only through
/// `T = ceil(seq/128)`, so one length per `T` (the largest, clipped to `max_seq_len`) stands for
/// all; `tests/mla_plan.rs` checks this against the maximum over every length.
pub fn worst_case(dtype: KvDtype, max_batch: i64, max_seq_len: i64, sm_count: i64) -> Result<Plan> {
    positive("sm_count", sm_count)?;
    super::worst_over_tiles(max_batch, max_seq_len, TILE_S, |b, s| plan(dtype, b, s, sm_count, None), |p| p.workspace_bytes)
}

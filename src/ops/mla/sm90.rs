//! Planning for graphsafe's own Hopper (sm_90a) MLA decode kernel (`cuda-src/mla/sm90/`): split
//! count and workspace (fp32 partial O and LSE per split). Host code; runs without a GPU. The op
//! and `graphsafe plan mla --arch sm_90` both use these functions.

use super::KvDtype;
use crate::error::{positive, Error, Result};
use crate::sys::{check_glue, kernels as k};

/// KV tokens per tile of the sm90 kernel.
pub const TILE_S: u32 = k::GS_MLA_SM90_TILE_S;

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
    let (b, s, m) = (positive("batch", batch)?, positive("max_seq_len", max_seq_len)?, positive("sm_count", sm_count)?);
    let h = check_heads(num_heads)?;
    let req = match requested {
        None => 0,
        Some(r) => {
            let max = (max_seq_len as u64).div_ceil(TILE_S as u64).min(256);
            if r < 1 || r as u64 > max {
                return Err(Error::invalid("num_splits", format!("1..={max} (one {TILE_S}-token tile per split at least)"), r));
            }
            r as i32
        }
    };
    let mut out = 0i32;
    // SAFETY: host function; out-pointer to a local.
    check_glue(unsafe { k::gs_mla_sm90_num_splits(b, h, s, m, req, &mut out) }, "gs_mla_sm90_num_splits")?;
    Ok(out as u32)
}

/// Workspace bytes for (batch, heads, splits).
pub fn workspace_bytes(batch: i64, num_heads: i64, num_splits: i64) -> Result<u64> {
    let b = positive("batch", batch)?;
    let h = check_heads(num_heads)?;
    let n = positive("num_splits", num_splits)?;
    let mut out = 0u64;
    // SAFETY: host function; out-pointer to a local.
    check_glue(unsafe { k::gs_mla_sm90_workspace_bytes(b, h, n, &mut out) }, "gs_mla_sm90_workspace_bytes")?;
    Ok(out)
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

/// The worst case over batch `1..=max_batch` and sequence lengths `1..=max_seq_len`. The default
/// rule depends on the length only through its 64-token tile count, so one length per tile count
/// stands for all (tests/mla_plan.rs checks this against every length).
pub fn worst_case(dtype: KvDtype, num_heads: i64, max_batch: i64, max_seq_len: i64, sm_count: i64) -> Result<Plan> {
    super::worst_over_tiles(max_batch, max_seq_len, TILE_S, |b, s| plan(dtype, num_heads, b, s, sm_count, None), |p| p.workspace_bytes)
}

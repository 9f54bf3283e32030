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
//! * batch > 1: one split, persistent scheduler (one split is never empty: the sanitize pre-pass
//!   below runs an empty request as one token);
//! * batch = 1: at most `cap = min(16, ceil(seq/128), max(1, sm_count/2))` splits (the kernel runs
//!   2-SM clusters, so an SM pair is one slot, as FlashInfer PR 3888 budgets), on the *individual*
//!   scheduler, where a CTA handles exactly one tile and cannot loop into the hang. The default is
//!   the balanced count `ceil(T / ceil(T / cap))`, `T = ceil(seq/128)`: the same tiles per split
//!   as `cap`, no empty split, and a smaller workspace.
//!
//! The rule lives in the C glue (`cuda-src/mla/sm100/plan.cu`) so the C ABI and Rust share it.
//!
//! # Device data
//! CUTLASS trusts `seq_lens` and the page table; graphsafe does not. The decode first runs a
//! sanitize pre-pass on the stream that writes clamped lengths and a clamped, compact copy of the
//! page table into a region of the workspace ([`sanitize_layout`]), CUTLASS reads those, and a
//! post-pass writes the output of empty requests. The rules, the same as the sm90 kernel's, are on
//! [`super::MlaDecodeArgs::seq_lens`] and [`super::MlaDecodeArgs::page_table`].
//!
//! # Limits
//! batch `1..=`[`super::MAX_BATCH`], max_seq_len `1..=`[`super::MAX_SEQ_LEN`], sm_count
//! `1..=`[`super::MAX_SM_COUNT`], page_size a power of two up to 128, and `batch × columns` of the
//! compact page table at most `i32::MAX` (CUTLASS indexes it with int32). Every function here
//! refuses values beyond them with [`crate::Error::InvalidArgument`] naming the limit.

use super::{check_limits, in_range, KvDtype, MAX_BATCH, MAX_SEQ_LEN};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::target::Target;
use crate::sys::glue::mla::{self as glue, Rows};
use crate::sys::kernels as k;

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
    /// Tokens per page of the KV cache (sizes the sanitized page table).
    pub page_size: u32,
    /// SMs of the target GPU.
    pub sm_count: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Tile scheduler the decode launches.
    pub scheduler: Scheduler,
    /// Workspace bytes: CUTLASS's `get_workspace_size` for these arguments, rounded up to 256,
    /// plus `sanitize_bytes`.
    pub workspace_bytes: u64,
    /// The part of `workspace_bytes` that holds the sanitized device data ([`sanitize_layout`]).
    pub sanitize_bytes: u64,
}

/// Where the decode keeps its sanitized copies of the device data, relative to the start of the
/// sanitize region (which follows CUTLASS's part of the workspace). Every offset is 256-byte
/// aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SanitizeLayout {
    /// `i32 [batch]`: `seq_lens` clamped to `0..=max_seq_len`; 0 marks an empty request.
    pub lens_offset: u64,
    /// `i32 [batch]`: `max(1, lens)`, the lengths CUTLASS reads (an empty request runs one token).
    pub kernel_lens_offset: u64,
    /// `i32 [batch, columns]`: the clamped, compact page table CUTLASS reads.
    pub page_table_offset: u64,
    /// `f32 [batch, 128]`: split-KV LSE scratch when the caller passes no `lse` (present only with
    /// more than one split; equal to `bytes` otherwise).
    pub lse_offset: u64,
    /// Bytes of the region.
    pub bytes: u64,
    /// Columns of the compact page table: `ceil(max_seq_len / 128) × (128 / page_size)`, whole KV
    /// tiles (CUTLASS reads the index of every page of a tile, also past the length).
    pub columns: u32,
}

/// `page_size` as an `i32` when it is a power of two up to 128 (what the kernel's loaders take).
pub fn check_page_size(page_size: i64) -> Result<i32> {
    if !(1..=TILE_S as i64).contains(&page_size) || page_size & (page_size - 1) != 0 {
        return Err(Error::invalid("page_size", "a power of two up to 128 for the sm100 kernel", page_size));
    }
    Ok(page_size as i32)
}

/// The largest split count the safety rule allows.
pub fn max_safe_splits(batch: i64, max_seq_len: i64, sm_count: i64) -> Result<u32> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    Ok(glue::sm100_max_safe_splits(b, s, m)? as u32)
}

/// KV splits for (batch, max_seq_len, sm_count): the default rule when `requested` is `None`,
/// else `requested` after checking it against the rule.
pub fn num_splits(batch: i64, max_seq_len: i64, sm_count: i64, requested: Option<i64>) -> Result<u32> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    let req = match requested {
        None => 0,
        Some(r) => {
            let cap = max_safe_splits(batch, max_seq_len, sm_count)?;
            if r < 1 || r > cap as i64 {
                return Err(Error::invalid(
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
    Ok(glue::sm100_num_splits(b, s, m, req)? as u32)
}

/// The scheduler the decode launches for a split count.
pub fn scheduler(num_splits: u32) -> Result<Scheduler> {
    let n = in_range("num_splits", num_splits as i64, MAX_SPLITS as i64)?;
    Ok(if glue::sm100_persistent(n)? { Scheduler::Persistent } else { Scheduler::Individual })
}

/// The sanitize region for these arguments (its size is part of [`workspace_bytes`]).
pub fn sanitize_layout(batch: i64, max_seq_len: i64, page_size: i64, num_splits: i64) -> Result<SanitizeLayout> {
    let b = in_range("batch", batch, MAX_BATCH)?;
    let s = in_range("max_seq_len", max_seq_len, MAX_SEQ_LEN)?;
    let p = check_page_size(page_size)?;
    let n = in_range("num_splits", num_splits, MAX_SPLITS as i64)?;
    // Both factors are below 2^31 here, so the product is exact in u64.
    let columns = (s as u64).div_ceil(TILE_S as u64) * (TILE_S as u64 / p as u64);
    let entries = b as u64 * columns;
    if entries > i32::MAX as u64 {
        return Err(Error::invalid(
            "batch x page-table columns",
            format!(
                "at most {} (CUTLASS indexes the page table with int32; columns = ceil(max_seq_len / 128) x 128 / page_size = {columns})",
                i32::MAX
            ),
            entries,
        ));
    }
    let l = glue::sanitize_layout(b, s, p, n)?;
    Ok(SanitizeLayout {
        lens_offset: l.lens_offset,
        kernel_lens_offset: l.kernel_lens_offset,
        page_table_offset: l.page_table_offset,
        lse_offset: l.lse_offset,
        bytes: l.bytes,
        columns: l.columns as u32,
    })
}

/// Workspace bytes of the decode: CUTLASS's `device::MLA::get_workspace_size` for these
/// arguments, rounded up to 256, then the sanitize region ([`sanitize_layout`]).
pub fn workspace_bytes(dtype: KvDtype, batch: i64, max_seq_len: i64, page_size: i64, sm_count: i64, num_splits: i64) -> Result<u64> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    let cap = max_safe_splits(batch, max_seq_len, sm_count)?;
    if num_splits < 1 || num_splits > cap as i64 {
        return Err(Error::invalid("num_splits", format!("1..={cap} (the split-KV safety rule for these arguments)"), num_splits));
    }
    sanitize_layout(batch, max_seq_len, page_size, num_splits)?; // names the failing limit first
    glue::sm100_workspace_bytes(dtype.to_glue(), b, s, page_size as i32, m, num_splits as i32)
}

/// Splits, scheduler and workspace for one decode shape.
pub fn plan(dtype: KvDtype, batch: i64, max_seq_len: i64, page_size: i64, sm_count: i64, requested_splits: Option<i64>) -> Result<Plan> {
    let num_splits = num_splits(batch, max_seq_len, sm_count, requested_splits)?;
    let sanitize = sanitize_layout(batch, max_seq_len, page_size, num_splits as i64)?;
    Ok(Plan {
        dtype,
        batch: batch as u32,
        max_seq_len: max_seq_len as u32,
        page_size: page_size as u32,
        sm_count: sm_count as u32,
        num_splits,
        scheduler: scheduler(num_splits)?,
        workspace_bytes: workspace_bytes(dtype, batch, max_seq_len, page_size, sm_count, num_splits as i64)?,
        sanitize_bytes: sanitize.bytes,
    })
}

/// The worst case over every shape an engine will capture: each batch size in `1..=max_batch` and
/// each sequence length in `1..=max_seq_len`, for one GPU and page size, with the default split
/// rule (`requested_splits` `None`) or one explicit count (shapes the count is not allowed for are
/// refused by the decode, so they need nothing). Pre-growing the workspace to
/// `plan.workspace_bytes` before capture is then enough for all of them.
///
/// Why a handful of shapes answer it exactly (at most 2 + 16·15), whatever the limits:
/// * the workspace depends on the length only through `T = ceil(seq / 128)` (the split rule and
///   the page-table columns both do), and CUTLASS's part needs more than one split, so batch 1;
/// * every other term (the sanitize region) only grows with batch and `T`, so with one split
///   `(max_batch, max_seq_len)` needs the most, and an explicit count `r > 1` (allowed only for
///   batch 1, and for every `T` from some point on) needs the most at `(1, max_seq_len)`;
/// * the default for batch 1 has `c = min(16, max(1, sm_count / 2))` splits for every
///   `T > c·(c − 1)` (then `q = ceil(T / c) ≥ c` and `ceil(T / q) = c`), the most it ever has, so
///   past `c·(c − 1)` tiles the longest length needs the most and only `T ≤ c·(c − 1)` are scanned.
///
/// `tests/mla_plan.rs` and `tests/planner_model.rs` check it against the maximum over every shape.
pub fn worst_case(dtype: KvDtype, max_batch: i64, max_seq_len: i64, page_size: i64, sm_count: i64, requested_splits: Option<i64>) -> Result<Plan> {
    let (_, _, sm) = check_limits(("max_batch", max_batch), ("max_seq_len", max_seq_len), sm_count)?;
    check_page_size(page_size)?;
    let mut shapes = vec![(max_batch, max_seq_len), (1, max_seq_len)];
    if requested_splits.is_none() {
        let c = (sm as i64 / 2).clamp(1, MAX_SPLITS as i64);
        let tiles = (max_seq_len as u64).div_ceil(TILE_S as u64) as i64; // max_seq_len >= 1 here
        shapes.extend((1..=tiles.min(c * (c - 1))).map(|t| (1, (t * TILE_S as i64).min(max_seq_len))));
    }
    let mut worst: Option<Plan> = None;
    for (b, s) in shapes {
        match plan(dtype, b, s, page_size, sm_count, requested_splits) {
            Ok(p) => {
                if worst.is_none_or(|w| p.workspace_bytes > w.workspace_bytes) {
                    worst = Some(p);
                }
            }
            // An explicit count the rule refuses for this shape: the decode would refuse it too.
            Err(Error::InvalidArgument { what, .. }) if what == "num_splits" && requested_splits.is_some() => {}
            Err(e) => return Err(e),
        }
    }
    worst.ok_or_else(|| {
        let cap = max_safe_splits(1, max_seq_len, sm_count).unwrap_or(1);
        Error::invalid(
            "num_splits",
            format!("1..={cap} (the most any batch up to {max_batch} and length up to {max_seq_len} allows on {sm_count} SMs)"),
            requested_splits.unwrap_or(0),
        )
    })
}

/// Test hook: runs the decode's sanitize pre-pass alone on `stream`, reading `seq_lens` (`[batch]`
/// i32) and `page_table` (`[batch, page_table_stride]` i32) and writing `region` as
/// [`sanitize_layout`] lays it out. Every size is checked against the buffers first.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn sanitize(
    stream: &Stream,
    seq_lens: &DeviceBuffer,
    page_table: &DeviceBuffer,
    page_table_stride: usize,
    (batch, max_seq_len, page_size, num_pages, num_splits): (i64, i64, i64, i64, i64),
    region: &DeviceBuffer,
) -> Result<SanitizeLayout> {
    let layout = sanitize_layout(batch, max_seq_len, page_size, num_splits)?;
    let pages = in_range("num_pages", num_pages, i32::MAX as i64)?;
    if num_pages * page_size > i32::MAX as i64 {
        return Err(Error::invalid("num_pages", "pages x page_size below 2^31 tokens", num_pages));
    }
    let row = (max_seq_len as u64).div_ceil(page_size as u64);
    if batch > 1 && (page_table_stride as u64) < row {
        return Err(Error::invalid("page_table_stride", format!("at least {row} (rows may not overlap)"), page_table_stride));
    }
    let stride = i32::try_from(page_table_stride).map_err(|_| Error::invalid("page_table_stride", "below 2^31", page_table_stride))?;
    let table_bytes = (batch as u64 - 1).checked_mul(page_table_stride as u64).and_then(|v| v.checked_add(row)).and_then(|v| v.checked_mul(4));
    let ctx = stream.context();
    for (what, buf, need) in
        [("seq_lens", seq_lens, Some(4 * batch as u64)), ("page_table", page_table, table_bytes), ("region", region, Some(layout.bytes))]
    {
        if need.is_none_or(|n| (buf.len() as u64) < n) {
            return Err(Error::invalid(what, format!("at least {} bytes", need.map_or("2^64".into(), |n| n.to_string())), buf.len()));
        }
        if buf.context().raw() != ctx.raw() {
            return Err(Error::invalid(format!("{what}.device"), "memory on the stream's device", "memory of another device"));
        }
    }
    let mut target = Target::eager(stream, None)?;
    let spans = (target.admit("seq_lens", &seq_lens)?, target.admit("page_table", &page_table)?, target.admit("region", &region)?);
    target.commit()?;
    let _current = ctx.enter()?;
    let sizes = (batch as i32, max_seq_len as i32, page_size as i32, pages, num_splits as i32);
    glue::sanitize(spans.0, spans.1, stride, sizes, spans.2, stream.handle())?;
    Ok(layout)
}

/// Test hook: runs the decode's post-pass alone on `stream`: for every request whose clamped
/// length in `region` (laid out by `layout`) is 0, zeros in `out` (`[batch, 128, 512]` 16-bit,
/// strides in elements) and `-inf` in `lse` (`[batch, 128]` f32).
#[doc(hidden)]
pub fn sanitize_finish(
    stream: &Stream,
    region: &DeviceBuffer,
    layout: &SanitizeLayout,
    batch: i64,
    out: (&DeviceBuffer, usize, usize),
    lse: Option<&DeviceBuffer>,
) -> Result<()> {
    let b = in_range("batch", batch, MAX_BATCH)? as u64;
    let (out, stride_b, stride_h) = out;
    let heads = super::NUM_HEADS as u64;
    let out_need = (b - 1)
        .checked_mul(stride_b as u64)
        .and_then(|v| v.checked_add((heads - 1).checked_mul(stride_h as u64)?))
        .and_then(|v| v.checked_add(super::LATENT_DIM as u64))
        .and_then(|v| v.checked_mul(2));
    let lens_need = layout.lens_offset.checked_add(4 * b);
    let ctx = stream.context();
    let mut checks = vec![("region", region, lens_need), ("out", out, out_need)];
    if let Some(l) = lse {
        checks.push(("lse", l, Some(4 * heads * b)));
    }
    for (what, buf, need) in checks {
        if need.is_none_or(|n| (buf.len() as u64) < n) {
            return Err(Error::invalid(what, format!("at least {} bytes", need.map_or("2^64".into(), |n| n.to_string())), buf.len()));
        }
        if buf.context().raw() != ctx.raw() {
            return Err(Error::invalid(format!("{what}.device"), "memory on the stream's device", "memory of another device"));
        }
    }
    let sb = i64::try_from(stride_b).map_err(|_| Error::invalid("out stride", "below 2^63", stride_b))?;
    let sh = i64::try_from(stride_h).map_err(|_| Error::invalid("out stride", "below 2^63", stride_h))?;
    let mut target = Target::eager(stream, None)?;
    let lens = target.admit("region", &region)?.skip("region", layout.lens_offset)?;
    let out = Rows { span: target.admit("out", &out)?, stride_batch: sb, stride_token: sb, stride_head: sh };
    let lse = lse.map(|l| target.admit("lse", &l)).transpose()?;
    target.commit()?;
    let _current = ctx.enter()?;
    glue::sanitize_finish(lens, b as i32, out, lse, stream.handle())
}

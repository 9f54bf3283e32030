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
//! page table into a region of the workspace ([`layout`]), CUTLASS reads those, and a post-pass
//! writes the output of the rows that attend no key. The rules, the same as the sm90 kernel's, are
//! on [`super::MlaDecodeArgs::seq_lens`] and [`super::MlaDecodeArgs::page_table`].
//!
//! # Shapes CUTLASS does not take
//! CUTLASS's kernel runs exactly one query token of 128 heads per request; graphsafe adapts every
//! other [`Shape`] inside the workspace, so the caller never does:
//!
//! * **s_q tokens** run as `B' = batch × s_q` kernel requests: kernel request `j = b·s_q + t` is
//!   token `t` of request `b`, over request `b`'s page-table row, with the length
//!   `len - (s_q - 1 - t)` when causal (token `t` attends keys `0 ..= len - s_q + t`) or `len`
//!   when not (`len` clamped first; a length ≤ 0 is a row that attends no key, run as one token
//!   and overwritten with zeros and `+inf`). The split rule sees `B'`, so only a single request of
//!   one token ever splits. `B'` must stay within [`super::MAX_BATCH`].
//! * **fewer than 128 heads** are padded: the pre-pass copies q into a `[B', 128, 576]` staging
//!   buffer (latent then rope, the padding heads zero), CUTLASS writes a `[B', 128, 512]` output
//!   and `[B', 128]` LSE staging, and the post-pass copies the real heads back into the caller's
//!   `out` (any strides) and `lse` (`[batch, heads, s_q]`).
//!
//! A decode of one token of 128 heads stays **direct**: CUTLASS reads q and writes out and lse in
//! place, no copies. Every other shape is **adapted** (and also takes `out` strides the direct
//! path refuses with splits). The price of adapting: the copies, CUTLASS computing 128 heads
//! whatever the count, and each request's keys read `s_q` times.
//! `include/graphsafe_kernels/mla.h` ("the shapes graphsafe adapts") has the contract, and
//! `gs_mla_sm100_kernel_args` (`cuda-src/mla/sm100/plan.cu`) computes what CUTLASS is given, on
//! the host, where the CPU tests check it.
//!
//! # Limits
//! batch `1..=`[`super::MAX_BATCH`], also `batch × s_q`; max_seq_len `1..=`[`super::MAX_SEQ_LEN`],
//! sm_count `1..=`[`super::MAX_SM_COUNT`], heads `1..=`[`super::NUM_HEADS`], s_q
//! `1..=`[`super::MAX_S_Q`], page_size a power of two up to 128, and `B' × columns` of the compact
//! page table at most `i32::MAX` (CUTLASS indexes it with int32). Every function here refuses
//! values beyond them with [`crate::Error::InvalidArgument`] naming the limit.

use super::plan::{check_batch, check_heads, check_s_q};
use super::{check_limits, in_range, DType, MlaArch, MlaDecodeArgs, MAX_BATCH, NUM_HEADS};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
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

/// One decode shape as the sm100 planner takes it: the caller's shape, before graphsafe adapts it
/// (see the module docs). Sizes are `i64` so that a value outside every limit is refused by name
/// rather than unrepresentable. Build it with [`Shape::new`] and the `with_*` setters.
///
/// ```
/// use graphsafe::ops::{mla::sm100, tensor::DType};
/// // TP 8 (16 heads), MTP (2 tokens), 64 requests of up to 32K tokens, 64-token pages, a B200.
/// let shape = sm100::Shape::new(DType::Bf16, 64, 32_768, 64, 148).with_heads(16).with_s_q(2);
/// let plan = sm100::plan(&shape, None)?;
/// assert_eq!((plan.kernel_batch, plan.num_splits), (128, 1)); // CUTLASS runs 128 requests
/// # Ok::<(), graphsafe::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Shape {
    /// Element type of q and the KV cache.
    pub dtype: DType,
    /// Requests (for [`worst_case`]: the largest batch).
    pub batch: i64,
    /// Query heads, `1..=128`.
    pub num_heads: i64,
    /// Query tokens per request, `1..=16` (for [`worst_case`]: the most).
    pub s_q: i64,
    /// Longest request (sizes splits and workspace).
    pub max_seq_len: i64,
    /// Tokens per page of the KV cache (sizes the sanitized page table).
    pub page_size: i64,
    /// SMs of the target GPU.
    pub sm_count: i64,
}

impl Shape {
    /// `batch` requests of one token of 128 heads (CUTLASS's own shape: a direct decode).
    pub fn new(dtype: DType, batch: i64, max_seq_len: i64, page_size: i64, sm_count: i64) -> Shape {
        Shape { dtype, batch, num_heads: NUM_HEADS as i64, s_q: 1, max_seq_len, page_size, sm_count }
    }
    /// Query heads.
    pub fn with_heads(mut self, num_heads: i64) -> Shape {
        self.num_heads = num_heads;
        self
    }
    /// Query tokens per request.
    pub fn with_s_q(mut self, s_q: i64) -> Shape {
        self.s_q = s_q;
        self
    }
    /// Whether CUTLASS runs this shape in place (one token of 128 heads) rather than over
    /// staging copies in the workspace.
    pub fn is_direct(&self) -> bool {
        self.num_heads == NUM_HEADS as i64 && self.s_q == 1
    }
    /// The requests CUTLASS runs, `batch × s_q`, after checking heads, tokens and batch against
    /// their limits (each refusal names its field; one above [`MAX_BATCH`] names `batch x s_q`).
    pub fn kernel_batch(&self) -> Result<i64> {
        check_batch("batch", self.batch)?;
        check_heads(self.num_heads)?;
        check_s_q(self.s_q)?;
        let kb = self.batch * self.s_q; // both checked above: no overflow
        if kb > MAX_BATCH {
            return Err(Error::invalid(
                "batch x s_q",
                format!("at most {MAX_BATCH} (CUTLASS's kernel runs each of the s_q query tokens as a request of its own)"),
                format!("{} x {} = {kb}", self.batch, self.s_q),
            ));
        }
        Ok(kb)
    }
    /// The glue's shape for `num_splits` (every field checked first).
    fn to_glue(self, num_splits: i64) -> Result<k::GsMlaSm100Shape> {
        self.kernel_batch()?;
        let (_, s, m) = check_limits(("batch", self.batch), ("max_seq_len", self.max_seq_len), self.sm_count)?;
        Ok(k::GsMlaSm100Shape {
            dtype: super::glue_dtype("dtype", self.dtype)?.code(),
            batch: self.batch as i32,
            num_heads: self.num_heads as i32,
            s_q: self.s_q as i32,
            max_seq_len: s,
            page_size: check_page_size(self.page_size)?,
            sm_count: m,
            num_splits: in_range("num_splits", num_splits, MAX_SPLITS as i64)?,
        })
    }
}

/// The plan for one decode shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// Element type of q and the KV cache.
    pub dtype: DType,
    /// Requests in the batch.
    pub batch: u32,
    /// Query heads.
    pub num_heads: u32,
    /// Query tokens per request.
    pub s_q: u32,
    /// Requests CUTLASS runs: `batch × s_q`.
    pub kernel_batch: u32,
    /// Whether CUTLASS runs over staging copies (fewer than 128 heads, or more than one token).
    pub adapted: bool,
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
    /// The part of `workspace_bytes` that graphsafe's region takes (sanitized device data and an
    /// adapted decode's staging: [`layout`]).
    pub sanitize_bytes: u64,
}

/// Where the decode keeps what it makes for CUTLASS, relative to the start of its region (which
/// follows CUTLASS's part of the workspace): every offset is 256-byte aligned, the parts in this
/// order, and a part that is absent has no bytes (its offset equals the next one's). `B'` is
/// `kernel_batch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SanitizeLayout {
    /// `i32 [B']`: each kernel request's length clamped to `0..=max_seq_len`; 0 marks a row that
    /// attends no key.
    pub lens_offset: u64,
    /// `i32 [B']`: `max(1, lens)`, the lengths CUTLASS reads (an empty row runs one token).
    pub kernel_lens_offset: u64,
    /// `i32 [B', columns]`: the clamped, compact page table CUTLASS reads (kernel request `j`:
    /// request `j / s_q`'s row).
    pub page_table_offset: u64,
    /// `f32 [B', 128]`: the LSE CUTLASS writes when it does not write the caller's: an adapted
    /// decode's staging, or a direct decode's split-KV scratch (used when the caller passes no
    /// `lse`). Absent for a direct decode of one split.
    pub lse_offset: u64,
    /// Adapted decodes: q's elements `[B', 128, 576]` (latent then rope, padding heads zero).
    pub q_offset: u64,
    /// Adapted decodes: the 16-bit output `[B', 128, 512]` CUTLASS writes.
    pub out_offset: u64,
    /// Bytes of the region.
    pub bytes: u64,
    /// Columns of the compact page table: `ceil(max_seq_len / 128) × (128 / page_size)`, whole KV
    /// tiles (CUTLASS reads the index of every page of a tile, also past the length).
    pub columns: u32,
    /// `B'`: the requests CUTLASS runs, `batch × s_q`.
    pub kernel_batch: u32,
    /// Whether the decode is adapted (then the staging parts are present).
    pub adapted: bool,
}

impl SanitizeLayout {
    fn to_glue(self) -> k::GsMlaSanitizeLayout {
        k::GsMlaSanitizeLayout {
            lens_offset: self.lens_offset,
            kernel_lens_offset: self.kernel_lens_offset,
            page_table_offset: self.page_table_offset,
            lse_offset: self.lse_offset,
            q_offset: self.q_offset,
            out_offset: self.out_offset,
            bytes: self.bytes,
            columns: self.columns as i32,
            kernel_batch: self.kernel_batch as i32,
            adapted: self.adapted as i32,
        }
    }

    fn of(l: k::GsMlaSanitizeLayout) -> SanitizeLayout {
        SanitizeLayout {
            lens_offset: l.lens_offset,
            kernel_lens_offset: l.kernel_lens_offset,
            page_table_offset: l.page_table_offset,
            lse_offset: l.lse_offset,
            q_offset: l.q_offset,
            out_offset: l.out_offset,
            bytes: l.bytes,
            columns: l.columns as u32,
            kernel_batch: l.kernel_batch as u32,
            adapted: l.adapted != 0,
        }
    }
}

/// `page_size` as an `i32` when it is a power of two up to 128 (what the kernel's loaders take):
/// the sm100 rule of [`super::plan::check_page_size`].
pub fn check_page_size(page_size: i64) -> Result<i32> {
    super::plan::check_page_size(MlaArch::Sm100, page_size)
}

/// The largest split count the safety rule allows. `batch` is the requests CUTLASS runs
/// ([`Shape::kernel_batch`]: `batch × s_q` of the decode).
pub fn max_safe_splits(batch: i64, max_seq_len: i64, sm_count: i64) -> Result<u32> {
    let (b, s, m) = check_limits(("batch", batch), ("max_seq_len", max_seq_len), sm_count)?;
    Ok(glue::sm100_max_safe_splits(b, s, m)? as u32)
}

/// KV splits for (batch, max_seq_len, sm_count): the default rule when `requested` is `None`,
/// else `requested` after checking it against the rule. `batch` is the requests CUTLASS runs
/// ([`Shape::kernel_batch`]: `batch × s_q` of the decode).
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

/// The region for `shape` and `num_splits` (its size is part of [`workspace_bytes`]).
pub fn layout(shape: &Shape, num_splits: i64) -> Result<SanitizeLayout> {
    let g = shape.to_glue(num_splits)?;
    let kb = shape.kernel_batch()? as u64;
    // Both factors are below 2^31 here, so the product is exact in u64.
    let columns = (g.max_seq_len as u64).div_ceil(TILE_S as u64) * (TILE_S as u64 / g.page_size as u64);
    let entries = kb * columns;
    if entries > i32::MAX as u64 {
        let what = if shape.s_q > 1 { "batch x s_q x page-table columns" } else { "batch x page-table columns" };
        return Err(Error::invalid(
            what,
            format!(
                "at most {} (CUTLASS indexes the page table with int32; columns = ceil(max_seq_len / 128) x 128 / page_size = {columns})",
                i32::MAX
            ),
            entries,
        ));
    }
    Ok(SanitizeLayout::of(glue::sanitize_layout(&g)?))
}

/// The region of a direct decode (one token of 128 heads): [`layout`] of
/// [`Shape::new`]`(_, batch, max_seq_len, page_size, _)`.
pub fn sanitize_layout(batch: i64, max_seq_len: i64, page_size: i64, num_splits: i64) -> Result<SanitizeLayout> {
    layout(&Shape::new(DType::Bf16, batch, max_seq_len, page_size, 1), num_splits)
}

/// Workspace bytes of the decode: CUTLASS's `device::MLA::get_workspace_size` for its `B'`
/// requests, rounded up to 256, then the region ([`layout`]).
pub fn workspace_bytes(shape: &Shape, num_splits: i64) -> Result<u64> {
    let kb = shape.kernel_batch()?;
    check_limits(("batch", shape.batch), ("max_seq_len", shape.max_seq_len), shape.sm_count)?;
    let cap = max_safe_splits(kb, shape.max_seq_len, shape.sm_count)?;
    if num_splits < 1 || num_splits > cap as i64 {
        return Err(Error::invalid("num_splits", format!("1..={cap} (the split-KV safety rule for these arguments)"), num_splits));
    }
    layout(shape, num_splits)?; // names the failing limit first
    glue::sm100_workspace_bytes(&shape.to_glue(num_splits)?)
}

/// Splits, scheduler and workspace for one decode shape.
pub fn plan(shape: &Shape, requested_splits: Option<i64>) -> Result<Plan> {
    let kb = shape.kernel_batch()?;
    check_limits(("batch", shape.batch), ("max_seq_len", shape.max_seq_len), shape.sm_count)?;
    let num_splits = num_splits(kb, shape.max_seq_len, shape.sm_count, requested_splits)?;
    let region = layout(shape, num_splits as i64)?;
    Ok(Plan {
        dtype: shape.dtype,
        batch: shape.batch as u32,
        num_heads: shape.num_heads as u32,
        s_q: shape.s_q as u32,
        kernel_batch: kb as u32,
        adapted: region.adapted,
        max_seq_len: shape.max_seq_len as u32,
        page_size: shape.page_size as u32,
        sm_count: shape.sm_count as u32,
        num_splits,
        scheduler: scheduler(num_splits)?,
        workspace_bytes: workspace_bytes(shape, num_splits as i64)?,
        sanitize_bytes: region.bytes,
    })
}

/// The worst case over every shape an engine will capture: each batch size in `1..=limits.batch`,
/// each token count in `1..=limits.s_q` and each sequence length in `1..=limits.max_seq_len`, for
/// one GPU, page size and head count, with the default split rule (`requested_splits` `None`) or
/// one explicit count (shapes the count is not allowed for are refused by the decode, so they
/// need nothing). Pre-growing the workspace to `plan.workspace_bytes` before capture is then
/// enough for all of them.
///
/// Why a handful of shapes answer it exactly (at most 2 + 16·15), whatever the limits:
/// * the workspace depends on the length only through `T = ceil(seq / 128)` (the split rule and
///   the page-table columns both do), on batch and tokens only through `B' = batch × s_q` and
///   whether the decode is adapted, and CUTLASS's part needs more than one split, so `B' = 1`;
/// * every other term (the region) only grows with `B'`, `T`, adapting (which `s_q > 1` implies)
///   and splitting (a direct decode's LSE scratch), so with one split
///   `(limits.batch, limits.s_q, max_seq_len)` needs the most, and an explicit count `r > 1`
///   (allowed only for `B' = 1`, and for every `T` from some point on) needs the most at
///   `(1, 1, max_seq_len)`;
/// * the default for `B' = 1` has `c = min(16, max(1, sm_count / 2))` splits for every
///   `T > c·(c − 1)` (then `q = ceil(T / c) ≥ c` and `ceil(T / q) = c`), the most it ever has, so
///   past `c·(c − 1)` tiles the longest length needs the most and only `T ≤ c·(c − 1)` are scanned.
///
/// `tests/mla_plan.rs` and `tests/planner_model.rs` check it against the maximum over every shape.
pub fn worst_case(limits: &Shape, requested_splits: Option<i64>) -> Result<Plan> {
    let (max_batch, max_seq_len) = (limits.batch, limits.max_seq_len);
    let (_, _, sm) = check_limits(("max_batch", max_batch), ("max_seq_len", max_seq_len), limits.sm_count)?;
    limits.kernel_batch()?;
    check_page_size(limits.page_size)?;
    let one = |b: i64, s_q: i64, seq: i64| Shape { batch: b, s_q, max_seq_len: seq, ..*limits };
    let mut shapes = vec![one(max_batch, limits.s_q, max_seq_len), one(1, 1, max_seq_len)];
    if requested_splits.is_none() {
        let c = (sm as i64 / 2).clamp(1, MAX_SPLITS as i64);
        let tiles = (max_seq_len as u64).div_ceil(TILE_S as u64) as i64; // max_seq_len >= 1 here
        shapes.extend((1..=tiles.min(c * (c - 1))).map(|t| one(1, 1, (t * TILE_S as i64).min(max_seq_len))));
    }
    let mut worst: Option<Plan> = None;
    for shape in shapes {
        match plan(&shape, requested_splits) {
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
        let cap = max_safe_splits(1, max_seq_len, sm as i64).unwrap_or(1);
        Error::invalid(
            "num_splits",
            format!("1..={cap} (the most any batch up to {max_batch} and length up to {max_seq_len} allows on {sm} SMs)"),
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
    let mut target = OpTarget::eager(stream, None)?;
    let spans = (target.admit("seq_lens", &seq_lens)?, target.admit("page_table", &page_table)?, target.admit("region", &region)?);
    let sizes = (batch as i32, max_seq_len as i32, page_size as i32, pages, num_splits as i32);
    let written = target.commit()?.glue(|stream| glue::sanitize(spans.0, spans.1, stride, sizes, spans.2, stream))?;
    Ok(SanitizeLayout::of(written))
}

/// Test hook: runs a direct decode's post-pass alone on `stream`: for every request whose clamped
/// length in `region` (laid out by `layout`, a direct decode's) is 0, zeros in `out`
/// (`[batch, 128, 512]` 16-bit, strides in elements) and `+inf` in `lse` (`[batch, 128]` f32).
#[doc(hidden)]
pub fn sanitize_finish(
    stream: &Stream,
    region: &DeviceBuffer,
    layout: &SanitizeLayout,
    batch: i64,
    out: (&DeviceBuffer, usize, usize),
    lse: Option<&DeviceBuffer>,
) -> Result<()> {
    let b = check_batch("batch", batch)? as u64;
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
    let mut target = OpTarget::eager(stream, None)?;
    let region = target.admit("region", &region)?;
    let out = Rows { span: target.admit("out", &out)?, stride_batch: sb, stride_token: sb, stride_head: sh };
    let lse = lse.map(|l| target.admit("lse", &l)).transpose()?;
    target.commit()?.glue(|stream| glue::sanitize_finish(region, &layout.to_glue(), b as i32, out, lse, stream))
}

/// Which of the decode's passes a test hook runs.
#[derive(Clone, Copy)]
enum Pass {
    Pre,
    Post,
}

/// Test hook: runs the pre-pass of the sm100 decode of `args` alone on `stream`, as the decode
/// would on a GPU with `sm_count` SMs (every argument checked and converted as the decode does it,
/// so an adapted decode's q staging and s_q expansion run exactly as there): reads the lengths,
/// the page table and (adapted) the queries, writes `region` (graphsafe's region of the
/// workspace, at least [`layout`]'s bytes for the decode's shape). Returns that layout. The
/// passes are plain CUDA, so this runs on every GPU graphsafe builds for, Hopper included.
#[doc(hidden)]
pub fn pre_pass(args: &MlaDecodeArgs<&DeviceBuffer>, sm_count: u32, region: &DeviceBuffer, stream: &Stream) -> Result<SanitizeLayout> {
    run_pass(Pass::Pre, args, sm_count, region, stream)
}

/// Test hook: runs the post-pass of the sm100 decode of `args` alone on `stream` (as
/// [`pre_pass`]): reads `region` (the lengths and, adapted, the staged output and LSE that CUTLASS
/// would have written), writes `args.out` and `args.lse`. Returns the region's layout.
#[doc(hidden)]
pub fn post_pass(args: &MlaDecodeArgs<&DeviceBuffer>, sm_count: u32, region: &DeviceBuffer, stream: &Stream) -> Result<SanitizeLayout> {
    run_pass(Pass::Post, args, sm_count, region, stream)
}

fn run_pass(pass: Pass, args: &MlaDecodeArgs<&DeviceBuffer>, sm_count: u32, region: &DeviceBuffer, stream: &Stream) -> Result<SanitizeLayout> {
    let ctx = stream.context();
    let plan = args.plan(MlaArch::Sm100, sm_count, ctx.raw())?;
    let mut target = OpTarget::eager(stream, None)?;
    let d = args.to_glue(&plan, sm_count, ctx.device().ordinal(), &mut target)?;
    let region = target.admit("region", &region)?;
    let l = target.commit()?.glue(|stream| match pass {
        Pass::Pre => glue::sm100_pre_pass(&d, region, stream),
        Pass::Post => glue::sm100_post_pass(&d, region, stream),
    })?;
    Ok(SanitizeLayout::of(l))
}

//! MLA glue (`include/graphsafe_kernels/mla.h`): the split rules and workspace sizes of both
//! back-ends, the sm100 sanitize passes and the two decodes. See the module docs of [`super`] for
//! what every launch checks and trusts.

use super::{check, out, require_workspace, DeviceSpan, GlueDtype, RawStream};
use crate::error::{Error, Result};
use crate::sys::kernels as k;
use crate::sys::span::{extent_of, unsigned};

/// KV splits of the CUTLASS sm100 kernel (`requested` 0: the default rule).
pub(crate) fn sm100_num_splits(batch: i32, max_seq_len: i32, sm_count: i32, requested: i32) -> Result<i32> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sm100_num_splits", |o| unsafe { k::gs_mla_sm100_num_splits(batch, max_seq_len, sm_count, requested, o) })
}

/// The most splits the sm100 safety rule allows.
pub(crate) fn sm100_max_safe_splits(batch: i32, max_seq_len: i32, sm_count: i32) -> Result<i32> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sm100_max_safe_splits", |o| unsafe { k::gs_mla_sm100_max_safe_splits(batch, max_seq_len, sm_count, o) })
}

/// Whether the sm100 decode runs the persistent scheduler for `num_splits`.
pub(crate) fn sm100_persistent(num_splits: i32) -> Result<bool> {
    // SAFETY: host function; the out-pointer is a live local.
    let s: i32 = out("gs_mla_sm100_scheduler", |o| unsafe { k::gs_mla_sm100_scheduler(num_splits, o) })?;
    Ok(s as u32 == k::GsMlaScheduler::GS_MLA_SCHED_PERSISTENT.0)
}

/// The sm100 decode's sanitize region for these arguments.
pub(crate) fn sanitize_layout(batch: i32, max_seq_len: i32, page_size: i32, num_splits: i32) -> Result<k::GsMlaSanitizeLayout> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sanitize_layout", |o| unsafe { k::gs_mla_sanitize_layout(batch, max_seq_len, page_size, num_splits, o) })
}

/// Workspace bytes of the sm100 decode (CUTLASS's part, then the sanitize region).
pub(crate) fn sm100_workspace_bytes(dtype: GlueDtype, batch: i32, max_seq_len: i32, page_size: i32, sm_count: i32, num_splits: i32) -> Result<u64> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sm100_workspace_bytes", |o| unsafe { k::gs_mla_sm100_workspace_bytes(dtype.code(), batch, max_seq_len, page_size, sm_count, num_splits, o) })
}

/// KV splits of the sm90 kernel (`requested` 0: the default rule).
pub(crate) fn sm90_num_splits(batch: i32, num_heads: i32, s_q: i32, max_seq_len: i32, sm_count: i32, requested: i32) -> Result<i32> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sm90_num_splits", |o| unsafe { k::gs_mla_sm90_num_splits(batch, num_heads, s_q, max_seq_len, sm_count, requested, o) })
}

/// Workspace bytes of the sm90 decode (0 for one split).
pub(crate) fn sm90_workspace_bytes(batch: i32, num_heads: i32, s_q: i32, num_splits: i32) -> Result<u64> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_mla_sm90_workspace_bytes", |o| unsafe { k::gs_mla_sm90_workspace_bytes(batch, num_heads, s_q, num_splits, o) })
}

fn count(what: &str, v: i32) -> Result<u64> {
    u64::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| Error::invalid(what, "a positive count", v))
}

/// A `[batch, s_q, heads, dim]` operand with its batch, token and head strides (elements;
/// innermost 1).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    pub span: DeviceSpan,
    pub stride_batch: i64,
    pub stride_token: i64,
    pub stride_head: i64,
}

impl Rows {
    /// The address, after checking that `[batch, s_q, heads, dim]` elements of `elem` bytes lie in
    /// the span and that it is `align`-byte aligned.
    fn address(&self, what: &str, elem: u64, (b, s, h, dim): (u64, u64, u64, u64), align: u64) -> Result<u64> {
        let stride = |name: &str, v: i64| unsigned(&format!("{what}.{name}"), v);
        let (sb, st, sh) = (stride("stride_batch", self.stride_batch)?, stride("stride_token", self.stride_token)?, stride("stride_head", self.stride_head)?);
        self.span.require(what, extent_of(what, elem, &[(b, sb), (s, st), (h, sh), (dim, 1)])?, align)
    }
}

/// How the cache stores K and V (`GsMlaKvFormat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KvLayout {
    /// `[pages, page_size, 576]` in q's dtype.
    Native,
    /// `[pages, page_size, 576]` e4m3 and the span of one f32 scale.
    Fp8PerTensor { scale: DeviceSpan },
    /// `[pages, page_size, 656]` bytes (DeepSeek V3.2's token).
    Fp8DsMla,
}

impl KvLayout {
    fn code(self) -> i32 {
        (match self {
            KvLayout::Native => k::GsMlaKvFormat::GS_MLA_KV_NATIVE,
            KvLayout::Fp8PerTensor { .. } => k::GsMlaKvFormat::GS_MLA_KV_FP8_PER_TENSOR,
            KvLayout::Fp8DsMla => k::GsMlaKvFormat::GS_MLA_KV_FP8_DS_MLA,
        })
        .0 as i32
    }

    /// (bytes per element, elements per token) of the cache, for q's element size `q_bytes`.
    fn token(self, q_bytes: u64) -> (u64, u64) {
        match self {
            KvLayout::Native => (q_bytes, 576),
            KvLayout::Fp8PerTensor { .. } => (1, 576),
            KvLayout::Fp8DsMla => (1, k::GS_MLA_DS_MLA_TOKEN_BYTES as u64),
        }
    }
}

/// The decode back-ends: the arch table's (`crate::arch` has no dependencies, so sys may use it).
pub(crate) use crate::arch::MlaArch as Backend;

/// One decode step (`GsMlaDecodeArgs`), its device memory as spans.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decode {
    pub dtype: GlueDtype,
    pub batch: i32,
    pub num_heads: i32,
    /// Query tokens per request.
    pub s_q: i32,
    /// Token t of s_q attends keys `0 ..= len - s_q + t`.
    pub causal: bool,
    pub max_seq_len: i32,
    pub num_splits: i32,
    pub sm_count: i32,
    pub device: i32,
    /// `[batch, s_q, heads, 512]`.
    pub q_nope: Rows,
    /// `[batch, s_q, heads, 64]`.
    pub q_pe: Rows,
    /// `[num_pages, page_size, 576]` (656 bytes per token for [`KvLayout::Fp8DsMla`]), contiguous.
    pub kv_cache: DeviceSpan,
    pub kv_layout: KvLayout,
    pub num_pages: i32,
    pub page_size: i32,
    /// `[batch]` i32.
    pub seq_lens: DeviceSpan,
    /// `[batch, page_table_stride]` i32, of which the first `ceil(max_seq_len / page_size)`
    /// columns of each row are read.
    pub page_table: DeviceSpan,
    pub page_table_stride: i32,
    /// `[batch, s_q, heads, 512]`, 16-bit.
    pub out: Rows,
    /// `[batch, heads, s_q]` f32.
    pub lse: Option<DeviceSpan>,
    pub sm_scale: f32,
}

/// Launches the decode on `backend` (when this build has it) with workspace `ws`.
pub(crate) fn decode(backend: Backend, d: &Decode, ws: DeviceSpan, stream: RawStream) -> Result<()> {
    let (b, s, h) = (count("batch", d.batch)?, count("s_q", d.s_q)?, count("num_heads", d.num_heads)?);
    let (pages, page) = (count("num_pages", d.num_pages)?, count("page_size", d.page_size)?);
    let e = d.dtype.bytes();
    let q_nope = d.q_nope.address("q_nope", e, (b, s, h, 512), 16)?;
    let q_pe = d.q_pe.address("q_pe", e, (b, s, h, 64), 16)?;
    let (kv_elem, kv_row) = d.kv_layout.token(e);
    let kv = d.kv_cache.require("kv_cache", extent_of("kv_cache", kv_elem, &[(pages, page * kv_row), (page * kv_row, 1)])?, 16)?;
    let kv_scale = match d.kv_layout {
        KvLayout::Fp8PerTensor { scale } => scale.require("kv_scale", 4, 4)?,
        _ => 0,
    };
    let lens = d.seq_lens.require("seq_lens", 4 * b, 4)?;
    let columns = count("max_seq_len", d.max_seq_len)?.div_ceil(page);
    let stride = unsigned("page_table_stride", d.page_table_stride as i64)?;
    let table = d.page_table.require("page_table", extent_of("page_table", 4, &[(b, stride), (columns, 1)])?, 4)?;
    let outp = d.out.address("out", 2, (b, s, h, 512), 16)?;
    let lse = match d.lse {
        Some(l) => l.require("lse", 4 * b * h * s, 4)?,
        None => 0,
    };
    if backend == Backend::Sm100 {
        // CUTLASS builds the Q and O tensor maps from these strides, and the driver takes only
        // multiples of 16 bytes below 2^40; CUTLASS's own check of the encode compiles out
        // (NDEBUG), so a bad stride would run the kernel on a zeroed map. The op passes a dense
        // stride for a dimension of size 1 (Decode's contract).
        for (what, r, elem) in [("q_nope", &d.q_nope, e), ("q_pe", &d.q_pe, e), ("out", &d.out, 2)] {
            for (name, st) in [("stride_batch", r.stride_batch), ("stride_token", r.stride_token), ("stride_head", r.stride_head)] {
                let bytes = unsigned(&format!("{what}.{name}"), st)?.checked_mul(elem);
                if bytes.is_none_or(|b| b % 16 != 0 || b >= 1 << 40) {
                    return Err(Error::invalid(format!("{what}.{name}"), "a multiple of 16 bytes below 2^40 (sm100's tensor maps)", st));
                }
            }
        }
    }
    let needed = match backend {
        Backend::Sm90 => sm90_workspace_bytes(d.batch, d.num_heads, d.s_q, d.num_splits)?,
        Backend::Sm100 => sm100_workspace_bytes(d.dtype, d.batch, d.max_seq_len, d.page_size, d.sm_count, d.num_splits)?,
    };
    let sizes = require_workspace(&ws, needed, 16)?;
    let args = k::GsMlaDecodeArgs {
        dtype: d.dtype.code(),
        batch: d.batch,
        num_heads: d.num_heads,
        s_q: d.s_q,
        causal: d.causal as i32,
        max_seq_len: d.max_seq_len,
        num_splits: d.num_splits,
        sm_count: d.sm_count,
        device: d.device,
        q_nope: q_nope as *const _,
        q_nope_stride_batch: d.q_nope.stride_batch,
        q_nope_stride_token: d.q_nope.stride_token,
        q_nope_stride_head: d.q_nope.stride_head,
        q_pe: q_pe as *const _,
        q_pe_stride_batch: d.q_pe.stride_batch,
        q_pe_stride_token: d.q_pe.stride_token,
        q_pe_stride_head: d.q_pe.stride_head,
        kv_cache: kv as *const _,
        num_pages: d.num_pages,
        page_size: d.page_size,
        seq_lens: lens as *const i32,
        page_table: table as *const i32,
        page_table_stride: d.page_table_stride,
        out: outp as *mut _,
        out_stride_batch: d.out.stride_batch,
        out_stride_token: d.out.stride_token,
        out_stride_head: d.out.stride_head,
        lse: lse as *mut f32,
        sm_scale: d.sm_scale,
        kv_format: d.kv_layout.code(),
        kv_scale: kv_scale as *const f32,
    };
    let (wsp, wsb, s) = (ws.ptr() as *mut std::ffi::c_void, ws.len(), stream.cast::<std::ffi::c_void>());
    let launched: Result<(i32, &'static str)> = match backend {
        #[cfg(graphsafe_mla = "sm90")]
        // SAFETY: every operand's extent for these sizes lies in its span, and the workspace holds
        // the glue's own planner's bytes (checked above); device lengths and page indices are
        // clamped by the kernel.
        Backend::Sm90 => Ok((unsafe { k::gs_mla_sm90_decode(&args, wsp, wsb, s) }, "gs_mla_sm90_decode")),
        #[cfg(graphsafe_mla = "sm100")]
        // SAFETY: as above; the sanitize pre-pass clamps the device data before CUTLASS reads it.
        Backend::Sm100 => Ok((unsafe { k::gs_mla_sm100_decode(&args, wsp, wsb, s) }, "gs_mla_sm100_decode")),
        #[allow(unreachable_patterns)]
        other => {
            let _ = (args, wsp, wsb, s); // a build without the arch launches nothing
            Err(Error::ArchUnsupported { op: "mla decode", need: format!("a build with {}", other.targets()), have: crate::build_info::archs().join(",") })
        }
    };
    let (status, op) = launched?;
    check(status, op, Some(sizes))
}

/// The sanitize pre-pass alone: reads `seq_lens` and the first `ceil(max_seq_len / page_size)`
/// columns of each `page_table` row, writes `region` (laid out by [`sanitize_layout`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sanitize(
    seq_lens: DeviceSpan,
    page_table: DeviceSpan,
    page_table_stride: i32,
    (batch, max_seq_len, page_size, num_pages, num_splits): (i32, i32, i32, i32, i32),
    region: DeviceSpan,
    stream: RawStream,
) -> Result<k::GsMlaSanitizeLayout> {
    let layout = sanitize_layout(batch, max_seq_len, page_size, num_splits)?;
    let b = count("batch", batch)?;
    let columns = count("max_seq_len", max_seq_len)?.div_ceil(count("page_size", page_size)?);
    let stride = unsigned("page_table_stride", page_table_stride as i64)?;
    let lens = seq_lens.require("seq_lens", 4 * b, 4)?;
    let table = page_table.require("page_table", extent_of("page_table", 4, &[(b, stride), (columns, 1)])?, 4)?;
    let sizes = require_workspace(&region, layout.bytes, 4)?;
    check(
        // SAFETY: seq_lens, the page-table columns the pass reads and the region it writes lie in
        // their spans (checked above).
        unsafe {
            k::gs_mla_sanitize(lens as *const i32, table as *const i32, page_table_stride, batch, max_seq_len, page_size, num_pages, num_splits, region.ptr() as *mut _, region.len(), stream.cast())
        },
        "gs_mla_sanitize",
        Some(sizes),
    )?;
    Ok(layout)
}

/// The post-pass alone: for each request whose length in `lens` (`[batch]` i32) is 0, zeros in
/// `out` (`[batch, 128, 512]`, 16-bit) and `-inf` in `lse` (`[batch, 128]` f32).
pub(crate) fn sanitize_finish(lens: DeviceSpan, batch: i32, out: Rows, lse: Option<DeviceSpan>, stream: RawStream) -> Result<()> {
    let b = count("batch", batch)?;
    let heads = k::GS_MLA_NUM_HEADS as u64;
    let lp = lens.require("lens", 4 * b, 4)?;
    let op = out.address("out", 2, (b, 1, heads, k::GS_MLA_LATENT_DIM as u64), 2)?;
    let lse = match lse {
        Some(l) => l.require("lse", 4 * heads * b, 4)?,
        None => 0,
    };
    check(
        // SAFETY: lens, the rows of out and lse the pass may write lie in their spans (above).
        unsafe { k::gs_mla_sanitize_finish(lp as *const i32, batch, op as *mut _, out.stride_batch, out.stride_head, lse as *mut f32, stream.cast()) },
        "gs_mla_sanitize_finish",
        None,
    )
}

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

/// The sm100 decode's region (sanitized device data, and an adapted decode's staging) for `shape`.
pub(crate) fn sanitize_layout(shape: &k::GsMlaSm100Shape) -> Result<k::GsMlaSanitizeLayout> {
    // SAFETY: host function; the shape and the out-pointer are live locals.
    out("gs_mla_sanitize_layout", |o| unsafe { k::gs_mla_sanitize_layout(shape, o) })
}

/// Workspace bytes of the sm100 decode of `shape` (CUTLASS's part, then the region).
pub(crate) fn sm100_workspace_bytes(shape: &k::GsMlaSm100Shape) -> Result<u64> {
    // SAFETY: host function; the shape and the out-pointer are live locals.
    out("gs_mla_sm100_workspace_bytes", |o| unsafe { k::gs_mla_sm100_workspace_bytes(shape, o) })
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
#[derive(Clone, Copy, Debug, Default)]
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

/// How the cache stores K and V (`GsMlaKvFormat`); the default is native, `GS_MLA_KV_NATIVE` (0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum KvLayout {
    /// `[pages, page_size, 576]` in q's dtype.
    #[default]
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

/// One decode step (`GsMlaDecodeArgs`), its device memory as spans. The default is the C struct
/// zero-initialised (empty spans: a launch refuses it), so that a test names only what it uses;
/// the op sets every field.
#[derive(Clone, Copy, Debug, Default)]
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

impl Decode {
    /// The sm100 planning functions' view of this decode.
    pub(crate) fn sm100_shape(&self) -> k::GsMlaSm100Shape {
        k::GsMlaSm100Shape {
            dtype: self.dtype.code(),
            batch: self.batch,
            num_heads: self.num_heads,
            s_q: self.s_q,
            max_seq_len: self.max_seq_len,
            page_size: self.page_size,
            sm_count: self.sm_count,
            num_splits: self.num_splits,
        }
    }

    /// Whether the sm100 decode runs CUTLASS on the caller's q, out and lse in place: its one
    /// token of 128 heads. Every other shape runs over staging copies in the workspace.
    pub(crate) fn sm100_direct(&self) -> bool {
        self.num_heads == k::GS_MLA_NUM_HEADS as i32 && self.s_q == 1
    }
}

/// The glue's `GsMlaDecodeArgs` for `d`, after checking that every operand's extent for these
/// sizes lies in its span (what the C side then reads without checking).
fn c_args(d: &Decode) -> Result<k::GsMlaDecodeArgs> {
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
    Ok(k::GsMlaDecodeArgs {
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
    })
}

/// CUTLASS builds a direct sm100 decode's Q and O tensor maps from the caller's strides, and the
/// driver takes only multiples of 16 bytes below 2^40; CUTLASS's own check of the encode compiles
/// out (NDEBUG), so a bad stride would run the kernel on a zeroed map. Refused by name here (the
/// glue refuses it too, unnamed). The op passes a dense stride for a dimension of size 1
/// (Decode's contract). An adapted decode gives CUTLASS graphsafe's own staging instead, and its
/// passes take any strides.
fn sm100_tma_strides(d: &Decode) -> Result<()> {
    if !d.sm100_direct() {
        return Ok(());
    }
    for (what, r, elem) in [("q_nope", &d.q_nope, d.dtype.bytes()), ("q_pe", &d.q_pe, d.dtype.bytes()), ("out", &d.out, 2)] {
        for (name, st) in [("stride_batch", r.stride_batch), ("stride_head", r.stride_head)] {
            let bytes = unsigned(&format!("{what}.{name}"), st)?.checked_mul(elem);
            if bytes.is_none_or(|b| b % 16 != 0 || b >= 1 << 40) {
                return Err(Error::invalid(format!("{what}.{name}"), "a multiple of 16 bytes below 2^40 (sm100's tensor maps)", st));
            }
        }
    }
    Ok(())
}

/// Launches the decode on `backend` (when this build has it) with workspace `ws`.
pub(crate) fn decode(backend: Backend, d: &Decode, ws: DeviceSpan, stream: RawStream) -> Result<()> {
    let args = c_args(d)?;
    if backend == Backend::Sm100 {
        sm100_tma_strides(d)?;
    }
    let needed = match backend {
        Backend::Sm90 => sm90_workspace_bytes(d.batch, d.num_heads, d.s_q, d.num_splits)?,
        Backend::Sm100 => sm100_workspace_bytes(&d.sm100_shape())?,
    };
    let sizes = require_workspace(&ws, needed, 16)?;
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

/// What CUTLASS's sm100 kernel is given for `d` over the workspace `ws`
/// (`gs_mla_sm100_kernel_args`: the head padding and the s_q expansion, every pointer and stride).
/// Host-only: nothing is dereferenced, so it runs on any build and machine. The same checks as
/// [`decode`] first. (The C decode calls the glue function itself; this is for the CPU tests.)
#[cfg(test)]
pub(crate) fn sm100_kernel_args(d: &Decode, ws: DeviceSpan) -> Result<k::GsMlaSm100KernelArgs> {
    let args = c_args(d)?;
    sm100_tma_strides(d)?;
    let sizes = require_workspace(&ws, sm100_workspace_bytes(&d.sm100_shape())?, 16)?;
    let mut ka = k::GsMlaSm100KernelArgs::default();
    // SAFETY: host function: reads the args and computes addresses, dereferences none of them;
    // `ka` is a live local.
    let status = unsafe { k::gs_mla_sm100_kernel_args(&args, ws.ptr() as *mut _, ws.len(), &mut ka) };
    check(status, "gs_mla_sm100_kernel_args", Some(sizes))?;
    Ok(ka)
}

/// The sm100 decode's pre-pass alone for `d` (what it enqueues before CUTLASS): reads `d`'s
/// lengths, page table and (adapted) queries, writes `region`, laid out for `d` (returned).
pub(crate) fn sm100_pre_pass(d: &Decode, region: DeviceSpan, stream: RawStream) -> Result<k::GsMlaSanitizeLayout> {
    let args = c_args(d)?;
    let layout = sanitize_layout(&d.sm100_shape())?;
    let sizes = require_workspace(&region, layout.bytes, 16)?;
    check(
        // SAFETY: every operand the pass reads lies in its span (c_args), and the region it writes
        // holds the layout's bytes (checked above).
        unsafe { k::gs_mla_sanitize(&args, region.ptr() as *mut _, region.len(), stream.cast()) },
        "gs_mla_sanitize",
        Some(sizes),
    )?;
    Ok(layout)
}

/// The sm100 decode's post-pass alone for `d` (what it enqueues after CUTLASS): reads `region`,
/// laid out for `d` (returned), writes `d`'s out and lse.
pub(crate) fn sm100_post_pass(d: &Decode, region: DeviceSpan, stream: RawStream) -> Result<k::GsMlaSanitizeLayout> {
    let args = c_args(d)?;
    let layout = sanitize_layout(&d.sm100_shape())?;
    let sizes = require_workspace(&region, layout.bytes, 16)?;
    check(
        // SAFETY: out and lse lie in their spans (c_args), and the region holds the layout's bytes
        // (checked above), which the pass checks every part it reads against.
        unsafe { k::gs_mla_sanitize_finish(&args, &layout, region.ptr() as *const _, region.len(), stream.cast()) },
        "gs_mla_sanitize_finish",
        Some(sizes),
    )?;
    Ok(layout)
}

/// The passes' arguments for a direct decode (128 heads, one token) described without its other
/// tensors: what they read of it, the rest null.
fn direct_pass_args(batch: i32, (max_seq_len, page_size, num_pages, num_splits): (i32, i32, i32, i32)) -> k::GsMlaDecodeArgs {
    k::GsMlaDecodeArgs {
        dtype: GlueDtype::Bf16.code(),
        batch,
        num_heads: k::GS_MLA_NUM_HEADS as i32,
        s_q: 1,
        max_seq_len,
        num_splits,
        num_pages,
        page_size,
        ..Default::default()
    }
}

/// The sanitize pre-pass alone, for a direct decode (128 heads, one token): reads `seq_lens` and
/// the first `ceil(max_seq_len / page_size)` columns of each `page_table` row, writes `region`
/// (laid out by [`sanitize_layout`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sanitize(
    seq_lens: DeviceSpan,
    page_table: DeviceSpan,
    page_table_stride: i32,
    (batch, max_seq_len, page_size, num_pages, num_splits): (i32, i32, i32, i32, i32),
    region: DeviceSpan,
    stream: RawStream,
) -> Result<k::GsMlaSanitizeLayout> {
    let mut args = direct_pass_args(batch, (max_seq_len, page_size, num_pages, num_splits));
    let layout = sanitize_layout(&k::GsMlaSm100Shape { dtype: args.dtype, batch, num_heads: args.num_heads, s_q: 1, max_seq_len, page_size, sm_count: 1, num_splits })?;
    let b = count("batch", batch)?;
    let columns = count("max_seq_len", max_seq_len)?.div_ceil(count("page_size", page_size)?);
    let stride = unsigned("page_table_stride", page_table_stride as i64)?;
    args.seq_lens = seq_lens.require("seq_lens", 4 * b, 4)? as *const i32;
    args.page_table = page_table.require("page_table", extent_of("page_table", 4, &[(b, stride), (columns, 1)])?, 4)? as *const i32;
    args.page_table_stride = page_table_stride;
    let sizes = require_workspace(&region, layout.bytes, 4)?;
    check(
        // SAFETY: seq_lens, the page-table columns the pass reads and the region it writes lie in
        // their spans (checked above); a direct decode's pre-pass reads no other operand.
        unsafe { k::gs_mla_sanitize(&args, region.ptr() as *mut _, region.len(), stream.cast()) },
        "gs_mla_sanitize",
        Some(sizes),
    )?;
    Ok(layout)
}

/// The post-pass alone, for a direct decode (128 heads, one token): for each request whose length
/// in `region` (laid out by `layout`) is 0, zeros in `out` (`[batch, 128, 512]`, 16-bit) and
/// `+inf` in `lse` (`[batch, 128]` f32).
pub(crate) fn sanitize_finish(region: DeviceSpan, layout: &k::GsMlaSanitizeLayout, batch: i32, out: Rows, lse: Option<DeviceSpan>, stream: RawStream) -> Result<()> {
    let b = count("batch", batch)?;
    let heads = k::GS_MLA_NUM_HEADS as u64;
    region.require("region", layout.lens_offset.checked_add(4 * b).ok_or_else(|| Error::invalid("layout", "offsets below 2^64", layout.lens_offset))?, 4)?;
    let mut args = direct_pass_args(batch, (1, 1, 1, 1));
    args.out = out.address("out", 2, (b, 1, heads, k::GS_MLA_LATENT_DIM as u64), 2)? as *mut _;
    (args.out_stride_batch, args.out_stride_token, args.out_stride_head) = (out.stride_batch, out.stride_token, out.stride_head);
    args.lse = match lse {
        Some(l) => l.require("lse", 4 * heads * b, 4)?,
        None => 0,
    } as *mut f32;
    check(
        // SAFETY: the rows of out and lse the pass may write lie in their spans, and the lengths it
        // reads in the region (checked above; the pass checks the layout against the region too).
        unsafe { k::gs_mla_sanitize_finish(&args, layout, region.ptr() as *const _, region.len(), stream.cast()) },
        "gs_mla_sanitize_finish",
        None,
    )
}

//! MLA decode planning and launch through the C ABI. Tensors are raw device pointers the caller
//! owns and keeps alive (shapes and strides are checked; bounds cannot be, without sizes).

use super::core::{capture_obj, captured_op, eager_op, stream_obj, workspace_obj, GraphsafeCapture, GraphsafeStream, GraphsafeWorkspace};
use super::{guard, null, put, read, CallerMemory, Fail, Raw};
use crate::ops::mla::decode::decode_on;
use crate::ops::mla::{self as mla, KvFormat, KvFormatKind, MlaArch, MlaDecodeArgs, MlaLimits, DS_MLA_TOKEN_BYTES};
use crate::ops::tensor::{DType, Tensor};
use kv_cache::{check_kv_format, format_name, format_of};
use std::ffi::c_int;

mod kv_cache;

/// bf16 q/KV (bf16 output).
pub const GRAPHSAFE_DTYPE_BF16: c_int = 0;
/// fp16 q/KV (fp16 output).
pub const GRAPHSAFE_DTYPE_FP16: c_int = 1;
/// fp8-e4m3: MLA q/KV with bf16 output (sm_100 back-end only), and a cuDNN matmul input. (sm_90's
/// fp8 KV caches take bf16 queries: GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, _FP8_DS_MLA.)
pub const GRAPHSAFE_DTYPE_FP8_E4M3: c_int = 2;

/// MLA KV-cache format (`GraphsafeMlaKvCache::kv_format`): `[num_pages, page_size, 576]` in q's
/// dtype, what graphsafe_mla_decode runs (every back-end).
pub const GRAPHSAFE_MLA_KV_NATIVE: c_int = 0;
/// MLA KV-cache format: fp8 e4m3 `[num_pages, page_size, 576]` with one f32 scale for the whole
/// cache (`kv_scale`, read on the device when the kernel runs, so an engine may update it between
/// replays): K = V = scale · e4m3 (vLLM's fp8 KV cache). q bf16 (GRAPHSAFE_DTYPE_BF16), output
/// bf16; sm_90 only.
pub const GRAPHSAFE_MLA_KV_FP8_PER_TENSOR: c_int = 1;
/// MLA KV-cache format: DeepSeek V3.2's token (FlashMLA's fp8 cache), bytes
/// `[num_pages, page_size, GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES]`: 512 e4m3 latent values, 4 f32
/// scales (one per 128 latent values), 64 bf16 rope values. q bf16 (GRAPHSAFE_DTYPE_BF16), output
/// bf16; sm_90 only.
pub const GRAPHSAFE_MLA_KV_FP8_DS_MLA: c_int = 2;
/// Bytes per token of a GRAPHSAFE_MLA_KV_FP8_DS_MLA cache.
pub const GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES: c_int = 656;
const _: () = assert!(GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES as usize == DS_MLA_TOKEN_BYTES);

/// Planning target: the `arch` argument of the planners is a compute capability as
/// `major * 10 + minor`, and the back-end is the one graphsafe's arch table gives that GPU: 90
/// (Hopper: graphsafe's kernels), 100 or 103 (B200/GB200, B300/GB300: CUTLASS's), 120 or 121
/// (RTX 50 / RTX PRO, DGX Spark: NVFP4 only). These constants name the first GPU of each back-end.
pub const GRAPHSAFE_ARCH_SM90: c_int = 90;
/// See GRAPHSAFE_ARCH_SM90.
pub const GRAPHSAFE_ARCH_SM100: c_int = 100;

/// A decode plan: KV splits and workspace bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeMlaPlan {
    /// KV splits.
    pub num_splits: c_int,
    /// Workspace bytes to provide (pre-grow to this before capturing).
    pub workspace_bytes: u64,
    /// For worst-case plans: the batch size that needs the most.
    pub worst_batch: c_int,
    /// For worst-case plans: the sequence length that needs the most.
    pub worst_seq_len: c_int,
}

/// One MLA decode step over caller-owned device memory. Strides are in elements. A request brings
/// `s_q` query tokens of `num_heads` heads each: q and out are `[batch, s_q, heads, dim]`, lse is
/// `[batch, heads, s_q]` (FlashMLA's layouts). A query row that attends no key (an empty request,
/// or a causal token before the request's first key) gets zeros in out and +inf in lse.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeMlaDecodeArgs {
    /// GRAPHSAFE_DTYPE_* of q, and of kv_cache unless graphsafe_mla_decode_kv is given an fp8
    /// KV-cache format.
    pub dtype: c_int,
    /// Requests.
    pub batch: c_int,
    /// Query heads, 1..=128, with any KV-cache format (sm_100 pads fewer to 128 inside its
    /// workspace).
    pub num_heads: c_int,
    /// Query tokens per request (MTP / speculative decode), 1..=16; 0 is read as 1. (sm_100 runs
    /// each token as a request of its own: batch x s_q at most 65535.)
    pub s_q: c_int,
    /// Non-zero: token t of s_q attends keys 0 ..= len - s_q + t (FlashMLA's causal); 0: every key.
    pub causal: c_int,
    /// KV heads of the cache (FlashMLA's h_kv): 0 or 1 (MLA has one latent KV head; anything else
    /// is refused with GRAPHSAFE_ERROR_INVALID_ARGUMENT naming h_kv).
    pub num_kv_heads: c_int,
    /// [batch, s_q, heads, 512].
    pub q_nope: u64,
    /// Stride between requests.
    pub q_nope_stride_batch: i64,
    /// Stride between query tokens (unused when s_q is 1).
    pub q_nope_stride_token: i64,
    /// Stride between heads.
    pub q_nope_stride_head: i64,
    /// [batch, s_q, heads, 64].
    pub q_pe: u64,
    /// Stride between requests.
    pub q_pe_stride_batch: i64,
    /// Stride between query tokens (unused when s_q is 1).
    pub q_pe_stride_token: i64,
    /// Stride between heads.
    pub q_pe_stride_head: i64,
    /// [num_pages, page_size, 576], contiguous (for graphsafe_mla_decode_kv: as its
    /// `GraphsafeMlaKvCache` says).
    pub kv_cache: u64,
    /// Pages in the cache.
    pub num_pages: c_int,
    /// Tokens per page.
    pub page_size: c_int,
    /// `[batch]` int32 sequence lengths, each in 1..=max_seq_len.
    pub seq_lens: u64,
    /// [batch, max_pages] int32 page indices.
    pub page_table: u64,
    /// Columns of page_table (its row stride).
    pub max_pages: c_int,
    /// [batch, s_q, heads, 512] output (bf16, or fp16 for fp16 input). On sm100 with one token of
    /// 128 heads, when the plan splits the sequence (single requests only), out_stride_head must
    /// be 512: CUTLASS's split reduction writes densely (INVALID_ARGUMENT otherwise; or ask for
    /// num_splits 1). Other shapes take any strides there (graphsafe copies out of its staging).
    pub out: u64,
    /// Stride between requests.
    pub out_stride_batch: i64,
    /// Stride between query tokens (unused when s_q is 1).
    pub out_stride_token: i64,
    /// Stride between heads.
    pub out_stride_head: i64,
    /// [batch, heads, s_q] fp32 log-sum-exp (contiguous), or 0.
    pub lse: u64,
    /// Softmax scale (> 0).
    pub sm_scale: f32,
    /// Upper bound of seq_lens.
    pub max_seq_len: c_int,
    /// KV splits, or 0 for the default rule.
    pub num_splits: c_int,
}

/// How `GraphsafeMlaDecodeArgs::kv_cache` stores K and V, for graphsafe_mla_decode_kv (a null
/// `GraphsafeMlaKvCache *` there is GRAPHSAFE_MLA_KV_NATIVE).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeMlaKvCache {
    /// GRAPHSAFE_MLA_KV_*.
    pub kv_format: c_int,
    /// For GRAPHSAFE_MLA_KV_FP8_PER_TENSOR: device address of the f32 scale (one float, 4-byte
    /// aligned, caller-owned like every other tensor, never written by the decode); else 0.
    pub kv_scale: u64,
}

/// A `GraphsafeMlaKvCache` read and checked as far as the host can: the format, and the scale's
/// address (0 unless per-tensor).
#[derive(Clone, Copy, Debug)]
struct Kv {
    format: KvFormatKind,
    scale: u64,
}

impl Kv {
    const NATIVE: Kv = Kv { format: KvFormatKind::Native, scale: 0 };

    fn of(kv: &GraphsafeMlaKvCache) -> Result<Kv, Fail> {
        let format = format_of(kv.kv_format)?;
        match format {
            KvFormatKind::Fp8PerTensor if kv.kv_scale == 0 => return Err(null("kv_scale")),
            KvFormatKind::Native | KvFormatKind::Fp8DsMla if kv.kv_scale != 0 => {
                let want = "0 unless kv_format is GRAPHSAFE_MLA_KV_FP8_PER_TENSOR";
                return Err(crate::Error::invalid("kv_scale", want, format!("{:#x} with kv_format {}", kv.kv_scale, format_name(format))).into());
            }
            _ => {}
        }
        Ok(Kv { format, scale: kv.kv_scale })
    }
}

/// The query's dtype and the output's (bf16 for fp8 queries).
fn dtype_of(d: c_int) -> Result<(DType, DType), Fail> {
    Ok(match d {
        GRAPHSAFE_DTYPE_BF16 => (DType::Bf16, DType::Bf16),
        GRAPHSAFE_DTYPE_FP16 => (DType::Fp16, DType::Fp16),
        GRAPHSAFE_DTYPE_FP8_E4M3 => (DType::Fp8E4m3, DType::Bf16),
        other => return Err(crate::Error::invalid("dtype", "GRAPHSAFE_DTYPE_BF16, _FP16 or _FP8_E4M3", other).into()),
    })
}

fn non_negative(what: &str, v: i64) -> Result<usize, Fail> {
    usize::try_from(v).map_err(|_| crate::Error::invalid(what, "a value >= 0", v).into())
}

/// `s_q` as the decode reads it: 0 (a caller that predates the field) is one token.
fn tokens(a: &GraphsafeMlaDecodeArgs) -> Result<usize, Fail> {
    if a.s_q == 0 {
        return Ok(1);
    }
    non_negative("s_q", a.s_q as i64)
}

fn to_args(a: &GraphsafeMlaDecodeArgs, kv: Kv, mem: CallerMemory<'_>) -> Result<MlaDecodeArgs<Raw>, Fail> {
    let (dt, out_dt) = dtype_of(a.dtype)?;
    let (b, s, h) = (non_negative("batch", a.batch as i64)?, tokens(a)?, non_negative("num_heads", a.num_heads as i64)?);
    let m = |ptr: u64, what: &str| mem.pointer(ptr, what);
    let st = |v: i64, what: &str| non_negative(what, v);
    let (kv_dt, kv_row) = kv.format.cache_element(dt);
    let kv_format = match kv.format {
        KvFormatKind::Native => KvFormat::Native,
        KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(m(kv.scale, "kv_scale")?, DType::F32, &[1]) },
        KvFormatKind::Fp8DsMla => KvFormat::Fp8DsMla,
    };
    let (pages, page) = (non_negative("num_pages", a.num_pages as i64)?, non_negative("page_size", a.page_size as i64)?);
    // A cache of h_kv KV heads is described as the op's 4-D cache, which refuses h_kv != 1 by name.
    let kv_shape = match a.num_kv_heads {
        0 => vec![pages, page, kv_row],
        n => vec![pages, page, non_negative("num_kv_heads (h_kv)", n as i64)?, kv_row],
    };
    let rows = |ptr: u64, what: &str, dt: DType, dim: usize, (sb, stk, sh): (i64, i64, i64)| -> Result<Tensor<Raw>, Fail> {
        let strides = [st(sb, &format!("{what}_stride_batch"))?, st(stk, &format!("{what}_stride_token"))?, st(sh, &format!("{what}_stride_head"))?, 1];
        Ok(Tensor::strided(m(ptr, what)?, 0, dt, &[b, s, h, dim], &strides))
    };
    let mut args = MlaDecodeArgs::new(
        rows(a.q_nope, "q_nope", dt, 512, (a.q_nope_stride_batch, a.q_nope_stride_token, a.q_nope_stride_head))?,
        rows(a.q_pe, "q_pe", dt, 64, (a.q_pe_stride_batch, a.q_pe_stride_token, a.q_pe_stride_head))?,
        Tensor::contiguous(m(a.kv_cache, "kv_cache")?, kv_dt, &kv_shape),
        Tensor::contiguous(m(a.seq_lens, "seq_lens")?, DType::I32, &[b]),
        Tensor::contiguous(m(a.page_table, "page_table")?, DType::I32, &[b, non_negative("max_pages", a.max_pages as i64)?]),
        rows(a.out, "out", out_dt, 512, (a.out_stride_batch, a.out_stride_token, a.out_stride_head))?,
    )
    .with_kv_format(kv_format)
    .with_sm_scale(a.sm_scale)
    .with_max_seq_len(non_negative("max_seq_len", a.max_seq_len as i64)? as u32)
    .with_causal(a.causal != 0)
    .with_num_splits(if a.num_splits == 0 { None } else { Some(non_negative("num_splits", a.num_splits as i64)? as u32) });
    if a.lse != 0 {
        args = args.with_lse(Tensor::contiguous(m(a.lse, "lse")?, DType::F32, &[b, h, s]));
    }
    Ok(args)
}

/// The shapes a decode (or every decode of a capture) runs, for graphsafe_mla_plan_limits and
/// graphsafe_mla_worst_case_limits: the C face of the Rust planners' `MlaLimits`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeMlaLimits {
    /// Compute capability x10 + minor of the target GPU with an MLA back-end (GRAPHSAFE_ARCH_SM90,
    /// GRAPHSAFE_ARCH_SM100, or 103).
    pub arch: c_int,
    /// GRAPHSAFE_DTYPE_* of q (and of a native cache).
    pub dtype: c_int,
    /// GRAPHSAFE_MLA_KV_* (0: native).
    pub kv_format: c_int,
    /// Query heads, 1..=128 (sm_100 pads fewer to 128 inside its workspace, which the plan counts).
    pub num_heads: c_int,
    /// Query tokens per request, 1..=16; 0 is read as 1 (sm_100: batch x s_q at most 65535). A
    /// worst case covers every count up to it.
    pub s_q: c_int,
    /// Requests; a worst case covers every batch up to it.
    pub batch: c_int,
    /// Longest request in tokens; a worst case covers every length up to it.
    pub max_seq_len: c_int,
    /// Tokens per page of the cache (sm_90: 64 or 128; sm_100: a power of two up to 128).
    pub page_size: c_int,
    /// SMs of the GPU.
    pub sm_count: c_int,
    /// KV splits, or 0 for the default rule.
    pub num_splits: c_int,
}

/// The Rust planners' limits for `l`, and its back-end.
fn limits_of(l: &GraphsafeMlaLimits) -> Result<(MlaArch, MlaLimits), Fail> {
    let (dtype, _) = dtype_of(l.dtype)?;
    let format = format_of(l.kv_format)?;
    let arch = crate::arch::mla_for_abi(l.arch)?;
    let count = |what: &str, v: c_int| u32::try_from(v).map_err(|_| Fail::from(crate::Error::invalid(what, "a value >= 0", v)));
    let s_q = if l.s_q == 0 { 1 } else { count("s_q", l.s_q)? };
    let limits = MlaLimits::new(count("num_heads", l.num_heads)?, count("batch", l.batch)?, count("max_seq_len", l.max_seq_len)?, count("sm_count", l.sm_count)?)
        .with_dtype(dtype)
        .with_kv_format(format)
        .with_s_q(s_q)
        .with_page_size(count("page_size", l.page_size)?)
        .with_num_splits(if l.num_splits == 0 { None } else { Some(count("num_splits", l.num_splits)?) });
    Ok((arch, limits))
}

fn plan_c(p: &mla::MlaDecodePlan) -> GraphsafeMlaPlan {
    GraphsafeMlaPlan { num_splits: p.num_splits as c_int, workspace_bytes: p.workspace_bytes, worst_batch: p.batch as c_int, worst_seq_len: p.max_seq_len as c_int }
}

/// Splits and workspace for the one decode shape `limits` describes: the planning front door (the
/// same rules as the decode, refused with GRAPHSAFE_ERROR_INVALID_ARGUMENT naming the field).
/// Host-only: works without a GPU. Thread-safe.
///
/// # Safety
/// `limits` is null (refused) or points to a valid `GraphsafeMlaLimits`; `out` is null (refused)
/// or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_plan_limits(limits: *const GraphsafeMlaLimits, out: *mut GraphsafeMlaPlan) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let l = unsafe { read(limits, "limits")? };
        if out.is_null() {
            return Err(null("out"));
        }
        let (arch, limits) = limits_of(&l)?;
        let p = mla::plan(arch, &limits)?;
        // SAFETY: the caller's contract (null is refused above).
        unsafe { put(out, "out", plan_c(&p)) }
    })
}

/// The workspace to pre-grow before capturing decodes within `limits`: the worst case over batch
/// 1..=batch, lengths 1..=max_seq_len and query tokens 1..=s_q (with the default split rule, or
/// the one count asked for), as graphsafe_mla_plan_limits' rules. `out->worst_batch` and
/// `worst_seq_len` name the shape that needs it. Host-only; milliseconds in practice.
/// Thread-safe.
///
/// # Safety
/// As graphsafe_mla_plan_limits.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_worst_case_limits(limits: *const GraphsafeMlaLimits, out: *mut GraphsafeMlaPlan) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let l = unsafe { read(limits, "limits")? };
        if out.is_null() {
            return Err(null("out"));
        }
        let (arch, limits) = limits_of(&l)?;
        let p = mla::worst_case(arch, &limits)?;
        // SAFETY: the caller's contract (null is refused above).
        unsafe { put(out, "out", plan_c(&p)) }
    })
}

/// Splits and workspace for one decode shape on `arch` (a compute capability x10 + minor with an
/// MLA kernel: GRAPHSAFE_ARCH_SM90, GRAPHSAFE_ARCH_SM100, or 103). Host-only:
/// works without a GPU. `page_size`: tokens per KV-cache page (sm_100: a power of two up to 128,
/// which sizes the sanitized page table in the workspace; sm_90: 64 or 128). `requested_splits`
/// 0 = default rule. Limits: batch 1..=65535, max_seq_len 1..=2147483520, sm_count 1..=1024;
/// beyond them GRAPHSAFE_ERROR_INVALID_ARGUMENT naming the limit. Thread-safe.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_plan(arch: c_int, dtype: c_int, num_heads: c_int, batch: c_int, max_seq_len: c_int, page_size: c_int, sm_count: c_int, requested_splits: c_int, out: *mut GraphsafeMlaPlan) -> c_int {
    // SAFETY: the caller's contract, passed on (the native format is what this function plans).
    guard(|| unsafe { mla_plan(arch, dtype, GRAPHSAFE_MLA_KV_NATIVE, num_heads, batch, max_seq_len, page_size, sm_count, requested_splits, out) })
}

/// As graphsafe_mla_plan, for a decode of `args->dtype` = `dtype` queries over a cache stored as
/// `kv_format` (GRAPHSAFE_MLA_KV_*; graphsafe_mla_decode_kv): refuses what that decode would,
/// with GRAPHSAFE_ERROR_INVALID_ARGUMENT naming the argument: an fp8 format on sm_100
/// (`kv_format`), or on sm_90 with `dtype` other than GRAPHSAFE_DTYPE_BF16 (`dtype`). The splits and workspace do not depend on the format (they
/// equal graphsafe_mla_plan's for GRAPHSAFE_DTYPE_BF16, so graphsafe_mla_worst_case with bf16 is
/// the pre-grow size for the fp8 formats too). Host-only: works without a GPU. Thread-safe.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_plan_kv(
    arch: c_int,
    dtype: c_int,
    kv_format: c_int,
    num_heads: c_int,
    batch: c_int,
    max_seq_len: c_int,
    page_size: c_int,
    sm_count: c_int,
    requested_splits: c_int,
    out: *mut GraphsafeMlaPlan,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { mla_plan(arch, dtype, kv_format, num_heads, batch, max_seq_len, page_size, sm_count, requested_splits, out) })
}

/// graphsafe_mla_plan and graphsafe_mla_plan_kv: graphsafe_mla_plan_limits for one token.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeMlaPlan`.
#[allow(clippy::too_many_arguments)]
unsafe fn mla_plan(arch: c_int, dtype: c_int, kv_format: c_int, num_heads: c_int, batch: c_int, max_seq_len: c_int, page_size: c_int, sm_count: c_int, requested_splits: c_int, out: *mut GraphsafeMlaPlan) -> Result<(), Fail> {
    if out.is_null() {
        return Err(null("out"));
    }
    let l = GraphsafeMlaLimits { arch, dtype, kv_format, num_heads, s_q: 1, batch, max_seq_len, page_size, sm_count, num_splits: requested_splits };
    let (arch, limits) = limits_of(&l)?;
    let p = mla::plan(arch, &limits)?;
    // SAFETY: the caller's contract (null is refused above).
    unsafe { put(out, "out", GraphsafeMlaPlan { worst_batch: batch, worst_seq_len: max_seq_len, ..plan_c(&p) }) }
}

/// The workspace to pre-grow before capture: the worst case over batch 1..=max_batch and sequence
/// lengths 1..=max_seq_len with the default split rule, for one page size and one query token
/// (graphsafe_mla_worst_case_limits takes more tokens; see graphsafe_mla_plan for `page_size` and
/// the limits). Host-only; answers in well under a millisecond at the limits. Thread-safe.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_worst_case(arch: c_int, dtype: c_int, num_heads: c_int, max_batch: c_int, max_seq_len: c_int, page_size: c_int, sm_count: c_int, out: *mut GraphsafeMlaPlan) -> c_int {
    let l = GraphsafeMlaLimits { arch, dtype, kv_format: GRAPHSAFE_MLA_KV_NATIVE, num_heads, s_q: 1, batch: max_batch, max_seq_len, page_size, sm_count, num_splits: 0 };
    // SAFETY: `l` is a live local; the caller's contract for `out`, passed on.
    unsafe { graphsafe_mla_worst_case_limits(&l, out) }
}

fn plan_out(a: &GraphsafeMlaDecodeArgs, p: &crate::ops::mla::MlaDecodePlan) -> GraphsafeMlaPlan {
    GraphsafeMlaPlan { num_splits: p.num_splits as c_int, workspace_bytes: p.workspace_bytes, worst_batch: a.batch, worst_seq_len: a.max_seq_len }
}

/// Eager MLA decode on `stream`: validates, grows `ws` if needed (retiring, zero-filled), launches.
/// `plan` (nullable) receives what ran. BUSY while the stream is capturing or `ws` is bound to an
/// open capture. Thread-safe (calls on one workspace are serialized). The cache is in q's dtype
/// (graphsafe_mla_decode_kv with GRAPHSAFE_MLA_KV_NATIVE).
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeMlaDecodeArgs` whose device addresses
/// are allocations of `stream`'s device holding the documented shapes (checked: shapes, strides,
/// alignment, each address's device, and that each tensor fits in the allocation the driver
/// reports for its address, which for a sub-allocating caching allocator is its whole segment)
/// and stay valid until the work finishes; `plan` is null or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode(args: *const GraphsafeMlaDecodeArgs, ws: GraphsafeWorkspace, stream: GraphsafeStream, plan: *mut GraphsafeMlaPlan) -> c_int {
    // SAFETY: the caller's contract, passed on; a null `kv` is the native format.
    guard(|| unsafe { mla_decode(args, std::ptr::null(), ws, stream, plan) })
}

/// Captured MLA decode: `ws` must be bound to `capture`; never grows it
/// (GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL names both sizes, nothing captured). Any thread (calls on
/// one capture are serialized); only the begin and the end of a THREAD_LOCAL/GLOBAL capture are
/// tied to one thread (CUDA's rule). The cache is in q's dtype
/// (graphsafe_mla_decode_kv_captured with GRAPHSAFE_MLA_KV_NATIVE).
///
/// # Safety
/// As graphsafe_mla_decode, and the caller's memory must stay valid for as long as any graph made
/// from the capture can run (graphsafe keeps only its own buffers and workspaces alive).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode_captured(args: *const GraphsafeMlaDecodeArgs, capture: GraphsafeCapture, ws: GraphsafeWorkspace, plan: *mut GraphsafeMlaPlan) -> c_int {
    // SAFETY: the caller's contract, passed on; a null `kv` is the native format.
    guard(|| unsafe { mla_decode_captured(args, std::ptr::null(), capture, ws, plan) })
}

/// Eager MLA decode over a KV cache stored as `kv` says (null: GRAPHSAFE_MLA_KV_NATIVE, exactly
/// graphsafe_mla_decode). `args->dtype` is q's dtype; `args->kv_cache` is fp8 e4m3
/// `[num_pages, page_size, 576]` for GRAPHSAFE_MLA_KV_FP8_PER_TENSOR (with `kv->kv_scale` the
/// address of its f32 scale) and bytes `[num_pages, page_size, GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES]`
/// for GRAPHSAFE_MLA_KV_FP8_DS_MLA; an fp8 format needs GRAPHSAFE_DTYPE_BF16 q (bf16 output), a
/// head count in 1..=128 and an sm_90 device (else GRAPHSAFE_ERROR_INVALID_ARGUMENT naming the argument;
/// the format, its scale address, dtype and heads are checked before any handle is looked up).
/// Workspace as graphsafe_mla_plan_kv says. `plan` (nullable) receives what ran. BUSY while the
/// stream is capturing or `ws` is bound to an open capture. Thread-safe (calls on one workspace
/// are serialized).
///
/// # Safety
/// As graphsafe_mla_decode, and `kv` is null or points to a valid `GraphsafeMlaKvCache` whose
/// `kv_scale`, when it is used, is device memory of `stream`'s device holding one f32 (checked
/// like the other addresses) that stays valid until the work finishes.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode_kv(args: *const GraphsafeMlaDecodeArgs, kv: *const GraphsafeMlaKvCache, ws: GraphsafeWorkspace, stream: GraphsafeStream, plan: *mut GraphsafeMlaPlan) -> c_int {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { mla_decode(args, kv, ws, stream, plan) })
}

/// Captured MLA decode over a KV cache stored as `kv` says (null: GRAPHSAFE_MLA_KV_NATIVE, exactly
/// graphsafe_mla_decode_captured); the arguments as graphsafe_mla_decode_kv. `ws` must be bound
/// to `capture`; never grows it (GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL names both sizes, nothing
/// captured). The graph reads `kv->kv_scale` at every replay, so an engine may update the scale
/// between replays. Any thread (calls on one capture are serialized); only the begin and the end of a
/// THREAD_LOCAL/GLOBAL capture are tied to one thread (CUDA's rule).
///
/// # Safety
/// As graphsafe_mla_decode_kv, and the caller's memory (the scale included) must stay valid for as
/// long as any graph made from the capture can run (graphsafe keeps only its own buffers and
/// workspaces alive).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode_kv_captured(
    args: *const GraphsafeMlaDecodeArgs,
    kv: *const GraphsafeMlaKvCache,
    capture: GraphsafeCapture,
    ws: GraphsafeWorkspace,
    plan: *mut GraphsafeMlaPlan,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { mla_decode_captured(args, kv, capture, ws, plan) })
}

/// Reads and host-checks the arguments (before any handle lookup): the args, the KV format and
/// its scale address, and what an fp8 format needs on every back-end.
///
/// # Safety
/// `args` is null or points to a valid `GraphsafeMlaDecodeArgs`; `kv` is null or points to a
/// valid `GraphsafeMlaKvCache`.
unsafe fn read_args(args: *const GraphsafeMlaDecodeArgs, kv: *const GraphsafeMlaKvCache) -> Result<(GraphsafeMlaDecodeArgs, Kv), Fail> {
    // SAFETY: the caller's contract (null is refused inside).
    let a = unsafe { read(args, "args")? };
    let kv = if kv.is_null() {
        Kv::NATIVE
    } else {
        // SAFETY: non-null; the caller's contract.
        Kv::of(&unsafe { read(kv, "kv")? })?
    };
    check_kv_format(None, kv.format, a.dtype)?;
    Ok((a, kv))
}

/// graphsafe_mla_decode and graphsafe_mla_decode_kv.
///
/// # Safety
/// As graphsafe_mla_decode_kv.
unsafe fn mla_decode(args: *const GraphsafeMlaDecodeArgs, kv: *const GraphsafeMlaKvCache, ws: GraphsafeWorkspace, stream: GraphsafeStream, plan: *mut GraphsafeMlaPlan) -> Result<(), Fail> {
    // SAFETY: the caller's contract.
    let (a, kv) = unsafe { read_args(args, kv)? };
    let (s, w) = (stream_obj(stream)?, workspace_obj(ws)?);
    let p = eager_op((&s, stream.id), Some((&w, ws.id)), |t| {
        let raw = to_args(&a, kv, CallerMemory::on(t.context()))?;
        Ok(decode_on(&raw, t)?)
    })?;
    // SAFETY: the caller's contract.
    unsafe { put_plan(plan, &a, &p) }
}

/// Writes the decode's plan to `plan` unless it is null.
///
/// # Safety
/// `plan` is null or points to a writable `GraphsafeMlaPlan`.
unsafe fn put_plan(plan: *mut GraphsafeMlaPlan, a: &GraphsafeMlaDecodeArgs, p: &crate::ops::mla::MlaDecodePlan) -> Result<(), Fail> {
    if !plan.is_null() {
        // SAFETY: non-null; the caller's contract.
        unsafe { put(plan, "plan", plan_out(a, p))? };
    }
    Ok(())
}

/// graphsafe_mla_decode_captured and graphsafe_mla_decode_kv_captured.
///
/// # Safety
/// As graphsafe_mla_decode_kv_captured.
unsafe fn mla_decode_captured(args: *const GraphsafeMlaDecodeArgs, kv: *const GraphsafeMlaKvCache, capture: GraphsafeCapture, ws: GraphsafeWorkspace, plan: *mut GraphsafeMlaPlan) -> Result<(), Fail> {
    // SAFETY: the caller's contract.
    let (a, kv) = unsafe { read_args(args, kv)? };
    let c = capture_obj(capture)?;
    let p = captured_op((&c, capture.id), Some(ws.id), |t| {
        let raw = to_args(&a, kv, CallerMemory::on(t.context()))?;
        Ok(decode_on(&raw, t)?)
    })?;
    // SAFETY: the caller's contract.
    unsafe { put_plan(plan, &a, &p) }
}

#[cfg(test)]
mod tests;

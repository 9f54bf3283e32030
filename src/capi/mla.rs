//! MLA decode planning and launch through the C ABI. Tensors are raw device pointers the caller
//! owns and keeps alive (shapes and strides are checked; bounds cannot be, without sizes).

use super::core::{capture_obj, captured_op, eager_op, stream_obj, workspace_obj, GraphsafeCapture, GraphsafeStream, GraphsafeWorkspace};
use super::{guard, null, put, read, CallerMemory, Fail, Raw};
use crate::ops::mla::decode::run;
use crate::ops::mla::{sm100, sm90, KvDtype, MlaArch, MlaDecodeArgs};
use crate::ops::tensor::{DType, Tensor};
use std::ffi::c_int;

/// bf16 q/KV (bf16 output).
pub const GRAPHSAFE_DTYPE_BF16: c_int = 0;
/// fp16 q/KV (fp16 output).
pub const GRAPHSAFE_DTYPE_FP16: c_int = 1;
/// fp8-e4m3: MLA q/KV with bf16 output (sm_100 back-end only), and a cuDNN matmul input.
pub const GRAPHSAFE_DTYPE_FP8_E4M3: c_int = 2;

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

/// One MLA decode step over caller-owned device memory. Strides are in elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeMlaDecodeArgs {
    /// GRAPHSAFE_DTYPE_* of q and kv_cache.
    pub dtype: c_int,
    /// Requests.
    pub batch: c_int,
    /// Query heads (128 on sm_100; a multiple of 16 up to 128 on sm_90).
    pub num_heads: c_int,
    /// [batch, heads, 512].
    pub q_nope: u64,
    /// Stride between requests.
    pub q_nope_stride_batch: i64,
    /// Stride between heads.
    pub q_nope_stride_head: i64,
    /// [batch, heads, 64].
    pub q_pe: u64,
    /// Stride between requests.
    pub q_pe_stride_batch: i64,
    /// Stride between heads.
    pub q_pe_stride_head: i64,
    /// [num_pages, page_size, 576], contiguous.
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
    /// [batch, heads, 512] output (bf16, or fp16 for fp16 input).
    pub out: u64,
    /// Stride between requests.
    pub out_stride_batch: i64,
    /// Stride between heads.
    pub out_stride_head: i64,
    /// [batch, heads] fp32 log-sum-exp, or 0.
    pub lse: u64,
    /// Softmax scale (> 0).
    pub sm_scale: f32,
    /// Upper bound of seq_lens.
    pub max_seq_len: c_int,
    /// KV splits, or 0 for the default rule.
    pub num_splits: c_int,
}

fn dtype_of(d: c_int) -> Result<(KvDtype, DType, DType), Fail> {
    Ok(match d {
        GRAPHSAFE_DTYPE_BF16 => (KvDtype::Bf16, DType::Bf16, DType::Bf16),
        GRAPHSAFE_DTYPE_FP16 => (KvDtype::Fp16, DType::Fp16, DType::Fp16),
        GRAPHSAFE_DTYPE_FP8_E4M3 => (KvDtype::Fp8E4m3, DType::Fp8E4m3, DType::Bf16),
        other => return Err(crate::Error::invalid("dtype", "GRAPHSAFE_DTYPE_BF16, _FP16 or _FP8_E4M3", other).into()),
    })
}

fn non_negative(what: &str, v: i64) -> Result<usize, Fail> {
    usize::try_from(v).map_err(|_| crate::Error::invalid(what, "a value >= 0", v).into())
}

fn to_args(a: &GraphsafeMlaDecodeArgs, mem: CallerMemory<'_>) -> Result<MlaDecodeArgs<Raw>, Fail> {
    let (_, dt, out_dt) = dtype_of(a.dtype)?;
    let (b, h) = (non_negative("batch", a.batch as i64)?, non_negative("num_heads", a.num_heads as i64)?);
    let m = |ptr: u64, what: &str| mem.pointer(ptr, what);
    let st = |v: i64, what: &str| non_negative(what, v);
    Ok(MlaDecodeArgs {
        q_nope: Tensor::strided(m(a.q_nope, "q_nope")?, 0, dt, &[b, h, 512], &[st(a.q_nope_stride_batch, "q_nope_stride_batch")?, st(a.q_nope_stride_head, "q_nope_stride_head")?, 1]),
        q_pe: Tensor::strided(m(a.q_pe, "q_pe")?, 0, dt, &[b, h, 64], &[st(a.q_pe_stride_batch, "q_pe_stride_batch")?, st(a.q_pe_stride_head, "q_pe_stride_head")?, 1]),
        kv_cache: Tensor::contiguous(m(a.kv_cache, "kv_cache")?, dt, &[non_negative("num_pages", a.num_pages as i64)?, non_negative("page_size", a.page_size as i64)?, 576]),
        kv_format: crate::ops::mla::KvFormat::Native,
        seq_lens: Tensor::contiguous(m(a.seq_lens, "seq_lens")?, DType::I32, &[b]),
        page_table: Tensor::contiguous(m(a.page_table, "page_table")?, DType::I32, &[b, non_negative("max_pages", a.max_pages as i64)?]),
        out: Tensor::strided(m(a.out, "out")?, 0, out_dt, &[b, h, 512], &[st(a.out_stride_batch, "out_stride_batch")?, st(a.out_stride_head, "out_stride_head")?, 1]),
        lse: if a.lse == 0 { None } else { Some(Tensor::contiguous(m(a.lse, "lse")?, DType::F32, &[b, h])) },
        sm_scale: a.sm_scale,
        max_seq_len: non_negative("max_seq_len", a.max_seq_len as i64)? as u32,
        num_splits: if a.num_splits == 0 { None } else { Some(non_negative("num_splits", a.num_splits as i64)? as u32) },
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
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let (kv, _, _) = dtype_of(dtype)?;
        let req = (requested_splits != 0).then_some(requested_splits as i64);
        let (n, bytes) = match crate::arch::mla_for_abi(arch)? {
            MlaArch::Sm100 => {
                if num_heads != 128 {
                    return Err(crate::Error::invalid("num_heads", "128 on sm_100", num_heads).into());
                }
                let p = sm100::plan(kv, batch as i64, max_seq_len as i64, page_size as i64, sm_count as i64, req)?;
                (p.num_splits, p.workspace_bytes)
            }
            MlaArch::Sm90 => {
                sm90_page_size(page_size)?;
                let p = sm90::plan(kv, num_heads as i64, batch as i64, max_seq_len as i64, sm_count as i64, req)?;
                (p.num_splits, p.workspace_bytes)
            }
        };
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", GraphsafeMlaPlan { num_splits: n as c_int, workspace_bytes: bytes, worst_batch: batch, worst_seq_len: max_seq_len }) }
    })
}

fn sm90_page_size(page_size: c_int) -> Result<(), Fail> {
    if page_size != 64 && page_size != 128 {
        return Err(crate::Error::invalid("page_size", "64 or 128 on sm_90", page_size).into());
    }
    Ok(())
}

/// The workspace to pre-grow before capture: the worst case over batch 1..=max_batch and sequence
/// lengths 1..=max_seq_len with the default split rule, for one page size (see
/// graphsafe_mla_plan for `page_size` and the limits). Host-only; answers in well under a
/// millisecond at the limits. Thread-safe.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_worst_case(arch: c_int, dtype: c_int, num_heads: c_int, max_batch: c_int, max_seq_len: c_int, page_size: c_int, sm_count: c_int, out: *mut GraphsafeMlaPlan) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let (kv, _, _) = dtype_of(dtype)?;
        let p = match crate::arch::mla_for_abi(arch)? {
            MlaArch::Sm100 => {
                if num_heads != 128 {
                    return Err(crate::Error::invalid("num_heads", "128 on sm_100", num_heads).into());
                }
                let w = sm100::worst_case(kv, max_batch as i64, max_seq_len as i64, page_size as i64, sm_count as i64, None)?;
                GraphsafeMlaPlan { num_splits: w.num_splits as c_int, workspace_bytes: w.workspace_bytes, worst_batch: w.batch as c_int, worst_seq_len: w.max_seq_len as c_int }
            }
            MlaArch::Sm90 => {
                sm90_page_size(page_size)?;
                let w = sm90::worst_case(kv, num_heads as i64, max_batch as i64, max_seq_len as i64, sm_count as i64, None)?;
                GraphsafeMlaPlan { num_splits: w.num_splits as c_int, workspace_bytes: w.workspace_bytes, worst_batch: w.batch as c_int, worst_seq_len: w.max_seq_len as c_int }
            }
        };
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", p) }
    })
}

fn plan_out(a: &GraphsafeMlaDecodeArgs, p: &crate::ops::mla::MlaDecodePlan) -> GraphsafeMlaPlan {
    GraphsafeMlaPlan { num_splits: p.num_splits as c_int, workspace_bytes: p.workspace_bytes, worst_batch: a.batch, worst_seq_len: a.max_seq_len }
}

/// Eager MLA decode on `stream`: validates, grows `ws` if needed (retiring, zero-filled), launches.
/// `plan` (nullable) receives what ran. BUSY while the stream is capturing or `ws` is bound to an
/// open capture. Thread-safe (calls on one workspace are serialized).
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeMlaDecodeArgs` whose device addresses
/// are allocations of `stream`'s device holding the documented shapes (checked: shapes, strides,
/// alignment, each address's device, and that each tensor fits in the allocation the driver
/// reports for its address, which for a sub-allocating caching allocator is its whole segment)
/// and stay valid until the work finishes; `plan` is null or points to a writable `GraphsafeMlaPlan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode(args: *const GraphsafeMlaDecodeArgs, ws: GraphsafeWorkspace, stream: GraphsafeStream, plan: *mut GraphsafeMlaPlan) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let (s, w) = (stream_obj(stream)?, workspace_obj(ws)?);
        let p = eager_op((&s, stream.id), Some((&w, ws.id)), |t| {
            let raw = to_args(&a, CallerMemory::on(t.context()))?;
            Ok(run(&raw, t)?)
        })?;
        if !plan.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { put(plan, "plan", plan_out(&a, &p))? };
        }
        Ok(())
    })
}

/// Captured MLA decode: `ws` must be bound to `capture`; never grows it
/// (GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL names both sizes, nothing captured). Same thread as the
/// capture's begin for THREAD_LOCAL/GLOBAL captures.
///
/// # Safety
/// As graphsafe_mla_decode, and the caller's memory must stay valid for as long as any graph made
/// from the capture can run (graphsafe keeps only its own buffers and workspaces alive).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_mla_decode_captured(args: *const GraphsafeMlaDecodeArgs, capture: GraphsafeCapture, ws: GraphsafeWorkspace, plan: *mut GraphsafeMlaPlan) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let c = capture_obj(capture)?;
        let p = captured_op((&c, capture.id), Some(ws.id), |t| {
            let raw = to_args(&a, CallerMemory::on(t.context()))?;
            Ok(run(&raw, t)?)
        })?;
        if !plan.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { put(plan, "plan", plan_out(&a, &p))? };
        }
        Ok(())
    })
}

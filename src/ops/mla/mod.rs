//! Multi-head latent attention (DeepSeek-V2/V3 MLA) decode.
//!
//! Per request 1..=16 query tokens (MTP / speculative decode, optionally causal), 1..=128 query
//! heads, one latent KV head of 512 + 64 rope dims (QK over 576, V over the first 512), fp32
//! softmax. [`decode()`] is the op; [`sm100`] (CUTLASS
//! 4.2's Blackwell kernel) and [`sm90`] (graphsafe's Hopper kernel) plan its two back-ends, on any
//! machine; [`reference`](mod@reference) checks them.

use crate::ops::tensor::DType;

mod args;
pub mod decode;
mod kv_format;
pub mod plan;
pub mod reference;
pub mod sm100;
pub mod sm90;

pub use args::MlaDecodeArgs;
pub use decode::{decode, decode_captured, MlaArch};
pub use kv_format::{KvFormat, KvFormatKind, DS_MLA_TOKEN_BYTES};
pub use plan::{plan, worst_case, MlaDecodePlan, MlaLimits};

/// The most query heads a decode takes (any count from 1 up; CUTLASS's sm100 kernel runs exactly
/// this many, so graphsafe pads fewer up to it inside its workspace).
pub const NUM_HEADS: usize = crate::sys::kernels::GS_MLA_NUM_HEADS as usize;
/// The most query tokens per request (`s_q`: MTP / speculative decode).
pub const MAX_S_Q: usize = crate::sys::kernels::GS_MLA_MAX_S_Q as usize;
/// Latent (nope) head dimension.
pub const LATENT_DIM: usize = crate::sys::kernels::GS_MLA_LATENT_DIM as usize;
/// Rope head dimension.
pub const ROPE_DIM: usize = crate::sys::kernels::GS_MLA_ROPE_DIM as usize;

/// Largest batch the decode and the planners accept (a grid dimension of both kernels).
pub const MAX_BATCH: i64 = crate::sys::kernels::GS_MLA_MAX_BATCH as i64;
/// Largest `max_seq_len` (2^31 - 128): every kernel computes `len + tile - 1` (tile ≤ 128) in int32.
pub const MAX_SEQ_LEN: i64 = crate::sys::kernels::GS_MLA_MAX_SEQ_LEN as i64;
/// Largest `sm_count` the planners accept: more than any GPU has, and it bounds the worst-case scans.
pub const MAX_SM_COUNT: i64 = crate::sys::kernels::GS_MLA_MAX_SM_COUNT as i64;

/// `v` as an `i32` when it lies in `1..=max`, else [`crate::Error::InvalidArgument`] naming `what`
/// and the range.
pub(crate) fn in_range(what: &str, v: i64, max: i64) -> crate::Result<i32> {
    if v < 1 || v > max {
        return Err(crate::Error::invalid(what, format!("an integer in 1..={max}"), v));
    }
    Ok(v as i32)
}

/// The limits every MLA planner checks first: `batch` in `1..=`[`MAX_BATCH`], `max_seq_len` in
/// `1..=`[`MAX_SEQ_LEN`], `sm_count` in `1..=`[`MAX_SM_COUNT`].
pub(crate) fn check_limits(batch: (&str, i64), max_seq_len: (&str, i64), sm_count: i64) -> crate::Result<(i32, i32, i32)> {
    Ok((plan::check_batch(batch.0, batch.1)?, in_range(max_seq_len.0, max_seq_len.1, MAX_SEQ_LEN)?, in_range("sm_count", sm_count, MAX_SM_COUNT)?))
}

/// The element types a decode takes for the query and a native KV cache: bf16, fp16, and fp8 e4m3
/// (sm_100's fp8 path; Hopper reads fp8 caches with bf16 queries: [`KvFormat`]).
pub const KV_DTYPES: [DType; 3] = [DType::Bf16, DType::Fp16, DType::Fp8E4m3];

/// MLA's former element type, now the one [`DType`] of every op (MLA takes those of [`KV_DTYPES`]).
#[deprecated(note = "use DType: MLA takes the dtypes of mla::KV_DTYPES")]
pub type KvDtype = DType;

/// `dtype` as the glue's, if MLA takes it ([`KV_DTYPES`]); else `InvalidArgument` naming `what`.
pub(crate) fn glue_dtype(what: &str, dtype: DType) -> crate::Result<crate::sys::glue::GlueDtype> {
    use crate::sys::glue::GlueDtype as G;
    match dtype {
        DType::Bf16 => Ok(G::Bf16),
        DType::Fp16 => Ok(G::Fp16),
        DType::Fp8E4m3 => Ok(G::Fp8E4m3),
        _ => Err(crate::Error::invalid(what, "bf16, fp16 or fp8 (e4m3)", dtype)),
    }
}

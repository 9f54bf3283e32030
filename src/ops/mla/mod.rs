//! Multi-head latent attention (DeepSeek-V2/V3 MLA) decode.
//!
//! Per request 1..=16 query tokens (MTP / speculative decode, optionally causal), 1..=128 query
//! heads, one latent KV head of 512 + 64 rope dims (QK over 576, V over the first 512), fp32
//! softmax. [`decode()`] is the op; [`sm100`] (CUTLASS
//! 4.2's Blackwell kernel) and [`sm90`] (graphsafe's Hopper kernel) plan its two back-ends, on any
//! machine; [`reference`](mod@reference) checks them.

use std::fmt;
use std::str::FromStr;

pub mod decode;
pub mod plan;
pub mod reference;
pub mod sm100;
pub mod sm90;

pub use decode::{decode, decode_captured, KvFormat, KvFormatKind, MlaArch, MlaDecodeArgs, DS_MLA_TOKEN_BYTES};
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
    Ok((in_range(batch.0, batch.1, MAX_BATCH)?, in_range(max_seq_len.0, max_seq_len.1, MAX_SEQ_LEN)?, in_range("sm_count", sm_count, MAX_SM_COUNT)?))
}

/// Element type of the query and the latent KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// bfloat16 in, bfloat16 out.
    Bf16,
    /// float16 in, float16 out.
    Fp16,
    /// float8 e4m3 in, bfloat16 out.
    Fp8E4m3,
}

impl KvDtype {
    /// Every dtype, for loops in tests and tools.
    pub const ALL: [KvDtype; 3] = [KvDtype::Bf16, KvDtype::Fp16, KvDtype::Fp8E4m3];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            KvDtype::Bf16 | KvDtype::Fp16 => 2,
            KvDtype::Fp8E4m3 => 1,
        }
    }

    /// The glue's name for it.
    pub(crate) fn to_glue(self) -> crate::sys::glue::GlueDtype {
        use crate::sys::glue::GlueDtype as G;
        match self {
            KvDtype::Bf16 => G::Bf16,
            KvDtype::Fp16 => G::Fp16,
            KvDtype::Fp8E4m3 => G::Fp8E4m3,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp16 => "fp16",
            KvDtype::Fp8E4m3 => "fp8",
        })
    }
}

impl FromStr for KvDtype {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "fp16" | "f16" | "half" | "float16" => Ok(KvDtype::Fp16),
            "fp8" | "fp8_e4m3" | "fp8-e4m3" | "e4m3" => Ok(KvDtype::Fp8E4m3),
            _ => Err(crate::Error::invalid("dtype", "bf16, fp16 or fp8", s)),
        }
    }
}

//! Multi-head latent attention (DeepSeek-V2/V3 MLA) decode.
//!
//! Per request one query token, up to 128 query heads, one latent KV head of 512 + 64 rope dims
//! (QK over 576, V over the first 512), fp32 softmax. [`decode()`] is the op; [`sm100`] (CUTLASS
//! 4.2's Blackwell kernel) and [`sm90`] (graphsafe's Hopper kernel) plan its two back-ends, on any
//! machine; [`reference`](mod@reference) checks them.

use std::fmt;
use std::str::FromStr;

pub mod decode;
pub mod reference;
pub mod sm100;
pub mod sm90;

pub use decode::{decode, decode_captured, MlaArch, MlaDecodeArgs, MlaDecodePlan};

/// Query heads of the MLA kernels (engines with tensor parallelism pad fewer heads up to this).
pub const NUM_HEADS: usize = crate::sys::kernels::GS_MLA_NUM_HEADS as usize;
/// Latent (nope) head dimension.
pub const LATENT_DIM: usize = crate::sys::kernels::GS_MLA_LATENT_DIM as usize;
/// Rope head dimension.
pub const ROPE_DIM: usize = crate::sys::kernels::GS_MLA_ROPE_DIM as usize;

/// The largest of `plan(batch, seq)` by `bytes` over batch `1..=max_batch` and one sequence
/// length per `tile`-token class up to `max_seq_len` (the largest of each class, clipped): both
/// back-ends' split rules depend on the length only through its tile count, so this equals the
/// maximum over every length (tests/mla_plan.rs checks both against brute force).
pub(crate) fn worst_over_tiles<P: Copy>(
    max_batch: i64,
    max_seq_len: i64,
    tile: u32,
    mut plan: impl FnMut(i64, i64) -> crate::Result<P>,
    bytes: impl Fn(&P) -> u64,
) -> crate::Result<P> {
    crate::error::positive("max_batch", max_batch)?;
    crate::error::positive("max_seq_len", max_seq_len)?;
    let tiles = (max_seq_len as u64).div_ceil(tile as u64);
    let mut worst: Option<P> = None;
    for batch in 1..=max_batch {
        for t in 1..=tiles {
            let seq = (t * tile as u64).min(max_seq_len as u64) as i64;
            let p = plan(batch, seq)?;
            if worst.as_ref().is_none_or(|w| bytes(&p) > bytes(w)) {
                worst = Some(p);
            }
        }
    }
    Ok(worst.expect("max_batch >= 1 and max_seq_len >= 1 give at least one shape"))
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

    pub(crate) fn to_sys(self) -> i32 {
        use crate::sys::kernels::GsDtype as D;
        (match self {
            KvDtype::Bf16 => D::GS_DTYPE_BF16,
            KvDtype::Fp16 => D::GS_DTYPE_FP16,
            KvDtype::Fp8E4m3 => D::GS_DTYPE_FP8_E4M3,
        })
        .0 as i32
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

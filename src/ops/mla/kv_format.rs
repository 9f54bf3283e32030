//! How an MLA decode's KV cache stores K and V: [`KvFormat`] (with its tensors) and
//! [`KvFormatKind`] (what planning takes).

use super::{LATENT_DIM, ROPE_DIM};
use crate::error::{Error, Result};
use crate::ops::tensor::{DType, Tensor};

/// How `kv_cache` stores K and V. `M` is the memory type of [`MlaDecodeArgs`](super::MlaDecodeArgs).
#[derive(Clone, Debug)]
pub enum KvFormat<M> {
    /// `[pages, page_size, 576]` in q's dtype (bf16, fp16, or fp8 e4m3 on sm_100, whose fp8 path
    /// takes fp8 queries too).
    Native,
    /// `[pages, page_size, 576]` fp8 e4m3 with one f32 scale for the whole cache, `scale` (f32
    /// `[1]`, device memory, read when the kernel runs: an engine may update it between replays):
    /// K = V = scale · e4m3, exactly (the scale is applied to the fp32 scores and output). vLLM's
    /// fp8 KV cache. Queries bf16, output bf16. sm_90, every head count and token count it takes.
    /// Up to 32 query rows (`s_q × heads`) the products run in fp16 with q scaled by a power of two
    /// per row (exact for every element of q above 2^-28 of its row's largest magnitude) and P in
    /// fp16; with more rows in bf16.
    Fp8PerTensor {
        /// f32 `[1]`.
        scale: Tensor<M>,
    },
    /// DeepSeek V3.2's 656-byte token (FlashMLA's fp8 cache), u8 `[pages, page_size, 656]`: 512
    /// e4m3 latent values, 4 f32 scales (one per 128 latent values), 64 bf16 rope values.
    /// K = V = bf16(scale_g · e4m3) for the latent (the product in f32, rounded once to bf16, as
    /// FlashMLA's fp8 kernels dequantise), the rope as stored. Queries bf16, output bf16. sm_90, every
    /// head count it takes. Up to 32 query rows (`s_q × heads`) the kernel multiplies the scales in
    /// as it converts, in fp16: the scale (times a power of two) and the product each rounded to
    /// fp16's 11 bits instead of once to bf16's 8, within one bf16 step of those values and closer
    /// to the exact product, except values far below their token's largest scale (fp16
    /// subnormals, a tiny absolute error); the exact rule and bounds:
    /// [`reference::dequantize_ds_mla_fp16_rounded`](super::reference::dequantize_ds_mla_fp16_rounded).
    Fp8DsMla,
}

impl<M> KvFormat<M> {
    /// Which format, without its tensors.
    pub fn kind(&self) -> KvFormatKind {
        match self {
            KvFormat::Native => KvFormatKind::Native,
            KvFormat::Fp8PerTensor { .. } => KvFormatKind::Fp8PerTensor,
            KvFormat::Fp8DsMla => KvFormatKind::Fp8DsMla,
        }
    }

    /// The same format over other memory (`f` maps the scale tensor's memory).
    pub fn map_mem<N>(self, f: impl FnOnce(M) -> N) -> KvFormat<N> {
        match self {
            KvFormat::Native => KvFormat::Native,
            KvFormat::Fp8PerTensor { scale } => {
                let Tensor { mem, offset, dtype, shape, strides } = scale;
                KvFormat::Fp8PerTensor { scale: Tensor { mem: f(mem), offset, dtype, shape, strides } }
            }
            KvFormat::Fp8DsMla => KvFormat::Fp8DsMla,
        }
    }
}

/// [`KvFormat`] without its tensors: what a plan records and the CLI names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvFormatKind {
    /// See [`KvFormat::Native`].
    Native,
    /// See [`KvFormat::Fp8PerTensor`].
    Fp8PerTensor,
    /// See [`KvFormat::Fp8DsMla`].
    Fp8DsMla,
}

impl KvFormatKind {
    /// Every format, for loops in tests and tools.
    pub const ALL: [KvFormatKind; 3] = [KvFormatKind::Native, KvFormatKind::Fp8PerTensor, KvFormatKind::Fp8DsMla];

    /// The cache's element type and elements per token (its last dimension), for queries of
    /// element type `q` (a native cache's element type).
    pub fn cache_element(self, q: DType) -> (DType, usize) {
        match self {
            KvFormatKind::Native => (q, LATENT_DIM + ROPE_DIM),
            KvFormatKind::Fp8PerTensor => (DType::Fp8E4m3, LATENT_DIM + ROPE_DIM),
            KvFormatKind::Fp8DsMla => (DType::U8, DS_MLA_TOKEN_BYTES),
        }
    }

    /// Bytes per token of the cache for queries of `q` (the element type of a native cache).
    pub fn token_bytes(self, q: DType) -> usize {
        let (dt, row) = self.cache_element(q);
        dt.size() * row
    }
}

/// Bytes per token of [`KvFormat::Fp8DsMla`].
pub const DS_MLA_TOKEN_BYTES: usize = crate::sys::kernels::GS_MLA_DS_MLA_TOKEN_BYTES as usize;

impl std::fmt::Display for KvFormatKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvFormatKind::Native => "native",
            KvFormatKind::Fp8PerTensor => "fp8",
            KvFormatKind::Fp8DsMla => "fp8-ds-mla",
        })
    }
}

impl std::str::FromStr for KvFormatKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "native" => Ok(KvFormatKind::Native),
            "fp8" | "fp8-per-tensor" => Ok(KvFormatKind::Fp8PerTensor),
            "fp8-ds-mla" | "ds-mla" => Ok(KvFormatKind::Fp8DsMla),
            _ => Err(Error::invalid("kv_format", "native, fp8 or fp8-ds-mla", s)),
        }
    }
}

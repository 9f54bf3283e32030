//! The MLA decode op: one graph-safe API over CUTLASS's sm100 kernel and graphsafe's sm90 kernel.
//!
//! ```text
//! q_nope [B, H, 512]   q_pe [B, H, 64]   kv_cache [pages, page_size, 576]
//! seq_lens [B] i32     page_table [B, max_pages] i32
//! out [B, H, 512]      lse [B, H] f32 (optional)
//! ```
//!
//! [`decode`] (eager) grows the workspace when it must; [`decode_captured`] never grows and returns
//! [`Error::WorkspaceTooSmall`] instead, launching nothing. Both validate every argument first.

use super::plan::{plan, MlaDecodePlan, MlaLimits};
use super::{glue_dtype, LATENT_DIM, MAX_SEQ_LEN, NUM_HEADS, ROPE_DIM};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{refuse_overlap, Check, DType, DeviceMemory, Tensor};
use crate::sys::cuda as c;
use crate::sys::glue::mla::{self as glue, Rows};
use crate::sys::DeviceSpan;
use crate::workspace::Workspace;

pub use crate::arch::MlaArch;

impl MlaArch {
    /// The back-end for a compute capability, if this build has one for it (the arch table's row).
    pub fn for_compute_capability(cc: (i32, i32)) -> Result<MlaArch> {
        crate::arch::mla(cc)
    }
}

/// How `kv_cache` stores K and V. `M` is the memory type of [`MlaDecodeArgs`].
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
    /// head count it takes.
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

/// Arguments of one decode step. `M` is `&DeviceBuffer` eagerly, [`CapturedBuffer`] in a capture.
///
/// Build one with [`MlaDecodeArgs::new`] and the `with_*` setters (the fields are public to read
/// and to change; the struct is `#[non_exhaustive]`, so new arguments come with defaults and never
/// break a caller). [`MlaDecodeArgs::bind`] turns eager arguments into a capture's.
///
/// A request brings `s_q` query tokens (1 for plain decode; 2..=16 for MTP / speculative decode),
/// each with `H` heads: `q_nope`, `q_pe` and `out` are `[B, s_q, H, dim]`, or `[B, H, dim]` for
/// one token. Heads: any count in `1..=`[`NUM_HEADS`] on every back-end.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MlaDecodeArgs<M> {
    /// `[B, s_q, H, 512]` (or `[B, H, 512]`), bf16/fp16/fp8. Any strides with an inner stride of 1.
    pub q_nope: Tensor<M>,
    /// `[B, s_q, H, 64]` (or `[B, H, 64]`), same dtype as q_nope.
    pub q_pe: Tensor<M>,
    /// `[pages, page_size, 576]` contiguous, same dtype as q (see [`KvFormat`] for the fp8 caches);
    /// also taken as `[pages, page_size, 1, 576]` (FlashMLA's layout with its `h_kv` = 1: MLA has
    /// one latent KV head, so any other `h_kv` is refused naming it).
    pub kv_cache: Tensor<M>,
    /// How `kv_cache` stores K and V.
    pub kv_format: KvFormat<M>,
    /// `[B]` i32 lengths. Device data, so never trusted; both back-ends read it the same way:
    /// a length above `max_seq_len` is clamped to `max_seq_len`, and a query row that attends no
    /// key (a length ≤ 0, or with `causal` a token `t` with `len - s_q + t < 0`) gets `out` all
    /// zeros and `lse` `+inf` (FlashMLA's convention: merged by LSE, such a row weighs nothing).
    /// Slots of the cache past a request's length may hold anything, NaN included: they are never
    /// read into the result. (The sm100 path clamps into a copy in the workspace before CUTLASS
    /// sees it: CUTLASS 4.2 hangs on an empty request with batch > 1.)
    pub seq_lens: Tensor<M>,
    /// [B, max_pages] i32 page indices, innermost contiguous. Device data, never trusted: only the
    /// columns that hold tokens of a request's clamped length are read (an entry past a request's
    /// last page may hold any value), and an index outside `0..pages` is clamped into it (negative
    /// reads page 0, too large reads page `pages - 1`), so no index reaches memory outside the
    /// cache. The sm100 path reads a clamped, compact copy the decode writes into the workspace.
    pub page_table: Tensor<M>,
    /// `[B, s_q, H, 512]` (or `[B, H, 512]`, as q): bf16 for bf16/fp8 inputs, fp16 for fp16. Any
    /// strides with an inner stride of 1, except on sm100 for one token of 128 heads when the plan
    /// splits the sequence (single requests only): then a head stride of 512, since CUTLASS's
    /// split reduction writes densely (refused otherwise, naming `out.strides`;
    /// `num_splits: Some(1)` takes any strides; other shapes go through graphsafe's staging).
    pub out: Tensor<M>,
    /// f32 log-sum-exp (natural log, of the scaled scores), optional: `[B, H, s_q]` (FlashMLA's
    /// layout) for a 4-D q, `[B, H]` for a 3-D one; contiguous. `+inf` for a row that attends no
    /// key (see `seq_lens`).
    pub lse: Option<Tensor<M>>,
    /// Softmax scale (finite, > 0). Default `1/sqrt(576)` (FlashMLA's); DeepSeek-V3 uses
    /// `1/sqrt(192)` with YaRN's mscale applied.
    pub sm_scale: f32,
    /// Upper bound of seq_lens: sizes the splits and the workspace (use the capture's maximum).
    /// Default: what the page table can name, `page_table.shape[1] × page_size`.
    pub max_seq_len: u32,
    /// Causal masking across the `s_q` tokens (FlashMLA's `causal=True`): token `t` attends keys
    /// `0 ..= len - s_q + t`, so the last token sees the whole request. Default `false` (every
    /// token sees every key); no effect for `s_q = 1`.
    pub causal: bool,
    /// Explicit KV split count, validated against the back-end's rule; `None` for the default.
    pub num_splits: Option<u32>,
}

impl<M> MlaDecodeArgs<M> {
    /// A decode of `q_nope`/`q_pe` against the native cache `kv_cache`, writing `out`: no `lse`,
    /// `sm_scale` `1/sqrt(576)`, `max_seq_len` what the page table can name, not causal, the
    /// default split rule. Nothing is checked here: the op checks everything before it launches.
    pub fn new(q_nope: Tensor<M>, q_pe: Tensor<M>, kv_cache: Tensor<M>, seq_lens: Tensor<M>, page_table: Tensor<M>, out: Tensor<M>) -> Self {
        let page_size = kv_cache.shape.get(1).copied().unwrap_or(0) as u64;
        let table = page_table.shape.get(1).copied().unwrap_or(0) as u64;
        let max_seq_len = table.saturating_mul(page_size).min(MAX_SEQ_LEN as u64) as u32;
        MlaDecodeArgs {
            q_nope,
            q_pe,
            kv_cache,
            kv_format: KvFormat::Native,
            seq_lens,
            page_table,
            out,
            lse: None,
            sm_scale: 1.0 / ((LATENT_DIM + ROPE_DIM) as f32).sqrt(),
            max_seq_len,
            causal: false,
            num_splits: None,
        }
    }
    /// Also write the log-sum-exp to `lse` (see the field); `None` writes none.
    pub fn with_lse(mut self, lse: impl Into<Option<Tensor<M>>>) -> Self {
        self.lse = lse.into();
        self
    }
    /// The softmax scale.
    pub fn with_sm_scale(mut self, sm_scale: f32) -> Self {
        self.sm_scale = sm_scale;
        self
    }
    /// The bound of `seq_lens` the plan sizes for.
    pub fn with_max_seq_len(mut self, max_seq_len: u32) -> Self {
        self.max_seq_len = max_seq_len;
        self
    }
    /// Causal masking across the query tokens (see the field).
    pub fn with_causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    /// How the cache stores K and V.
    pub fn with_kv_format(mut self, kv_format: KvFormat<M>) -> Self {
        self.kv_format = kv_format;
        self
    }
    /// An explicit KV split count (`None`: the default rule).
    pub fn with_num_splits(mut self, num_splits: Option<u32>) -> Self {
        self.num_splits = num_splits;
        self
    }

    /// The same arguments over other memory: `f` maps each tensor's memory (failing on the first
    /// error). [`bind`](MlaDecodeArgs::bind) is this with a capture's `bind_buffer`.
    pub fn try_map_mem<N, E>(&self, mut f: impl FnMut(&M) -> std::result::Result<N, E>) -> std::result::Result<MlaDecodeArgs<N>, E>
    where
        M: Clone,
    {
        let mut t = |x: &Tensor<M>| -> std::result::Result<Tensor<N>, E> {
            Ok(Tensor { mem: f(&x.mem)?, offset: x.offset, dtype: x.dtype, shape: x.shape.clone(), strides: x.strides.clone() })
        };
        Ok(MlaDecodeArgs {
            q_nope: t(&self.q_nope)?,
            q_pe: t(&self.q_pe)?,
            kv_cache: t(&self.kv_cache)?,
            kv_format: match &self.kv_format {
                KvFormat::Native => KvFormat::Native,
                KvFormat::Fp8PerTensor { scale } => KvFormat::Fp8PerTensor { scale: t(scale)? },
                KvFormat::Fp8DsMla => KvFormat::Fp8DsMla,
            },
            seq_lens: t(&self.seq_lens)?,
            page_table: t(&self.page_table)?,
            out: t(&self.out)?,
            lse: self.lse.as_ref().map(&mut t).transpose()?,
            sm_scale: self.sm_scale,
            max_seq_len: self.max_seq_len,
            causal: self.causal,
            num_splits: self.num_splits,
        })
    }
}

impl MlaDecodeArgs<&DeviceBuffer> {
    /// The same decode inside `cap`: every buffer bound to the capture (so the graph keeps it
    /// alive), the views and scalars unchanged. A buffer of another context is refused.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<MlaDecodeArgs<CapturedBuffer<'id>>> {
        self.try_map_mem(|buf| cap.bind_buffer(buf))
    }
}

impl<M: DeviceMemory> MlaDecodeArgs<M> {
    /// Validates everything that can be checked on the host and plans the launch for `arch` on a
    /// GPU with `sm_count` SMs whose context is `ctx` (null skips the device check: planning only).
    pub fn plan(&self, arch: MlaArch, sm_count: u32, ctx: c::CUcontext) -> Result<MlaDecodePlan> {
        // q's rank says whether a request brings s_q tokens ([B, s_q, H, D]) or one ([B, H, D]).
        let (batch, s_q, heads) = query_shape(&self.q_nope)?;
        let four = self.q_nope.shape.len() == 4;
        let rows_shape = |dim: usize| -> Vec<Option<usize>> {
            if four {
                vec![Some(batch), Some(s_q), Some(heads), Some(dim)]
            } else {
                vec![Some(batch), Some(heads), Some(dim)]
            }
        };
        let qn = Check { name: "q_nope", t: &self.q_nope };
        qn.dtype(&[DType::Bf16, DType::Fp16, DType::Fp8E4m3])?.shape(&rows_shape(LATENT_DIM))?.inner_contiguous()?;
        if batch == 0 || batch > 65_535 {
            return Err(Error::invalid("q_nope.shape[0] (batch)", "1..=65535", batch));
        }
        let dt = self.q_nope.dtype;
        let qp = Check { name: "q_pe", t: &self.q_pe };
        qp.dtype(&[dt])?.shape(&rows_shape(ROPE_DIM))?.inner_contiguous()?;
        let format = self.kv_format.kind();
        let (kv_dt, kv_row) = format.cache_element(dt);
        let kv = Check { name: "kv_cache", t: &self.kv_cache };
        if self.kv_cache.shape.len() == 4 {
            // FlashMLA's [blocks, block_size, h_kv, d]: MLA has one latent KV head.
            let h_kv = self.kv_cache.shape[2];
            if h_kv != 1 {
                return Err(Error::invalid("kv_cache.shape[2] (h_kv, KV heads)", "1 (MLA attends one latent KV head; h_kv > 1 is not MLA)", h_kv));
            }
            kv.shape(&[None, None, Some(1), None])?;
        } else {
            kv.shape(&[None, None, None])?;
        }
        let (pages, page_size) = (self.kv_cache.shape[0], self.kv_cache.shape[1]);
        // Every rule on the scalars (dtype and format per back-end, heads, tokens, page size) is the
        // planners' (plan.rs), named here by the tensor that carries the value.
        let limits = MlaLimits {
            dtype: dt,
            kv_format: format,
            num_heads: u32::try_from(heads).unwrap_or(u32::MAX),
            s_q: u32::try_from(s_q).unwrap_or(u32::MAX),
            batch: batch as u32,
            max_seq_len: self.max_seq_len,
            page_size: u32::try_from(page_size).unwrap_or(u32::MAX),
            sm_count,
            num_splits: self.num_splits,
        };
        super::plan::check(arch, &limits).map_err(|e| name_by_tensors(e, four))?;
        kv.dtype(&[kv_dt])?.shape(&if self.kv_cache.shape.len() == 4 { vec![None, None, Some(1), Some(kv_row)] } else { vec![None, None, Some(kv_row)] })?.contiguous()?;
        if let KvFormat::Fp8PerTensor { scale } = &self.kv_format {
            Check { name: "kv_format.scale", t: scale }.dtype(&[DType::F32])?.shape(&[Some(1)])?.contiguous()?;
        }
        if pages == 0 || (pages as u64).checked_mul(page_size as u64).is_none_or(|tokens| tokens >= 1 << 31) {
            return Err(Error::invalid("kv_cache.shape[0] (pages)", "at least 1, with pages x page_size below 2^31 tokens", pages));
        }
        Check { name: "seq_lens", t: &self.seq_lens }.dtype(&[DType::I32])?.shape(&[Some(batch)])?.contiguous()?;
        let pt = Check { name: "page_table", t: &self.page_table };
        pt.dtype(&[DType::I32])?.shape(&[Some(batch), None])?.inner_contiguous()?;
        let max_pages = self.page_table.shape[1];
        if self.max_seq_len == 0 {
            return Err(Error::invalid("max_seq_len", "at least 1", 0));
        }
        let table_tokens = (max_pages as u64).saturating_mul(page_size as u64);
        if self.max_seq_len as u64 > table_tokens {
            return Err(Error::invalid("max_seq_len", format!("at most page_table.shape[1] x page_size = {table_tokens}"), self.max_seq_len));
        }
        if batch > 1 && (self.page_table.strides[0] < max_pages || self.page_table.strides[0] > i32::MAX as usize) {
            return Err(Error::invalid(
                "page_table.strides[0]",
                format!("{max_pages}..2^31 (rows of the page table may not overlap)"),
                self.page_table.strides[0],
            ));
        }
        let out_dt = if dt == DType::Fp16 { DType::Fp16 } else { DType::Bf16 };
        let out = Check { name: "out", t: &self.out };
        out.dtype(&[out_dt])?.shape(&rows_shape(LATENT_DIM))?.inner_contiguous()?.no_self_overlap()?;
        if let Some(lse) = &self.lse {
            let shape: &[Option<usize>] = if four { &[Some(batch), Some(heads), Some(s_q)] } else { &[Some(batch), Some(heads)] };
            Check { name: "lse", t: lse }.dtype(&[DType::F32])?.shape(shape)?.contiguous()?;
        }
        if !(self.sm_scale.is_finite() && self.sm_scale > 0.0) {
            return Err(Error::invalid("sm_scale", "a finite value > 0", self.sm_scale));
        }
        // Alignment (16-byte vector and TMA loads), bounds and device, for every tensor.
        let mut all: Vec<(&str, &Tensor<M>, usize)> = vec![
            ("q_nope", &self.q_nope, 16),
            ("q_pe", &self.q_pe, 16),
            ("kv_cache", &self.kv_cache, 16),
            ("seq_lens", &self.seq_lens, 4),
            ("page_table", &self.page_table, 4),
            ("out", &self.out, 16),
        ];
        if let Some(lse) = &self.lse {
            all.push(("lse", lse, 4));
        }
        if let KvFormat::Fp8PerTensor { scale } = &self.kv_format {
            all.push(("kv_format.scale", scale, 4));
        }
        for (name, t, align) in all {
            let ch = Check { name, t };
            ch.aligned(align)?.in_bounds()?;
            if !ctx.is_null() {
                ch.device(ctx)?;
            }
        }

        // The outputs may not overlap what the kernels trust (the lengths and page indices they
        // index the cache with: overwritten while other CTAs still read them, they could send a
        // kernel out of bounds or hang it), what they read (queries and cache: other CTAs may still
        // read what one writes, so the result would depend on timing) or each other.
        let written = [("out", self.out.byte_range()), ("lse", self.lse.as_ref().and_then(Tensor::byte_range))];
        for w in written {
            refuse_overlap(w, ("seq_lens", self.seq_lens.byte_range()))?;
            refuse_overlap(w, ("page_table", self.page_table.byte_range()))?;
            refuse_overlap(w, ("q_nope", self.q_nope.byte_range()))?;
            refuse_overlap(w, ("q_pe", self.q_pe.byte_range()))?;
            refuse_overlap(w, ("kv_cache", self.kv_cache.byte_range()))?;
            // The scale multiplies every score: a write racing its read would make the result
            // depend on timing.
            if let KvFormat::Fp8PerTensor { scale } = &self.kv_format {
                refuse_overlap(w, ("kv_format.scale", scale.byte_range()))?;
            }
        }
        refuse_overlap(written[1], written[0])?;

        let p = plan(arch, &limits)?;
        if arch == MlaArch::Sm100 && heads == NUM_HEADS && s_q == 1 {
            // With splits, CUTLASS's reduction kernel writes `out` densely, [B, 128, 512]
            // whatever its strides (examples/77_blackwell_fmha, sm100_fmha_mla_reduction.hpp):
            // a head stride below 512 would run past the buffer, one above it over the
            // caller's columns. One split writes through the strides. Only a direct decode (one
            // token of 128 heads) gives CUTLASS the caller's `out`; an adapted one gives it
            // graphsafe's dense staging and copies out through any strides (sm100.rs).
            let (sb, sh) = (self.out.strides[0], self.out.strides[self.out.strides.len() - 2]);
            if p.num_splits > 1 && (sh != LATENT_DIM || (batch > 1 && sb != heads * LATENT_DIM)) {
                return Err(Error::invalid(
                    "out.strides",
                    format!("[{}, {LATENT_DIM}, 1] (dense) when the sm100 decode splits the sequence ({} splits; CUTLASS's split reduction ignores strides), or num_splits 1", heads * LATENT_DIM, p.num_splits),
                    format!("{:?}", self.out.strides),
                ));
            }
        }
        Ok(p)
    }

    /// The glue's arguments: every tensor admitted to `target` (its span, from its first element)
    /// with the plan's sizes.
    pub(super) fn to_glue(&self, p: &MlaDecodePlan, sm_count: u32, device: usize, target: &mut OpTarget<'_>) -> Result<glue::Decode> {
        // Every value below was bounded by plan(): shapes, and strides by the bounds check (an
        // extent that fits in the address space); the conversions only restate that.
        let i32_of = |what: &str, v: u64| i32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^31", v));
        let rows = |target: &mut OpTarget<'_>, name: &str, t: &Tensor<M>| -> Result<Rows> {
            let (stride_batch, stride_token, stride_head) = glue_row_strides(t)?;
            Ok(Rows { span: span(target, name, t)?, stride_batch, stride_token, stride_head })
        };
        let (q_nope, q_pe, out) = (rows(target, "q_nope", &self.q_nope)?, rows(target, "q_pe", &self.q_pe)?, rows(target, "out", &self.out)?);
        Ok(glue::Decode {
            dtype: glue_dtype("q_nope.dtype", p.dtype)?,
            batch: i32_of("batch", p.batch as u64)?,
            num_heads: i32_of("num_heads", p.num_heads as u64)?,
            s_q: i32_of("s_q", p.s_q as u64)?,
            causal: self.causal,
            max_seq_len: i32_of("max_seq_len", self.max_seq_len as u64)?,
            num_splits: i32_of("num_splits", p.num_splits as u64)?,
            sm_count: i32_of("sm_count", sm_count as u64)?,
            device: i32_of("device", device as u64)?,
            q_nope,
            q_pe,
            kv_cache: span(target, "kv_cache", &self.kv_cache)?,
            kv_layout: match &self.kv_format {
                KvFormat::Native => glue::KvLayout::Native,
                KvFormat::Fp8PerTensor { scale } => glue::KvLayout::Fp8PerTensor { scale: span(target, "kv_format.scale", scale)? },
                KvFormat::Fp8DsMla => glue::KvLayout::Fp8DsMla,
            },
            num_pages: i32_of("kv_cache.shape[0] (pages)", self.kv_cache.shape[0] as u64)?,
            page_size: i32_of("page_size", p.page_size as u64)?,
            seq_lens: span(target, "seq_lens", &self.seq_lens)?,
            page_table: span(target, "page_table", &self.page_table)?,
            // One request: its row's stride is never stepped (see `rows`).
            page_table_stride: if p.batch <= 1 {
                i32_of("page_table.shape[1]", self.page_table.shape[1] as u64)?
            } else {
                i32_of("page_table.strides[0]", self.page_table.strides[0] as u64)?
            },
            out,
            lse: self.lse.as_ref().map(|t| span(target, "lse", t)).transpose()?,
            sm_scale: self.sm_scale,
        })
    }
}

/// A planner's refusal (plan.rs names the scalar) named by the tensor that carries the value.
fn name_by_tensors(e: Error, four: bool) -> Error {
    match e {
        Error::InvalidArgument { what, expected, got } => {
            let what = match what.as_str() {
                "dtype" => "q_nope.dtype".to_string(),
                "num_heads" => format!("q_nope.shape[{}] (heads)", if four { 2 } else { 1 }),
                "s_q" => "q_nope.shape[1] (s_q, query tokens per request)".to_string(),
                "num_heads, s_q" => "q_nope.shape (heads, tokens)".to_string(),
                "batch x s_q" => "q_nope.shape (batch x s_q)".to_string(),
                "page_size" => "kv_cache.shape[1] (page_size)".to_string(),
                _ => what,
            };
            Error::InvalidArgument { what, expected, got }
        }
        other => other,
    }
}

/// The query shape `(batch, s_q, heads)` of a decode, from q_nope: `[B, s_q, H, 512]`, or
/// `[B, H, 512]` for one token. Any other rank is refused naming q_nope's shape.
fn query_shape<M>(q: &Tensor<M>) -> Result<(usize, usize, usize)> {
    match q.shape[..] {
        [b, s, h, _] => Ok((b, s, h)),
        [b, h, _] => Ok((b, 1, h)),
        _ => Err(Error::invalid("q_nope.shape", "[B, s_q, H, 512] or [B, H, 512]", format!("{:?}", q.shape))),
    }
}

/// The batch, token and head strides the kernels get for a `[batch, s_q, heads, dim]` (or
/// `[batch, heads, dim]`: one token) tensor, validated by plan(). A dimension of size 1 is never
/// stepped, so its stride is whatever the caller's framework left there (1, or 2^40): the kernels
/// get the dense stride instead. sm100 builds tensor maps from these strides (multiples of 16
/// bytes below 2^40 only; the glue refuses others), and sm90 takes its vector path only for
/// strides that are multiples of 8 elements.
fn glue_row_strides<M: DeviceMemory>(t: &Tensor<M>) -> Result<(i64, i64, i64)> {
    let n = t.shape.len();
    let (batch, tokens, heads, dim) = if n == 4 { (t.shape[0], t.shape[1], t.shape[2], t.shape[3]) } else { (t.shape[0], 1, t.shape[1], t.shape[2]) };
    let dense_head = dim as i64;
    let dense_token = (heads * dim) as i64;
    let dense_batch = (tokens * heads * dim) as i64;
    let stride_batch = if batch <= 1 { dense_batch } else { t.stride_i64(0)? };
    let stride_token = if tokens <= 1 { dense_token } else { t.stride_i64(1)? };
    let stride_head = if heads <= 1 { dense_head } else { t.stride_i64(n - 2)? };
    Ok((stride_batch, stride_token, stride_head))
}

/// A tensor admitted to `target`: the span from its first element to the end of its memory.
fn span<M: DeviceMemory>(target: &mut OpTarget<'_>, name: &str, t: &Tensor<M>) -> Result<DeviceSpan> {
    target.admit(name, &t.mem)?.skip(name, t.offset as u64)
}

/// Validate, size, launch: the one path behind every entry point (Rust eager, Rust captured, C).
/// Everything is checked before anything is enqueued: a refusal captures and launches nothing.
pub(crate) fn run<M: DeviceMemory>(args: &MlaDecodeArgs<M>, mut target: OpTarget<'_>) -> Result<MlaDecodePlan> {
    let ctx = target.context().clone();
    let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
    let sms = ctx.sm_count();
    let plan = args.plan(arch, sms, ctx.raw())?;
    let decode = args.to_glue(&plan, sms, ctx.device().ordinal(), &mut target)?;
    let ws = target.workspace(plan.workspace_bytes)?;
    // Nor the workspace (on sm100 it holds the sanitized copy of the lengths and page table that
    // CUTLASS trusts). A buffer the workspace just grew into is fresh, so only an unchanged one
    // can overlap, and then nothing was enqueued yet.
    if !ws.is_empty() {
        let w = Some((ws.ptr(), ws.ptr().saturating_add(ws.len())));
        refuse_overlap(("out", args.out.byte_range()), ("the workspace", w))?;
        refuse_overlap(("lse", args.lse.as_ref().and_then(Tensor::byte_range)), ("the workspace", w))?;
        // Nor the per-tensor scale: every CTA reads it while the split kernels write partials.
        if let KvFormat::Fp8PerTensor { scale } = &args.kv_format {
            refuse_overlap(("kv_format.scale", scale.byte_range()), ("the workspace", w))?;
        }
    }
    let backend = match arch {
        MlaArch::Sm90 => glue::Backend::Sm90,
        MlaArch::Sm100 => glue::Backend::Sm100,
    };
    target.commit()?.glue(|stream| glue::decode(backend, &decode, ws, stream))?;
    Ok(plan)
}

/// Eager decode on `stream`: validates, grows `ws` if needed (retiring, zero-filled), launches.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// // One request of 16 heads (DeepSeek V3 at TP 8) over two 64-token pages, bf16.
/// let (heads, page, pages) = (16, 64, 2);
/// # let q_nope = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// # let q_pe = DeviceBuffer::alloc_zeroed(&stream, heads * 64 * 2)?;
/// # let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
/// # let seq_lens = DeviceBuffer::from_host(&stream, &[100i32])?;
/// # let page_table = DeviceBuffer::from_host(&stream, &[0i32, 1])?;
/// # let out = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// let args = MlaDecodeArgs::new(
///     Tensor::contiguous(&q_nope, DType::Bf16, &[1, heads, 512]),
///     Tensor::contiguous(&q_pe, DType::Bf16, &[1, heads, 64]),
///     Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
///     Tensor::contiguous(&seq_lens, DType::I32, &[1]),
///     Tensor::contiguous(&page_table, DType::I32, &[1, pages]),
///     Tensor::contiguous(&out, DType::Bf16, &[1, heads, 512]),
/// );
/// let mut ws = Workspace::new(&stream, 0)?; // an eager decode grows it as it needs
/// let plan = mla::decode(&args, &mut ws, &stream)?;
/// assert!(ws.capacity() >= plan.workspace_bytes);
/// let out_host = out.to_host_vec::<u16>(&stream)?; // bf16 bits, [1, 16, 512]
/// # let _ = out_host; Ok(()) }
/// ```
pub fn decode(args: &MlaDecodeArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<MlaDecodePlan> {
    run(args, OpTarget::eager(stream, Some(ws))?)
}

/// Captured decode: validates, checks that every view belongs to `cap`, checks the captured
/// workspace (never grows: `WorkspaceTooSmall` naming both sizes, nothing captured), captures the
/// launch, and adds every buffer it bakes in to the capture.
///
/// Size the workspace before the capture ([`super::worst_case`] over every shape captured); a
/// captured decode never grows it:
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// // One request of 16 heads (DeepSeek V3 at TP 8) over two 64-token pages, bf16.
/// let (heads, page, pages) = (16, 64, 2);
/// # let q_nope = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// # let q_pe = DeviceBuffer::alloc_zeroed(&stream, heads * 64 * 2)?;
/// # let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
/// # let seq_lens = DeviceBuffer::from_host(&stream, &[100i32])?;
/// # let page_table = DeviceBuffer::from_host(&stream, &[0i32, 1])?;
/// # let out = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// let args = MlaDecodeArgs::new(
///     Tensor::contiguous(&q_nope, DType::Bf16, &[1, heads, 512]),
///     Tensor::contiguous(&q_pe, DType::Bf16, &[1, heads, 64]),
///     Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
///     Tensor::contiguous(&seq_lens, DType::I32, &[1]),
///     Tensor::contiguous(&page_table, DType::I32, &[1, pages]),
///     Tensor::contiguous(&out, DType::Bf16, &[1, heads, 512]),
/// );
/// let limits = MlaLimits::new(heads as u32, 1, (pages * page) as u32, ctx.sm_count());
/// let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
/// let mut ws = Workspace::new(&stream, mla::worst_case(arch, &limits)?.workspace_bytes)?;
/// let exec = {
///     let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
///     let w = cap.bind_workspace(&mut ws)?; // ws cannot grow until the capture ends
///     let bound = args.bind(&mut cap)?; // every buffer kept alive by the graph
///     mla::decode_captured(&bound, &w, &cap)?;
///     cap.end()?.instantiate()?
/// };
/// exec.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn decode_captured<'id>(args: &MlaDecodeArgs<CapturedBuffer<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<MlaDecodePlan> {
    run(args, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

#[cfg(test)]
mod tests {
    use super::glue_row_strides;
    use crate::ops::tensor::{DType, DeviceMemory, Tensor};

    /// Memory that is never dereferenced: the strides are all that is read.
    #[derive(Clone, Copy)]
    struct NoMemory;
    impl DeviceMemory for NoMemory {
        fn device_ptr(&self) -> crate::driver::DevicePtr {
            0x1000
        }
        fn len(&self) -> usize {
            usize::MAX
        }
        fn context_raw(&self) -> crate::sys::cuda::CUcontext {
            std::ptr::null_mut()
        }
    }

    /// The kernels get dense strides for dimensions of size 1, whatever the caller left there (a
    /// batch-1 query with batch stride 1 would otherwise reach sm100's tensor maps, which the glue
    /// refuses, after the op had committed), and the caller's strides for the others.
    #[test]
    fn size_one_dimensions_get_dense_strides() {
        let t = |shape: &[usize], strides: &[usize]| Tensor::strided(NoMemory, 0, DType::Bf16, shape, strides);
        assert_eq!(glue_row_strides(&t(&[1, 128, 512], &[1, 512, 1])).unwrap(), (128 * 512, 128 * 512, 512));
        assert_eq!(glue_row_strides(&t(&[1, 16, 512], &[1 << 40, 576, 1])).unwrap(), (16 * 512, 16 * 512, 576));
        assert_eq!(glue_row_strides(&t(&[4, 1, 64], &[64, 3, 1])).unwrap(), (64, 64, 64));
        assert_eq!(glue_row_strides(&t(&[4, 16, 512], &[16 * 576, 576, 1])).unwrap(), (16 * 576, 16 * 512, 576));
        // [B, s_q, H, D]: the token stride is the caller's when s_q > 1, dense otherwise.
        assert_eq!(glue_row_strides(&t(&[4, 2, 16, 512], &[2 * 16 * 576, 16 * 576, 576, 1])).unwrap(), (2 * 16 * 576, 16 * 576, 576));
        assert_eq!(glue_row_strides(&t(&[4, 1, 16, 512], &[16 * 576, 7, 576, 1])).unwrap(), (16 * 576, 16 * 512, 576));
        assert_eq!(glue_row_strides(&t(&[1, 2, 1, 512], &[3, 5, 9, 1])).unwrap(), (2 * 512, 5, 512));
    }
}

//! [`MlaDecodeArgs`]: the arguments of one decode step, their defaults and setters, and their
//! validation (the planners' rules, named by the tensor that carries each value) down to the
//! glue's view of the decode.

use super::plan::{plan, MlaDecodePlan, MlaLimits};
use super::{glue_dtype, KvFormat, MlaArch, LATENT_DIM, MAX_SEQ_LEN, NUM_HEADS, ROPE_DIM};
use crate::driver::DeviceBuffer;
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedBuffer};
use crate::ops::tensor::{refuse_overlap, Check, DType, DeviceMemory, Tensor};
use crate::sys::cuda as c;
use crate::sys::glue::mla::{self as glue, Rows};
use crate::sys::DeviceSpan;

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
        super::plan::check_batch("q_nope.shape[0] (batch)", i64::try_from(batch).unwrap_or(i64::MAX))?;
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

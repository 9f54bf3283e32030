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

use super::{sm100, sm90, KvDtype, LATENT_DIM, NUM_HEADS, ROPE_DIM};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::target::Target;
use crate::graph::{Capture, Captured, CapturedBuffer};
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
    /// fp8 KV cache. Queries bf16, output bf16. sm_90, every head count it takes. At 16 and 32
    /// heads the products run in fp16 with q scaled by a power of two per head (exact for every
    /// element of q above 2^-28 of its head's largest magnitude) and P in fp16; at 48..128 heads
    /// in bf16.
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
    pub fn token_bytes(self, q: KvDtype) -> usize {
        let q = match q {
            KvDtype::Bf16 => DType::Bf16,
            KvDtype::Fp16 => DType::Fp16,
            KvDtype::Fp8E4m3 => DType::Fp8E4m3,
        };
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
#[derive(Clone, Debug)]
pub struct MlaDecodeArgs<M> {
    /// [B, H, 512], bf16/fp16/fp8.
    pub q_nope: Tensor<M>,
    /// [B, H, 64], same dtype as q_nope.
    pub q_pe: Tensor<M>,
    /// [pages, page_size, 576] contiguous, same dtype as q (see [`KvFormat`] for the fp8 caches).
    pub kv_cache: Tensor<M>,
    /// How `kv_cache` stores K and V.
    pub kv_format: KvFormat<M>,
    /// `[B]` i32 lengths. Device data, so never trusted; both back-ends read it the same way:
    /// a length ≤ 0 is an empty request (its `out` rows are all zeros and its `lse` is `-inf`),
    /// a length above `max_seq_len` is clamped to `max_seq_len`. (The sm100 path clamps into a
    /// copy in the workspace before CUTLASS sees it: CUTLASS 4.2 hangs on an empty request with
    /// batch > 1.)
    pub seq_lens: Tensor<M>,
    /// [B, max_pages] i32 page indices, innermost contiguous. Device data, never trusted: only the
    /// columns that hold tokens of a request's clamped length are read, and an index outside
    /// `0..pages` is clamped into it (negative reads page 0, too large reads page `pages - 1`), so
    /// no index reaches memory outside the cache. The sm100 path reads a clamped, compact copy the
    /// decode writes into the workspace.
    pub page_table: Tensor<M>,
    /// [B, H, 512]: bf16 for bf16/fp8 inputs, fp16 for fp16. Any strides with an inner stride of
    /// 1, except on sm100 when the plan splits the sequence (single requests only): then a head
    /// stride of 512, since CUTLASS's split reduction writes densely (refused otherwise, naming
    /// `out.strides`; `num_splits: Some(1)` takes any strides).
    pub out: Tensor<M>,
    /// [B, H] f32 log-sum-exp, optional.
    pub lse: Option<Tensor<M>>,
    /// Softmax scale (finite, > 0), e.g. 1/sqrt(192) for DeepSeek-V3 (with YaRN's mscale applied).
    pub sm_scale: f32,
    /// Upper bound of seq_lens: sizes the splits and the workspace (use the capture's maximum).
    pub max_seq_len: u32,
    /// Explicit KV split count, validated against the back-end's rule; `None` for the default.
    pub num_splits: Option<u32>,
}

/// What a decode will launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MlaDecodePlan {
    /// Back-end.
    pub arch: MlaArch,
    /// Element type of the queries (and of a native cache).
    pub dtype: KvDtype,
    /// How the cache stores K and V.
    pub kv_format: KvFormatKind,
    /// Requests.
    pub batch: u32,
    /// Heads.
    pub num_heads: u32,
    /// Page size.
    pub page_size: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Workspace bytes needed.
    pub workspace_bytes: u64,
}

fn kv_dtype(d: DType) -> Option<KvDtype> {
    match d {
        DType::Bf16 => Some(KvDtype::Bf16),
        DType::Fp16 => Some(KvDtype::Fp16),
        DType::Fp8E4m3 => Some(KvDtype::Fp8E4m3),
        _ => None,
    }
}

impl<M: DeviceMemory> MlaDecodeArgs<M> {
    /// Validates everything that can be checked on the host and plans the launch for `arch` on a
    /// GPU with `sm_count` SMs whose context is `ctx` (null skips the device check: planning only).
    pub fn plan(&self, arch: MlaArch, sm_count: u32, ctx: c::CUcontext) -> Result<MlaDecodePlan> {
        let q_types: &[DType] = match arch {
            MlaArch::Sm100 => &[DType::Bf16, DType::Fp16, DType::Fp8E4m3],
            MlaArch::Sm90 => &[DType::Bf16, DType::Fp16],
        };
        let qn = Check { name: "q_nope", t: &self.q_nope };
        qn.dtype(q_types)?.shape(&[None, None, Some(LATENT_DIM)])?.inner_contiguous()?;
        let (batch, heads) = (self.q_nope.shape[0], self.q_nope.shape[1]);
        if batch == 0 || batch > 65_535 {
            return Err(Error::invalid("q_nope.shape[0] (batch)", "1..=65535", batch));
        }
        match arch {
            MlaArch::Sm100 if heads != NUM_HEADS => {
                return Err(Error::invalid("q_nope.shape[1] (heads)", format!("{NUM_HEADS} for the sm100 kernel (pad heads up to 128)"), heads))
            }
            MlaArch::Sm90 => {
                sm90::check_heads(heads as i64).map_err(|_| Error::invalid("q_nope.shape[1] (heads)", "a multiple of 16 in 16..=128", heads))?;
            }
            _ => {}
        }
        let dt = self.q_nope.dtype;
        let qp = Check { name: "q_pe", t: &self.q_pe };
        qp.dtype(&[dt])?.shape(&[Some(batch), Some(heads), Some(ROPE_DIM)])?.inner_contiguous()?;
        let format = self.kv_format.kind();
        if format != KvFormatKind::Native {
            if arch != MlaArch::Sm90 {
                return Err(Error::invalid("kv_format", "KvFormat::Native on sm_100 (its fp8 path takes fp8 q and KV: dtype Fp8E4m3)", format));
            }
            if dt != DType::Bf16 {
                return Err(Error::invalid("q_nope.dtype", format!("bf16 with kv_format {format}"), dt));
            }
        }
        let (kv_dt, kv_row) = format.cache_element(dt);
        let kv = Check { name: "kv_cache", t: &self.kv_cache };
        kv.dtype(&[kv_dt])?.shape(&[None, None, Some(kv_row)])?.contiguous()?;
        if let KvFormat::Fp8PerTensor { scale } = &self.kv_format {
            Check { name: "kv_format.scale", t: scale }.dtype(&[DType::F32])?.shape(&[Some(1)])?.contiguous()?;
        }
        let (pages, page_size) = (self.kv_cache.shape[0], self.kv_cache.shape[1]);
        if pages == 0 || (pages as u64).checked_mul(page_size as u64).is_none_or(|tokens| tokens >= 1 << 31) {
            return Err(Error::invalid("kv_cache.shape[0] (pages)", "at least 1, with pages x page_size below 2^31 tokens", pages));
        }
        let page_ok = match arch {
            MlaArch::Sm100 => page_size.is_power_of_two() && page_size <= 128,
            MlaArch::Sm90 => page_size == 64 || page_size == 128,
        };
        if !page_ok {
            let want = match arch {
                MlaArch::Sm100 => "a power of two up to 128 (128 uses TMA loads)",
                MlaArch::Sm90 => "64 or 128",
            };
            return Err(Error::invalid("kv_cache.shape[1] (page_size)", want, page_size));
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
        out.dtype(&[out_dt])?.shape(&[Some(batch), Some(heads), Some(LATENT_DIM)])?.inner_contiguous()?.no_self_overlap()?;
        if let Some(lse) = &self.lse {
            Check { name: "lse", t: lse }.dtype(&[DType::F32])?.shape(&[Some(batch), Some(heads)])?.contiguous()?;
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

        let dtype = kv_dtype(dt).expect("checked above");
        let requested = self.num_splits.map(|n| n as i64);
        let (num_splits, workspace_bytes) = match arch {
            MlaArch::Sm100 => {
                let p = sm100::plan(dtype, batch as i64, self.max_seq_len as i64, page_size as i64, sm_count as i64, requested)?;
                // With splits, CUTLASS's reduction kernel writes `out` densely, [B, 128, 512]
                // whatever its strides (examples/77_blackwell_fmha, sm100_fmha_mla_reduction.hpp):
                // a head stride below 512 would run past the buffer, one above it over the
                // caller's columns. One split writes through the strides.
                let (sb, sh) = (self.out.strides[0], self.out.strides[1]);
                if p.num_splits > 1 && (sh != LATENT_DIM || (batch > 1 && sb != heads * LATENT_DIM)) {
                    return Err(Error::invalid(
                        "out.strides",
                        format!("[{}, {LATENT_DIM}, 1] (dense) when the sm100 decode splits the sequence ({} splits; CUTLASS's split reduction ignores strides), or num_splits 1", heads * LATENT_DIM, p.num_splits),
                        format!("{:?}", self.out.strides),
                    ));
                }
                (p.num_splits, p.workspace_bytes)
            }
            MlaArch::Sm90 => {
                let p = sm90::plan(dtype, heads as i64, batch as i64, self.max_seq_len as i64, sm_count as i64, requested)?;
                (p.num_splits, p.workspace_bytes)
            }
        };
        Ok(MlaDecodePlan {
            arch,
            dtype,
            kv_format: format,
            batch: batch as u32,
            num_heads: heads as u32,
            page_size: page_size as u32,
            num_splits,
            workspace_bytes,
        })
    }

    /// The glue's arguments: every tensor admitted to `target` (its span, from its first element)
    /// with the plan's sizes.
    fn to_glue(&self, p: &MlaDecodePlan, sm_count: u32, device: usize, target: &mut Target<'_>) -> Result<glue::Decode> {
        // Every value below was bounded by plan(): shapes, and strides by the bounds check (an
        // extent that fits in the address space); the conversions only restate that.
        let i32_of = |what: &str, v: u64| i32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^31", v));
        let rows = |target: &mut Target<'_>, name: &str, t: &Tensor<M>| -> Result<Rows> {
            let (stride_batch, stride_head) = glue_row_strides(t)?;
            Ok(Rows { span: span(target, name, t)?, stride_batch, stride_head })
        };
        let (q_nope, q_pe, out) = (rows(target, "q_nope", &self.q_nope)?, rows(target, "q_pe", &self.q_pe)?, rows(target, "out", &self.out)?);
        Ok(glue::Decode {
            dtype: p.dtype.to_glue(),
            batch: i32_of("batch", p.batch as u64)?,
            num_heads: i32_of("num_heads", p.num_heads as u64)?,
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

/// The batch and head strides the kernels get for a `[batch, heads, dim]` tensor (validated by
/// plan()). A dimension of size 1 is never stepped, so its stride is whatever the caller's framework
/// left there (1, or 2^40): the kernels get the dense stride instead. sm100 builds tensor maps from
/// these strides (multiples of 16 bytes below 2^40 only; the glue refuses others), and sm90 takes
/// its vector path only for strides that are multiples of 8 elements.
fn glue_row_strides<M: DeviceMemory>(t: &Tensor<M>) -> Result<(i64, i64)> {
    let dense_head = t.shape[2] as i64;
    let dense_batch = (t.shape[1] * t.shape[2]) as i64;
    let stride_batch = if t.shape[0] <= 1 { dense_batch } else { t.stride_i64(0)? };
    let stride_head = if t.shape[1] <= 1 { dense_head } else { t.stride_i64(1)? };
    Ok((stride_batch, stride_head))
}

/// A tensor admitted to `target`: the span from its first element to the end of its memory.
fn span<M: DeviceMemory>(target: &mut Target<'_>, name: &str, t: &Tensor<M>) -> Result<DeviceSpan> {
    target.admit(name, &t.mem)?.skip(name, t.offset as u64)
}

/// Validate, size, launch: the one path behind every entry point (Rust eager, Rust captured, C).
/// Everything is checked before anything is enqueued: a refusal captures and launches nothing.
pub(crate) fn run<M: DeviceMemory>(args: &MlaDecodeArgs<M>, mut target: Target<'_>) -> Result<MlaDecodePlan> {
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
    target.commit()?;
    let _current = ctx.enter()?;
    let backend = match arch {
        MlaArch::Sm90 => glue::Backend::Sm90,
        MlaArch::Sm100 => glue::Backend::Sm100,
    };
    glue::decode(backend, &decode, ws, target.raw_stream())?;
    Ok(plan)
}

/// Eager decode on `stream`: validates, grows `ws` if needed (retiring, zero-filled), launches.
pub fn decode(args: &MlaDecodeArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<MlaDecodePlan> {
    run(args, Target::eager(stream, Some(ws))?)
}

/// Captured decode: validates, checks that every view belongs to `cap`, checks the captured
/// workspace (never grows: `WorkspaceTooSmall` naming both sizes, nothing captured), captures the
/// launch, and adds every buffer it bakes in to the capture.
pub fn decode_captured<'id>(args: &MlaDecodeArgs<CapturedBuffer<'id>>, ws: &Captured<'id>, cap: &Capture<'_, 'id>) -> Result<MlaDecodePlan> {
    run(args, Target::captured(cap.site(), Some(ws.view()))?)
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
        assert_eq!(glue_row_strides(&t(&[1, 128, 512], &[1, 512, 1])).unwrap(), (128 * 512, 512));
        assert_eq!(glue_row_strides(&t(&[1, 16, 512], &[1 << 40, 576, 1])).unwrap(), (16 * 512, 576));
        assert_eq!(glue_row_strides(&t(&[4, 1, 64], &[64, 3, 1])).unwrap(), (64, 64));
        assert_eq!(glue_row_strides(&t(&[4, 16, 512], &[16 * 576, 576, 1])).unwrap(), (16 * 576, 576));
    }
}

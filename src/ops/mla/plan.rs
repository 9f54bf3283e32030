//! The MLA decode's one planning front door: what an engine will run ([`MlaLimits`]) in, what a
//! decode launches and needs ([`MlaDecodePlan`]) out, on either back-end. The op
//! ([`super::MlaDecodeArgs::plan`]), the C ABI and the CLI all plan through [`plan`] and
//! [`worst_case`], so each shape rule (heads, query tokens, page sizes, cache formats) is written
//! here once; [`super::sm90`] and [`super::sm100`] hold each back-end's split and workspace rules.

use super::{in_range, sm100, sm90, DType, KvFormatKind, MlaArch, MAX_BATCH, MAX_S_Q, NUM_HEADS};
use crate::error::{Error, Result};
use crate::sys::kernels as k;

/// The shapes a decode (or every decode of a capture) runs: one shape for [`plan`], the bounds of
/// every shape for [`worst_case`] (batch `1..=batch`, lengths `1..=max_seq_len`, tokens
/// `1..=s_q`). Build it with [`MlaLimits::new`] and the `with_*` setters.
///
/// ```
/// use graphsafe::ops::mla::{self, KvFormatKind, MlaArch, MlaLimits};
/// // DeepSeek V3 at TP 8 (16 heads), MTP (2 tokens a step), up to 128 requests of 32K tokens, on an H200.
/// let limits = MlaLimits::new(16, 128, 32_768, 132).with_s_q(2).with_kv_format(KvFormatKind::Fp8DsMla);
/// let plan = mla::worst_case(MlaArch::Sm90, &limits)?;
/// assert!(plan.workspace_bytes > 0); // pre-grow the workspace to this before capture
/// # Ok::<(), graphsafe::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MlaLimits {
    /// Element type of the queries (and of a native cache). Default bf16.
    pub dtype: DType,
    /// How the cache stores K and V. Default [`KvFormatKind::Native`].
    pub kv_format: KvFormatKind,
    /// Query heads, `1..=`[`NUM_HEADS`].
    pub num_heads: u32,
    /// Query tokens per request, `1..=`[`MAX_S_Q`]. Default 1.
    pub s_q: u32,
    /// Requests (for [`worst_case`]: the largest batch).
    pub batch: u32,
    /// The longest request, in tokens.
    pub max_seq_len: u32,
    /// Tokens per page of the cache. Default 64.
    pub page_size: u32,
    /// SMs of the GPU (each row of [`crate::arch::TARGETS`] has its reference GPU's).
    pub sm_count: u32,
    /// An explicit KV split count; `None` (default) for the back-end's rule.
    pub num_splits: Option<u32>,
}

impl MlaLimits {
    /// `batch` requests of one token of `num_heads` heads, up to `max_seq_len` keys, on a GPU with
    /// `sm_count` SMs; bf16, native cache, page size 64, the default split rule.
    pub fn new(num_heads: u32, batch: u32, max_seq_len: u32, sm_count: u32) -> MlaLimits {
        MlaLimits { dtype: DType::Bf16, kv_format: KvFormatKind::Native, num_heads, s_q: 1, batch, max_seq_len, page_size: 64, sm_count, num_splits: None }
    }
    /// The query (and native cache) element type.
    pub fn with_dtype(mut self, dtype: DType) -> MlaLimits {
        self.dtype = dtype;
        self
    }
    /// The cache format.
    pub fn with_kv_format(mut self, kv_format: KvFormatKind) -> MlaLimits {
        self.kv_format = kv_format;
        self
    }
    /// Query tokens per request.
    pub fn with_s_q(mut self, s_q: u32) -> MlaLimits {
        self.s_q = s_q;
        self
    }
    /// Tokens per page of the cache.
    pub fn with_page_size(mut self, page_size: u32) -> MlaLimits {
        self.page_size = page_size;
        self
    }
    /// An explicit KV split count (`None`: the back-end's rule).
    pub fn with_num_splits(mut self, num_splits: Option<u32>) -> MlaLimits {
        self.num_splits = num_splits;
        self
    }
}

/// What a decode will launch, and the workspace it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MlaDecodePlan {
    /// Back-end.
    pub arch: MlaArch,
    /// Element type of the queries (and of a native cache).
    pub dtype: DType,
    /// How the cache stores K and V.
    pub kv_format: KvFormatKind,
    /// Requests (for a worst case: the batch that needs the most).
    pub batch: u32,
    /// Query tokens per request (for a worst case: the count that needs the most).
    pub s_q: u32,
    /// Heads.
    pub num_heads: u32,
    /// The longest request (for a worst case: the length that needs the most).
    pub max_seq_len: u32,
    /// Page size.
    pub page_size: u32,
    /// KV splits.
    pub num_splits: u32,
    /// Workspace bytes needed.
    pub workspace_bytes: u64,
}

/// Query heads a decode takes on either back-end: `1..=`[`NUM_HEADS`] (sm_100 pads fewer up to it
/// in its workspace). The one definition of the rule: the planners of both back-ends, the op, the
/// C ABI and the CLI all check heads here; the glue checks the same `GS_MLA_NUM_HEADS`.
pub fn check_heads(num_heads: i64) -> Result<i32> {
    in_range("num_heads", num_heads, NUM_HEADS as i64)
}

/// Query tokens per request (`s_q`): `1..=`[`MAX_S_Q`] on either back-end (`GS_MLA_MAX_S_Q`).
pub fn check_s_q(s_q: i64) -> Result<i32> {
    in_range("s_q", s_q, MAX_S_Q as i64)
}

/// Requests of a decode: `1..=`[`MAX_BATCH`] (`GS_MLA_MAX_BATCH`, a grid dimension of both
/// kernels), named `what`.
pub fn check_batch(what: &str, batch: i64) -> Result<i32> {
    in_range(what, batch, MAX_BATCH)
}

/// Tokens per cache page `arch`'s kernels read, from the glue header's bounds:
/// * sm_90: a power of two from `GS_MLA_SM90_MIN_PAGE_SIZE` to `GS_MLA_SM90_MAX_PAGE_SIZE` (64 or
///   128): the minimum is the kernel's 64-token tile, which then never crosses a page;
/// * sm_100: a power of two up to `GS_MLA_SM100_MAX_PAGE_SIZE` (128, CUTLASS's KV tile, which
///   holds whole pages).
pub fn check_page_size(arch: MlaArch, page_size: i64) -> Result<i32> {
    let (min, max, on) = match arch {
        MlaArch::Sm90 => (k::GS_MLA_SM90_MIN_PAGE_SIZE, k::GS_MLA_SM90_MAX_PAGE_SIZE, "on sm_90"),
        MlaArch::Sm100 => (1, k::GS_MLA_SM100_MAX_PAGE_SIZE, "for the sm100 kernel"),
    };
    if !(i64::from(min)..=i64::from(max)).contains(&page_size) || page_size & (page_size - 1) != 0 {
        let range = if min == 1 { format!("up to {max}") } else { format!("from {min} to {max}") };
        return Err(Error::invalid("page_size", format!("a power of two {range} {on}"), page_size));
    }
    Ok(page_size as i32)
}

/// Checks `l` against `arch`'s shape rules, naming the field that breaks one.
pub(crate) fn check(arch: MlaArch, l: &MlaLimits) -> Result<()> {
    super::glue_dtype("dtype", l.dtype)?;
    if arch == MlaArch::Sm90 && l.dtype == DType::Fp8E4m3 {
        return Err(Error::invalid("dtype", "bf16 or fp16 on sm_90 (fp8 caches take bf16 queries: kv_format)", l.dtype));
    }
    if l.kv_format != KvFormatKind::Native {
        if arch != MlaArch::Sm90 {
            return Err(Error::invalid("kv_format", "native on sm_100 (its fp8 path takes fp8 q and KV: dtype fp8)", l.kv_format));
        }
        if l.dtype != DType::Bf16 {
            return Err(Error::invalid("dtype", format!("bf16 with kv_format {}", l.kv_format), l.dtype));
        }
    }
    check_heads(l.num_heads.into())?;
    check_s_q(l.s_q.into())?;
    if arch == MlaArch::Sm100 {
        // CUTLASS runs each query token as a request of its own (sm100.rs, "Shapes CUTLASS does
        // not take"): the batch it sees is batch x s_q.
        sm100_shape(l).kernel_batch()?;
    }
    check_page_size(arch, l.page_size.into()).map(drop)
}

/// The plan for one decode shape on `arch`: every shape rule checked (an error names the field),
/// then the back-end's split count (or `l.num_splits`, validated) and workspace.
///
/// ```
/// use graphsafe::ops::mla::{self, MlaArch, MlaLimits};
/// // 8 requests of up to 4096 tokens, 16 heads, on an H200 (132 SMs).
/// let p = mla::plan(MlaArch::Sm90, &MlaLimits::new(16, 8, 4096, 132))?;
/// assert_eq!((p.batch, p.max_seq_len, p.num_heads), (8, 4096, 16));
/// assert!(p.num_splits >= 1);
/// // sm_90's kernel reads pages of 64 or 128 tokens: 48 is refused, naming the field.
/// let e = mla::plan(MlaArch::Sm90, &MlaLimits::new(16, 8, 4096, 132).with_page_size(48)).unwrap_err();
/// assert!(e.to_string().contains("page_size"));
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn plan(arch: MlaArch, l: &MlaLimits) -> Result<MlaDecodePlan> {
    check(arch, l)?;
    let requested = l.num_splits.map(i64::from);
    // The workspace does not depend on the cache format (partials are fp32), so
    // the fp8 formats plan as bf16 (their queries' and output's type).
    let (num_splits, workspace_bytes) = match arch {
        MlaArch::Sm90 => {
            let p = sm90::plan(l.dtype, l.num_heads.into(), l.s_q.into(), l.batch.into(), l.max_seq_len.into(), l.sm_count.into(), requested)?;
            (p.num_splits, p.workspace_bytes)
        }
        MlaArch::Sm100 => {
            let p = sm100::plan(&sm100_shape(l), requested)?;
            (p.num_splits, p.workspace_bytes)
        }
    };
    Ok(plan_of(arch, l, num_splits, workspace_bytes))
}

/// The workspace to pre-grow before capture: the most any shape within `l` needs on `arch` (batch
/// `1..=l.batch`, lengths `1..=l.max_seq_len`, tokens `1..=l.s_q`), as the plan of the shape that
/// needs it. Every shape rule is checked first, as by [`plan`].
///
/// ```
/// use graphsafe::arch::sm_count_of;
/// use graphsafe::ops::mla::{self, MlaArch, MlaLimits};
/// // Every decode a B200 engine captures: batch 1..=128, contexts up to 32K tokens.
/// let limits = MlaLimits::new(128, 128, 32_768, sm_count_of("B200")?);
/// let worst = mla::worst_case(MlaArch::Sm100, &limits)?;
/// for batch in [1, 7, 64, 128] {
///     for len in [1, 1000, 32_768] {
///         let mut one = limits;
///         (one.batch, one.max_seq_len) = (batch, len);
///         assert!(mla::plan(MlaArch::Sm100, &one)?.workspace_bytes <= worst.workspace_bytes);
///     }
/// }
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn worst_case(arch: MlaArch, l: &MlaLimits) -> Result<MlaDecodePlan> {
    check(arch, l)?;
    let requested = l.num_splits.map(i64::from);
    Ok(match arch {
        MlaArch::Sm90 => {
            let p = sm90::worst_case(l.dtype, l.num_heads.into(), l.s_q.into(), l.batch.into(), l.max_seq_len.into(), l.sm_count.into(), requested)?;
            let shape = MlaLimits { batch: p.batch, s_q: p.s_q, max_seq_len: p.max_seq_len, ..*l };
            plan_of(arch, &shape, p.num_splits, p.workspace_bytes)
        }
        MlaArch::Sm100 => {
            let p = sm100::worst_case(&sm100_shape(l), requested)?;
            let shape = MlaLimits { batch: p.batch, s_q: p.s_q, max_seq_len: p.max_seq_len, ..*l };
            plan_of(arch, &shape, p.num_splits, p.workspace_bytes)
        }
    })
}

/// The sm100 planner's shape for `l` (heads and tokens included: it pads and expands them).
fn sm100_shape(l: &MlaLimits) -> sm100::Shape {
    sm100::Shape::new(l.dtype, l.batch.into(), l.max_seq_len.into(), l.page_size.into(), l.sm_count.into()).with_heads(l.num_heads.into()).with_s_q(l.s_q.into())
}

fn plan_of(arch: MlaArch, l: &MlaLimits, num_splits: u32, workspace_bytes: u64) -> MlaDecodePlan {
    MlaDecodePlan {
        arch,
        dtype: l.dtype,
        kv_format: l.kv_format,
        batch: l.batch,
        s_q: l.s_q,
        num_heads: l.num_heads,
        max_seq_len: l.max_seq_len,
        page_size: l.page_size,
        num_splits,
        workspace_bytes,
    }
}

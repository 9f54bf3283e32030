//! Planning (`cuda-src/nvfp4/plan.cu`, `sm90/plan.cu`): scale sizes, the Blackwell tile, and the
//! workspace and prepared-weight sizes (and on Hopper the kernel's schedule) of one GEMM shape.
//! Host code; runs without a GPU.
//!
//! The front door: [`plan`] for one shape (what the GEMMs plan with on every call) and
//! [`worst_case`] over every M an engine captures ([`Nvfp4Limits`]): the size to pre-grow the
//! workspace to before capture. The CLI (`graphsafe plan nvfp4`) and the C ABI
//! (`graphsafe_nvfp4_worst_case`) answer through them.

use super::{Nvfp4Arch, Nvfp4Plan, Tile, W4a16Schedule};
use crate::error::{positive, Error, Result};
use crate::ops::tensor::DType;
use crate::sys::glue::{nvfp4 as glue, GlueDtype};
use crate::sys::kernels::GS_NVFP4_BLOCK;

/// The glue's output dtype: bf16 or fp16.
pub(super) fn out_dtype(d: DType) -> Result<GlueDtype> {
    match d {
        DType::Bf16 => Ok(GlueDtype::Bf16),
        DType::Fp16 => Ok(GlueDtype::Fp16),
        other => Err(Error::invalid("d.dtype", "bf16 or fp16", other)),
    }
}

/// `n` and `k` as `i32`s when both are positive multiples of 32.
pub(super) fn check_nk(n: i64, kk: i64) -> Result<(i32, i32)> {
    let (n, kk) = (positive("n", n)?, positive("k", kk)?);
    if kk % 32 != 0 {
        return Err(Error::invalid("k", "a multiple of 32", kk));
    }
    if n % 32 != 0 {
        return Err(Error::invalid("n", "a multiple of 32", n));
    }
    Ok((n, kk))
}

/// Bytes of the swizzled scale tensor of an [rows, k] NVFP4 matrix (k a multiple of 16):
/// `round_up(rows,128) × round_up(k/16,4)`, exact for every `i32` size (computed in 64 bits).
///
/// ```
/// use graphsafe::ops::nvfp4::scale_bytes;
/// assert_eq!(scale_bytes(300, 96)?, 384 * 8); // rows to 384, 6 scales a row to 8
/// assert!(scale_bytes(300, 40).is_err()); // k not a multiple of 16
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn scale_bytes(rows: i64, kk: i64) -> Result<u64> {
    let (r, kk) = (positive("rows", rows)?, positive("k", kk)?);
    if kk % GS_NVFP4_BLOCK as i32 != 0 {
        return Err(Error::invalid("k", format!("a multiple of {GS_NVFP4_BLOCK}"), kk));
    }
    glue::scale_bytes(r, kk)
}

/// The Blackwell GEMM's tile for `m` on `arch` (Sm100 or Sm120).
///
/// ```
/// use graphsafe::ops::nvfp4::{gemm_tile, Nvfp4Arch};
/// // Decode-sized M gets the small tile, prefill-sized M the 2-CTA cluster's.
/// assert_eq!((gemm_tile(Nvfp4Arch::Sm100, 8)?.m, gemm_tile(Nvfp4Arch::Sm100, 8)?.cluster_m), (128, 1));
/// assert_eq!((gemm_tile(Nvfp4Arch::Sm100, 4096)?.m, gemm_tile(Nvfp4Arch::Sm100, 4096)?.cluster_m), (256, 2));
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn gemm_tile(arch: Nvfp4Arch, m: i64) -> Result<Tile> {
    let m = positive("m", m)?;
    if arch == Nvfp4Arch::Sm90 {
        return Err(Error::invalid("arch", "sm_100 or sm_120 (Hopper runs the weight-only kernel)", "sm_90"));
    }
    let t = glue::gemm_tile(arch, m)?;
    Ok(Tile { m: t.tile_m as u32, n: t.tile_n as u32, k: t.tile_k as u32, cluster_m: t.cluster_m as u32, cluster_n: t.cluster_n as u32 })
}

/// Splits, workspace and (Hopper) prepared-weight size for D[m, n] = A[m, k] · W[n, k]ᵀ: what
/// [`super::gemm`] and [`super::w4a16_gemm`] plan with (and launch exactly that), on every call.
///
/// ```
/// use graphsafe::ops::nvfp4::{self, Nvfp4Arch};
/// use graphsafe::ops::tensor::DType;
/// // One decode step's projection on a B200: D[16, 8192] = A[16, 8192] · W[8192, 8192]ᵀ.
/// let p = nvfp4::plan(Nvfp4Arch::Sm100, 16, 8192, 8192, DType::Bf16, 148)?;
/// assert_eq!(p.tile.map(|t| (t.m, t.n)), Some((128, 128)));
/// // Hopper runs the weight-only kernel over a weight prepared once, outside capture.
/// let h = nvfp4::plan(Nvfp4Arch::Sm90, 16, 8192, 8192, DType::Bf16, 132)?;
/// assert!(h.prepared_weight_bytes.unwrap() >= 8192 * 8192 / 2);
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn plan(arch: Nvfp4Arch, m: i64, n: i64, kk: i64, out: DType, sm_count: i64) -> Result<Nvfp4Plan> {
    let mm = positive("m", m)?;
    let (nn, k32) = check_nk(n, kk)?;
    let sm = positive("sm_count", sm_count)?;
    let (tile, workspace_bytes, prepared, schedule) = match arch {
        Nvfp4Arch::Sm90 => {
            if out != DType::Bf16 {
                return Err(Error::invalid("d.dtype", "bf16 (the Hopper W4A16 kernel)", out));
            }
            glue::w4a16_check_shape(mm, nn, k32)
                .map_err(|_| Error::invalid("shape (m, n, k)", "a shape the sm90 W4A16 kernel supports (see its README section)", format!("({m}, {n}, {kk})")))?;
            let s = glue::w4a16_schedule(mm, nn, k32, sm)?;
            let schedule = W4a16Schedule {
                rows_per_cta: s.rows_per_cta as u32,
                ctas_per_sm: s.ctas_per_sm as u32,
                stream_k: s.stream_k != 0,
                ctas: s.ctas as u64,
                splits: s.splits as u32,
            };
            (None, glue::w4a16_workspace_bytes(mm, nn, k32, sm)?, Some(glue::w4a16_prepared_bytes(nn, k32)?), Some(schedule))
        }
        _ => {
            // CUTLASS's block-scaled layouts index scale factors with int32 strides.
            for (what, rows) in [("m x k (A's scale factors)", m), ("n x k (B's scale factors)", n)] {
                let sf = scale_bytes(rows, kk)?;
                if sf > i32::MAX as u64 {
                    return Err(Error::invalid(
                        what,
                        format!("scales of at most {} bytes (CUTLASS indexes them with int32)", i32::MAX),
                        format!("{sf} bytes for ({rows}, {kk})"),
                    ));
                }
            }
            let t = gemm_tile(arch, m)?;
            (Some(t), glue::gemm_workspace_bytes(arch, mm, nn, k32, out_dtype(out)?, sm)?, None, None)
        }
    };
    Ok(Nvfp4Plan { arch, m: mm as u32, n: nn as u32, k: k32 as u32, tile, workspace_bytes, prepared_weight_bytes: prepared, schedule })
}

/// The GEMM shapes an engine captures: every M (rows of A, the tokens of a batch) it captures a
/// graph for, against one weight `[n, k]`, on a GPU with `sm_count` SMs. Build it with
/// [`Nvfp4Limits::new`] and the `with_*` setters.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Nvfp4Limits {
    /// The M values captured (e.g. an engine's batch sizes 1, 2, 4, …, 512), in any order.
    pub m: Vec<u32>,
    /// Rows of the weight (output features), a multiple of 32.
    pub n: u32,
    /// The reduction length, a multiple of 32.
    pub k: u32,
    /// D's element type: bf16 (default) or fp16 (Blackwell only).
    pub out: DType,
    /// SMs of the GPU ([`crate::arch::sm_count_of`] by name).
    pub sm_count: u32,
}

impl Nvfp4Limits {
    /// GEMMs of every M in `m` against an `[n, k]` weight on a GPU of `sm_count` SMs, bf16 out.
    pub fn new(m: impl Into<Vec<u32>>, n: u32, k: u32, sm_count: u32) -> Nvfp4Limits {
        Nvfp4Limits { m: m.into(), n, k, out: DType::Bf16, sm_count }
    }
    /// D's element type.
    pub fn with_out(mut self, out: DType) -> Nvfp4Limits {
        self.out = out;
        self
    }
}

/// The workspace to pre-grow before capture: the plan of the M in `l.m` that needs the most
/// workspace (the first such M, in `l.m`'s order), every M planned by [`plan`] (so every shape
/// rule is checked, an error naming the field). Its `workspace_bytes` covers every GEMM of the
/// limits, so one pre-grow before capture suffices; `prepared_weight_bytes` (Hopper) does not
/// depend on M.
///
/// ```
/// use graphsafe::arch::sm_count_of;
/// use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Nvfp4Limits};
/// // The batch sizes an engine captures, on an H200, for one 8192 x 8192 NVFP4 weight.
/// let limits = Nvfp4Limits::new([1, 2, 4, 8, 16, 32, 64, 128, 256], 8192, 8192, sm_count_of("H200")?);
/// let worst = nvfp4::worst_case(Nvfp4Arch::Sm90, &limits)?;
/// for &m in &limits.m {
///     let p = nvfp4::plan(Nvfp4Arch::Sm90, m.into(), 8192, 8192, limits.out, 132)?;
///     assert!(p.workspace_bytes <= worst.workspace_bytes); // one pre-grow covers every capture
/// }
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn worst_case(arch: Nvfp4Arch, l: &Nvfp4Limits) -> Result<Nvfp4Plan> {
    let mut worst: Option<Nvfp4Plan> = None;
    for &m in &l.m {
        let p = plan(arch, m.into(), l.n.into(), l.k.into(), l.out, l.sm_count.into()).map_err(|e| match e {
            // `plan` names the output dtype as the op's argument `d`; here it is the limits' `out`.
            Error::InvalidArgument { what, expected, got } if what == "d.dtype" => Error::InvalidArgument { what: "out".into(), expected, got },
            e => e,
        })?;
        if worst.is_none_or(|w| p.workspace_bytes > w.workspace_bytes) {
            worst = Some(p);
        }
    }
    worst.ok_or_else(|| Error::invalid("m", "at least one M value", "none"))
}

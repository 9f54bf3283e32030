//! Planning (`cuda-src/nvfp4/plan.cu`, `sm90/plan.cu`): scale sizes, the Blackwell tile, and the
//! workspace and prepared-weight sizes (and on Hopper the kernel's schedule) of one GEMM shape.
//! Host code; runs without a GPU.

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
pub fn scale_bytes(rows: i64, kk: i64) -> Result<u64> {
    let (r, kk) = (positive("rows", rows)?, positive("k", kk)?);
    if kk % GS_NVFP4_BLOCK as i32 != 0 {
        return Err(Error::invalid("k", format!("a multiple of {GS_NVFP4_BLOCK}"), kk));
    }
    glue::scale_bytes(r, kk)
}

/// The Blackwell GEMM's tile for `m` on `arch` (Sm100 or Sm120).
pub fn gemm_tile(arch: Nvfp4Arch, m: i64) -> Result<Tile> {
    let m = positive("m", m)?;
    if arch == Nvfp4Arch::Sm90 {
        return Err(Error::invalid("arch", "sm_100 or sm_120 (Hopper runs the weight-only kernel)", "sm_90"));
    }
    let t = glue::gemm_tile(arch.number(), m)?;
    Ok(Tile { m: t.tile_m as u32, n: t.tile_n as u32, k: t.tile_k as u32, cluster_m: t.cluster_m as u32, cluster_n: t.cluster_n as u32 })
}

/// Splits, workspace and (Hopper) prepared-weight size for D[m, n] = A[m, k] · W[n, k]ᵀ.
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
            (Some(t), glue::gemm_workspace_bytes(arch.number(), mm, nn, k32, out_dtype(out)?, sm)?, None, None)
        }
    };
    Ok(Nvfp4Plan { arch, m: mm as u32, n: nn as u32, k: k32 as u32, tile, workspace_bytes, prepared_weight_bytes: prepared, schedule })
}

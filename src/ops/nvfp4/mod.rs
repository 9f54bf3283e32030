//! NVFP4: 4-bit e2m1 values packed two per byte, one fp8-e4m3 scale per 16 elements along K (in
//! CUTLASS's swizzled 128x4 layout), one fp32 global scale per tensor.
//!
//! * [`quantize()`] / [`dequantize`] / [`global_scale`]: every arch (bit-identical to
//!   [`reference`](mod@reference), the host algorithm);
//! * [`gemm()`]: Blackwell, CUTLASS block-scaled GEMM `D = alpha · A · Bᵀ`, A and B NVFP4 (sm_100f:
//!   B200/GB200/B300, sm_120f: RTX 50 / RTX PRO / DGX Spark), tile chosen by M as production engines do;
//! * [`w4a16_gemm`]: Hopper, graphsafe's weight-only kernel `D = alpha · A(bf16) · Wᵀ(NVFP4)`, over
//!   a weight repacked once by [`prepare_weight`] (outside capture).
//!
//! `alpha` is always a device scalar, so it can change between graph replays. Eager calls may grow
//! the workspace; captured calls never do ([`Error::WorkspaceTooSmall`], nothing captured).
//!
//! The code follows `cuda-src/nvfp4/`: planning (`plan.rs`), quantize and friends (`quantize.rs`),
//! the Blackwell GEMM (`gemm.rs`), the Hopper W4A16 GEMM (`w4a16.rs`); the types they share are
//! here. Every launch goes through the safe glue wrappers (`sys::glue::nvfp4`).

pub mod reference;

mod gemm;
mod plan;
mod quantize;
mod w4a16;

pub use gemm::{gemm, gemm_captured, Nvfp4GemmArgs};
pub(crate) use gemm::gemm_on;
pub use plan::{gemm_tile, plan, scale_bytes, worst_case, Nvfp4Limits};
pub use quantize::{dequantize, global_scale, quantize, quantize_captured, Nvfp4QuantizeArgs};
pub(crate) use quantize::quantize_on;
pub use w4a16::{prepare_weight, w4a16_gemm, w4a16_gemm_captured, CapturedWeight, PreparedWeight, W4a16GemmArgs};
pub(crate) use w4a16::{prepare_weight_on, w4a16_on, WeightArg};

use crate::driver::DeviceBuffer;
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedBuffer};
use crate::ops::tensor::{mem_range, refuse_overlap, Check, DType, DeviceMemory, Tensor};
use crate::sys::cuda as c;
use crate::sys::glue::{nvfp4::Fp4Matrix, GlueDtype};

pub use crate::arch::Nvfp4Arch;

impl Nvfp4Arch {
    /// The back-end for a compute capability, if this build has it (the arch table's row).
    pub fn for_compute_capability(cc: (i32, i32)) -> Result<Nvfp4Arch> {
        crate::arch::nvfp4(cc)
    }
}

/// A CUTLASS tile configuration of the Blackwell GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Tile {
    /// CTA tile M.
    pub m: u32,
    /// CTA tile N.
    pub n: u32,
    /// CTA tile K.
    pub k: u32,
    /// Cluster M.
    pub cluster_m: u32,
    /// Cluster N.
    pub cluster_n: u32,
}

/// How the Hopper W4A16 kernel runs one shape (host planning, `cuda-src/nvfp4/sm90/w4a16_plan.cuh`):
/// what decides its speed, for reading benchmarks and choosing shapes; nothing here is needed to
/// call it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct W4a16Schedule {
    /// Activation rows per CTA tile (8, 16, 32, 64, 128, 192 or 256); each CTA covers 128 weight rows.
    pub rows_per_cta: u32,
    /// CTAs per SM that tile is built for.
    pub ctas_per_sm: u32,
    /// Stream-K (small m, many weight chunks): each CTA streams an equal run of chunks; otherwise
    /// a grid of tiles. Where a CTA's run starts inside a tile, that tile is shared and a second
    /// (fixup) kernel adds its parts: exactly when the plan's `workspace_bytes` is non-zero.
    pub stream_k: bool,
    /// CTAs launched: tiles × splits, or the stream-K grid.
    pub ctas: u64,
    /// Tile grid: split-K ways, the splits of a tile one cluster reducing in shared memory; an
    /// upper bound (the launcher lowers it where the device cannot hold that many clusters at once).
    pub splits: u32,
}

/// What a GEMM of one shape needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Nvfp4Plan {
    /// Back-end.
    pub arch: Nvfp4Arch,
    /// Rows of A / D.
    pub m: u32,
    /// Rows of B (W) / columns of D.
    pub n: u32,
    /// Reduction length.
    pub k: u32,
    /// The CUTLASS tile (Blackwell only).
    pub tile: Option<Tile>,
    /// Workspace bytes.
    pub workspace_bytes: u64,
    /// Bytes of the prepared weight (Hopper only).
    pub prepared_weight_bytes: Option<u64>,
    /// The W4A16 kernel's schedule (Hopper only).
    pub schedule: Option<W4a16Schedule>,
}

/// A named `[start, end)` byte range (`None`: empty), for overlap checks.
pub(crate) type NamedRange = (String, Option<(u64, u64)>);

/// An NVFP4 matrix [rows, k] in device memory. Made with [`Nvfp4Matrix::new`] (the fields are
/// public to read and to change; the struct is `#[non_exhaustive]`, so a new field comes with a
/// default and breaks no caller).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Nvfp4Matrix<M> {
    /// Packed values, [rows, k/2] bytes, row-major, 16-byte aligned.
    pub packed: M,
    /// Swizzled fp8 scales ([`scale_bytes`] bytes), 16-byte aligned.
    pub scales: M,
    /// One fp32: the global scale.
    pub global_scale: M,
    /// Rows.
    pub rows: usize,
    /// Columns (the K dimension), a multiple of 32.
    pub k: usize,
}

impl<M> Nvfp4Matrix<M> {
    /// The matrix [rows, k] stored in `packed` (e2m1 pairs), `scales` (swizzled fp8) and
    /// `global_scale` (one f32). Nothing is checked here: the ops check everything before they
    /// launch.
    pub fn new(packed: M, scales: M, global_scale: M, rows: usize, k: usize) -> Self {
        Nvfp4Matrix { packed, scales, global_scale, rows, k }
    }
}

impl<M: DeviceMemory> Nvfp4Matrix<M> {
    /// Checks sizes, alignment and device (`ctx` null: skip the device check). The ops call this first.
    pub fn validate(&self, name: &str, ctx: c::CUcontext) -> Result<()> {
        if self.rows == 0 || self.rows > i32::MAX as usize {
            return Err(Error::invalid(format!("{name}.rows"), "1..2^31", self.rows));
        }
        if self.k == 0 || self.k % 32 != 0 || self.k > i32::MAX as usize {
            return Err(Error::invalid(format!("{name}.k"), "a positive multiple of 32", self.k));
        }
        let parts: [(&str, &M, u64, u64); 3] = [
            ("packed", &self.packed, self.packed_bytes(), 16),
            ("scales", &self.scales, scale_bytes(self.rows as i64, self.k as i64)?, 16),
            ("global_scale", &self.global_scale, 4, 4),
        ];
        for (part, mem, need, align) in parts {
            // Caller-owned memory has no known size: at least its end must be an address.
            if (mem.len() as u64) < need || mem.device_ptr().checked_add(need).is_none() {
                return Err(Error::invalid(format!("{name}.{part}"), format!("at least {need} bytes"), mem.len()));
            }
            if mem.device_ptr() % align != 0 {
                return Err(Error::invalid(format!("{name}.{part}.address"), format!("{align}-byte aligned"), format!("{:#x}", mem.device_ptr())));
            }
            if !ctx.is_null() && mem.context_raw() != ctx {
                return Err(Error::other_context(format!("{name}.{part}.device"), "memory", "the stream's", ctx, mem.context_raw()));
            }
        }
        Ok(())
    }

    /// Bytes of the packed values: rows x k / 2 (below 2^61 once rows and k passed validate).
    fn packed_bytes(&self) -> u64 {
        self.rows as u64 * (self.k as u64 / 2)
    }

    /// The byte ranges the three parts use (after [`Nvfp4Matrix::validate`]), named
    /// `name.packed`, `name.scales`, `name.global_scale`: for overlap checks.
    pub(crate) fn ranges(&self, name: &str) -> Result<[NamedRange; 3]> {
        Ok([
            (format!("{name}.packed"), mem_range(&self.packed, self.packed_bytes())),
            (format!("{name}.scales"), mem_range(&self.scales, scale_bytes(self.rows as i64, self.k as i64)?)),
            (format!("{name}.global_scale"), mem_range(&self.global_scale, 4)),
        ])
    }

    /// Refuses a matrix a kernel writes (its codes and scales; the global scale is read) whose
    /// codes and scales overlap each other, its global scale, or memory the same call reads
    /// (`read`): threads would write bytes others still read or write, and the result depend on
    /// timing. After [`Nvfp4Matrix::validate`].
    pub(crate) fn refuse_overlaps(&self, name: &str, read: &[NamedRange]) -> Result<()> {
        let [packed, scales, global] = self.ranges(name)?;
        refuse_overlap((&packed.0, packed.1), (&scales.0, scales.1))?;
        for (w, wr) in [&packed, &scales] {
            for (o, or) in std::iter::once(&global).chain(read) {
                refuse_overlap((w, *wr), (o, *or))?;
            }
        }
        Ok(())
    }

    /// Admits the three parts to `target` (after [`Nvfp4Matrix::validate`]) and returns them as
    /// the glue takes them.
    pub(crate) fn admit(&self, name: &str, target: &mut OpTarget<'_>) -> Result<Fp4Matrix> {
        Ok(Fp4Matrix {
            packed: target.admit(&format!("{name}.packed"), &self.packed)?,
            scales: target.admit(&format!("{name}.scales"), &self.scales)?,
            global_scale: target.admit(&format!("{name}.global_scale"), &self.global_scale)?,
            rows: i32_of(&format!("{name}.rows"), self.rows)?,
            k: i32_of(&format!("{name}.k"), self.k)?,
        })
    }
}

impl Nvfp4Matrix<&DeviceBuffer> {
    /// The same matrix inside `cap`: its three buffers bound to the capture (so every graph made
    /// from it keeps them alive), the sizes unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<Nvfp4Matrix<CapturedBuffer<'id>>> {
        Ok(Nvfp4Matrix {
            packed: cap.bind_buffer(self.packed)?,
            scales: cap.bind_buffer(self.scales)?,
            global_scale: cap.bind_buffer(self.global_scale)?,
            rows: self.rows,
            k: self.k,
        })
    }
}

/// Checks a device f32 scalar (alpha, a global scale): 4 bytes, 4-byte aligned, on `ctx`'s device.
pub(crate) fn scalar<M: DeviceMemory>(name: &str, m: &M, ctx: c::CUcontext) -> Result<()> {
    if m.len() < 4 || m.device_ptr() % 4 != 0 || m.device_ptr().checked_add(4).is_none() {
        return Err(Error::invalid(name, "a 4-byte aligned device f32", format!("{} bytes at {:#x}", m.len(), m.device_ptr())));
    }
    if !ctx.is_null() && m.context_raw() != ctx {
        return Err(Error::other_context(format!("{name}.device"), "memory", "the stream's", ctx, m.context_raw()));
    }
    Ok(())
}

/// The glue's name for a 16-bit dtype already checked to be bf16 or fp16.
pub(crate) fn half_dtype(d: DType) -> GlueDtype {
    match d {
        DType::Fp16 => GlueDtype::Fp16,
        _ => GlueDtype::Bf16,
    }
}

/// Checks a row-major bf16/fp16 matrix [rows, cols] with 16-byte aligned rows that do not overlap
/// (the kernels take a leading dimension of at least cols, and an output's overlapping rows would
/// race): refused here, before anything is enqueued, not by the kernel glue after the op committed.
pub(crate) fn check_matrix<M: DeviceMemory>(name: &str, t: &Tensor<M>, types: &[DType], ctx: c::CUcontext) -> Result<(usize, usize)> {
    let ch = Check { name, t };
    ch.dtype(types)?.shape(&[None, None])?.inner_contiguous()?.aligned(16)?.in_bounds()?;
    if t.shape[0] > 1 && t.strides[0] < t.shape[1] {
        return Err(Error::invalid(format!("{name}.strides[0]"), format!("at least {} (one row; rows may not overlap)", t.shape[1]), t.strides[0]));
    }
    if !ctx.is_null() {
        ch.device(ctx)?;
    }
    Ok((t.shape[0], t.shape[1]))
}

pub(crate) fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^31", v))
}

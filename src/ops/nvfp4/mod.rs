//! NVFP4: 4-bit e2m1 values packed two per byte, one fp8-e4m3 scale per 16 elements along K (in
//! CUTLASS's swizzled 128x4 layout), one fp32 global scale per tensor.
//!
//! * [`quantize`] / [`dequantize`] / [`global_scale`]: every arch (bit-identical to
//!   [`reference`](mod@reference), the host algorithm);
//! * [`gemm`]: Blackwell, CUTLASS block-scaled GEMM `D = alpha · A · Bᵀ`, A and B NVFP4 (sm_100f:
//!   B200/GB200/B300, sm_120f: RTX 50 / RTX PRO / DGX Spark), tile chosen by M as production engines do;
//! * [`w4a16_gemm`]: Hopper, graphsafe's weight-only kernel `D = alpha · A(bf16) · Wᵀ(NVFP4)`, over
//!   a weight repacked once by [`prepare_weight`] (outside capture).
//!
//! `alpha` is always a device scalar, so it can change between graph replays. Eager calls may grow
//! the workspace; captured calls never do ([`Error::WorkspaceTooSmall`], nothing captured).

pub mod reference;

use crate::driver::{DeviceBuffer, DevicePtr, Stream};
use crate::error::{positive, Error, Result};
use crate::graph::target::Target;
use crate::graph::{Capture, Captured, CapturedBuffer};
use crate::ops::tensor::{Check, DType, DeviceMemory, Tensor};
use crate::sys::{check_glue, cuda as c, kernels as k};
use crate::workspace::Workspace;

pub use crate::arch::Nvfp4Arch;

impl Nvfp4Arch {
    /// The back-end for a compute capability, if this build has it.
    pub fn for_compute_capability(cc: (i32, i32)) -> Result<Nvfp4Arch> {
        crate::arch::nvfp4(cc)
    }

    fn number(self) -> i32 {
        match self {
            Nvfp4Arch::Sm90 => 90,
            Nvfp4Arch::Sm100 => 100,
            Nvfp4Arch::Sm120 => 120,
        }
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
}

fn out_code(d: DType) -> Result<i32> {
    match d {
        DType::Bf16 => Ok(k::GsDtype::GS_DTYPE_BF16.0 as i32),
        DType::Fp16 => Ok(k::GsDtype::GS_DTYPE_FP16.0 as i32),
        other => Err(Error::invalid("d.dtype", "bf16 or fp16", other)),
    }
}

fn check_nk(n: i64, kk: i64) -> Result<(i32, i32)> {
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
    if kk % k::GS_NVFP4_BLOCK as i32 != 0 {
        return Err(Error::invalid("k", format!("a multiple of {}", k::GS_NVFP4_BLOCK), kk));
    }
    let mut out = 0u64;
    // SAFETY: host function; out-pointer to a local.
    check_glue(unsafe { k::gs_nvfp4_scale_bytes(r, kk, &mut out) }, "gs_nvfp4_scale_bytes")?;
    Ok(out)
}

/// The Blackwell GEMM's tile for `m` on `arch` (Sm100 or Sm120).
pub fn gemm_tile(arch: Nvfp4Arch, m: i64) -> Result<Tile> {
    let m = positive("m", m)?;
    if arch == Nvfp4Arch::Sm90 {
        return Err(Error::invalid("arch", "sm_100 or sm_120 (Hopper runs the weight-only kernel)", "sm_90"));
    }
    let mut t = k::GsNvfp4Tile::default();
    // SAFETY: host function; out-pointer to a local.
    check_glue(unsafe { k::gs_nvfp4_gemm_tile(arch.number(), m, &mut t) }, "gs_nvfp4_gemm_tile")?;
    Ok(Tile { m: t.tile_m as u32, n: t.tile_n as u32, k: t.tile_k as u32, cluster_m: t.cluster_m as u32, cluster_n: t.cluster_n as u32 })
}

/// Splits, workspace and (Hopper) prepared-weight size for D[m, n] = A[m, k] · W[n, k]ᵀ.
pub fn plan(arch: Nvfp4Arch, m: i64, n: i64, kk: i64, out: DType, sm_count: i64) -> Result<Nvfp4Plan> {
    let mm = positive("m", m)?;
    let (nn, k32) = check_nk(n, kk)?;
    let sm = positive("sm_count", sm_count)?;
    let mut ws = 0u64;
    let (tile, prepared) = match arch {
        Nvfp4Arch::Sm90 => {
            if out != DType::Bf16 {
                return Err(Error::invalid("d.dtype", "bf16 (the Hopper W4A16 kernel)", out));
            }
            // SAFETY: host functions; out-pointers to locals.
            check_glue(unsafe { k::gs_nvfp4_w4a16_check_shape(mm, nn, k32) }, "gs_nvfp4_w4a16_check_shape")
                .map_err(|_| Error::invalid("shape (m, n, k)", "a shape the sm90 W4A16 kernel supports (see its README section)", format!("({m}, {n}, {kk})")))?;
            // SAFETY: host function; out-pointer to a local.
            check_glue(unsafe { k::gs_nvfp4_w4a16_workspace_bytes(mm, nn, k32, sm, &mut ws) }, "gs_nvfp4_w4a16_workspace_bytes")?;
            let mut p = 0u64;
            // SAFETY: host function; out-pointer to a local.
            check_glue(unsafe { k::gs_nvfp4_w4a16_prepared_bytes(nn, k32, &mut p) }, "gs_nvfp4_w4a16_prepared_bytes")?;
            (None, Some(p))
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
            check_glue(
                // SAFETY: host function; out-pointer to a local.
                unsafe { k::gs_nvfp4_gemm_workspace_bytes(arch.number(), mm, nn, k32, out_code(out)?, sm, &mut ws) },
                "gs_nvfp4_gemm_workspace_bytes",
            )?;
            (Some(t), None)
        }
    };
    Ok(Nvfp4Plan { arch, m: mm as u32, n: nn as u32, k: k32 as u32, tile, workspace_bytes: ws, prepared_weight_bytes: prepared })
}

/// An NVFP4 matrix [rows, k] in device memory.
#[derive(Clone, Debug)]
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

impl<M: DeviceMemory> Nvfp4Matrix<M> {
    /// Checks sizes, alignment and device (`ctx` null: skip the device check). The ops call this first.
    pub fn validate(&self, name: &str, ctx: c::CUcontext) -> Result<()> {
        if self.rows == 0 || self.rows > i32::MAX as usize {
            return Err(Error::invalid(format!("{name}.rows"), "1..2^31", self.rows));
        }
        if self.k == 0 || self.k % 32 != 0 || self.k > i32::MAX as usize {
            return Err(Error::invalid(format!("{name}.k"), "a positive multiple of 32", self.k));
        }
        // rows and k are below 2^31 here, so rows * (k / 2) < 2^61.
        let packed_bytes = self.rows as u64 * (self.k as u64 / 2);
        let parts: [(&str, &M, u64, u64); 3] = [
            ("packed", &self.packed, packed_bytes, 16),
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
                return Err(Error::invalid(format!("{name}.{part}.device"), "memory on the stream's device", "memory of another device"));
            }
        }
        Ok(())
    }
}

fn scalar<M: DeviceMemory>(name: &str, m: &M, ctx: c::CUcontext) -> Result<DevicePtr> {
    if m.len() < 4 || m.device_ptr() % 4 != 0 || m.device_ptr().checked_add(4).is_none() {
        return Err(Error::invalid(name, "a 4-byte aligned device f32", format!("{} bytes at {:#x}", m.len(), m.device_ptr())));
    }
    if !ctx.is_null() && m.context_raw() != ctx {
        return Err(Error::invalid(format!("{name}.device"), "memory on the stream's device", "memory of another device"));
    }
    Ok(m.device_ptr())
}

fn dtype_code(d: DType) -> i32 {
    match d {
        DType::Fp16 => k::GsDtype::GS_DTYPE_FP16.0 as i32,
        _ => k::GsDtype::GS_DTYPE_BF16.0 as i32,
    }
}

/// Checks a row-major bf16/fp16 matrix [rows, cols] with 16-byte aligned rows.
fn check_matrix<M: DeviceMemory>(name: &str, t: &Tensor<M>, types: &[DType], ctx: c::CUcontext) -> Result<(usize, usize)> {
    let ch = Check { name, t };
    ch.dtype(types)?.shape(&[None, None])?.inner_contiguous()?.aligned(16)?.in_bounds()?;
    if !ctx.is_null() {
        ch.device(ctx)?;
    }
    Ok((t.shape[0], t.shape[1]))
}

impl<M: DeviceMemory> Nvfp4Matrix<M> {
    fn admit(&self, name: &str, target: &mut Target<'_>) -> Result<()> {
        target.admit(&format!("{name}.packed"), &self.packed)?;
        target.admit(&format!("{name}.scales"), &self.scales)?;
        target.admit(&format!("{name}.global_scale"), &self.global_scale)
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^31", v))
}

/// Validate, then launch: the one quantize path (Rust eager, Rust captured, C ABI).
pub(crate) fn quantize_on<M: DeviceMemory>(x: &Tensor<M>, gs: &M, out: &Nvfp4Matrix<M>, mut target: Target<'_>) -> Result<()> {
    let ctx = target.context().clone();
    let (m, kk) = check_matrix("x", x, &[DType::Bf16, DType::Fp16], ctx.raw())?;
    if out.rows != m || out.k != kk {
        return Err(Error::invalid("out", format!("an NVFP4 matrix of [{m}, {kk}]"), format!("[{}, {}]", out.rows, out.k)));
    }
    out.validate("out", ctx.raw())?;
    let g = scalar("global_scale", gs, ctx.raw())?;
    let (mi, ki, ld) = (i32_of("x.shape[0]", m)?, i32_of("x.shape[1]", kk)?, x.stride_i64(0)?);
    target.admit("x", &x.mem)?;
    target.admit("global_scale", gs)?;
    out.admit("out", &mut target)?;
    target.commit();
    let _current = ctx.enter()?;
    check_glue(
        // SAFETY: every pointer was checked for size, alignment and device above.
        unsafe {
            k::gs_nvfp4_quantize(
                x.device_ptr() as *const _,
                dtype_code(x.dtype),
                mi,
                ki,
                ld,
                g as *const f32,
                out.packed.device_ptr() as *mut u8,
                out.scales.device_ptr() as *mut u8,
                target.raw_stream().cast(),
            )
        },
        "gs_nvfp4_quantize",
    )
}

/// Quantizes x [m, k] (bf16/fp16) with the device global scale `gs` into `out`, on `stream`.
pub fn quantize(x: &Tensor<&DeviceBuffer>, gs: &DeviceBuffer, out: &Nvfp4Matrix<&DeviceBuffer>, stream: &Stream) -> Result<()> {
    quantize_on(x, &gs, out, Target::eager(stream, None)?)
}

/// Captures a quantize (every buffer bound to `cap`).
pub fn quantize_captured<'id>(x: &Tensor<CapturedBuffer<'id>>, gs: &CapturedBuffer<'id>, out: &Nvfp4Matrix<CapturedBuffer<'id>>, cap: &Capture<'_, 'id>) -> Result<()> {
    quantize_on(x, gs, out, Target::captured(cap.site(), None)?)
}

/// The inverse: `out` [m, k] (bf16/fp16) from an NVFP4 matrix, on `stream`.
pub fn dequantize(src: &Nvfp4Matrix<&DeviceBuffer>, out: &Tensor<&DeviceBuffer>, stream: &Stream) -> Result<()> {
    let target = Target::eager(stream, None)?;
    let ctx = target.context();
    src.validate("src", ctx.raw())?;
    let (m, kk) = check_matrix("out", out, &[DType::Bf16, DType::Fp16], ctx.raw())?;
    if src.rows != m || src.k != kk {
        return Err(Error::invalid("out.shape", format!("[{}, {}]", src.rows, src.k), format!("[{m}, {kk}]")));
    }
    let (mi, ki, ld) = (i32_of("out.shape[0]", m)?, i32_of("out.shape[1]", kk)?, out.stride_i64(0)?);
    let _current = ctx.enter()?;
    check_glue(
        // SAFETY: checked above.
        unsafe {
            k::gs_nvfp4_dequantize(
                src.packed.device_ptr() as *const u8,
                src.scales.device_ptr() as *const u8,
                src.global_scale.device_ptr() as *const f32,
                mi,
                ki,
                dtype_code(out.dtype),
                out.device_ptr() as *mut _,
                ld,
                stream.raw().cast(),
            )
        },
        "gs_nvfp4_dequantize",
    )
}

/// `out[0] = 448·6 / amax(|x|)` over a contiguous bf16/fp16 tensor (1 when amax is 0 or not finite).
pub fn global_scale(x: &Tensor<&DeviceBuffer>, out: &DeviceBuffer, stream: &Stream) -> Result<()> {
    let target = Target::eager(stream, None)?;
    let ctx = target.context();
    let ch = Check { name: "x", t: x };
    ch.dtype(&[DType::Bf16, DType::Fp16])?.contiguous()?.aligned(16)?.in_bounds()?.device(ctx.raw())?;
    let g = scalar("out", &out, ctx.raw())?;
    let n = x.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| Error::invalid("x.shape", "a tensor that fits in memory", format!("{:?}", x.shape)))?;
    if n == 0 {
        return Err(Error::invalid("x.shape", "at least one element", format!("{:?}", x.shape)));
    }
    let _current = ctx.enter()?;
    check_glue(
        // SAFETY: checked above.
        unsafe { k::gs_nvfp4_global_scale(x.device_ptr() as *const _, dtype_code(x.dtype), n as i64, g as *mut f32, stream.raw().cast()) },
        "gs_nvfp4_global_scale",
    )
}

/// A Hopper weight repacked for the W4A16 kernel (made by [`prepare_weight`], outside capture).
#[derive(Clone, Debug)]
pub struct PreparedWeight {
    buf: DeviceBuffer,
    n: usize,
    k: usize,
}

impl PreparedWeight {
    /// The weight's [n, k].
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    /// Binds it to a capture (the graph keeps it alive).
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<CapturedWeight<'id>> {
        Ok(CapturedWeight { buf: cap.bind_buffer(&self.buf)?, n: self.n, k: self.k })
    }
}

/// A prepared weight bound to a capture.
#[derive(Clone, Debug)]
pub struct CapturedWeight<'id> {
    buf: CapturedBuffer<'id>,
    n: usize,
    k: usize,
}

/// Repacks an [n, k] NVFP4 weight for the Hopper W4A16 kernel (allocates; eager only).
pub fn prepare_weight(w: &Nvfp4Matrix<&DeviceBuffer>, stream: &Stream) -> Result<PreparedWeight> {
    let buf = prepare_weight_raw(w, stream)?;
    Ok(PreparedWeight { buf, n: w.rows, k: w.k })
}

/// [`prepare_weight`] over any memory, returning the prepared buffer (the C ABI's path).
pub(crate) fn prepare_weight_raw<M: DeviceMemory>(w: &Nvfp4Matrix<M>, stream: &Stream) -> Result<DeviceBuffer> {
    let target = Target::eager(stream, None)?;
    let ctx = target.context();
    if Nvfp4Arch::for_compute_capability(ctx.compute_capability())? != Nvfp4Arch::Sm90 {
        return Err(Error::ArchUnsupported { op: "nvfp4 prepare_weight", need: "sm_90 (the weight-only kernel)".into(), have: format!("{:?}", ctx.compute_capability()) });
    }
    w.validate("w", ctx.raw())?;
    let (n, kk) = check_nk(w.rows as i64, w.k as i64)?;
    let mut bytes = 0u64;
    // SAFETY: host function; out-pointer to a local.
    check_glue(unsafe { k::gs_nvfp4_w4a16_prepared_bytes(n, kk, &mut bytes) }, "gs_nvfp4_w4a16_prepared_bytes")?;
    let len = usize::try_from(bytes).map_err(|_| Error::invalid("weight", "a prepared size that fits in memory", bytes))?;
    let buf = DeviceBuffer::alloc_zeroed(stream, len)?;
    let _current = ctx.enter()?;
    #[cfg(graphsafe_nvfp4 = "sm90")]
    check_glue(
        // SAFETY: checked above; buf holds `bytes`.
        unsafe {
            k::gs_nvfp4_w4a16_prepare(
                w.packed.device_ptr() as *const u8,
                w.scales.device_ptr() as *const u8,
                w.global_scale.device_ptr() as *const f32,
                n,
                kk,
                buf.device_ptr() as *mut _,
                bytes,
                stream.raw().cast(),
            )
        },
        "gs_nvfp4_w4a16_prepare",
    )?;
    Ok(buf)
}

/// The W4A16 weight as the GEMM reads it: the prepared buffer (any memory kind) and its [n, k].
pub(crate) struct WeightArg<'w, W> {
    pub mem: &'w W,
    pub n: usize,
    pub k: usize,
}

/// Validate, size, launch: the one W4A16 path (Rust eager, Rust captured, C ABI).
pub(crate) fn w4a16_on<M: DeviceMemory, W: DeviceMemory>(a: &Tensor<M>, w: WeightArg<'_, W>, alpha: &M, d: &Tensor<M>, mut target: Target<'_>) -> Result<Nvfp4Plan> {
    let ctx = target.context().clone();
    let arch = Nvfp4Arch::for_compute_capability(ctx.compute_capability())?;
    if arch != Nvfp4Arch::Sm90 {
        return Err(Error::ArchUnsupported { op: "nvfp4 w4a16_gemm", need: "sm_90 (Blackwell: nvfp4::gemm)".into(), have: format!("{arch:?}") });
    }
    let (m, ka) = check_matrix("a", a, &[DType::Bf16], ctx.raw())?;
    let (dm, dn) = check_matrix("d", d, &[DType::Bf16], ctx.raw())?;
    if w.mem.context_raw() != ctx.raw() {
        return Err(Error::invalid("w.device", "a weight prepared on the stream's device", "one of another device"));
    }
    if ka != w.k {
        return Err(Error::invalid("a.shape[1] (k)", format!("{}, the weight's k", w.k), ka));
    }
    if dm != m || dn != w.n {
        return Err(Error::invalid("d.shape", format!("[{m}, {}]", w.n), format!("[{dm}, {dn}]")));
    }
    let al = scalar("alpha", alpha, ctx.raw())?;
    let plan = plan(arch, m as i64, w.n as i64, w.k as i64, DType::Bf16, ctx.sm_count() as i64)?;
    let need = plan.prepared_weight_bytes.unwrap_or(0);
    if (w.mem.len() as u64) < need {
        return Err(Error::invalid("weight", format!("a weight prepared for [{}, {}] ({need} bytes)", w.n, w.k), format!("{} bytes", w.mem.len())));
    }
    let (lda, ldd) = (a.stride_i64(0)?, d.stride_i64(0)?);
    target.admit("a", &a.mem)?;
    target.admit("weight", w.mem)?;
    target.admit("alpha", alpha)?;
    target.admit("d", &d.mem)?;
    let (wsp, wcap) = target.workspace(plan.workspace_bytes)?;
    target.commit();
    let _current = ctx.enter()?;
    #[cfg(graphsafe_nvfp4 = "sm90")]
    check_glue(
        // SAFETY: every pointer checked above; the workspace holds `wcap` >= the plan's bytes.
        unsafe {
            k::gs_nvfp4_w4a16_gemm(
                a.device_ptr() as *const _,
                lda,
                w.mem.device_ptr() as *const _,
                al as *const f32,
                d.device_ptr() as *mut _,
                ldd,
                plan.m as i32,
                plan.n as i32,
                plan.k as i32,
                ctx.sm_count() as i32,
                wsp as *mut _,
                wcap,
                target.raw_stream().cast(),
            )
        },
        "gs_nvfp4_w4a16_gemm",
    )?;
    #[cfg(not(graphsafe_nvfp4 = "sm90"))]
    let _ = (al, wsp, wcap, lda, ldd);
    Ok(plan)
}

/// Hopper: D[m, n] (bf16) = alpha · A[m, k] (bf16) · Wᵀ, eager (may grow `ws`).
pub fn w4a16_gemm(a: &Tensor<&DeviceBuffer>, w: &PreparedWeight, alpha: &DeviceBuffer, d: &Tensor<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<Nvfp4Plan> {
    let wa = WeightArg { mem: &&w.buf, n: w.n, k: w.k };
    w4a16_on(a, wa, &alpha, d, Target::eager(stream, Some(ws))?)
}

/// Hopper, captured: never grows the workspace; every view must belong to `cap`.
pub fn w4a16_gemm_captured<'id>(a: &Tensor<CapturedBuffer<'id>>, w: &CapturedWeight<'id>, alpha: &CapturedBuffer<'id>, d: &Tensor<CapturedBuffer<'id>>, ws: &Captured<'id>, cap: &Capture<'_, 'id>) -> Result<Nvfp4Plan> {
    let wa = WeightArg { mem: &w.buf, n: w.n, k: w.k };
    w4a16_on(a, wa, alpha, d, Target::captured(cap.site(), Some(ws.view()))?)
}

/// Validate, size, launch: the one Blackwell GEMM path (Rust eager, Rust captured, C ABI).
pub(crate) fn gemm_on<M: DeviceMemory>(a: &Nvfp4Matrix<M>, b: &Nvfp4Matrix<M>, alpha: &M, d: &Tensor<M>, mut target: Target<'_>) -> Result<Nvfp4Plan> {
    let ctx = target.context().clone();
    let arch = Nvfp4Arch::for_compute_capability(ctx.compute_capability())?;
    if arch == Nvfp4Arch::Sm90 {
        return Err(Error::ArchUnsupported { op: "nvfp4 gemm", need: "sm_100 or sm_120 (Hopper: nvfp4::w4a16_gemm)".into(), have: "sm_90".into() });
    }
    a.validate("a", ctx.raw())?;
    b.validate("b", ctx.raw())?;
    if a.k != b.k {
        return Err(Error::invalid("b.k", format!("{}, a's k", a.k), b.k));
    }
    let (dm, dn) = check_matrix("d", d, &[DType::Bf16, DType::Fp16], ctx.raw())?;
    if dm != a.rows || dn != b.rows || d.strides[0] != dn {
        return Err(Error::invalid("d", format!("a contiguous [{}, {}]", a.rows, b.rows), format!("{:?} strides {:?}", d.shape, d.strides)));
    }
    let al = scalar("alpha", alpha, ctx.raw())?;
    let plan = plan(arch, a.rows as i64, b.rows as i64, a.k as i64, d.dtype, ctx.sm_count() as i64)?;
    a.admit("a", &mut target)?;
    b.admit("b", &mut target)?;
    target.admit("alpha", alpha)?;
    target.admit("d", &d.mem)?;
    let out = out_code(d.dtype)?;
    let (wsp, wcap) = target.workspace(plan.workspace_bytes)?;
    target.commit();
    let _current = ctx.enter()?;
    let stream = target.raw_stream();
    let args = (
        a.packed.device_ptr() as *const u8,
        a.scales.device_ptr() as *const u8,
        b.packed.device_ptr() as *const u8,
        b.scales.device_ptr() as *const u8,
        al as *const f32,
        d.device_ptr() as *mut std::ffi::c_void,
        out,
        (plan.m as i32, plan.n as i32, plan.k as i32, ctx.sm_count() as i32),
    );
    #[allow(unused_variables, unreachable_code)] // builds without the sm100/sm120 back-ends have no arm that launches
    let status: i32 = match arch {
        #[cfg(graphsafe_nvfp4 = "sm100")]
        // SAFETY: every pointer checked above; the workspace holds `wcap` >= the plan's bytes.
        Nvfp4Arch::Sm100 => unsafe {
            k::gs_nvfp4_gemm_sm100(args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7 .0, args.7 .1, args.7 .2, args.7 .3, wsp as *mut _, wcap, stream.cast())
        },
        #[cfg(graphsafe_nvfp4 = "sm120")]
        // SAFETY: as above.
        Nvfp4Arch::Sm120 => unsafe {
            k::gs_nvfp4_gemm_sm120(args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7 .0, args.7 .1, args.7 .2, args.7 .3, wsp as *mut _, wcap, stream.cast())
        },
        #[allow(unreachable_patterns)]
        other => {
            let _ = (args, wsp, wcap, stream);
            return Err(Error::ArchUnsupported { op: "nvfp4 gemm", need: format!("a build with {other:?}"), have: crate::build_info::archs().join(",") });
        }
    };
    check_glue(status, "gs_nvfp4_gemm")?;
    Ok(plan)
}

/// Blackwell: D[m, n] (bf16/fp16, contiguous) = alpha · A[m, k] · B[n, k]ᵀ, A and B NVFP4; eager.
pub fn gemm(a: &Nvfp4Matrix<&DeviceBuffer>, b: &Nvfp4Matrix<&DeviceBuffer>, alpha: &DeviceBuffer, d: &Tensor<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<Nvfp4Plan> {
    gemm_on(a, b, &alpha, d, Target::eager(stream, Some(ws))?)
}

/// Blackwell, captured: never grows the workspace; every view must belong to `cap`.
pub fn gemm_captured<'id>(a: &Nvfp4Matrix<CapturedBuffer<'id>>, b: &Nvfp4Matrix<CapturedBuffer<'id>>, alpha: &CapturedBuffer<'id>, d: &Tensor<CapturedBuffer<'id>>, ws: &Captured<'id>, cap: &Capture<'_, 'id>) -> Result<Nvfp4Plan> {
    gemm_on(a, b, alpha, d, Target::captured(cap.site(), Some(ws.view()))?)
}

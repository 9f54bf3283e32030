//! NVFP4 glue (`include/graphsafe_kernels/nvfp4.h`): scale layout, quantize/dequantize, the
//! global scale, the Hopper W4A16 GEMM and the Blackwell block-scaled GEMM. See the module docs of
//! [`super`] for what every launch checks and trusts.

use super::{check, out, require_workspace, DeviceSpan, GlueDtype, RawStream};
use crate::arch::Nvfp4Arch;
use crate::error::{Error, Result};
use crate::sys::kernels as k;
use crate::sys::span::{extent_of, unsigned};

/// Bytes of the swizzled scale tensor of an [rows, k] matrix (`k` a multiple of 16).
pub(crate) fn scale_bytes(rows: i32, kk: i32) -> Result<u64> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_scale_bytes", |o| unsafe { k::gs_nvfp4_scale_bytes(rows, kk, o) })
}

/// The `GsNvfp4Backend` the block-scaled GEMM's host functions take for a back-end
/// (`include/graphsafe_kernels/nvfp4.h`), as the `int32_t` they are declared with. Exhaustive, so a
/// back-end added to [`Nvfp4Arch`] must be mapped here. Hopper has no block-scaled GEMM: it runs
/// the W4A16 kernel.
fn block_scaled_backend(arch: Nvfp4Arch) -> Result<i32> {
    let b = match arch {
        Nvfp4Arch::Sm100 => k::GsNvfp4Backend::GS_NVFP4_BACKEND_SM100,
        Nvfp4Arch::Sm120 => k::GsNvfp4Backend::GS_NVFP4_BACKEND_SM120,
        Nvfp4Arch::Sm90 => return Err(Error::invalid("arch", "a back-end with the block-scaled GEMM (sm100 or sm120; sm90 runs the W4A16 kernel)", arch.name())),
    };
    // The enumerators are small positive constants (1, 2): the cast is exact.
    Ok(b.0 as i32)
}

/// The Blackwell GEMM's CUTLASS tile for `m` on `arch`.
pub(crate) fn gemm_tile(arch: Nvfp4Arch, m: i32) -> Result<k::GsNvfp4Tile> {
    let backend = block_scaled_backend(arch)?;
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_gemm_tile", |o| unsafe { k::gs_nvfp4_gemm_tile(backend, m, o) })
}

/// Workspace bytes of the Blackwell GEMM for these arguments (CUTLASS's own number).
pub(crate) fn gemm_workspace_bytes(arch: Nvfp4Arch, m: i32, n: i32, kk: i32, out_dtype: GlueDtype, sm_count: i32) -> Result<u64> {
    let backend = block_scaled_backend(arch)?;
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_gemm_workspace_bytes", |o| unsafe { k::gs_nvfp4_gemm_workspace_bytes(backend, m, n, kk, out_dtype.code(), sm_count, o) })
}

/// Whether the Hopper W4A16 GEMM supports (m, n, k).
pub(crate) fn w4a16_check_shape(m: i32, n: i32, kk: i32) -> Result<()> {
    // SAFETY: host function; plain integer arguments.
    check(unsafe { k::gs_nvfp4_w4a16_check_shape(m, n, kk) }, "gs_nvfp4_w4a16_check_shape", None)
}

/// Workspace bytes of the Hopper W4A16 GEMM (non-zero only for its stream-K schedule).
pub(crate) fn w4a16_workspace_bytes(m: i32, n: i32, kk: i32, sm_count: i32) -> Result<u64> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_w4a16_workspace_bytes", |o| unsafe { k::gs_nvfp4_w4a16_workspace_bytes(m, n, kk, sm_count, o) })
}

/// The Hopper W4A16 GEMM's schedule of (m, n, k) on `sm_count` SMs (what the launcher plans).
pub(crate) fn w4a16_schedule(m: i32, n: i32, kk: i32, sm_count: i32) -> Result<k::GsW4a16Schedule> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_w4a16_schedule", |o| unsafe { k::gs_nvfp4_w4a16_schedule(m, n, kk, sm_count, o) })
}

/// Bytes of an [n, k] weight prepared for the W4A16 GEMM.
pub(crate) fn w4a16_prepared_bytes(n: i32, kk: i32) -> Result<u64> {
    // SAFETY: host function; the out-pointer is a live local.
    out("gs_nvfp4_w4a16_prepared_bytes", |o| unsafe { k::gs_nvfp4_w4a16_prepared_bytes(n, kk, o) })
}

/// An NVFP4 matrix [rows, k] in device memory, as the glue reads or writes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fp4Matrix {
    /// Packed values, `[rows, k/2]` bytes.
    pub packed: DeviceSpan,
    /// Swizzled fp8 scales, [`scale_bytes`] bytes.
    pub scales: DeviceSpan,
    /// One fp32.
    pub global_scale: DeviceSpan,
    pub rows: i32,
    pub k: i32,
}

impl Fp4Matrix {
    /// The three addresses after checking that each holds its part (packed and scales 4-byte
    /// aligned as the glue stores them 4 bytes at a time; `align` for the caller's stricter rule).
    fn addresses(&self, what: &str, align: u64) -> Result<(u64, u64, u64)> {
        let (rows, kk) = (positive(what, self.rows)?, positive(what, self.k)?);
        let packed = self.packed.require(&format!("{what}.packed"), rows * (kk / 2), align.max(4))?;
        let scales = self.scales.require(&format!("{what}.scales"), scale_bytes(self.rows, self.k)?, align.max(4))?;
        let gs = self.global_scale.require(&format!("{what}.global_scale"), 4, 4)?;
        Ok((packed, scales, gs))
    }
}

fn positive(what: &str, v: i32) -> Result<u64> {
    u64::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| Error::invalid(what, "a positive size", v))
}

/// A 16-bit matrix [rows, cols] with row stride `ld` elements.
fn half_matrix(span: &DeviceSpan, what: &str, rows: i32, cols: i32, ld: i64, align: u64) -> Result<u64> {
    let (r, c) = (positive(what, rows)?, positive(what, cols)?);
    let ld = unsigned(&format!("{what}.ld"), ld)?;
    span.require(what, extent_of(what, 2, &[(r, ld), (c, 1)])?, align)
}

fn half(d: GlueDtype, what: &str) -> Result<GlueDtype> {
    match d {
        GlueDtype::Bf16 | GlueDtype::Fp16 => Ok(d),
        other => Err(Error::invalid(what, "bf16 or fp16", format!("{other:?}"))),
    }
}

/// `out[0] = 448·6 / amax(|x|)` over `n` 16-bit elements of `x`, on `stream`.
pub(crate) fn global_scale(x: DeviceSpan, dtype: GlueDtype, n: i64, result: DeviceSpan, stream: RawStream) -> Result<()> {
    let elems = u64::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| Error::invalid("n", "at least one element", n))?;
    let bytes = elems.checked_mul(2).ok_or_else(|| Error::invalid("n", "a tensor that fits in memory", n))?;
    let xp = x.require("x", bytes, 16)?;
    let gp = result.require("global_scale", 4, 4)?;
    let dt = half(dtype, "dtype")?.code();
    // SAFETY: x holds n 16-bit elements and result one f32 (checked above); the spans' invariant
    // and the stream's are the module's trusted preconditions.
    check(unsafe { k::gs_nvfp4_global_scale(xp as *const _, dt, n, gp as *mut f32, stream.cast()) }, "gs_nvfp4_global_scale", None)
}

/// Quantizes `x` [m, k] (row stride `ld` elements) with `global_scale` into `out`'s packed
/// values and scales (`out.global_scale` is not read: the kernel reads `global_scale`).
pub(crate) fn quantize(x: DeviceSpan, dtype: GlueDtype, ld: i64, global_scale: DeviceSpan, dst: &Fp4Matrix, stream: RawStream) -> Result<()> {
    let xp = half_matrix(&x, "x", dst.rows, dst.k, ld, 16)?;
    let gp = global_scale.require("global_scale", 4, 4)?;
    let (packed, scales, _) = dst.addresses("out", 4)?;
    let dt = half(dtype, "dtype")?.code();
    check(
        // SAFETY: every extent the header documents for (m, k, ld) lies in its span (above); the
        // spans' invariant and the stream's are the module's trusted preconditions.
        unsafe { k::gs_nvfp4_quantize(xp as *const _, dt, dst.rows, dst.k, ld, gp as *const f32, packed as *mut u8, scales as *mut u8, stream.cast()) },
        "gs_nvfp4_quantize",
        None,
    )
}

/// The inverse: `dst` [m, k] (row stride `ld`) from `src`.
pub(crate) fn dequantize(src: &Fp4Matrix, dtype: GlueDtype, dst: DeviceSpan, ld: i64, stream: RawStream) -> Result<()> {
    let (packed, scales, gs) = src.addresses("src", 4)?;
    let op = half_matrix(&dst, "out", src.rows, src.k, ld, 2)?;
    let dt = half(dtype, "dtype")?.code();
    check(
        // SAFETY: as in quantize: every documented extent lies in its span.
        unsafe { k::gs_nvfp4_dequantize(packed as *const u8, scales as *const u8, gs as *const f32, src.rows, src.k, dt, op as *mut _, ld, stream.cast()) },
        "gs_nvfp4_dequantize",
        None,
    )
}

/// Repacks the [n, k] weight `w` into `prepared` for the W4A16 GEMM (Hopper builds only).
pub(crate) fn w4a16_prepare(w: &Fp4Matrix, prepared: DeviceSpan, stream: RawStream) -> Result<()> {
    let (packed, scales, gs) = w.addresses("w", 16)?;
    let bytes = w4a16_prepared_bytes(w.rows, w.k)?;
    let pp = prepared.require("prepared", bytes, 16)?;
    #[cfg(graphsafe_nvfp4 = "sm90")]
    {
        check(
            // SAFETY: the weight's parts and `bytes` of `prepared` lie in their spans (above).
            unsafe { k::gs_nvfp4_w4a16_prepare(packed as *const u8, scales as *const u8, gs as *const f32, w.rows, w.k, pp as *mut _, bytes, stream.cast()) },
            "gs_nvfp4_w4a16_prepare",
            None,
        )
    }
    #[cfg(not(graphsafe_nvfp4 = "sm90"))]
    {
        let _ = (packed, scales, gs, pp, stream);
        Err(not_built("nvfp4 prepare_weight", &crate::arch::Nvfp4Arch::Sm90.targets()))
    }
}

/// One W4A16 GEMM: `d` [m, n] (bf16, stride `ldd`) = alpha · `a` [m, k] (bf16, stride `lda`) · Wᵀ.
#[derive(Clone, Copy, Debug)]
pub(crate) struct W4a16 {
    pub a: DeviceSpan,
    pub lda: i64,
    /// The prepared weight ([`w4a16_prepare`]).
    pub weight: DeviceSpan,
    pub alpha: DeviceSpan,
    pub d: DeviceSpan,
    pub ldd: i64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub sm_count: i32,
}

/// Launches the W4A16 GEMM (Hopper builds only) with `ws` as its workspace.
pub(crate) fn w4a16_gemm(g: &W4a16, ws: DeviceSpan, stream: RawStream) -> Result<()> {
    w4a16_check_shape(g.m, g.n, g.k).map_err(|_| Error::invalid("shape (m, n, k)", "a shape the sm90 W4A16 kernel supports", format!("({}, {}, {})", g.m, g.n, g.k)))?;
    let ap = half_matrix(&g.a, "a", g.m, g.k, g.lda, 16)?;
    let dp = half_matrix(&g.d, "d", g.m, g.n, g.ldd, 2)?;
    let wp = g.weight.require("weight", w4a16_prepared_bytes(g.n, g.k)?, 16)?;
    let al = g.alpha.require("alpha", 4, 4)?;
    let sizes = require_workspace(&ws, w4a16_workspace_bytes(g.m, g.n, g.k, g.sm_count)?, 16)?;
    #[cfg(graphsafe_nvfp4 = "sm90")]
    {
        check(
            // SAFETY: a, d, the weight, alpha and the workspace hold what the GEMM touches for
            // (m, n, k) (checked above, the workspace against the glue's own planner).
            unsafe {
                k::gs_nvfp4_w4a16_gemm(ap as *const _, g.lda, wp as *const _, al as *const f32, dp as *mut _, g.ldd, g.m, g.n, g.k, g.sm_count, ws.ptr() as *mut _, ws.len(), stream.cast())
            },
            "gs_nvfp4_w4a16_gemm",
            Some(sizes),
        )
    }
    #[cfg(not(graphsafe_nvfp4 = "sm90"))]
    {
        let _ = (ap, dp, wp, al, sizes, stream);
        Err(not_built("nvfp4 w4a16_gemm", &crate::arch::Nvfp4Arch::Sm90.targets()))
    }
}

/// One Blackwell GEMM: `d` [m, n] (contiguous, `out`) = alpha · A · Bᵀ.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    /// The back-end to launch (sm100 or sm120).
    pub arch: Nvfp4Arch,
    pub a: Fp4Matrix,
    pub b: Fp4Matrix,
    pub alpha: DeviceSpan,
    pub d: DeviceSpan,
    pub out: GlueDtype,
    pub sm_count: i32,
}

/// Launches the block-scaled GEMM for `g.arch` (when this build has it) with workspace `ws`.
pub(crate) fn gemm(g: &Gemm, ws: DeviceSpan, stream: RawStream) -> Result<()> {
    if g.a.k != g.b.k {
        return Err(Error::invalid("b.k", format!("{}, a's k", g.a.k), g.b.k));
    }
    let (m, n, kk) = (g.a.rows, g.b.rows, g.a.k);
    let (ap, asf, _) = g.a.addresses("a", 16)?;
    let (bp, bsf, _) = g.b.addresses("b", 16)?;
    let al = g.alpha.require("alpha", 4, 4)?;
    let out = half(g.out, "d.dtype")?;
    let (mu, nu) = (positive("m", m)?, positive("n", n)?);
    let d_bytes = extent_of("d", out.bytes(), &[(mu, nu), (nu, 1)])?;
    let dp = g.d.require("d", d_bytes, 16)?;
    let sizes = require_workspace(&ws, gemm_workspace_bytes(g.arch, m, n, kk, out, g.sm_count)?, 16)?;
    let (wsp, wsb, s) = (ws.ptr() as *mut std::ffi::c_void, ws.len(), stream.cast::<std::ffi::c_void>());
    let status: Result<i32> = match g.arch {
        #[cfg(graphsafe_nvfp4 = "sm100")]
        // SAFETY: A, B (packed and scales), alpha, d and the workspace hold what the GEMM touches
        // for (m, n, k) (checked above, the workspace against CUTLASS's own size).
        Nvfp4Arch::Sm100 => Ok(unsafe { k::gs_nvfp4_gemm_sm100(ap as _, asf as _, bp as _, bsf as _, al as _, dp as _, out.code(), m, n, kk, g.sm_count, wsp, wsb, s) }),
        #[cfg(graphsafe_nvfp4 = "sm120")]
        // SAFETY: as above.
        Nvfp4Arch::Sm120 => Ok(unsafe { k::gs_nvfp4_gemm_sm120(ap as _, asf as _, bp as _, bsf as _, al as _, dp as _, out.code(), m, n, kk, g.sm_count, wsp, wsb, s) }),
        // Unreachable for sm90 (gemm_workspace_bytes refused it above), and for a back-end this
        // build did not compile, nothing to launch.
        #[allow(unreachable_patterns)]
        other => {
            let _ = (ap, asf, bp, bsf, al, dp, wsp, wsb, s);
            Err(not_built("nvfp4 gemm", &other.targets()))
        }
    };
    check(status?, "gs_nvfp4_gemm", Some(sizes))
}

#[allow(dead_code)] // used only by builds that lack an arch
fn not_built(op: &'static str, arch: &str) -> Error {
    Error::ArchUnsupported { op, need: format!("a build with {arch}"), have: crate::build_info::archs().join(",") }
}

//! NVFP4 through the C ABI: planning, global scale, quantize, weight preparation (Hopper), the
//! W4A16 GEMM (Hopper) and the block-scaled GEMM (Blackwell). Activations, outputs, packed values,
//! scales and scalars are caller-owned device pointers; a prepared weight is a graphsafe buffer
//! (bind it to captures that use it).

use super::core::{captured_op, eager_op, eager_stream, GraphsafeBuffer, GraphsafeCapture, GraphsafeStream, GraphsafeWorkspace};
use super::handles::{self, Tag};
use super::mla::{GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16};
use super::{guard, null, put, Fail, Raw};
use crate::driver::DeviceBuffer;
use crate::ops::nvfp4::{self, gemm_on, quantize_on, w4a16_on, Nvfp4Arch, Nvfp4Matrix};
use crate::ops::tensor::{DType, Tensor};
use crate::sys::cuda as c;
use std::ffi::c_int;

/// Back-end selector for NVFP4 planning (GRAPHSAFE_ARCH_SM90 / SM100 as for MLA, or this).
pub const GRAPHSAFE_ARCH_SM120: c_int = 120;

/// An NVFP4 GEMM plan.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GraphsafeNvfp4Plan {
    /// CUTLASS tile (Blackwell; 0 on Hopper).
    pub tile_m: c_int,
    /// CUTLASS tile N.
    pub tile_n: c_int,
    /// CUTLASS tile K.
    pub tile_k: c_int,
    /// Cluster M.
    pub cluster_m: c_int,
    /// Cluster N.
    pub cluster_n: c_int,
    /// Workspace bytes (pre-grow to the largest over the shapes you capture).
    pub workspace_bytes: u64,
    /// Bytes of a prepared weight (Hopper; 0 on Blackwell).
    pub prepared_weight_bytes: u64,
}

/// An NVFP4 matrix [rows, k] in caller-owned device memory.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeNvfp4Matrix {
    /// Packed e2m1 values [rows, k/2], 16-byte aligned.
    pub packed: u64,
    /// Swizzled fp8 scales (graphsafe_nvfp4_scale_bytes), 16-byte aligned.
    pub scales: u64,
    /// One fp32 global scale.
    pub global_scale: u64,
    /// Rows.
    pub rows: c_int,
    /// Columns (K), a multiple of 32.
    pub k: c_int,
}

fn arch_of(a: c_int) -> Result<Nvfp4Arch, Fail> {
    match a {
        90 => Ok(Nvfp4Arch::Sm90),
        100 => Ok(Nvfp4Arch::Sm100),
        120 => Ok(Nvfp4Arch::Sm120),
        other => Err(crate::Error::invalid("arch", "GRAPHSAFE_ARCH_SM90, _SM100 or _SM120", other).into()),
    }
}

fn half_dtype(d: c_int, what: &str) -> Result<DType, Fail> {
    match d {
        GRAPHSAFE_DTYPE_BF16 => Ok(DType::Bf16),
        GRAPHSAFE_DTYPE_FP16 => Ok(DType::Fp16),
        other => Err(crate::Error::invalid(what, "GRAPHSAFE_DTYPE_BF16 or _FP16", other).into()),
    }
}

fn n(v: c_int, what: &str) -> Result<usize, Fail> {
    usize::try_from(v).map_err(|_| crate::Error::invalid(what, "a value >= 0", v).into())
}

fn raw(ptr: u64, what: &str, ctx: c::CUcontext) -> Result<Raw, Fail> {
    if ptr == 0 {
        return Err(null(what));
    }
    Ok(Raw { ptr, ctx })
}

/// Rows in caller memory, row-major with leading dimension `ld` (elements).
fn matrix_2d(ptr: u64, what: &str, dtype: DType, rows: c_int, cols: c_int, ld: i64, ctx: c::CUcontext) -> Result<Tensor<Raw>, Fail> {
    let ld = usize::try_from(ld).map_err(|_| crate::Error::invalid(what, "a leading dimension >= 0", ld))?;
    Ok(Tensor::strided(raw(ptr, what, ctx)?, 0, dtype, &[n(rows, what)?, n(cols, what)?], &[ld, 1]))
}

fn nvfp4_matrix(m: &GraphsafeNvfp4Matrix, what: &str, ctx: c::CUcontext) -> Result<Nvfp4Matrix<Raw>, Fail> {
    Ok(Nvfp4Matrix {
        packed: raw(m.packed, what, ctx)?,
        scales: raw(m.scales, what, ctx)?,
        global_scale: raw(m.global_scale, what, ctx)?,
        rows: n(m.rows, what)?,
        k: n(m.k, what)?,
    })
}

/// Tile and workspace (and, on Hopper, the prepared weight's size) for D[m,n] = A[m,k]·W[n,k]ᵀ.
/// Host-only: works without a GPU. Thread-safe. `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_plan(arch: c_int, m: c_int, n_: c_int, k: c_int, out_dtype: c_int, sm_count: c_int, out: *mut GraphsafeNvfp4Plan) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let p = nvfp4::plan(arch_of(arch)?, m as i64, n_ as i64, k as i64, half_dtype(out_dtype, "out_dtype")?, sm_count as i64)?;
        let t = p.tile.unwrap_or(nvfp4::Tile { m: 0, n: 0, k: 0, cluster_m: 0, cluster_n: 0 });
        put(
            out,
            "out",
            GraphsafeNvfp4Plan {
                tile_m: t.m as c_int,
                tile_n: t.n as c_int,
                tile_k: t.k as c_int,
                cluster_m: t.cluster_m as c_int,
                cluster_n: t.cluster_n as c_int,
                workspace_bytes: p.workspace_bytes,
                prepared_weight_bytes: p.prepared_weight_bytes.unwrap_or(0),
            },
        )
    })
}

/// Bytes of the swizzled scale tensor of an [rows, k] NVFP4 matrix (k a multiple of 16):
/// round_up(rows, 128) * round_up(k / 16, 4), exact for every positive `int`. Host-only.
/// `out`: non-null.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_scale_bytes(rows: c_int, k: c_int, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        put(out, "out", nvfp4::scale_bytes(rows as i64, k as i64)?)
    })
}

/// Quantizes x [m, k] (bf16/fp16, leading dimension ld_x) with the device global scale into
/// `out` (whose global_scale must point to the same scalar or a copy), on `stream`.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_quantize(x: u64, dtype: c_int, m: c_int, k: c_int, ld_x: i64, out: *const GraphsafeNvfp4Matrix, stream: GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = eager_stream(stream)?;
        let ctx = s.stream.context();
        // SAFETY: non-null; the caller passes a valid struct.
        let q = nvfp4_matrix(unsafe { &*out }, "out", ctx.raw())?;
        let xt = matrix_2d(x, "x", half_dtype(dtype, "dtype")?, m, k, ld_x, ctx.raw())?;
        Ok(quantize_on(&xt, &q.global_scale, &q, ctx, s.stream.raw())?)
    })
}

/// Captured quantize (the memory is the caller's to keep alive while the graph can run).
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_quantize_captured(x: u64, dtype: c_int, m: c_int, k: c_int, ld_x: i64, out: *const GraphsafeNvfp4Matrix, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: non-null; the caller passes a valid struct.
        let o = unsafe { *out };
        captured_op(capture, ws, |s, _| {
            let ctx = s.context();
            let q = nvfp4_matrix(&o, "out", ctx.raw())?;
            let xt = matrix_2d(x, "x", half_dtype(dtype, "dtype")?, m, k, ld_x, ctx.raw())?;
            Ok(quantize_on(&xt, &q.global_scale, &q, ctx, s.raw())?)
        })
    })
}

/// Repacks an [n, k] NVFP4 weight for the Hopper W4A16 GEMM into a new graphsafe buffer (`out`),
/// once, eagerly. ARCH_UNSUPPORTED on other GPUs.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_prepare_weight(weight: *const GraphsafeNvfp4Matrix, stream: GraphsafeStream, out: *mut GraphsafeBuffer) -> c_int {
    guard(|| {
        if weight.is_null() || out.is_null() {
            return Err(null("weight/out"));
        }
        let s = eager_stream(stream)?;
        // SAFETY: non-null; the caller passes a valid struct.
        let w = unsafe { *weight };
        // The op takes buffers; wrap the caller's pointers (sizes are checked against the format).
        let ctx = s.stream.context();
        let m = nvfp4_matrix(&w, "weight", ctx.raw())?;
        let prepared = nvfp4::prepare_weight_raw(&m, &s.stream)?;
        put(out, "out", GraphsafeBuffer { id: handles::insert(Tag::Buffer, std::sync::Arc::new(prepared)) })
    })
}

/// The W4A16 GEMM's arguments: D[m, n] (bf16) = alpha · A[m, k] (bf16) · Wᵀ.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeW4a16Args {
    /// A's device address, leading dimension lda.
    pub a: u64,
    /// Leading dimension of A (elements).
    pub lda: i64,
    /// The prepared weight (graphsafe_nvfp4_prepare_weight).
    pub weight: GraphsafeBuffer,
    /// Rows of the weight.
    pub n: c_int,
    /// Columns of the weight (K).
    pub k: c_int,
    /// Device fp32 scalar alpha (read at run time: may change between replays).
    pub alpha: u64,
    /// D's device address, leading dimension ldd.
    pub d: u64,
    /// Leading dimension of D (elements).
    pub ldd: i64,
    /// Rows of A and D.
    pub m: c_int,
}

fn w4a16(a: &GraphsafeW4a16Args, s: &crate::driver::Stream, ws: crate::workspace::WorkspaceArg<'_>) -> Result<(), Fail> {
    let ctx = s.context();
    let wbuf = handles::get::<DeviceBuffer>(Tag::Buffer, a.weight.id)?;
    let at = matrix_2d(a.a, "a", DType::Bf16, a.m, a.k, a.lda, ctx.raw())?;
    let dt = matrix_2d(a.d, "d", DType::Bf16, a.m, a.n, a.ldd, ctx.raw())?;
    let w = (wbuf.device_ptr(), n(a.n, "n")?, n(a.k, "k")?, wbuf.context().raw());
    let need = nvfp4::plan(Nvfp4Arch::Sm90, a.m as i64, a.n as i64, a.k as i64, DType::Bf16, ctx.sm_count() as i64)?
        .prepared_weight_bytes
        .unwrap_or(0);
    if (wbuf.len() as u64) < need {
        return Err(crate::Error::invalid("weight", format!("a weight prepared for [{}, {}] ({need} bytes)", a.n, a.k), format!("{} bytes", wbuf.len())).into());
    }
    w4a16_on(&at, w, &raw(a.alpha, "alpha", ctx.raw())?, &dt, ws, ctx, s.raw())?;
    Ok(())
}

/// Eager W4A16 GEMM (Hopper): may grow `ws`. BUSY while the stream is capturing or `ws` is bound.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_w4a16_gemm(args: *const GraphsafeW4a16Args, ws: GraphsafeWorkspace, stream: GraphsafeStream) -> c_int {
    guard(|| {
        if args.is_null() {
            return Err(null("args"));
        }
        // SAFETY: non-null; the caller passes a valid struct.
        let a = unsafe { *args };
        eager_op(ws, stream, |s, w| w4a16(&a, s, w))
    })
}

/// Captured W4A16 GEMM: `ws` bound to `capture`, never grown; bind the prepared weight too
/// (graphsafe_capture_bind_buffer) so the graph keeps it alive.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_w4a16_gemm_captured(args: *const GraphsafeW4a16Args, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        if args.is_null() {
            return Err(null("args"));
        }
        // SAFETY: non-null; the caller passes a valid struct.
        let a = unsafe { *args };
        captured_op(capture, ws, |s, w| w4a16(&a, s, w))
    })
}

/// The Blackwell GEMM's arguments: D[m, n] = alpha · A · Bᵀ, A [m, k] and B [n, k] NVFP4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeNvfp4GemmArgs {
    /// A [m, k].
    pub a: GraphsafeNvfp4Matrix,
    /// B [n, k].
    pub b: GraphsafeNvfp4Matrix,
    /// Device fp32 scalar alpha.
    pub alpha: u64,
    /// D [m, n], contiguous.
    pub d: u64,
    /// GRAPHSAFE_DTYPE_BF16 or _FP16.
    pub out_dtype: c_int,
}

fn gemm(a: &GraphsafeNvfp4GemmArgs, s: &crate::driver::Stream, ws: crate::workspace::WorkspaceArg<'_>) -> Result<(), Fail> {
    let ctx = s.context();
    let (am, bm) = (nvfp4_matrix(&a.a, "a", ctx.raw())?, nvfp4_matrix(&a.b, "b", ctx.raw())?);
    let dt = matrix_2d(a.d, "d", half_dtype(a.out_dtype, "out_dtype")?, a.a.rows, a.b.rows, a.b.rows as i64, ctx.raw())?;
    gemm_on(&am, &bm, &raw(a.alpha, "alpha", ctx.raw())?, &dt, ws, ctx, s.raw())?;
    Ok(())
}

/// Eager block-scaled GEMM (Blackwell): may grow `ws`.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_gemm(args: *const GraphsafeNvfp4GemmArgs, ws: GraphsafeWorkspace, stream: GraphsafeStream) -> c_int {
    guard(|| {
        if args.is_null() {
            return Err(null("args"));
        }
        // SAFETY: non-null; the caller passes a valid struct.
        let a = unsafe { *args };
        eager_op(ws, stream, |s, w| gemm(&a, s, w))
    })
}

/// Captured block-scaled GEMM (Blackwell): `ws` bound to `capture`, never grown.
#[no_mangle]
pub extern "C" fn graphsafe_nvfp4_gemm_captured(args: *const GraphsafeNvfp4GemmArgs, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        if args.is_null() {
            return Err(null("args"));
        }
        // SAFETY: non-null; the caller passes a valid struct.
        let a = unsafe { *args };
        captured_op(capture, ws, |s, w| gemm(&a, s, w))
    })
}

//! NVFP4 through the C ABI: planning, global scale, quantize, weight preparation (Hopper), the
//! W4A16 GEMM (Hopper) and the block-scaled GEMM (Blackwell). Activations, outputs, packed values,
//! scales and scalars are caller-owned device pointers; a prepared weight is a graphsafe buffer
//! (bind it to captures that use it).

use super::core::{capture_obj, captured_op, eager_op, stream_obj, workspace_obj, GraphsafeBuffer, GraphsafeCapture, GraphsafeStream, GraphsafeWorkspace};
use super::handles::{self, Tag};
use super::mla::{GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16};
use super::{guard, null, put, read, CallerMemory, Fail, Raw};
use crate::driver::DeviceBuffer;
use crate::graph::op_target::OpTarget;
use crate::ops::nvfp4::{self, gemm_on, quantize_on, w4a16_on, Nvfp4Arch, Nvfp4GemmArgs, Nvfp4Matrix, Nvfp4QuantizeArgs, WeightArg};
use crate::ops::tensor::{DType, Tensor};
use std::ffi::c_int;

/// Planning target for NVFP4 (a compute capability x10 + minor, as GRAPHSAFE_ARCH_SM90 / SM100;
/// 103 and 121 work too): the RTX 50 / RTX PRO / DGX Spark back-end.
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
    Ok(crate::arch::nvfp4_for_abi(a)?)
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

/// Rows in caller memory, row-major with leading dimension `ld` (elements). `rows` and `cols` are
/// (value, the argument's name): a refusal names the dimension, not the matrix.
fn matrix_2d(ptr: u64, what: &str, dtype: DType, rows: (c_int, &str), cols: (c_int, &str), ld: i64, ctx: CallerMemory<'_>) -> Result<Tensor<Raw>, Fail> {
    let ld = usize::try_from(ld).map_err(|_| crate::Error::invalid(format!("{what}'s leading dimension"), "a leading dimension >= 0", ld))?;
    let shape = [n(rows.0, rows.1)?, n(cols.0, cols.1)?];
    Ok(Tensor::strided(ctx.pointer(ptr, what)?, 0, dtype, &shape, &[ld, 1]))
}

fn nvfp4_matrix(m: &GraphsafeNvfp4Matrix, what: &str, ctx: CallerMemory<'_>) -> Result<Nvfp4Matrix<Raw>, Fail> {
    let (rows, k) = (n(m.rows, &format!("{what}.rows"))?, n(m.k, &format!("{what}.k"))?);
    Ok(Nvfp4Matrix {
        packed: ctx.pointer(m.packed, &format!("{what}.packed"))?,
        scales: ctx.pointer(m.scales, &format!("{what}.scales"))?,
        global_scale: ctx.pointer(m.global_scale, &format!("{what}.global_scale"))?,
        rows,
        k,
    })
}

/// Tile and workspace (and, on Hopper, the prepared weight's size) for `D[m,n] = A[m,k]·W[n,k]ᵀ`.
/// Host-only: works without a GPU. Thread-safe.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeNvfp4Plan`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_plan(arch: c_int, m: c_int, n_: c_int, k: c_int, out_dtype: c_int, sm_count: c_int, out: *mut GraphsafeNvfp4Plan) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let p = nvfp4::plan(arch_of(arch)?, m as i64, n_ as i64, k as i64, half_dtype(out_dtype, "out_dtype")?, sm_count as i64)?;
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", plan_c(&p)) }
    })
}

/// The workspace to pre-grow before capturing GEMMs of every M in `m_values[0..m_count]` (the
/// batch sizes an engine captures) against one `[n, k]` weight: the plan of the M that needs the
/// most (the first such, in the array's order), written to `out`, and that M to `worst_m` (nullable).
/// The same rules as graphsafe_nvfp4_plan, for every M (GRAPHSAFE_ERROR_INVALID_ARGUMENT naming
/// the argument, `m_count` 0 included). Host-only: works without a GPU. Thread-safe.
///
/// # Safety
/// `m_values` is null (refused) or points to `m_count` readable `int`s; `out` is null (refused)
/// or points to a writable `GraphsafeNvfp4Plan`; `worst_m` is null or points to a writable `int`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn graphsafe_nvfp4_worst_case(
    arch: c_int,
    m_values: *const c_int,
    m_count: usize,
    n_: c_int,
    k: c_int,
    out_dtype: c_int,
    sm_count: c_int,
    out: *mut GraphsafeNvfp4Plan,
    worst_m: *mut c_int,
) -> c_int {
    guard(|| {
        if m_values.is_null() {
            return Err(null("m_values"));
        }
        if out.is_null() {
            return Err(null("out"));
        }
        let count = |what: &str, v: c_int| u32::try_from(v).map_err(|_| Fail::from(crate::Error::invalid(what, "a value >= 0", v)));
        let mut ms = Vec::new();
        for i in 0..m_count {
            // SAFETY: the caller's contract: `m_count` ints behind the non-null `m_values` (read
            // unaligned: no alignment is assumed).
            let m = unsafe { m_values.add(i).read_unaligned() };
            ms.push(count("m_values", m)?);
        }
        let limits = nvfp4::Nvfp4Limits::new(ms, count("n", n_)?, count("k", k)?, count("sm_count", sm_count)?).with_out(half_dtype(out_dtype, "out_dtype")?);
        let p = nvfp4::worst_case(arch_of(arch)?, &limits)?;
        // SAFETY: the caller's contract (null is refused above).
        unsafe { put(out, "out", plan_c(&p)) }?;
        if !worst_m.is_null() {
            // SAFETY: non-null; the caller's contract. The M came from an `int`.
            unsafe { put(worst_m, "worst_m", p.m as c_int) }?;
        }
        Ok(())
    })
}

fn plan_c(p: &nvfp4::Nvfp4Plan) -> GraphsafeNvfp4Plan {
    let t = p.tile.unwrap_or(nvfp4::Tile { m: 0, n: 0, k: 0, cluster_m: 0, cluster_n: 0 });
    GraphsafeNvfp4Plan {
        tile_m: t.m as c_int,
        tile_n: t.n as c_int,
        tile_k: t.k as c_int,
        cluster_m: t.cluster_m as c_int,
        cluster_n: t.cluster_n as c_int,
        workspace_bytes: p.workspace_bytes,
        prepared_weight_bytes: p.prepared_weight_bytes.unwrap_or(0),
    }
}

/// Bytes of the swizzled scale tensor of an [rows, k] NVFP4 matrix (k a multiple of 16):
/// round_up(rows, 128) * round_up(k / 16, 4), exact for every positive `int`. Host-only.
///
/// # Safety
/// `out` is null (refused) or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_scale_bytes(rows: c_int, k: c_int, out: *mut u64) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", nvfp4::scale_bytes(rows as i64, k as i64)?) }
    })
}

/// Quantizes x [m, k] (bf16/fp16, leading dimension ld_x) with the device global scale into
/// `out` (whose global_scale must point to the same scalar or a copy), on `stream`.
///
/// # Safety
/// `out` is null (refused) or points to a valid `GraphsafeNvfp4Matrix`; every device address is an
/// allocation of `stream`'s device holding the documented sizes and stays valid until the work
/// finishes. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_quantize(x: u64, dtype: c_int, m: c_int, k: c_int, ld_x: i64, out: *const GraphsafeNvfp4Matrix, stream: GraphsafeStream) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let o = unsafe { read(out, "out")? };
        let s = stream_obj(stream)?;
        eager_op((&s, stream.id), None, |t| quantize(&o, x, dtype, m, k, ld_x, t))
    })
}

fn quantize(o: &GraphsafeNvfp4Matrix, x: u64, dtype: c_int, m: c_int, k: c_int, ld_x: i64, t: OpTarget<'_>) -> Result<(), Fail> {
    let ctx = CallerMemory::on(t.context());
    let q = nvfp4_matrix(o, "out", ctx)?;
    let xt = matrix_2d(x, "x", half_dtype(dtype, "dtype")?, (m, "m"), (k, "k"), ld_x, ctx)?;
    Ok(quantize_on(&Nvfp4QuantizeArgs::new(xt, q.global_scale.clone(), q), t)?)
}

/// Captured quantize.
///
/// # Safety
/// As graphsafe_nvfp4_quantize, and the memory must stay valid for as long as any graph made from
/// the capture can run. Any thread (calls on one capture are serialized); only the begin and the end of a
/// THREAD_LOCAL/GLOBAL capture are tied to one thread (CUDA's rule).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_quantize_captured(x: u64, dtype: c_int, m: c_int, k: c_int, ld_x: i64, out: *const GraphsafeNvfp4Matrix, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let o = unsafe { read(out, "out")? };
        let c = capture_obj(capture)?;
        // The quantize needs no workspace; `ws` (if non-zero) must still be bound to the capture.
        let ws_id = (ws.id != 0).then_some(ws.id);
        captured_op((&c, capture.id), ws_id, |t| quantize(&o, x, dtype, m, k, ld_x, t))
    })
}

/// Repacks an [n, k] NVFP4 weight for the Hopper W4A16 GEMM into a new graphsafe buffer (`out`),
/// once, eagerly. ARCH_UNSUPPORTED on other GPUs.
///
/// # Safety
/// `weight` is null (refused) or points to a valid `GraphsafeNvfp4Matrix` whose memory holds the
/// documented sizes on `stream`'s device; `out` is null (refused) or points to a writable
/// `GraphsafeBuffer`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_prepare_weight(weight: *const GraphsafeNvfp4Matrix, stream: GraphsafeStream, out: *mut GraphsafeBuffer) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: the caller's contract (null is refused inside).
        let w = unsafe { read(weight, "weight")? };
        let s = stream_obj(stream)?;
        let prepared = eager_op((&s, stream.id), None, |t| {
            let m = nvfp4_matrix(&w, "weight", CallerMemory::on(t.context()))?;
            Ok(nvfp4::prepare_weight_on(&m, t)?)
        })?;
        let id = handles::insert(Tag::Buffer, std::sync::Arc::new(prepared))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeBuffer { id }) }
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

fn w4a16(a: &GraphsafeW4a16Args, weight: &DeviceBuffer, t: OpTarget<'_>) -> Result<(), Fail> {
    let ctx = CallerMemory::on(t.context());
    let at = matrix_2d(a.a, "a", DType::Bf16, (a.m, "m"), (a.k, "k"), a.lda, ctx)?;
    let dt = matrix_2d(a.d, "d", DType::Bf16, (a.m, "m"), (a.n, "n"), a.ldd, ctx)?;
    let w = WeightArg { mem: &weight, n: n(a.n, "n")?, k: n(a.k, "k")? };
    w4a16_on(&at, w, &ctx.pointer(a.alpha, "alpha")?, &dt, t)?;
    Ok(())
}

/// Eager W4A16 GEMM (Hopper): may grow `ws`. BUSY while the stream is capturing or `ws` is bound.
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeW4a16Args` whose device addresses are
/// allocations of `stream`'s device of the documented sizes, valid until the work finishes.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_w4a16_gemm(args: *const GraphsafeW4a16Args, ws: GraphsafeWorkspace, stream: GraphsafeStream) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        // Every handle first, before any lock (capi/mod.rs, rule 1).
        let weight = handles::get::<DeviceBuffer>(Tag::Buffer, a.weight.id)?;
        let (s, w) = (stream_obj(stream)?, workspace_obj(ws)?);
        eager_op((&s, stream.id), Some((&w, ws.id)), |t| w4a16(&a, &weight, t))
    })
}

/// Captured W4A16 GEMM: `ws` bound to `capture`, never grown; the prepared weight (a graphsafe
/// buffer) is kept alive by the graph.
///
/// # Safety
/// As graphsafe_nvfp4_w4a16_gemm, and the caller's memory (a, alpha, d) must stay valid for as
/// long as any graph made from the capture can run.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_w4a16_gemm_captured(args: *const GraphsafeW4a16Args, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let weight = handles::get::<DeviceBuffer>(Tag::Buffer, a.weight.id)?;
        let c = capture_obj(capture)?;
        captured_op((&c, capture.id), Some(ws.id), |t| w4a16(&a, &weight, t))
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

fn gemm(a: &GraphsafeNvfp4GemmArgs, t: OpTarget<'_>) -> Result<(), Fail> {
    let ctx = CallerMemory::on(t.context());
    let (am, bm) = (nvfp4_matrix(&a.a, "a", ctx)?, nvfp4_matrix(&a.b, "b", ctx)?);
    let dt = matrix_2d(a.d, "d", half_dtype(a.out_dtype, "out_dtype")?, (a.a.rows, "a.rows"), (a.b.rows, "b.rows"), a.b.rows as i64, ctx)?;
    gemm_on(&Nvfp4GemmArgs::new(am, bm, ctx.pointer(a.alpha, "alpha")?, dt), t)?;
    Ok(())
}

/// Eager block-scaled GEMM (Blackwell): may grow `ws`.
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeNvfp4GemmArgs` whose device addresses
/// are allocations of `stream`'s device of the documented sizes, valid until the work finishes.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_gemm(args: *const GraphsafeNvfp4GemmArgs, ws: GraphsafeWorkspace, stream: GraphsafeStream) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let (s, w) = (stream_obj(stream)?, workspace_obj(ws)?);
        eager_op((&s, stream.id), Some((&w, ws.id)), |t| gemm(&a, t))
    })
}

/// Captured block-scaled GEMM (Blackwell): `ws` bound to `capture`, never grown.
///
/// # Safety
/// As graphsafe_nvfp4_gemm, and the memory must stay valid for as long as any graph made from the
/// capture can run.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_nvfp4_gemm_captured(args: *const GraphsafeNvfp4GemmArgs, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let c = capture_obj(capture)?;
        captured_op((&c, capture.id), Some(ws.id), |t| gemm(&a, t))
    })
}

//! cuDNN matmul through the C ABI: plan before capture, execute eagerly or captured.

use super::core::{capture_obj, captured_op, eager_op, stream_obj, workspace_obj, GraphsafeCapture, GraphsafeContext, GraphsafeStream, GraphsafeWorkspace};
use super::handles::{self, Tag};
use super::mla::{GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_DTYPE_FP8_E4M3};
use super::{guard, null, put, read, CallerMemory, Fail, Raw};
use crate::driver::Context;
use crate::ops::cudnn::{self, matmul::matmul_on, Cudnn, MatmulArgs};
use crate::ops::tensor::{DType, Tensor};
use std::ffi::c_int;
use std::sync::Arc;

/// fp32 (cuDNN matmul output only).
pub const GRAPHSAFE_DTYPE_F32: c_int = 3;

/// C[b, m, n] = A[b, m, k] · B[b, k, n] over caller-owned device memory. Strides are in elements,
/// [batch, row, column]; a batch of 1 for A or B broadcasts it. Row- or column-major via strides.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GraphsafeCudnnMatmulArgs {
    /// GRAPHSAFE_DTYPE_BF16, _FP16 or _FP8_E4M3 (A and B).
    pub input_dtype: c_int,
    /// GRAPHSAFE_DTYPE_BF16, _FP16 or _F32 (C).
    pub output_dtype: c_int,
    /// Batch of C (1 for a plain GEMM).
    pub batch: c_int,
    /// Rows of A and C.
    pub m: c_int,
    /// Columns of B and C.
    pub n: c_int,
    /// Reduction length.
    pub k: c_int,
    /// A's device address.
    pub a: u64,
    /// A's batch (1 or `batch`).
    pub a_batch: c_int,
    /// A's strides [batch, row, column].
    pub a_strides: [i64; 3],
    /// B's device address.
    pub b: u64,
    /// B's batch (1 or `batch`).
    pub b_batch: c_int,
    /// B's strides [batch, row, column].
    pub b_strides: [i64; 3],
    /// C's device address (written).
    pub c: u64,
    /// C's strides [batch, row, column].
    pub c_strides: [i64; 3],
}

fn dt(v: c_int, what: &str, allowed: &[c_int]) -> Result<DType, Fail> {
    if !allowed.contains(&v) {
        return Err(crate::Error::invalid(what, "one of the GRAPHSAFE_DTYPE_* this argument takes", v).into());
    }
    Ok(match v {
        GRAPHSAFE_DTYPE_BF16 => DType::Bf16,
        GRAPHSAFE_DTYPE_FP16 => DType::Fp16,
        GRAPHSAFE_DTYPE_FP8_E4M3 => DType::Fp8E4m3,
        _ => DType::F32,
    })
}

fn us(v: i64, what: &str) -> Result<usize, Fail> {
    usize::try_from(v).map_err(|_| crate::Error::invalid(what, "a value >= 0", v).into())
}

fn to_args(a: &GraphsafeCudnnMatmulArgs, mem: CallerMemory<'_>) -> Result<MatmulArgs<Raw>, Fail> {
    let input = dt(a.input_dtype, "input_dtype", &[GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_DTYPE_FP8_E4M3])?;
    let output = dt(a.output_dtype, "output_dtype", &[GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_DTYPE_F32])?;
    let (m, n, k) = (us(a.m as i64, "m")?, us(a.n as i64, "n")?, us(a.k as i64, "k")?);
    let t = |ptr: u64, what: &str, dtype: DType, batch: i64, rows: usize, cols: usize, st: [i64; 3]| -> Result<Tensor<Raw>, Fail> {
        let strides = [us(st[0], what)?, us(st[1], what)?, us(st[2], what)?];
        Ok(Tensor::strided(mem.pointer(ptr, what)?, 0, dtype, &[us(batch, what)?, rows, cols], &strides))
    };
    Ok(MatmulArgs {
        a: t(a.a, "a", input, a.a_batch as i64, m, k, a.a_strides)?,
        b: t(a.b, "b", input, a.b_batch as i64, k, n, a.b_strides)?,
        c: t(a.c, "c", output, a.batch as i64, m, n, a.c_strides)?,
    })
}

fn handle(ctx: GraphsafeContext) -> Result<(Arc<Context>, Arc<Cudnn>), Fail> {
    let c = handles::get::<Context>(Tag::Context, ctx.id)?;
    let dnn = Cudnn::new(&c)?;
    Ok((c, dnn))
}

/// The captured entry points' lookup: the context's cuDNN state only if a plan call or an eager
/// call made it before. Never loads cuDNN or creates its handle (cudnnCreate allocates, which
/// would invalidate the caller's thread-local capture before the refusal).
fn existing_handle(ctx: GraphsafeContext) -> Result<Arc<Cudnn>, Fail> {
    let c = handles::get::<Context>(Tag::Context, ctx.id)?;
    Cudnn::existing(&c).ok_or_else(|| {
        crate::Error::invalid("ctx", "a context with a cuDNN plan built before the capture (graphsafe_cudnn_plan or an eager call)", "no cuDNN call on this context yet").into()
    })
}

/// cuDNN's version (major, minor, patch) as found at run time; GRAPHSAFE_ERROR_CUDNN_NOT_FOUND
/// (the text lists where it looked) without it. Thread-safe.
///
/// # Safety
/// Each output is null (refused) or points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_cudnn_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int) -> c_int {
    guard(|| {
        if major.is_null() || minor.is_null() || patch.is_null() {
            return Err(null("major/minor/patch"));
        }
        let (v, _) = cudnn::library_info()?;
        // SAFETY: non-null; the caller's contract.
        unsafe {
            put(major, "major", v.major as c_int)?;
            put(minor, "minor", v.minor as c_int)?;
            put(patch, "patch", v.patch as c_int)
        }
    })
}

/// Builds (once; cached for the process) the plan of this matmul on `ctx`'s device and returns the
/// workspace bytes its execute uses: call it for every problem you will capture, before capturing,
/// and pre-grow the workspace to the largest. The pointers are not dereferenced. Thread-safe.
/// The context's cuDNN handle and plans live until the process exits: an adopted context used
/// here must too (graphsafe_context_adopt).
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeCudnnMatmulArgs`; `workspace_bytes` is
/// null (refused) or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_cudnn_plan(ctx: GraphsafeContext, args: *const GraphsafeCudnnMatmulArgs, workspace_bytes: *mut u64) -> c_int {
    guard(|| {
        if workspace_bytes.is_null() {
            return Err(null("workspace_bytes"));
        }
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let (c, dnn) = handle(ctx)?;
        let p = to_args(&a, CallerMemory::planning(c.raw()))?.problem(c.raw())?;
        let bytes = cudnn::matmul::workspace_size(&dnn, &p)?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(workspace_bytes, "workspace_bytes", bytes) }
    })
}

/// Eager matmul on `stream` (of `ctx`'s device): builds the plan if needed, grows `ws` if needed.
/// BUSY while the stream is capturing or `ws` is bound to an open capture.
///
/// # Safety
/// `args` is null (refused) or points to a valid `GraphsafeCudnnMatmulArgs` whose device addresses
/// are allocations of `stream`'s device of the described layout, valid until the work finishes.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_cudnn_matmul(ctx: GraphsafeContext, args: *const GraphsafeCudnnMatmulArgs, ws: GraphsafeWorkspace, stream: GraphsafeStream) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        // Every handle (and the cuDNN handle, whose cache has its own lock) before any object lock.
        let (_, dnn) = handle(ctx)?;
        let (s, w) = (stream_obj(stream)?, workspace_obj(ws)?);
        eager_op((&s, stream.id), Some((&w, ws.id)), |t| {
            let m = to_args(&a, CallerMemory::on(t.context()))?;
            Ok(matmul_on(&dnn, &m, t)?)
        })
        .map(drop)
    })
}

/// Captured matmul: only a plan built before the capture (graphsafe_cudnn_plan or an eager call),
/// `ws` bound to `capture` and never grown (GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL otherwise).
/// GRAPHSAFE_ERROR_INVALID_ARGUMENT, with no cuDNN call at all, when no plan or eager call ever
/// ran on `ctx`: the capture is left as it was.
///
/// # Safety
/// As graphsafe_cudnn_matmul, and the memory must stay valid for as long as any graph made from the
/// capture can run.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_cudnn_matmul_captured(ctx: GraphsafeContext, args: *const GraphsafeCudnnMatmulArgs, capture: GraphsafeCapture, ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract (null is refused inside).
        let a = unsafe { read(args, "args")? };
        let dnn = existing_handle(ctx)?;
        let c = capture_obj(capture)?;
        captured_op((&c, capture.id), Some(ws.id), |t| {
            let m = to_args(&a, CallerMemory::on(t.context()))?;
            Ok(matmul_on(&dnn, &m, t)?)
        })
        .map(drop)
    })
}

//! The Blackwell block-scaled GEMM (`cuda-src/nvfp4/gemm.cuh`, `sm100/`, `sm120/`):
//! `D = alpha · A · Bᵀ`, A and B NVFP4, CUTLASS's kernel with the tile chosen by M.

use super::plan::{out_dtype, plan};
use super::{check_matrix, scalar, Nvfp4Arch, Nvfp4Matrix, Nvfp4Plan};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{mem_range, refuse_overlap, DType, DeviceMemory, Tensor};
use crate::sys::glue::nvfp4 as glue;
use crate::workspace::Workspace;

/// Arguments of one Blackwell GEMM, `d = alpha · a · bᵀ`. `M` is `&DeviceBuffer` eagerly,
/// [`CapturedBuffer`] in a capture.
///
/// Build one with [`Nvfp4GemmArgs::new`] (the fields are public to read and to change; the struct
/// is `#[non_exhaustive]`, so a new argument comes with a default and never breaks a caller).
/// [`Nvfp4GemmArgs::bind`] turns eager arguments into a capture's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Nvfp4GemmArgs<M> {
    /// A [m, k], NVFP4.
    pub a: Nvfp4Matrix<M>,
    /// B [n, k], NVFP4 (the same k).
    pub b: Nvfp4Matrix<M>,
    /// One device f32, read when the GEMM runs (so it may change between graph replays).
    pub alpha: M,
    /// D [m, n], bf16 or fp16, contiguous rows; overlapping none of the other operands.
    pub d: Tensor<M>,
}

impl<M> Nvfp4GemmArgs<M> {
    /// `d = alpha · a · bᵀ`. Nothing is checked here: the op checks everything before it launches.
    pub fn new(a: Nvfp4Matrix<M>, b: Nvfp4Matrix<M>, alpha: M, d: Tensor<M>) -> Self {
        Nvfp4GemmArgs { a, b, alpha, d }
    }
}

impl Nvfp4GemmArgs<&DeviceBuffer> {
    /// The same arguments inside `cap`: every buffer bound to the capture (so every graph made from
    /// it keeps them alive), shapes and strides unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<Nvfp4GemmArgs<CapturedBuffer<'id>>> {
        Ok(Nvfp4GemmArgs { a: self.a.bind(cap)?, b: self.b.bind(cap)?, alpha: cap.bind_buffer(self.alpha)?, d: self.d.bind(cap)? })
    }
}

/// Validate, size, launch: the one Blackwell GEMM path (Rust eager, Rust captured, C ABI).
pub(crate) fn gemm_on<M: DeviceMemory>(args: &Nvfp4GemmArgs<M>, mut target: OpTarget<'_>) -> Result<Nvfp4Plan> {
    let Nvfp4GemmArgs { a, b, alpha, d } = args;
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
    // Dense rows (a single row's stride is never used).
    if dm != a.rows || dn != b.rows || (dm > 1 && d.strides[0] != dn) {
        return Err(Error::invalid("d", format!("a contiguous [{}, {}]", a.rows, b.rows), format!("{:?} strides {:?}", d.shape, d.strides)));
    }
    scalar("alpha", alpha, ctx.raw())?;
    // d is written while other CTAs still read the operands and alpha.
    for (name, r) in a.ranges("a")?.into_iter().chain(b.ranges("b")?).chain([("alpha".to_string(), mem_range(alpha, 4))]) {
        refuse_overlap(("d", d.byte_range()), (&name, r))?;
    }
    let plan = plan(arch, a.rows as i64, b.rows as i64, a.k as i64, d.dtype, ctx.sm_count() as i64)?;
    let g = glue::Gemm {
        arch,
        a: a.admit("a", &mut target)?,
        b: b.admit("b", &mut target)?,
        alpha: target.admit("alpha", alpha)?,
        d: target.admit("d", &d.mem)?.skip("d", d.offset as u64)?,
        out: out_dtype(d.dtype)?,
        sm_count: ctx.sm_count() as i32,
    };
    let ws = target.workspace(plan.workspace_bytes)?;
    target.commit()?.glue(|stream| glue::gemm(&g, ws, stream))?;
    Ok(plan)
}

/// Blackwell: D[m, n] (bf16/fp16, contiguous) = alpha · A[m, k] · B[n, k]ᵀ, A and B NVFP4; eager.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, n, k) = (16, 4096, 4096);
/// // An NVFP4 matrix [rows, k]: packed e2m1 pairs, swizzled fp8 scales, one f32 global scale.
/// let matrix = |rows: usize| -> graphsafe::Result<[DeviceBuffer; 3]> {
///     let scales = nvfp4::scale_bytes(rows as i64, k as i64)? as usize;
///     Ok([DeviceBuffer::alloc_zeroed(&stream, rows * k / 2)?, DeviceBuffer::alloc_zeroed(&stream, scales)?, DeviceBuffer::from_host(&stream, &[1.0f32])?])
/// };
/// let ([ap, asc, ag], [bp, bsc, bg]) = (matrix(m)?, matrix(n)?);
/// let a = Nvfp4Matrix::new(&ap, &asc, &ag, m, k);
/// let b = Nvfp4Matrix::new(&bp, &bsc, &bg, n, k);
/// let alpha = DeviceBuffer::from_host(&stream, &[1.0f32])?;
/// let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?;
/// let d = Tensor::contiguous(&d, DType::Bf16, &[m, n]);
/// let mut ws = Workspace::new(&stream, 0)?;
/// let plan = nvfp4::gemm(&Nvfp4GemmArgs::new(a, b, &alpha, d), &mut ws, &stream)?;
/// assert_eq!(plan.tile, Some(nvfp4::gemm_tile(plan.arch, m as i64)?));
/// # Ok(()) }
/// ```
pub fn gemm(args: &Nvfp4GemmArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<Nvfp4Plan> {
    gemm_on(args, OpTarget::eager(stream, Some(ws))?)
}

/// Blackwell, captured: never grows the workspace; every view must belong to `cap`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let (m, n, k) = (16, 4096, 4096);
/// // An NVFP4 matrix [rows, k]: packed e2m1 pairs, swizzled fp8 scales, one f32 global scale.
/// let matrix = |rows: usize| -> graphsafe::Result<[DeviceBuffer; 3]> {
///     let scales = nvfp4::scale_bytes(rows as i64, k as i64)? as usize;
///     Ok([DeviceBuffer::alloc_zeroed(&stream, rows * k / 2)?, DeviceBuffer::alloc_zeroed(&stream, scales)?, DeviceBuffer::from_host(&stream, &[1.0f32])?])
/// };
/// let ([ap, asc, ag], [bp, bsc, bg]) = (matrix(m)?, matrix(n)?);
/// let a = Nvfp4Matrix::new(&ap, &asc, &ag, m, k);
/// let b = Nvfp4Matrix::new(&bp, &bsc, &bg, n, k);
/// let alpha = DeviceBuffer::from_host(&stream, &[1.0f32])?;
/// let d = DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?;
/// let d = Tensor::contiguous(&d, DType::Bf16, &[m, n]);
/// let arch = Nvfp4Arch::for_compute_capability(ctx.compute_capability())?;
/// let limits = Nvfp4Limits::new([1, 4, 16], n as u32, k as u32, ctx.sm_count());
/// let mut ws = Workspace::new(&stream, nvfp4::worst_case(arch, &limits)?.workspace_bytes)?;
/// let args = Nvfp4GemmArgs::new(a, b, &alpha, d);
/// let (graph, _plan) = stream.capture(CaptureMode::ThreadLocal, |cap| {
///     let w = cap.bind_workspace(&mut ws)?;
///     nvfp4::gemm_captured(&args.bind(cap)?, &w, cap)
/// })?;
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn gemm_captured<'id>(args: &Nvfp4GemmArgs<CapturedBuffer<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<Nvfp4Plan> {
    gemm_on(args, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

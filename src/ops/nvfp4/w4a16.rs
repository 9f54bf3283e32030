//! The Hopper weight-only GEMM (`cuda-src/nvfp4/sm90/`): `D = alpha · A(bf16) · Wᵀ(NVFP4)` over a
//! weight repacked once, outside capture, by [`prepare_weight`].

use super::plan::{check_nk, plan};
use super::{check_matrix, scalar, Nvfp4Arch, Nvfp4Matrix, Nvfp4Plan};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{mem_range, refuse_overlap};
use crate::ops::tensor::{DType, DeviceMemory, Tensor};
use crate::sys::glue::nvfp4 as glue;
use crate::workspace::Workspace;

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
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, n, k) = (16, 4096, 4096);
/// // The NVFP4 weight [n, k]: packed e2m1 pairs, swizzled fp8 scales, one f32 global scale.
/// let packed = DeviceBuffer::alloc_zeroed(&stream, n * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(n as i64, k as i64)? as usize)?;
/// let global = DeviceBuffer::from_host(&stream, &[1.0f32])?;
/// let weight = Nvfp4Matrix::new(&packed, &scales, &global, n, k);
/// let prepared = nvfp4::prepare_weight(&weight, &stream)?; // once per weight, outside capture
/// let (a, d) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let alpha = DeviceBuffer::from_host(&stream, &[1.0f32])?; // read at run time: may change between replays
/// let (a, d) = (Tensor::contiguous(&a, DType::Bf16, &[m, k]), Tensor::contiguous(&d, DType::Bf16, &[m, n]));
/// assert_eq!(prepared.shape(), (n, k));
/// let mut ws = Workspace::new(&stream, 0)?;
/// nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a, &prepared, &alpha, d), &mut ws, &stream)?;
/// # Ok(()) }
/// ```
pub fn prepare_weight(w: &Nvfp4Matrix<&DeviceBuffer>, stream: &Stream) -> Result<PreparedWeight> {
    let buf = prepare_weight_on(w, OpTarget::eager(stream, None)?)?;
    Ok(PreparedWeight { buf, n: w.rows, k: w.k })
}

/// [`prepare_weight`] over any memory on an eager target, returning the prepared buffer (the C
/// ABI's path too).
pub(crate) fn prepare_weight_on<M: DeviceMemory>(w: &Nvfp4Matrix<M>, mut target: OpTarget<'_>) -> Result<DeviceBuffer> {
    if target.is_captured() {
        return Err(Error::invalid("stream", "an eager stream (prepare_weight allocates: do it before capture)", "a capture"));
    }
    let ctx = target.context().clone();
    if Nvfp4Arch::for_compute_capability(ctx.compute_capability())? != Nvfp4Arch::Sm90 {
        return Err(Error::ArchUnsupported { op: "nvfp4 prepare_weight", need: "sm_90 (the weight-only kernel)".into(), have: format!("{:?}", ctx.compute_capability()) });
    }
    w.validate("w", ctx.raw())?;
    let (n, kk) = check_nk(w.rows as i64, w.k as i64)?;
    let bytes = glue::w4a16_prepared_bytes(n, kk)?;
    let len = usize::try_from(bytes).map_err(|_| Error::invalid("weight", "a prepared size that fits in memory", bytes))?;
    let buf = DeviceBuffer::alloc_zeroed(target.stream(), len)?;
    let src = w.admit("w", &mut target)?;
    let dst = target.admit("prepared", &&buf)?;
    target.commit()?.glue(|stream| glue::w4a16_prepare(&src, dst, stream))?;
    Ok(buf)
}

/// The W4A16 weight as the GEMM reads it: the prepared buffer (any memory kind) and its [n, k].
pub(crate) struct WeightArg<'w, W> {
    pub mem: &'w W,
    pub n: usize,
    pub k: usize,
}

/// Arguments of one W4A16 GEMM, `d = alpha · a · weightᵀ`. `M` is `&DeviceBuffer` and `W`
/// `&PreparedWeight` eagerly, [`CapturedBuffer`] and [`CapturedWeight`] in a capture.
///
/// Build one with [`W4a16GemmArgs::new`] (the fields are public to read and to change; the struct
/// is `#[non_exhaustive]`, so a new argument comes with a default and never breaks a caller).
/// [`W4a16GemmArgs::bind`] turns eager arguments into a capture's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct W4a16GemmArgs<M, W> {
    /// A [m, k], bf16, rows 16-byte aligned with a row stride a multiple of 8 elements.
    pub a: Tensor<M>,
    /// The [n, k] weight, prepared by [`prepare_weight`].
    pub weight: W,
    /// One device f32, read when the GEMM runs (so it may change between graph replays).
    pub alpha: M,
    /// D [m, n], bf16, any row stride; overlapping none of the other operands.
    pub d: Tensor<M>,
}

impl<M, W> W4a16GemmArgs<M, W> {
    /// `d = alpha · a · weightᵀ`. Nothing is checked here: the op checks everything before it
    /// launches.
    pub fn new(a: Tensor<M>, weight: W, alpha: M, d: Tensor<M>) -> Self {
        W4a16GemmArgs { a, weight, alpha, d }
    }
}

impl W4a16GemmArgs<&DeviceBuffer, &PreparedWeight> {
    /// The same arguments inside `cap`: every buffer and the weight bound to the capture (so every
    /// graph made from it keeps them alive), shapes and strides unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<W4a16GemmArgs<CapturedBuffer<'id>, CapturedWeight<'id>>> {
        Ok(W4a16GemmArgs { a: self.a.bind(cap)?, weight: self.weight.bind(cap)?, alpha: cap.bind_buffer(self.alpha)?, d: self.d.bind(cap)? })
    }
}

/// Validate, size, launch: the one W4A16 path (Rust eager, Rust captured, C ABI).
pub(crate) fn w4a16_on<M: DeviceMemory, W: DeviceMemory>(a: &Tensor<M>, w: WeightArg<'_, W>, alpha: &M, d: &Tensor<M>, mut target: OpTarget<'_>) -> Result<Nvfp4Plan> {
    let ctx = target.context().clone();
    let arch = Nvfp4Arch::for_compute_capability(ctx.compute_capability())?;
    if arch != Nvfp4Arch::Sm90 {
        return Err(Error::ArchUnsupported { op: "nvfp4 w4a16_gemm", need: "sm_90 (Blackwell: nvfp4::gemm)".into(), have: format!("{arch:?}") });
    }
    let (m, ka) = check_matrix("a", a, &[DType::Bf16], ctx.raw())?;
    let (dm, dn) = check_matrix("d", d, &[DType::Bf16], ctx.raw())?;
    if w.mem.context_raw() != ctx.raw() {
        return Err(Error::other_context("w.device", "a weight", "the stream's", ctx.raw(), w.mem.context_raw()));
    }
    if ka != w.k {
        return Err(Error::invalid("a.shape[1] (k)", format!("{}, the weight's k", w.k), ka));
    }
    if dm != m || dn != w.n {
        return Err(Error::invalid("d.shape", format!("[{m}, {}]", w.n), format!("[{dm}, {dn}]")));
    }
    scalar("alpha", alpha, ctx.raw())?;
    let plan = plan(arch, m as i64, w.n as i64, w.k as i64, DType::Bf16, ctx.sm_count() as i64)?;
    let need = plan.prepared_weight_bytes.unwrap_or(0);
    if (w.mem.len() as u64) < need {
        return Err(Error::invalid("weight", format!("a weight prepared for [{}, {}] ({need} bytes)", w.n, w.k), format!("{} bytes", w.mem.len())));
    }
    // d is written while other CTAs still read a, the weight and alpha (its epilogue reads alpha
    // and the weight's header): an overlap would make the result depend on timing.
    for (name, r) in [("a", a.byte_range()), ("weight", mem_range(w.mem, need)), ("alpha", mem_range(alpha, 4))] {
        refuse_overlap(("d", d.byte_range()), (name, r))?;
    }
    let g = glue::W4a16 {
        lda: a.leading_dim()?,
        ldd: d.leading_dim()?,
        a: target.admit("a", &a.mem)?.skip("a", a.offset as u64)?,
        weight: target.admit("weight", w.mem)?,
        alpha: target.admit("alpha", alpha)?,
        d: target.admit("d", &d.mem)?.skip("d", d.offset as u64)?,
        m: plan.m as i32,
        n: plan.n as i32,
        k: plan.k as i32,
        sm_count: ctx.sm_count() as i32,
    };
    let ws = target.workspace(plan.workspace_bytes)?;
    target.commit()?.glue(|stream| glue::w4a16_gemm(&g, ws, stream))?;
    Ok(plan)
}

/// Hopper: D[m, n] (bf16) = alpha · A[m, k] (bf16) · Wᵀ, eager (may grow `ws`).
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, n, k) = (16, 4096, 4096);
/// // The NVFP4 weight [n, k]: packed e2m1 pairs, swizzled fp8 scales, one f32 global scale.
/// let packed = DeviceBuffer::alloc_zeroed(&stream, n * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(n as i64, k as i64)? as usize)?;
/// let global = DeviceBuffer::from_host(&stream, &[1.0f32])?;
/// let weight = Nvfp4Matrix::new(&packed, &scales, &global, n, k);
/// let prepared = nvfp4::prepare_weight(&weight, &stream)?; // once per weight, outside capture
/// let (a, d) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let alpha = DeviceBuffer::from_host(&stream, &[1.0f32])?; // read at run time: may change between replays
/// let (a, d) = (Tensor::contiguous(&a, DType::Bf16, &[m, k]), Tensor::contiguous(&d, DType::Bf16, &[m, n]));
/// let mut ws = Workspace::new(&stream, 0)?; // grown as the plan needs
/// let plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a, &prepared, &alpha, d), &mut ws, &stream)?;
/// assert!(plan.schedule.is_some() && ws.capacity() >= plan.workspace_bytes);
/// # Ok(()) }
/// ```
pub fn w4a16_gemm(args: &W4a16GemmArgs<&DeviceBuffer, &PreparedWeight>, ws: &mut Workspace, stream: &Stream) -> Result<Nvfp4Plan> {
    let w = args.weight;
    let wa = WeightArg { mem: &&w.buf, n: w.n, k: w.k };
    w4a16_on(&args.a, wa, &args.alpha, &args.d, OpTarget::eager(stream, Some(ws))?)
}

/// Hopper, captured: never grows the workspace; every view must belong to `cap`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let (m, n, k) = (16, 4096, 4096);
/// // The NVFP4 weight [n, k]: packed e2m1 pairs, swizzled fp8 scales, one f32 global scale.
/// let packed = DeviceBuffer::alloc_zeroed(&stream, n * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(n as i64, k as i64)? as usize)?;
/// let global = DeviceBuffer::from_host(&stream, &[1.0f32])?;
/// let weight = Nvfp4Matrix::new(&packed, &scales, &global, n, k);
/// let prepared = nvfp4::prepare_weight(&weight, &stream)?; // once per weight, outside capture
/// let (a, d) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let alpha = DeviceBuffer::from_host(&stream, &[1.0f32])?; // read at run time: may change between replays
/// let (a, d) = (Tensor::contiguous(&a, DType::Bf16, &[m, k]), Tensor::contiguous(&d, DType::Bf16, &[m, n]));
/// // Size before capture: the most any captured M needs.
/// let limits = Nvfp4Limits::new([1, 2, 4, 8, 16], n as u32, k as u32, ctx.sm_count());
/// let mut ws = Workspace::new(&stream, nvfp4::worst_case(Nvfp4Arch::Sm90, &limits)?.workspace_bytes)?;
/// let args = W4a16GemmArgs::new(a, &prepared, &alpha, d);
/// let (graph, _plan) = stream.capture(CaptureMode::ThreadLocal, |cap| {
///     let w = cap.bind_workspace(&mut ws)?;
///     nvfp4::w4a16_gemm_captured(&args.bind(cap)?, &w, cap)
/// })?;
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn w4a16_gemm_captured<'id>(args: &W4a16GemmArgs<CapturedBuffer<'id>, CapturedWeight<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<Nvfp4Plan> {
    let w = &args.weight;
    let wa = WeightArg { mem: &w.buf, n: w.n, k: w.k };
    w4a16_on(&args.a, wa, &args.alpha, &args.d, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

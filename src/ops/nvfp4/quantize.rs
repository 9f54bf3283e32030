//! Quantize, dequantize and the global scale (`cuda-src/nvfp4/quantize.cu`): every arch, bit-exact
//! with [`super::reference`].

use super::{check_matrix, half_dtype, scalar, Nvfp4Matrix};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedBuffer};
use crate::ops::tensor::{mem_range, refuse_overlap, Check, DType, DeviceMemory, Tensor};
use crate::sys::glue::nvfp4 as glue;

/// Arguments of one quantize: `x` into `out` with the device scalar `global_scale`. `M` is
/// `&DeviceBuffer` eagerly, [`CapturedBuffer`] in a capture.
///
/// Build one with [`Nvfp4QuantizeArgs::new`] (the fields are public to read and to change; the
/// struct is `#[non_exhaustive]`, so a new argument comes with a default and never breaks a
/// caller). [`Nvfp4QuantizeArgs::bind`] turns eager arguments into a capture's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Nvfp4QuantizeArgs<M> {
    /// x [m, k], bf16 or fp16, rows 16-byte aligned; k a multiple of 32.
    pub x: Tensor<M>,
    /// One device f32 the kernel reads when it runs (usually [`global_scale`]'s result); `out`'s
    /// own `global_scale` is not read.
    pub global_scale: M,
    /// The NVFP4 [m, k] written: its packed values and scales; overlapping neither input.
    pub out: Nvfp4Matrix<M>,
}

impl<M> Nvfp4QuantizeArgs<M> {
    /// Quantize `x` with `global_scale` into `out`. Nothing is checked here: the op checks
    /// everything before it launches.
    pub fn new(x: Tensor<M>, global_scale: M, out: Nvfp4Matrix<M>) -> Self {
        Nvfp4QuantizeArgs { x, global_scale, out }
    }
}

impl Nvfp4QuantizeArgs<&DeviceBuffer> {
    /// The same arguments inside `cap`: every buffer bound to the capture (so every graph made from
    /// it keeps them alive), shapes and strides unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<Nvfp4QuantizeArgs<CapturedBuffer<'id>>> {
        Ok(Nvfp4QuantizeArgs { x: self.x.bind(cap)?, global_scale: cap.bind_buffer(self.global_scale)?, out: self.out.bind(cap)? })
    }
}

/// Validate, then launch: the one quantize path (Rust eager, Rust captured, C ABI).
pub(crate) fn quantize_on<M: DeviceMemory>(args: &Nvfp4QuantizeArgs<M>, mut target: OpTarget<'_>) -> Result<()> {
    let Nvfp4QuantizeArgs { x, global_scale: gs, out } = args;
    let ctx = target.context().clone();
    let (m, kk) = check_matrix("x", x, &[DType::Bf16, DType::Fp16], ctx.raw())?;
    if out.rows != m || out.k != kk {
        return Err(Error::invalid("out", format!("an NVFP4 matrix of [{m}, {kk}]"), format!("[{}, {}]", out.rows, out.k)));
    }
    out.validate("out", ctx.raw())?;
    scalar("global_scale", gs, ctx.raw())?;
    out.refuse_overlaps("out", &[("x".into(), x.byte_range()), ("global_scale".into(), mem_range(gs, 4))])?;
    let ld = x.leading_dim()?;
    let xs = target.admit("x", &x.mem)?.skip("x", x.offset as u64)?;
    let g = target.admit("global_scale", gs)?;
    let dst = out.admit("out", &mut target)?;
    target.commit()?.glue(|stream| glue::quantize(xs, half_dtype(x.dtype), ld, g, &dst, stream))
}

/// Quantizes x [m, k] (bf16/fp16) with the device global scale `gs` into `out`, on `stream`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, k) = (16, 4096);
/// let x = DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?; // bf16 activations
/// let x = Tensor::contiguous(&x, DType::Bf16, &[m, k]);
/// let gs = DeviceBuffer::alloc_zeroed(&stream, 4)?; // the f32 global scale
/// let packed = DeviceBuffer::alloc_zeroed(&stream, m * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(m as i64, k as i64)? as usize)?;
/// let q = Nvfp4Matrix::new(&packed, &scales, &gs, m, k);
/// nvfp4::global_scale(&x, &gs, &stream)?; // 448·6 / amax(|x|)
/// nvfp4::quantize(&Nvfp4QuantizeArgs::new(x.clone(), &gs, q.clone()), &stream)?;
/// # Ok(()) }
/// ```
pub fn quantize(args: &Nvfp4QuantizeArgs<&DeviceBuffer>, stream: &Stream) -> Result<()> {
    quantize_on(args, OpTarget::eager(stream, None)?)
}

/// Captures a quantize (every buffer bound to `cap`).
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let (m, k) = (16, 4096);
/// let x = DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?; // bf16 activations
/// let x = Tensor::contiguous(&x, DType::Bf16, &[m, k]);
/// let gs = DeviceBuffer::alloc_zeroed(&stream, 4)?; // the f32 global scale
/// let packed = DeviceBuffer::alloc_zeroed(&stream, m * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(m as i64, k as i64)? as usize)?;
/// let q = Nvfp4Matrix::new(&packed, &scales, &gs, m, k);
/// let args = Nvfp4QuantizeArgs::new(x, &gs, q);
/// let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| nvfp4::quantize_captured(&args.bind(cap)?, cap))?;
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn quantize_captured<'id>(args: &Nvfp4QuantizeArgs<CapturedBuffer<'id>>, cap: &Capture<'_, 'id>) -> Result<()> {
    quantize_on(args, OpTarget::captured(cap.site(), None)?)
}

/// The inverse: `out` [m, k] (bf16/fp16) from an NVFP4 matrix, on `stream`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, k) = (16, 4096);
/// let x = DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?; // bf16 activations
/// let x = Tensor::contiguous(&x, DType::Bf16, &[m, k]);
/// let gs = DeviceBuffer::alloc_zeroed(&stream, 4)?; // the f32 global scale
/// let packed = DeviceBuffer::alloc_zeroed(&stream, m * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(m as i64, k as i64)? as usize)?;
/// let q = Nvfp4Matrix::new(&packed, &scales, &gs, m, k);
/// nvfp4::global_scale(&x, &gs, &stream)?;
/// nvfp4::quantize(&Nvfp4QuantizeArgs::new(x.clone(), &gs, q.clone()), &stream)?;
/// let back = DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?;
/// nvfp4::dequantize(&q, &Tensor::contiguous(&back, DType::Bf16, &[m, k]), &stream)?;
/// # Ok(()) }
/// ```
pub fn dequantize(src: &Nvfp4Matrix<&DeviceBuffer>, out: &Tensor<&DeviceBuffer>, stream: &Stream) -> Result<()> {
    let mut target = OpTarget::eager(stream, None)?;
    let ctx = target.context().clone();
    src.validate("src", ctx.raw())?;
    let (m, kk) = check_matrix("out", out, &[DType::Bf16, DType::Fp16], ctx.raw())?;
    if src.rows != m || src.k != kk {
        return Err(Error::invalid("out.shape", format!("[{}, {}]", src.rows, src.k), format!("[{m}, {kk}]")));
    }
    for (name, r) in src.ranges("src")? {
        refuse_overlap(("out", out.byte_range()), (&name, r))?;
    }
    let ld = out.leading_dim()?;
    let s = src.admit("src", &mut target)?;
    let o = target.admit("out", &out.mem)?.skip("out", out.offset as u64)?;
    target.commit()?.glue(|stream| glue::dequantize(&s, half_dtype(out.dtype), o, ld, stream))
}

/// `out[0] = 448·6 / amax(|x|)` over a contiguous bf16/fp16 tensor (1 when amax is 0 or not finite).
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let (m, k) = (16, 4096);
/// let x = DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?; // bf16 activations
/// let x = Tensor::contiguous(&x, DType::Bf16, &[m, k]);
/// let gs = DeviceBuffer::alloc_zeroed(&stream, 4)?; // the f32 global scale
/// let packed = DeviceBuffer::alloc_zeroed(&stream, m * k / 2)?;
/// let scales = DeviceBuffer::alloc_zeroed(&stream, nvfp4::scale_bytes(m as i64, k as i64)? as usize)?;
/// let q = Nvfp4Matrix::new(&packed, &scales, &gs, m, k);
/// nvfp4::global_scale(&x, &gs, &stream)?;
/// let scale = gs.to_host_vec::<f32>(&stream)?[0]; // 1.0 for the all-zero x
/// # let _ = (scale, q); Ok(()) }
/// ```
pub fn global_scale(x: &Tensor<&DeviceBuffer>, out: &DeviceBuffer, stream: &Stream) -> Result<()> {
    let mut target = OpTarget::eager(stream, None)?;
    let ctx = target.context().clone();
    let ch = Check { name: "x", t: x };
    ch.dtype(&[DType::Bf16, DType::Fp16])?.contiguous()?.aligned(16)?.in_bounds()?.device(ctx.raw())?;
    scalar("out", &out, ctx.raw())?;
    // The glue zeroes `out` before its amax kernel reads `x`.
    refuse_overlap(("out", mem_range(&out, 4)), ("x", x.byte_range()))?;
    let n = x.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| Error::invalid("x.shape", "a tensor that fits in memory", format!("{:?}", x.shape)))?;
    if n == 0 {
        return Err(Error::invalid("x.shape", "at least one element", format!("{:?}", x.shape)));
    }
    let n = i64::try_from(n).map_err(|_| Error::invalid("x.shape", "fewer than 2^63 elements", n))?;
    let xs = target.admit("x", &x.mem)?.skip("x", x.offset as u64)?;
    let g = target.admit("out", &out)?;
    target.commit()?.glue(|stream| glue::global_scale(xs, half_dtype(x.dtype), n, g, stream))
}

//! Tensor arguments of the ops: device memory plus dtype, shape, strides and a byte offset, and the
//! checks every op runs on them (dtype, shape, stride, alignment, bounds, device).
//!
//! `M` is the memory: `&DeviceBuffer` for eager calls, [`CapturedBuffer`] inside a capture (so a
//! captured op can only be given buffers the graph keeps alive).

use crate::driver::{DeviceBuffer, DevicePtr};
use crate::error::{Error, Result};
use crate::graph::{Capture, CapturedBuffer};
use crate::sys::cuda as c;
use std::fmt;

/// Element types of op arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// bfloat16
    Bf16,
    /// float16
    Fp16,
    /// float8 e4m3
    Fp8E4m3,
    /// float32
    F32,
    /// int32
    I32,
    /// raw bytes (packed FP4 pairs, fp8 scale factors)
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Fp8E4m3 | DType::U8 => 1,
            DType::Bf16 | DType::Fp16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::Bf16 => "bf16",
            DType::Fp16 => "fp16",
            DType::Fp8E4m3 => "fp8_e4m3",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::U8 => "u8",
        })
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    /// The names [`DType`]'s `Display` writes, and the usual others (`bfloat16`, `half`, `fp8`, …).
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "fp16" | "f16" | "half" | "float16" => Ok(DType::Fp16),
            "fp8" | "fp8_e4m3" | "fp8-e4m3" | "e4m3" => Ok(DType::Fp8E4m3),
            "f32" | "fp32" | "float" | "float32" => Ok(DType::F32),
            "i32" | "int32" => Ok(DType::I32),
            "u8" | "uint8" => Ok(DType::U8),
            _ => Err(Error::invalid("dtype", "bf16, fp16, fp8, f32, i32 or u8", s)),
        }
    }
}

impl Tensor<&DeviceBuffer> {
    /// The same view inside `cap`: its buffer bound to the capture (so every graph made from it
    /// keeps the buffer alive), offset, dtype, shape and strides unchanged. A buffer of another
    /// device is refused.
    ///
    /// ```no_run
    /// use graphsafe::prelude::*;
    /// # fn main() -> graphsafe::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let mut stream = Stream::new(&ctx)?;
    /// let buf = DeviceBuffer::alloc_zeroed(&stream, 64 * 128 * 2)?;
    /// let x = Tensor::contiguous(&buf, DType::Bf16, &[64, 128]);
    /// let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| {
    ///     let xc = x.bind(cap)?; // a Tensor<CapturedBuffer>, what captured ops take
    ///     assert_eq!(xc.shape, [64, 128]);
    ///     Ok(())
    /// })?;
    /// assert_eq!(graph.kept_alive(), 1);
    /// # Ok(()) }
    /// ```
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<Tensor<CapturedBuffer<'id>>> {
        Ok(self.clone().with_mem(cap.bind_buffer(self.mem)?))
    }
}

/// Device memory an op argument can live in (defined by the graph layer, which records what a
/// capture bakes in; re-exported here, where the ops take it).
pub use crate::graph::DeviceMemory;

/// A strided view of device memory. Strides are in elements.
#[derive(Clone, Debug)]
pub struct Tensor<M> {
    /// The memory.
    pub mem: M,
    /// Byte offset of element [0, 0, …] from the memory's base.
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Strides in elements, one per dimension.
    pub strides: Vec<usize>,
}

impl<M: DeviceMemory> Tensor<M> {
    /// A row-major contiguous tensor at the start of `mem`. (Strides of a shape too large for
    /// memory saturate; the ops' bounds check then refuses the tensor.)
    pub fn contiguous(mem: M, dtype: DType, shape: &[usize]) -> Self {
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
        }
        Tensor { mem, offset: 0, dtype, shape: shape.to_vec(), strides }
    }

    /// A tensor with explicit strides (in elements) at byte `offset` of `mem`.
    pub fn strided(mem: M, offset: usize, dtype: DType, shape: &[usize], strides: &[usize]) -> Self {
        Tensor { mem, offset, dtype, shape: shape.to_vec(), strides: strides.to_vec() }
    }

    /// The same view over other memory (e.g. the buffer bound to a capture).
    pub fn with_mem<N: DeviceMemory>(self, mem: N) -> Tensor<N> {
        Tensor { mem, offset: self.offset, dtype: self.dtype, shape: self.shape, strides: self.strides }
    }

    /// Address of element [0, 0, …] (wrapping: an offset past the address space is refused by
    /// the ops' bounds check before any address is used).
    pub fn device_ptr(&self) -> DevicePtr {
        self.mem.device_ptr().wrapping_add(self.offset as u64)
    }

    /// Bytes from element [0, …] to one past the last element (0 for an empty tensor); `None`
    /// when that does not fit in a `usize`.
    fn extent_bytes(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last = 0usize;
        for (d, s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((d - 1).checked_mul(*s)?)?;
        }
        last.checked_add(1)?.checked_mul(self.dtype.size())
    }

    /// Byte range `[start, end)` its elements span (`None` for an empty tensor, or one whose
    /// extent does not fit in the address space, which the bounds check refuses).
    pub(crate) fn byte_range(&self) -> Option<(u64, u64)> {
        let bytes = self.extent_bytes().filter(|&b| b > 0)?;
        let start = self.device_ptr();
        Some((start, start.checked_add(bytes as u64)?))
    }

    /// Stride `i` in elements as the kernels take it (`i64`); the bounds check already proved it
    /// fits (an extent that fits in the address space bounds every used stride).
    pub(crate) fn stride_i64(&self, i: usize) -> Result<i64> {
        let s = self.strides.get(i).copied().unwrap_or(0);
        i64::try_from(s).map_err(|_| Error::invalid(format!("strides[{i}]"), "a stride below 2^63 elements", s))
    }

    /// The leading dimension to hand a kernel of a row-major [rows, cols] matrix: its row stride,
    /// or `cols` when it has one row. A single row's stride is never used (so the op's checks let
    /// any value through), but the kernel glue checks the leading dimension it is given (at least
    /// cols, 16-byte rows) after the op committed: with the tensor's own stride an eager call would
    /// grow its workspace and then be refused.
    pub(crate) fn leading_dim(&self) -> Result<i64> {
        if self.shape.first().is_some_and(|&rows| rows <= 1) {
            let cols = self.shape.get(1).copied().unwrap_or(1);
            return i64::try_from(cols).map_err(|_| Error::invalid("shape[1]", "below 2^63", cols));
        }
        self.stride_i64(0)
    }
}

/// Whether no two elements of a tensor of `shape` and `strides` (elements) share an address: over
/// the dimensions of size > 1 in order of stride, each stride steps past everything the smaller
/// ones span. (Sufficient, and what every layout the ops take satisfies; a layout that interleaves
/// two dimensions without aliasing is refused too.)
pub(crate) fn elements_disjoint(shape: &[usize], strides: &[usize]) -> bool {
    let mut dims: Vec<(usize, usize)> = shape.iter().zip(strides).filter(|(&d, _)| d > 1).map(|(&d, &s)| (s, d)).collect();
    dims.sort_unstable();
    let mut span = 1usize; // elements the smaller strides reach, plus one
    for (stride, size) in dims {
        if stride < span {
            return false;
        }
        span = stride.saturating_mul(size - 1).saturating_add(span);
    }
    true
}

/// `[start, start + bytes)` of `m`'s memory (`None` when empty): for [`refuse_overlap`].
pub(crate) fn mem_range<M: DeviceMemory + ?Sized>(m: &M, bytes: u64) -> Option<(u64, u64)> {
    if bytes == 0 {
        return None;
    }
    let start = m.device_ptr();
    Some((start, start.checked_add(bytes)?))
}

/// Refuses a tensor a kernel writes (`written`) overlapping memory it trusts or another output
/// (`other`): `InvalidArgument` naming `written`. Ranges are `[start, end)` byte ranges (`None`:
/// empty, nothing to overlap).
pub(crate) fn refuse_overlap(written: (&str, Option<(u64, u64)>), other: (&str, Option<(u64, u64)>)) -> Result<()> {
    if let ((name, Some((w0, w1))), (what, Some((o0, o1)))) = (written, other) {
        if w0 < o1 && o0 < w1 {
            return Err(Error::invalid(name, format!("memory that does not overlap {what}"), format!("[{w0:#x}, {w1:#x}) overlapping [{o0:#x}, {o1:#x})")));
        }
    }
    Ok(())
}

/// Argument checks shared by the ops. Each returns `InvalidArgument` naming the argument.
pub(crate) struct Check<'a, M> {
    pub name: &'a str,
    pub t: &'a Tensor<M>,
}

impl<M: DeviceMemory> Check<'_, M> {
    pub fn dtype(&self, allowed: &[DType]) -> Result<&Self> {
        if !allowed.contains(&self.t.dtype) {
            let list: Vec<String> = allowed.iter().map(|d| d.to_string()).collect();
            return Err(Error::invalid(format!("{}.dtype", self.name), list.join(" or "), self.t.dtype));
        }
        Ok(self)
    }

    /// `expected[i] == None` accepts any size in dimension i.
    pub fn shape(&self, expected: &[Option<usize>]) -> Result<&Self> {
        let fmt = |v: &[Option<usize>]| {
            let parts: Vec<String> = v.iter().map(|d| d.map_or("*".to_string(), |n| n.to_string())).collect();
            format!("[{}]", parts.join(", "))
        };
        let ok = self.t.shape.len() == expected.len()
            && self.t.shape.iter().zip(expected).all(|(s, e)| e.is_none_or(|e| e == *s));
        if !ok || self.t.strides.len() != self.t.shape.len() {
            return Err(Error::invalid(format!("{}.shape", self.name), fmt(expected), format!("{:?}", self.t.shape)));
        }
        Ok(self)
    }

    /// The last dimension is contiguous.
    pub fn inner_contiguous(&self) -> Result<&Self> {
        if self.t.strides.last().is_some_and(|&s| s != 1) && self.t.shape.last().is_some_and(|&n| n > 1) {
            return Err(Error::invalid(format!("{}.strides", self.name), "innermost stride 1", format!("{:?}", self.t.strides)));
        }
        Ok(self)
    }

    /// Row-major contiguous.
    pub fn contiguous(&self) -> Result<&Self> {
        let mut expect = 1usize;
        for i in (0..self.t.shape.len()).rev() {
            if self.t.shape[i] > 1 && self.t.strides.get(i) != Some(&expect) {
                return Err(Error::invalid(
                    format!("{}.strides", self.name),
                    "row-major contiguous strides",
                    format!("{:?} for shape {:?}", self.t.strides, self.t.shape),
                ));
            }
            expect = expect.saturating_mul(self.t.shape[i]);
        }
        Ok(self)
    }

    /// The base address and every outer stride are multiples of `bytes`.
    pub fn aligned(&self, bytes: usize) -> Result<&Self> {
        if self.t.device_ptr() % bytes as u64 != 0 {
            return Err(Error::invalid(format!("{}.address", self.name), format!("{bytes}-byte aligned"), format!("{:#x}", self.t.device_ptr())));
        }
        let n = self.t.strides.len();
        for (i, s) in self.t.strides.iter().enumerate().take(n.saturating_sub(1)) {
            // A stride whose byte size overflows cannot be in bounds either; refuse it here, named.
            let stride_bytes = s.checked_mul(self.t.dtype.size());
            if self.t.shape.get(i).is_some_and(|&d| d > 1) && stride_bytes.is_none_or(|b| b % bytes != 0) {
                return Err(Error::invalid(
                    format!("{}.strides[{i}]", self.name),
                    format!("a multiple of {bytes} bytes"),
                    format!("{} elements of {}", s, self.t.dtype),
                ));
            }
        }
        Ok(self)
    }

    /// Every element lies inside the memory, and inside the address space (for caller-owned
    /// memory of unknown size: base + offset + extent must not wrap, every stride fits an `i64`).
    pub fn in_bounds(&self) -> Result<&Self> {
        let end = self.t.extent_bytes().and_then(|e| e.checked_add(self.t.offset));
        let addressable = end.is_some_and(|end| {
            self.t.mem.device_ptr().checked_add(end as u64).is_some()
                && self.t.shape.iter().zip(&self.t.strides).all(|(&d, &s)| d <= 1 || i64::try_from(s).is_ok())
        });
        match end {
            Some(end) if end <= self.t.mem.len() && addressable => Ok(self),
            _ => Err(Error::invalid(
                format!("{}.extent", self.name),
                format!("within its buffer of {} bytes", self.t.mem.len()),
                format!("offset {} + shape {:?} strides {:?} of {}", self.t.offset, self.t.shape, self.t.strides, self.t.dtype),
            )),
        }
    }

    /// No two elements share an address (a tensor a kernel writes: elements written twice by
    /// different threads would race, and the result depend on timing). Checked on the dimensions
    /// of size > 1 in order of stride: each stride must step past everything the smaller ones span.
    pub fn no_self_overlap(&self) -> Result<&Self> {
        if !elements_disjoint(&self.t.shape, &self.t.strides) {
            return Err(Error::invalid(
                format!("{}.strides", self.name),
                "strides under which no two elements share an address (a written tensor)",
                format!("{:?} for shape {:?}", self.t.strides, self.t.shape),
            ));
        }
        Ok(self)
    }

    /// The memory belongs to context `ctx` (the stream's).
    pub fn device(&self, ctx: c::CUcontext) -> Result<&Self> {
        if self.t.mem.context_raw() != ctx {
            return Err(Error::other_context(format!("{}.device", self.name), "memory", "the stream's", ctx, self.t.mem.context_raw()));
        }
        Ok(self)
    }
}

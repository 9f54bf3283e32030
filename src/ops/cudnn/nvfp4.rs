//! NVFP4 block-scaled matmul (Blackwell): `C = alpha · dequant(A, sA) · dequant(B, sB)`.
//!
//! ```text
//! a        [batch, M, K] fp4 e2m1, row-major, two values per byte (K/2 bytes a row)
//! a_scale  [batch, ⌈M/128⌉·128, ⌈K/16/4⌉·4] fp8 e4m3, one per 16 values of a row, F8_128x4 order
//! b        [batch, K, N] fp4 e2m1, column-major (K contiguous: a weight stored [N, K])
//! b_scale  [batch, ⌈K/16/4⌉·4, ⌈N/128⌉·128] fp8 e4m3, F8_128x4 order
//! alpha    one f32 in device memory (the global scale: both tensors' per-tensor scales)
//! c        [batch, M, N] bf16 | fp16 | f32, row-major
//! ```
//!
//! One cuDNN operation graph: two `BLOCK_SCALE_DEQUANTIZE` nodes (block 16), a matmul with fp32
//! compute, and a pointwise multiply by alpha. cuDNN has engines for it on Blackwell (sm_100,
//! sm_103, sm_120, sm_121) from cuDNN 9.7. Anywhere else the call returns
//! [`Error::ArchUnsupported`] naming what it needs (the GPU first, then the cuDNN version) before
//! touching cuDNN. Planning, the workspace rules and capture behave as for [`super::matmul`](mod@super::matmul).

use super::{data_type, Cudnn, OpKey, PlanInfo, Version};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{Check, DType, DeviceMemory, Tensor};
use crate::sys::cuda as cu;
use crate::sys::cudnn::backend::{Attr, Descriptor, Handle, Kind, OpGraph, TensorSpec, TENSOR_ALIGNMENT};
use crate::sys::cudnn::{ffi as c, Api};
use crate::workspace::Workspace;
use std::sync::Arc;

/// Values per block scale.
pub const NVFP4_BLOCK: usize = 16;
/// The first cuDNN with block-scale dequantize (and NVFP4 matmul engines on Blackwell).
pub const NVFP4_MIN_VERSION: Version = Version::new(9, 7, 0);

const UID_A: i64 = 10;
const UID_SA: i64 = 11;
const UID_B: i64 = 12;
const UID_SB: i64 = 13;
const UID_ALPHA: i64 = 14;
const UID_C: i64 = 15;
const UID_DA: i64 = 100;
const UID_DB: i64 = 101;
const UID_ACC: i64 = 102;

/// The shape of one NVFP4 matmul (everything that selects its plan). Made with
/// [`Nvfp4Problem::new`] and [`Nvfp4Problem::with_batch`] (`#[non_exhaustive]`: a new field comes
/// with a default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub struct Nvfp4Problem {
    /// Batch (1 = not batched).
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The reduction (a multiple of 16).
    pub k: usize,
    /// C's dtype: bf16, fp16 or f32.
    pub out: DType,
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m).saturating_mul(m)
}

impl Nvfp4Problem {
    /// An unbatched problem.
    pub fn new(m: usize, n: usize, k: usize, out: DType) -> Nvfp4Problem {
        Nvfp4Problem { batch: 1, m, n, k, out }
    }

    /// `batch` independent problems.
    pub fn with_batch(mut self, batch: usize) -> Nvfp4Problem {
        self.batch = batch;
        self
    }

    /// Host checks; errors name the field.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [("batch", self.batch), ("m", self.m), ("n", self.n), ("k", self.k)] {
            crate::error::positive(what, v.try_into().unwrap_or(i64::MAX))?;
        }
        if self.k % NVFP4_BLOCK != 0 {
            return Err(Error::invalid("k", format!("a multiple of {NVFP4_BLOCK} (the scale block)"), self.k));
        }
        if ![DType::Bf16, DType::Fp16, DType::F32].contains(&self.out) {
            return Err(Error::invalid("c.dtype", "bf16, fp16 or f32", self.out));
        }
        // Every size below must be exact (they saturate otherwise): bound them all by 2^62 bytes.
        let fits = |parts: &[usize]| parts.iter().try_fold(1u128, |a, &p| Some(a * p as u128)).is_some_and(|v| v < 1 << 62);
        let kb = self.k.div_ceil(NVFP4_BLOCK * 4) * 4;
        let (mp, np) = (self.m.div_ceil(128) * 128, self.n.div_ceil(128) * 128);
        let out = self.out.size();
        if !(fits(&[self.batch, self.m, self.k]) && fits(&[self.batch, self.n, self.k]) && fits(&[self.batch, mp, kb]) && fits(&[self.batch, np, kb]) && fits(&[self.batch, self.m, self.n, out])) {
            return Err(Error::invalid("problem", "operands whose sizes fit in memory (below 2^62 bytes)", self.label()));
        }
        Ok(())
    }

    /// Scale blocks along K, padded to the F8_128x4 tile (4).
    fn k_blocks(&self) -> usize {
        round_up(self.k / NVFP4_BLOCK, 4)
    }

    /// Bytes of packed A (`batch·M·K/2`).
    pub fn a_bytes(&self) -> usize {
        self.batch.saturating_mul(self.m).saturating_mul(self.k) / 2
    }
    /// Bytes of packed B (`batch·K·N/2`).
    pub fn b_bytes(&self) -> usize {
        self.batch.saturating_mul(self.n).saturating_mul(self.k) / 2
    }
    /// Bytes of A's scales (`batch·⌈M/128⌉·128·⌈K/64⌉·4`).
    pub fn a_scale_bytes(&self) -> usize {
        self.batch.saturating_mul(round_up(self.m, 128)).saturating_mul(self.k_blocks())
    }
    /// Bytes of B's scales (`batch·⌈K/64⌉·4·⌈N/128⌉·128`).
    pub fn b_scale_bytes(&self) -> usize {
        self.batch.saturating_mul(round_up(self.n, 128)).saturating_mul(self.k_blocks())
    }

    /// A short description for planners and logs.
    pub fn label(&self) -> String {
        format!("cudnn nvfp4 matmul ->{} batch={} m={} n={} k={}", self.out, self.batch, self.m, self.n, self.k)
    }

    pub(crate) fn graph(&self, api: &'static Api, handle: &Handle) -> Result<OpGraph> {
        let (b, m, n, k) = (self.batch as i64, self.m as i64, self.n as i64, self.k as i64);
        let (mp, np, kb) = (round_up(self.m, 128) as i64, round_up(self.n, 128) as i64, self.k_blocks() as i64);
        let fp4 = c::cudnnDataType_t::CUDNN_DATA_FP4_E2M1;
        let fp8 = c::cudnnDataType_t::CUDNN_DATA_FP8_E4M3;
        let f32_ = c::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let out = data_type(self.out).ok_or_else(|| Error::invalid("c.dtype", "bf16, fp16 or f32", self.out))?;
        let reorder = c::cudnnBackendTensorReordering_t::CUDNN_TENSOR_REORDERING_F8_128x4;

        let a = TensorSpec::io(UID_A, fp4, &[b, m, k], &[m * k, k, 1]).build(api)?;
        let sa = TensorSpec { reordering: Some(reorder), ..TensorSpec::io(UID_SA, fp8, &[b, mp, kb], &[mp * kb, kb, 1]) }.build(api)?;
        let bq = TensorSpec::io(UID_B, fp4, &[b, k, n], &[k * n, 1, k]).build(api)?;
        let sb = TensorSpec { reordering: Some(reorder), ..TensorSpec::io(UID_SB, fp8, &[b, kb, np], &[np * kb, 1, kb]) }.build(api)?;
        let alpha = TensorSpec::io(UID_ALPHA, f32_, &[1, 1, 1], &[1, 1, 1]).build(api)?;
        let cc = TensorSpec::io(UID_C, out, &[b, m, n], &[m * n, n, 1]).build(api)?;
        let da = TensorSpec::virt(UID_DA, f32_, &[b, m, k], &[m * k, k, 1]).build(api)?;
        let db = TensorSpec::virt(UID_DB, f32_, &[b, k, n], &[k * n, 1, k]).build(api)?;
        let acc = TensorSpec::virt(UID_ACC, f32_, &[b, m, n], &[m * n, n, 1]).build(api)?;

        let dequant = |x: &Descriptor, s: &Descriptor, y: &Descriptor| -> Result<Descriptor> {
            let d = Descriptor::new(api, Kind::CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR)?;
            d.set_descs(Attr::CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_XDESC, &[x])?;
            d.set_descs(Attr::CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_SCALE_DESC, &[s])?;
            d.set_descs(Attr::CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_YDESC, &[y])?;
            d.set_dtype(Attr::CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_MATH_PREC, f32_)?;
            d.set_i32s(Attr::CUDNN_ATTR_OPERATION_BLOCK_SCALE_DEQUANTIZE_BLOCK_SIZE, &[NVFP4_BLOCK as i32])?;
            d.finalize()?;
            Ok(d)
        };
        let deq_a = dequant(&a, &sa, &da)?;
        let deq_b = dequant(&bq, &sb, &db)?;

        let mm = Descriptor::new(api, Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set_dtype(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, f32_)?;
        mm.finalize()?;
        let op_mm = Descriptor::new(api, Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op_mm.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[&da])?;
        op_mm.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[&db])?;
        op_mm.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[&acc])?;
        op_mm.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        op_mm.finalize()?;

        let pw = Descriptor::new(api, Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        pw.set_pointwise_mode(Attr::CUDNN_ATTR_POINTWISE_MODE, c::cudnnPointwiseMode_t::CUDNN_POINTWISE_MUL)?;
        pw.set_dtype(Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, f32_)?;
        pw.finalize()?;
        let op_scale = Descriptor::new(api, Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op_scale.set_descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        op_scale.set_descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[&acc])?;
        op_scale.set_descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[&alpha])?;
        op_scale.set_descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[&cc])?;
        op_scale.finalize()?;

        OpGraph::new(
            api,
            handle,
            vec![deq_a, deq_b, op_mm, op_scale],
            vec![mm, pw, a, sa, bq, sb, alpha, cc, da, db, acc],
            vec![UID_A, UID_SA, UID_B, UID_SB, UID_ALPHA, UID_C],
        )
    }
}

/// Arguments of one NVFP4 matmul. `M` is `&DeviceBuffer` eagerly, [`CapturedBuffer`] in a capture.
/// The quantized operands are raw memory (their layout is fixed by the problem); `c` is a tensor.
/// Made with [`Nvfp4MatmulArgs::new`] (the fields are public to read and to change; the struct is
/// `#[non_exhaustive]`, so a new field comes with a default and breaks no caller).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Nvfp4MatmulArgs<M> {
    /// The problem (batch, M, N, K, C's dtype).
    pub problem: Nvfp4Problem,
    /// Packed A, at least [`Nvfp4Problem::a_bytes`].
    pub a: M,
    /// A's scales, at least [`Nvfp4Problem::a_scale_bytes`].
    pub a_scale: M,
    /// Packed B, at least [`Nvfp4Problem::b_bytes`].
    pub b: M,
    /// B's scales, at least [`Nvfp4Problem::b_scale_bytes`].
    pub b_scale: M,
    /// One f32: the global scale.
    pub alpha: M,
    /// C: [batch, M, N] (or [M, N] unbatched), row-major contiguous, of the problem's dtype.
    pub c: Tensor<M>,
}

impl<M> Nvfp4MatmulArgs<M> {
    /// `c = alpha · A · Bᵀ` for `problem`, A and B NVFP4 (packed values and their scales).
    /// Nothing is checked here: the op checks everything before it executes.
    pub fn new(problem: Nvfp4Problem, a: M, a_scale: M, b: M, b_scale: M, alpha: M, c: Tensor<M>) -> Self {
        Nvfp4MatmulArgs { problem, a, a_scale, b, b_scale, alpha, c }
    }
}

impl Nvfp4MatmulArgs<&DeviceBuffer> {
    /// The same matmul inside `cap`: every buffer bound to the capture (so every graph made from
    /// it keeps them alive), the problem and views unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<Nvfp4MatmulArgs<CapturedBuffer<'id>>> {
        Ok(Nvfp4MatmulArgs::new(
            self.problem,
            cap.bind_buffer(self.a)?,
            cap.bind_buffer(self.a_scale)?,
            cap.bind_buffer(self.b)?,
            cap.bind_buffer(self.b_scale)?,
            cap.bind_buffer(self.alpha)?,
            self.c.bind(cap)?,
        ))
    }
}

impl<M: DeviceMemory> Nvfp4MatmulArgs<M> {
    /// Validates sizes, alignment and device (`ctx` null skips the device check).
    pub fn validate(&self, ctx: cu::CUcontext) -> Result<()> {
        let p = &self.problem;
        p.validate()?;
        let bufs: [(&str, &M, usize); 5] = [
            ("a", &self.a, p.a_bytes()),
            ("a_scale", &self.a_scale, p.a_scale_bytes()),
            ("b", &self.b, p.b_bytes()),
            ("b_scale", &self.b_scale, p.b_scale_bytes()),
            ("alpha", &self.alpha, 4),
        ];
        for (name, mem, need) in bufs {
            if mem.len() < need || mem.device_ptr().checked_add(need as u64).is_none() {
                return Err(Error::invalid(format!("{name}.len"), format!("at least {need} bytes for {}", p.label()), mem.len()));
            }
            if mem.device_ptr() % TENSOR_ALIGNMENT as u64 != 0 {
                return Err(Error::invalid(format!("{name}.address"), format!("{TENSOR_ALIGNMENT}-byte aligned"), format!("{:#x}", mem.device_ptr())));
            }
            if !ctx.is_null() && mem.context_raw() != ctx {
                return Err(Error::other_context(format!("{name}.device"), "memory", "the stream's", ctx, mem.context_raw()));
            }
        }
        let want: Vec<Option<usize>> = if self.c.shape.len() == 2 { vec![Some(p.m), Some(p.n)] } else { vec![Some(p.batch), Some(p.m), Some(p.n)] };
        if self.c.shape.len() == 2 && p.batch != 1 {
            return Err(Error::invalid("c.shape", format!("[{}, {}, {}]", p.batch, p.m, p.n), format!("{:?}", self.c.shape)));
        }
        let ch = Check { name: "c", t: &self.c };
        ch.dtype(&[p.out])?.shape(&want)?.contiguous()?.in_bounds()?;
        if self.c.device_ptr() % TENSOR_ALIGNMENT as u64 != 0 {
            return Err(Error::invalid("c.address", format!("{TENSOR_ALIGNMENT}-byte aligned"), format!("{:#x}", self.c.device_ptr())));
        }
        if !ctx.is_null() {
            ch.device(ctx)?;
        }
        // C may not overlap what the execute reads: the result would depend on timing.
        for (name, mem, need) in bufs {
            let start = mem.device_ptr();
            crate::ops::tensor::refuse_overlap(("c", self.c.byte_range()), (name, Some((start, start + need as u64))))?;
        }
        Ok(())
    }
}

/// The GPU, then the cuDNN version: what NVFP4 needs, named in the error.
///
/// ```
/// use graphsafe::ops::cudnn::{nvfp4::check_support, Version, NVFP4_MIN_VERSION};
/// assert!(check_support((10, 0), NVFP4_MIN_VERSION).is_ok()); // B200
/// assert!(check_support((9, 0), NVFP4_MIN_VERSION).is_err()); // H200: no FP4 tensor cores
/// assert!(check_support((12, 0), Version { major: 9, minor: 6, patch: 0 }).is_err()); // cuDNN too old
/// ```
pub fn check_support(cc: (i32, i32), version: Version) -> Result<()> {
    crate::arch::require_fp4_tensor_cores("cudnn nvfp4 matmul", cc)?;
    if version < NVFP4_MIN_VERSION {
        return Err(Error::ArchUnsupported {
            op: "cudnn nvfp4 matmul",
            need: format!("cuDNN >= {NVFP4_MIN_VERSION} (block-scale dequantize)"),
            have: format!("cuDNN {version}"),
        });
    }
    Ok(())
}

fn plan_of(dnn: &Cudnn, p: &Nvfp4Problem) -> Result<Arc<super::Plan>> {
    check_support(dnn.context().compute_capability(), dnn.version())?;
    dnn.plan(&dnn.key(OpKey::Nvfp4Matmul(*p)), |api, h| p.graph(api, h))
}

/// The workspace bytes of `problem`'s plan (builds and caches it): as [`super::workspace_size`].
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let dnn = Cudnn::new(&Context::new(0)?)?;
/// let bytes = cudnn::nvfp4_workspace_size(&dnn, &Nvfp4Problem::new(16, 4096, 4096, DType::Bf16))?;
/// # let _ = bytes; Ok(()) }
/// ```
pub fn nvfp4_workspace_size(dnn: &Cudnn, problem: &Nvfp4Problem) -> Result<u64> {
    problem.validate()?;
    Ok(plan_of(dnn, problem)?.info().workspace_bytes)
}

/// Eager NVFP4 matmul: validates, checks the GPU and cuDNN, plans (cached), grows `ws` if needed,
/// executes on `stream`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?;
/// let problem = Nvfp4Problem::new(16, 4096, 4096, DType::Bf16);
/// let buf = |bytes: usize| DeviceBuffer::alloc_zeroed(&stream, bytes);
/// let (a, a_scale, b, b_scale) = (buf(problem.a_bytes())?, buf(problem.a_scale_bytes())?, buf(problem.b_bytes())?, buf(problem.b_scale_bytes())?);
/// let (alpha, c) = (DeviceBuffer::from_host(&stream, &[1.0f32])?, buf(16 * 4096 * 2)?);
/// let c = Tensor::contiguous(&c, DType::Bf16, &[16, 4096]);
/// let args = Nvfp4MatmulArgs::new(problem, &a, &a_scale, &b, &b_scale, &alpha, c);
/// let mut ws = Workspace::new(&stream, 0)?;
/// cudnn::nvfp4_matmul(&dnn, &args, &mut ws, &stream)?;
/// # Ok(()) }
/// ```
pub fn nvfp4_matmul(dnn: &Cudnn, args: &Nvfp4MatmulArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<PlanInfo> {
    nvfp4_matmul_on(dnn, args, OpTarget::eager(stream, Some(ws))?)
}

/// Captured NVFP4 matmul: a plan built before the capture only, never grows the workspace; every
/// view must belong to `cap`.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?;
/// let problem = Nvfp4Problem::new(16, 4096, 4096, DType::Bf16);
/// let buf = |bytes: usize| DeviceBuffer::alloc_zeroed(&stream, bytes);
/// let (a, a_scale, b, b_scale) = (buf(problem.a_bytes())?, buf(problem.a_scale_bytes())?, buf(problem.b_bytes())?, buf(problem.b_scale_bytes())?);
/// let (alpha, c) = (DeviceBuffer::from_host(&stream, &[1.0f32])?, buf(16 * 4096 * 2)?);
/// let c = Tensor::contiguous(&c, DType::Bf16, &[16, 4096]);
/// let args = Nvfp4MatmulArgs::new(problem, &a, &a_scale, &b, &b_scale, &alpha, c);
/// let mut ws = Workspace::new(&stream, cudnn::nvfp4_workspace_size(&dnn, &problem)?)?; // plans before capture
/// let (graph, _info) = stream.capture(CaptureMode::ThreadLocal, |cap| {
///     let w = cap.bind_workspace(&mut ws)?;
///     cudnn::nvfp4_matmul_captured(&dnn, &args.bind(cap)?, &w, cap)
/// })?;
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn nvfp4_matmul_captured<'id>(dnn: &Cudnn, args: &Nvfp4MatmulArgs<CapturedBuffer<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<PlanInfo> {
    nvfp4_matmul_on(dnn, args, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

fn nvfp4_matmul_on<M: DeviceMemory>(dnn: &Cudnn, args: &Nvfp4MatmulArgs<M>, mut target: OpTarget<'_>) -> Result<PlanInfo> {
    dnn.same_context(target.context())?;
    args.validate(target.context().raw())?;
    let plan = if target.is_captured() {
        check_support(dnn.context().compute_capability(), dnn.version())?;
        dnn.cached(&dnn.key(OpKey::Nvfp4Matmul(args.problem))).ok_or_else(|| {
            Error::invalid("plan", "a plan built before the capture (nvfp4_workspace_size or an eager call)", format!("none cached for {}", args.problem.label()))
        })?
    } else {
        plan_of(dnn, &args.problem)?
    };
    let mut ptrs = Vec::with_capacity(6);
    for (name, m) in [("a", &args.a), ("a_scale", &args.a_scale), ("b", &args.b), ("b_scale", &args.b_scale), ("alpha", &args.alpha)] {
        ptrs.push(target.admit(name, m)?);
    }
    ptrs.push(target.admit("c", &args.c.mem)?.skip("c", args.c.offset as u64)?);
    let w = target.workspace(plan.info().workspace_bytes)?;
    // Plans are never freed, so a graph that captured this execute keeps working.
    target.commit()?.glue(|stream| dnn.execute(&plan, &ptrs, w, stream))?;
    Ok(plan.info())
}

#[doc(hidden)]
/// Builds and finalizes the NVFP4 operation graph only (no engine, no GPU check): shows on any GPU
/// that the graph is well-formed for this cuDNN.
pub fn finalize_graph(dnn: &Cudnn, problem: &Nvfp4Problem) -> Result<()> {
    problem.validate()?;
    dnn.finalize_graph_only(|api, h| problem.graph(api, h))
}

//! The matmul op: `C[M, N] = A[M, K] · B[K, N]`, optionally batched, through cuDNN's backend
//! graph API (one `OPERATION_MATMUL` node, fp32 compute).
//!
//! ```text
//! a [M, K] or [batch|1, M, K]    bf16 | fp16 | fp8_e4m3 (fp8: sm_89+)
//! b [K, N] or [batch|1, K, N]    the dtype of a
//! c [M, N] or [batch, M, N]      bf16 | fp16 | f32
//! ```
//!
//! Row- or column-major operands through strides (in elements): each matrix needs a unit stride in
//! one of its last two dimensions; the other is its leading dimension (padding allowed). A batch of
//! one in `a` or `b` is broadcast over C's batch (shared weights). Base addresses must be 16-byte
//! aligned (declared to cuDNN as `CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT`); `c` may not overlap `a` or `b`.
//!
//! [`matmul`] (eager) builds the plan on first use and grows the workspace when it must;
//! [`matmul_captured`] uses plans built before the capture only and never grows
//! ([`Error::WorkspaceTooSmall`], nothing executed). [`plan_workspace`] builds every plan an engine
//! will capture and returns the largest workspace: pre-grow to it once, then capture.

use super::{data_type, Cudnn, OpKey, PlanInfo};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedWorkspace, CapturedBuffer};
use crate::ops::tensor::{Check, DType, DeviceMemory, Tensor};
use crate::sys::cuda as cu;
use crate::sys::cudnn::backend::{Attr, Descriptor, Handle, Kind, OpGraph, TensorSpec, TENSOR_ALIGNMENT};
use crate::sys::cudnn::{ffi as c, Api};
use crate::sys::DeviceSpan;
use crate::workspace::{Workspace, WorkspacePlanner};
use std::sync::Arc;

// Choosing the fastest plan of a problem, before capture.
mod autotune;
// The raw paths tests and benchmarks measure the safe one against.
mod raw;

pub use autotune::{autotune, AutotuneReport};
pub use raw::{matmul_raw, RawExecutor};

const UID_A: i64 = 1;
const UID_B: i64 = 2;
const UID_C: i64 = 3;

/// One operand of a [`MatmulProblem`]: its dtype, its batch (1 = broadcast, or C's batch) and its
/// strides in elements over (batch, rows, cols).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct MatmulOperand {
    /// Element type.
    pub dtype: DType,
    /// 1 (broadcast over C's batch) or C's batch.
    pub batch: usize,
    /// (batch, row, column) strides in elements. Normalized: a batch of 1 has stride rows·cols.
    pub strides: [usize; 3],
}

/// The shape of one matmul, everything that selects its plan: what planning takes (before any
/// buffer exists) and what [`MatmulArgs::problem`] derives from tensors. Made with
/// [`MatmulProblem::new`] and the `with_*` setters (`#[non_exhaustive]`: a new field comes with a
/// default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub struct MatmulProblem {
    /// C's batch (1 = not batched).
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// A [batch, M, K].
    pub a: MatmulOperand,
    /// B [batch, K, N].
    pub b: MatmulOperand,
    /// C [batch, M, N].
    pub c: MatmulOperand,
}

// Products of caller sizes saturate: a problem too large for memory is refused by `validate`.
fn row_major(dtype: DType, batch: usize, rows: usize, cols: usize) -> MatmulOperand {
    MatmulOperand { dtype, batch, strides: [rows.saturating_mul(cols), cols, 1] }
}

fn col_major(dtype: DType, batch: usize, rows: usize, cols: usize) -> MatmulOperand {
    MatmulOperand { dtype, batch, strides: [rows.saturating_mul(cols), 1, rows] }
}

impl MatmulOperand {
    fn is_col_major(&self) -> bool {
        self.strides[1] == 1 && self.strides[2] != 1
    }
}

impl MatmulProblem {
    /// An unbatched problem with every operand row-major and contiguous.
    pub fn new(m: usize, n: usize, k: usize, input: DType, output: DType) -> MatmulProblem {
        MatmulProblem {
            batch: 1,
            m,
            n,
            k,
            a: row_major(input, 1, m, k),
            b: row_major(input, 1, k, n),
            c: row_major(output, 1, m, n),
        }
    }

    /// The same problem over `batch` contiguous matrices of each operand.
    pub fn with_batch(mut self, batch: usize) -> MatmulProblem {
        self.batch = batch;
        for o in [&mut self.a, &mut self.b, &mut self.c] {
            o.batch = batch;
        }
        self
    }

    /// B broadcast: one B for every batch of A and C (shared weights).
    pub fn with_broadcast_b(mut self) -> MatmulProblem {
        self.b.batch = 1;
        self
    }

    /// A stored column-major (M contiguous).
    pub fn with_a_col_major(mut self) -> MatmulProblem {
        self.a = col_major(self.a.dtype, self.a.batch, self.m, self.k);
        self
    }

    /// B stored column-major (K contiguous): a weight matrix stored `[N, K]` row-major, as
    /// `y = x·Wᵀ` layers keep it. The layout fp8 engines want.
    pub fn with_b_col_major(mut self) -> MatmulProblem {
        self.b = col_major(self.b.dtype, self.b.batch, self.k, self.n);
        self
    }

    /// C stored column-major (M contiguous).
    pub fn with_c_col_major(mut self) -> MatmulProblem {
        self.c = col_major(self.c.dtype, self.c.batch, self.m, self.n);
        self
    }

    /// A short description for workspace planners and logs.
    pub fn label(&self) -> String {
        let l = |o: &MatmulOperand| if o.is_col_major() { "col" } else { "row" };
        format!(
            "cudnn matmul {}x{}->{} batch={} m={} n={} k={} a={} b={}{} c={}",
            self.a.dtype,
            self.b.dtype,
            self.c.dtype,
            self.batch,
            self.m,
            self.n,
            self.k,
            l(&self.a),
            l(&self.b),
            if self.b.batch == 1 && self.batch > 1 { "(broadcast)" } else { "" },
            l(&self.c)
        )
    }

    /// Host-side checks of the problem itself (dtypes, sizes, batches, strides); every error names
    /// the field.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [("batch", self.batch), ("m", self.m), ("n", self.n), ("k", self.k)] {
            crate::error::positive(what, v.try_into().unwrap_or(i64::MAX))?;
        }
        let inputs = [DType::Bf16, DType::Fp16, DType::Fp8E4m3];
        if !inputs.contains(&self.a.dtype) {
            return Err(Error::invalid("a.dtype", "bf16, fp16 or fp8_e4m3", self.a.dtype));
        }
        if self.b.dtype != self.a.dtype {
            return Err(Error::invalid("b.dtype", format!("{} (the dtype of a)", self.a.dtype), self.b.dtype));
        }
        if ![DType::Bf16, DType::Fp16, DType::F32].contains(&self.c.dtype) {
            return Err(Error::invalid("c.dtype", "bf16, fp16 or f32", self.c.dtype));
        }
        let dims = [("a", &self.a, self.m, self.k), ("b", &self.b, self.k, self.n), ("c", &self.c, self.m, self.n)];
        for (name, o, rows, cols) in dims {
            let batch_ok = if name == "c" { o.batch == self.batch } else { o.batch == 1 || o.batch == self.batch };
            if !batch_ok {
                let want = if name == "c" { format!("{}", self.batch) } else { format!("1 or {}", self.batch) };
                return Err(Error::invalid(format!("{name}.batch"), want, o.batch));
            }
            let [bs, rs, cs] = o.strides;
            let unit = (cs == 1 || cols == 1) || (rs == 1 || rows == 1);
            if !unit {
                return Err(Error::invalid(
                    format!("{name}.strides"),
                    "a unit stride in one of the last two dimensions (row- or column-major)",
                    format!("{:?}", o.strides),
                ));
            }
            if (rows > 1 && rs == 0) || (cols > 1 && cs == 0) || (o.batch > 1 && bs == 0) {
                return Err(Error::invalid(format!("{name}.strides"), "non-zero strides (broadcast with a batch of 1)", format!("{:?}", o.strides)));
            }
            // The output's elements are written by different threads: none may share an address.
            if name == "c" && !crate::ops::tensor::elements_disjoint(&[o.batch, rows, cols], &o.strides) {
                return Err(Error::invalid("c.strides", "strides under which no two elements of c share an address", format!("{:?} over [{}, {rows}, {cols}]", o.strides, o.batch)));
            }
            // cuDNN takes every dimension and stride as an int64, and the elements must be
            // addressable: the last element's offset has to fit too.
            let last = [(o.batch, bs), (rows, rs), (cols, cs)]
                .iter()
                .try_fold(0u64, |acc, &(d, st)| (d.max(1) as u64 - 1).checked_mul(st as u64).and_then(|x| acc.checked_add(x)));
            let fits = last.is_some_and(|l| l < i64::MAX as u64) && [o.batch, rows, cols, bs, rs, cs].iter().all(|&v| i64::try_from(v).is_ok());
            if !fits {
                return Err(Error::invalid(format!("{name}.strides"), "sizes and strides whose extent fits in an int64", format!("{:?} over [{}, {rows}, {cols}]", o.strides, o.batch)));
            }
        }
        Ok(())
    }

    /// The batch stride of a batch-1 operand is meaningless; fix it so equal problems hash equal.
    fn normalized(mut self) -> MatmulProblem {
        let (m, n, k) = (self.m, self.n, self.k);
        for (o, rows, cols) in [(&mut self.a, m, k), (&mut self.b, k, n), (&mut self.c, m, n)] {
            if o.batch == 1 {
                o.strides[0] = rows.saturating_mul(cols);
            }
        }
        self
    }

    /// The cuDNN operation graph of the problem.
    fn graph(&self, api: &'static Api, handle: &Handle) -> Result<OpGraph> {
        let batch = self.batch;
        let spec = |uid, o: &MatmulOperand, rows: usize, cols: usize| {
            let dt = data_type(o.dtype).ok_or_else(|| Error::invalid("dtype", "bf16, fp16, fp8_e4m3 or f32", o.dtype))?;
            // A broadcast operand (batch 1 under a batch > 1) is described to cuDNN as the full
            // batch with batch stride 0: on cuDNN 9.14 its size-1-batch form gave wrong results
            // with the cuBLASLt-backed engine (tests/gpu_cudnn.rs caught it).
            let (b, bs) = if o.batch == 1 && batch > 1 { (batch, 0) } else { (o.batch, o.strides[0]) };
            let dims = [b as i64, rows as i64, cols as i64];
            let strides = [bs as i64, o.strides[1] as i64, o.strides[2] as i64];
            TensorSpec::io(uid, dt, &dims, &strides).build(api)
        };
        let a = spec(UID_A, &self.a, self.m, self.k)?;
        let b = spec(UID_B, &self.b, self.k, self.n)?;
        let cc = spec(UID_C, &self.c, self.m, self.n)?;
        let mm = Descriptor::new(api, Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
        mm.set_dtype(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, c::cudnnDataType_t::CUDNN_DATA_FLOAT)?;
        mm.finalize()?;
        let op = Descriptor::new(api, Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
        op.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[&a])?;
        op.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[&b])?;
        op.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[&cc])?;
        op.set_descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        op.finalize()?;
        OpGraph::new(api, handle, vec![op], vec![mm, a, b, cc], vec![UID_A, UID_B, UID_C])
    }
}

/// Arguments of one matmul. `M` is `&DeviceBuffer` eagerly, [`CapturedBuffer`] in a capture.
/// Made with [`MatmulArgs::new`] (the fields are public to read and to change; the struct is
/// `#[non_exhaustive]`, so a new field comes with a default and breaks no caller).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MatmulArgs<M> {
    /// A: [M, K] or [batch|1, M, K].
    pub a: Tensor<M>,
    /// B: [K, N] or [batch|1, K, N].
    pub b: Tensor<M>,
    /// C: [M, N] or [batch, M, N] (written).
    pub c: Tensor<M>,
}

impl<M> MatmulArgs<M> {
    /// `c = a · b`. Nothing is checked here: the op checks everything before it executes.
    pub fn new(a: Tensor<M>, b: Tensor<M>, c: Tensor<M>) -> Self {
        MatmulArgs { a, b, c }
    }
}

impl MatmulArgs<&DeviceBuffer> {
    /// The same matmul inside `cap`: every buffer bound to the capture (so every graph made from
    /// it keeps them alive), the views unchanged.
    pub fn bind<'id>(&self, cap: &mut Capture<'_, 'id>) -> Result<MatmulArgs<CapturedBuffer<'id>>> {
        Ok(MatmulArgs::new(self.a.bind(cap)?, self.b.bind(cap)?, self.c.bind(cap)?))
    }
}

/// (batch, rows, cols, strides[3]) of a rank-2 or rank-3 tensor.
fn dims3<M>(name: &str, t: &Tensor<M>) -> Result<(usize, usize, usize, [usize; 3])> {
    let ok = (t.shape.len() == 2 || t.shape.len() == 3) && t.strides.len() == t.shape.len();
    if !ok {
        return Err(Error::invalid(format!("{name}.shape"), "[rows, cols] or [batch, rows, cols] (with as many strides)", format!("{:?} strides {:?}", t.shape, t.strides)));
    }
    Ok(if t.shape.len() == 2 {
        (1, t.shape[0], t.shape[1], [t.shape[0].saturating_mul(t.shape[1]), t.strides[0], t.strides[1]])
    } else {
        (t.shape[0], t.shape[1], t.shape[2], [t.strides[0], t.strides[1], t.strides[2]])
    })
}

impl<M: DeviceMemory> MatmulArgs<M> {
    /// Validates everything that can be checked on the host (shapes, dtypes, strides, alignment,
    /// bounds, overlap, and the device when `ctx` is not null) and returns the problem.
    pub fn problem(&self, ctx: cu::CUcontext) -> Result<MatmulProblem> {
        let (ab, m, k, a_st) = dims3("a", &self.a)?;
        let (bb, k2, n, b_st) = dims3("b", &self.b)?;
        let (cb, m2, n2, c_st) = dims3("c", &self.c)?;
        if k2 != k {
            return Err(Error::invalid("b.shape[-2] (K)", format!("{k} (a.shape[-1])"), k2));
        }
        if m2 != m {
            return Err(Error::invalid("c.shape[-2] (M)", format!("{m} (a.shape[-2])"), m2));
        }
        if n2 != n {
            return Err(Error::invalid("c.shape[-1] (N)", format!("{n} (b.shape[-1])"), n2));
        }
        let batch = ab.max(bb);
        if cb != batch {
            return Err(Error::invalid("c.shape[0] (batch)", format!("{batch} (the batch of a and b)"), cb));
        }
        let p = MatmulProblem {
            batch,
            m,
            n,
            k,
            a: MatmulOperand { dtype: self.a.dtype, batch: ab, strides: a_st },
            b: MatmulOperand { dtype: self.b.dtype, batch: bb, strides: b_st },
            c: MatmulOperand { dtype: self.c.dtype, batch: cb, strides: c_st },
        }
        .normalized();
        p.validate()?;
        for (name, t) in [("a", &self.a), ("b", &self.b), ("c", &self.c)] {
            if t.device_ptr() % TENSOR_ALIGNMENT as u64 != 0 {
                return Err(Error::invalid(format!("{name}.address"), format!("{TENSOR_ALIGNMENT}-byte aligned"), format!("{:#x}", t.device_ptr())));
            }
            let ch = Check { name, t };
            ch.in_bounds()?;
            if !ctx.is_null() {
                ch.device(ctx)?;
            }
        }
        for (name, t) in [("a", &self.a), ("b", &self.b)] {
            crate::ops::tensor::refuse_overlap(("c", self.c.byte_range()), (name, t.byte_range()))?;
        }
        Ok(p)
    }

    /// The spans of a, b and c (each from its first element), admitted to `target`.
    fn spans(&self, target: &mut OpTarget<'_>) -> Result<[DeviceSpan; 3]> {
        let mut span = |name: &str, t: &Tensor<M>| target.admit(name, &t.mem)?.skip(name, t.offset as u64);
        Ok([span("a", &self.a)?, span("b", &self.b)?, span("c", &self.c)?])
    }
}

/// Refuses fp8 on GPUs without fp8 tensor cores, naming both.
fn check_arch(dnn: &Cudnn, p: &MatmulProblem) -> Result<()> {
    let cc = dnn.context().compute_capability();
    if p.a.dtype == DType::Fp8E4m3 && cc < (8, 9) {
        return Err(Error::ArchUnsupported { op: "cudnn matmul (fp8_e4m3)", need: "sm_89 or newer (Ada, Hopper, Blackwell)".into(), have: format!("sm_{}{}", cc.0, cc.1) });
    }
    Ok(())
}

fn plan_of(dnn: &Cudnn, p: &MatmulProblem) -> Result<Arc<super::Plan>> {
    let key = dnn.key(OpKey::Matmul(*p));
    dnn.plan(&key, |api, h| p.graph(api, h))
}

/// Eager matmul on `stream`: validates, builds the plan on first use (cached), grows `ws` if the
/// plan needs more (retiring the old buffer, zero-filled), executes. Returns what the plan is.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?; // one per device, for the process
/// // y[m, n] = x[m, k] · W[n, k]ᵀ: B = Wᵀ is column-major.
/// let (m, n, k) = (8, 4096, 4096);
/// let (x, w, y) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, n * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let args = MatmulArgs::new(
///     Tensor::contiguous(&x, DType::Bf16, &[m, k]),
///     Tensor::strided(&w, 0, DType::Bf16, &[k, n], &[1, k]),
///     Tensor::contiguous(&y, DType::Bf16, &[m, n]),
/// );
/// let mut ws = Workspace::new(&stream, 0)?;
/// let info = cudnn::matmul(&dnn, &args, &mut ws, &stream)?;
/// assert!(ws.capacity() >= info.workspace_bytes);
/// # Ok(()) }
/// ```
pub fn matmul(dnn: &Cudnn, args: &MatmulArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<PlanInfo> {
    matmul_on(dnn, args, OpTarget::eager(stream, Some(ws))?)
}

/// Captured matmul: validates, looks up the plan built before the capture (never builds one
/// inside it: building may allocate, which a capture forbids), checks that every view belongs to
/// `cap` and that the captured workspace holds the plan's (never grows: [`Error::WorkspaceTooSmall`]
/// naming both sizes, nothing captured), captures the execute.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?; // one per device, for the process
/// // y[m, n] = x[m, k] · W[n, k]ᵀ: B = Wᵀ is column-major.
/// let (m, n, k) = (8, 4096, 4096);
/// let (x, w, y) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, n * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let args = MatmulArgs::new(
///     Tensor::contiguous(&x, DType::Bf16, &[m, k]),
///     Tensor::strided(&w, 0, DType::Bf16, &[k, n], &[1, k]),
///     Tensor::contiguous(&y, DType::Bf16, &[m, n]),
/// );
/// // Before the capture: every plan built, the workspace sized for the largest.
/// let problems: Vec<MatmulProblem> = [1, 8].iter().map(|&m| MatmulProblem::new(m, n, k, DType::Bf16, DType::Bf16).with_b_col_major()).collect();
/// let mut ws = Workspace::new(&stream, cudnn::plan_workspace(&dnn, &problems)?)?;
/// let (graph, _info) = stream.capture(CaptureMode::ThreadLocal, |cap| {
///     let w = cap.bind_workspace(&mut ws)?;
///     cudnn::matmul_captured(&dnn, &args.bind(cap)?, &w, cap)
/// })?;
/// graph.instantiate()?.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn matmul_captured<'id>(dnn: &Cudnn, args: &MatmulArgs<CapturedBuffer<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<PlanInfo> {
    matmul_on(dnn, args, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

/// The one path behind every entry point: eager (builds the plan if needed, may grow) or captured
/// (only a plan built before the capture, never grows). Everything is checked before the execute.
pub(crate) fn matmul_on<M: DeviceMemory>(dnn: &Cudnn, args: &MatmulArgs<M>, mut target: OpTarget<'_>) -> Result<PlanInfo> {
    dnn.same_context(target.context())?;
    let p = args.problem(target.context().raw())?;
    check_arch(dnn, &p)?;
    let plan = if target.is_captured() {
        dnn.cached(&dnn.key(OpKey::Matmul(p))).ok_or_else(|| {
            Error::invalid(
                "plan",
                "a plan built before the capture (ops::cudnn::plan_workspace, workspace_size, graphsafe_cudnn_plan or an eager matmul of this problem)",
                format!("none cached for {}", p.label()),
            )
        })?
    } else {
        plan_of(dnn, &p)?
    };
    let ptrs = args.spans(&mut target)?;
    let w = target.workspace(plan.info().workspace_bytes)?;
    // Plans are never freed, so a graph that captured this execute keeps working.
    target.commit()?.glue(|stream| dnn.execute(&plan, &ptrs, w, stream))?;
    Ok(plan.info())
}

/// The workspace bytes `problem`'s plan uses: builds (and caches) the plan, so a later capture
/// executes exactly the plan that was sized.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let dnn = Cudnn::new(&Context::new(0)?)?;
/// let bytes = cudnn::workspace_size(&dnn, &MatmulProblem::new(8, 4096, 4096, DType::Bf16, DType::Bf16))?;
/// assert_eq!(dnn.plan_count(), 1); // built now, reused by every later call
/// # let _ = bytes; Ok(()) }
/// ```
pub fn workspace_size(dnn: &Cudnn, problem: &MatmulProblem) -> Result<u64> {
    let p = problem.normalized();
    p.validate()?;
    check_arch(dnn, &p)?;
    Ok(plan_of(dnn, &p)?.info().workspace_bytes)
}

/// Size before capture: builds the plan of every problem an engine will capture and returns the
/// largest workspace among them (0 if none needs one). Pre-grow the shared workspace to it once.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?;
/// // Every batch size the engine captures, for one linear layer (W stored [N, K]).
/// let problems: Vec<MatmulProblem> =
///     [1, 2, 4, 8, 16].iter().map(|&m| MatmulProblem::new(m, 4096, 4096, DType::Bf16, DType::Bf16).with_b_col_major()).collect();
/// let bytes = cudnn::plan_workspace(&dnn, &problems)?;
/// for p in &problems {
///     assert!(cudnn::workspace_size(&dnn, p)? <= bytes); // the plans are cached: no rebuild
/// }
/// let ws = Workspace::new(&stream, bytes)?; // the one pre-grow
/// # let _ = ws; Ok(()) }
/// ```
pub fn plan_workspace(dnn: &Cudnn, problems: &[MatmulProblem]) -> Result<u64> {
    let mut planner = WorkspacePlanner::new();
    require_workspace(dnn, problems, &mut planner)?;
    Ok(planner.bytes())
}

/// [`plan_workspace`] into a [`WorkspacePlanner`] shared with other ops' requirements.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let dnn = Cudnn::new(&ctx)?;
/// let mut planner = WorkspacePlanner::new();
/// // The attention of the same step shares the workspace.
/// let attn = mla::worst_case(MlaArch::for_compute_capability(ctx.compute_capability())?, &MlaLimits::new(16, 64, 32_768, ctx.sm_count()))?;
/// planner.require("mla decode", attn.workspace_bytes);
/// cudnn::require_workspace(&dnn, &[MatmulProblem::new(64, 4096, 4096, DType::Bf16, DType::Bf16)], &mut planner)?;
/// let ws = Workspace::new(&Stream::new(&ctx)?, planner.bytes())?;
/// # let _ = ws; Ok(()) }
/// ```
pub fn require_workspace(dnn: &Cudnn, problems: &[MatmulProblem], planner: &mut WorkspacePlanner) -> Result<()> {
    for p in problems {
        let bytes = workspace_size(dnn, p)?;
        planner.require(p.label(), bytes);
    }
    Ok(())
}

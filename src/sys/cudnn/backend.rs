//! Safe RAII types over cuDNN's backend graph API: the handle, descriptors (tensors, operations,
//! operation graphs, heuristics, engine configs, execution plans, variant packs), and execute.
//!
//! Every descriptor is destroyed exactly once, by its owner's `Drop`; a failure there is logged,
//! not hidden. Attribute setters take Rust slices, so element counts always match the data.
//!
//! Executing touches device memory. [`Handle::execute`] checks every pointer it is given against
//! the operation graph's own tensors (each non-virtual tensor's extent from its dimensions and
//! strides, and the declared alignment) and the workspace against the plan's size; it trusts
//! each [`DeviceSpan`]'s invariant (the memory exists and stays allocated while the work may run)
//! and that the stream it is given is a live stream of the handle's device.

use crate::error::{Error, Result};
use crate::sys::cudnn::{check, ffi as c, Api};
use crate::sys::cuda::CUstream;
use crate::sys::span::extent;
use crate::sys::DeviceSpan;
use std::ffi::c_void;
use std::sync::Arc;

pub(crate) use c::cudnnBackendAttributeName_t as Attr;
pub(crate) use c::cudnnBackendDescriptorType_t as Kind;
use c::cudnnBackendAttributeType_t as Ty;

/// A cuDNN handle (`cudnnCreate`/`cudnnDestroy`). Bound to the device that was current when it
/// was made; not to be used from two threads at once (it is `Send` but not `Sync`; its owner keeps
/// it behind a mutex).
pub(crate) struct Handle {
    raw: c::cudnnHandle_t,
    api: &'static Api,
}

// SAFETY: the handle is only used under its owner's mutex (one thread at a time).
unsafe impl Send for Handle {}

impl Handle {
    /// A handle for the device whose context is current (the caller entered it).
    pub fn new(api: &'static Api) -> Result<Handle> {
        let f = api.cudnnCreate()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(api, unsafe { (f.f)(&mut raw) }, f.name)?;
        Ok(Handle { raw, api })
    }

    /// Makes `stream` the handle's stream (`cudnnSetStream`). Trusted: `stream` is a live stream
    /// of the handle's device (the op passes its target's stream).
    pub fn set_stream(&self, stream: CUstream) -> Result<()> {
        let f = self.api.cudnnSetStream()?;
        // SAFETY: the handle is live; the stream is live (the trusted precondition above).
        check(self.api, unsafe { (f.f)(self.raw, stream.cast()) }, f.name)
    }

    /// Executes `plan` on the handle's stream with `ptrs` (one span per non-virtual tensor of the
    /// plan's graph, in [`OpGraph::io_uids`] order) and the workspace `ws`: checks every span
    /// against its tensor's extent and alignment and `ws` against the plan's workspace, then
    /// reuses `pack` if it was made for the same plan and addresses (a decode loop over fixed
    /// buffers builds none after the first) or makes a new one. Trusted: the spans' invariant.
    pub fn execute(&self, plan: &ExecPlan, ptrs: &[DeviceSpan], ws: DeviceSpan, pack: &mut Option<VariantPack>) -> Result<()> {
        check_io(&plan.graph, ptrs, ws, plan.workspace_bytes)?;
        if !pack.as_ref().is_some_and(|p| p.matches(&plan.graph, ptrs, ws)) {
            *pack = None; // destroy the old one first
            *pack = Some(VariantPack::build(self.api, &plan.graph, ptrs, ws)?);
        }
        match pack {
            Some(p) => self.execute_pack(plan, p),
            None => Err(Error::invalid("variant pack", "a finalized variant pack", "none")),
        }
    }

    /// One bare `cudnnBackendExecute` of `plan` with a pack made for it, and no other check: the
    /// benchmarks' floor. Trusted: the spans the pack was made from are still valid.
    pub fn execute_pack(&self, plan: &ExecPlan, pack: &VariantPack) -> Result<()> {
        if !Arc::ptr_eq(&plan.graph, &pack.graph) {
            return Err(Error::invalid("variant pack", "a pack made for this plan's operation graph", "one of another graph"));
        }
        let f = self.api.cudnnBackendExecute()?;
        // SAFETY: handle, plan and pack are live descriptors; the pack's pointers were checked
        // against this graph's tensors and the plan's workspace when it was made (check_io), and
        // their memory is valid (the trusted precondition).
        check(self.api, unsafe { (f.f)(self.raw, plan.plan.raw, pack.desc.raw) }, "cudnnBackendExecute")
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let r = self.api.cudnnDestroy().and_then(|f| {
            // SAFETY: created in new(), destroyed once.
            check(self.api, unsafe { (f.f)(self.raw) }, f.name)
        });
        if let Err(e) = r {
            crate::logging::error(format!("graphsafe: cudnnDestroy failed in drop: {e}"));
        }
    }
}

/// One backend descriptor of any kind.
pub(crate) struct Descriptor {
    raw: c::cudnnBackendDescriptor_t,
    kind: Kind,
    api: &'static Api,
    /// For a tensor made by [`TensorSpec::build`]: its uid, the bytes its elements span (`None`
    /// for a data type of unknown size) and whether it is virtual.
    tensor: Option<(i64, Option<u64>, bool)>,
}

// SAFETY: a descriptor is plain host memory owned by this value; cuDNN documents finalized
// descriptors as read-only, and mutation happens only before they are shared.
unsafe impl Send for Descriptor {}
// SAFETY: as for Send.
unsafe impl Sync for Descriptor {}

/// The `call` text of finalize errors, per descriptor kind (the error carries a `&'static str`).
fn finalize_call(kind: Kind) -> &'static str {
    match kind {
        Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR => "cudnnBackendFinalize(TENSOR)",
        Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR => "cudnnBackendFinalize(MATMUL)",
        Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR => "cudnnBackendFinalize(OPERATION_MATMUL)",
        Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR => "cudnnBackendFinalize(POINTWISE)",
        Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR => "cudnnBackendFinalize(OPERATION_POINTWISE)",
        Kind::CUDNN_BACKEND_OPERATION_BLOCK_SCALE_DEQUANTIZE_DESCRIPTOR => "cudnnBackendFinalize(OPERATION_BLOCK_SCALE_DEQUANTIZE)",
        Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR => "cudnnBackendFinalize(OPERATIONGRAPH)",
        Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR => "cudnnBackendFinalize(ENGINEHEUR)",
        Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR => "cudnnBackendFinalize(ENGINECFG)",
        Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR => "cudnnBackendFinalize(EXECUTION_PLAN)",
        Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR => "cudnnBackendFinalize(VARIANT_PACK)",
        _ => "cudnnBackendFinalize",
    }
}

impl Descriptor {
    pub fn new(api: &'static Api, kind: Kind) -> Result<Descriptor> {
        let f = api.cudnnBackendCreateDescriptor()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(api, unsafe { (f.f)(kind, &mut raw) }, f.name)?;
        Ok(Descriptor { raw, kind, api, tensor: None })
    }

    /// # Safety
    /// `data` must point to `count` elements of the C type `ty` names.
    unsafe fn set_raw(&self, name: Attr, ty: Ty, count: usize, data: *const c_void) -> Result<()> {
        let f = self.api.cudnnBackendSetAttribute()?;
        // SAFETY: the caller's contract covers `data`; the descriptor is live.
        let r = unsafe { (f.f)(self.raw, name, ty, count as i64, data) };
        check(self.api, r, f.name).inspect_err(|_| crate::logging::debug(|| format!("graphsafe: setting cuDNN attribute {} failed", name.0)))
    }

    pub fn set_i64s(&self, name: Attr, v: &[i64]) -> Result<()> {
        // SAFETY: v holds v.len() int64_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_INT64, v.len(), v.as_ptr().cast()) }
    }

    pub fn set_i32s(&self, name: Attr, v: &[i32]) -> Result<()> {
        // SAFETY: v holds v.len() int32_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_INT32, v.len(), v.as_ptr().cast()) }
    }

    pub fn set_bool(&self, name: Attr, v: bool) -> Result<()> {
        let b: bool = v; // C's bool is one byte, as Rust's
        // SAFETY: one bool.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_BOOLEAN, 1, (&b as *const bool).cast()) }
    }

    pub fn set_dtype(&self, name: Attr, v: c::cudnnDataType_t) -> Result<()> {
        // SAFETY: one cudnnDataType_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_DATA_TYPE, 1, (&v as *const c::cudnnDataType_t).cast()) }
    }

    pub fn set_heur_mode(&self, name: Attr, v: c::cudnnBackendHeurMode_t) -> Result<()> {
        // SAFETY: one cudnnBackendHeurMode_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_HEUR_MODE, 1, (&v as *const c::cudnnBackendHeurMode_t).cast()) }
    }

    pub fn set_pointwise_mode(&self, name: Attr, v: c::cudnnPointwiseMode_t) -> Result<()> {
        // SAFETY: one cudnnPointwiseMode_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_POINTWISE_MODE, 1, (&v as *const c::cudnnPointwiseMode_t).cast()) }
    }

    pub fn set_reordering(&self, name: Attr, v: c::cudnnBackendTensorReordering_t) -> Result<()> {
        // SAFETY: one cudnnBackendTensorReordering_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, (&v as *const c::cudnnBackendTensorReordering_t).cast()) }
    }

    pub fn set_handle(&self, name: Attr, h: &Handle) -> Result<()> {
        // SAFETY: one cudnnHandle_t.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_HANDLE, 1, (&h.raw as *const c::cudnnHandle_t).cast()) }
    }

    pub fn set_descs(&self, name: Attr, v: &[&Descriptor]) -> Result<()> {
        let raws: Vec<c::cudnnBackendDescriptor_t> = v.iter().map(|d| d.raw).collect();
        // SAFETY: raws holds raws.len() descriptor handles, each alive for the call.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, raws.len(), raws.as_ptr().cast()) }
    }

    pub fn set_ptrs(&self, name: Attr, v: &[*mut c_void]) -> Result<()> {
        // SAFETY: v holds v.len() void pointers.
        unsafe { self.set_raw(name, Ty::CUDNN_TYPE_VOID_PTR, v.len(), v.as_ptr().cast()) }
    }

    pub fn finalize(&self) -> Result<()> {
        let f = self.api.cudnnBackendFinalize()?;
        // SAFETY: live descriptor.
        check(self.api, unsafe { (f.f)(self.raw) }, finalize_call(self.kind))
    }

    /// # Safety
    /// `out` must have room for `cap` elements of the C type `ty` names.
    unsafe fn get_raw(&self, name: Attr, ty: Ty, cap: usize, out: *mut c_void) -> Result<usize> {
        let f = self.api.cudnnBackendGetAttribute()?;
        let mut n: i64 = 0;
        // SAFETY: the caller's contract covers `out`; `n` is a local.
        check(self.api, unsafe { (f.f)(self.raw, name, ty, cap as i64, &mut n, out) }, f.name)?;
        Ok(n.max(0) as usize)
    }

    pub fn get_i64(&self, name: Attr) -> Result<i64> {
        let mut v: i64 = 0;
        // SAFETY: room for one int64_t.
        unsafe { self.get_raw(name, Ty::CUDNN_TYPE_INT64, 1, (&mut v as *mut i64).cast()) }?;
        Ok(v)
    }

    /// Up to `cap` enum values (notes) of type `ty`, as their raw numbers.
    pub fn get_enums(&self, name: Attr, ty: Ty, cap: usize) -> Result<Vec<u32>> {
        let mut v = vec![0u32; cap];
        // SAFETY: cuDNN enums are C enums (4 bytes); room for cap of them.
        let n = unsafe { self.get_raw(name, ty, cap, v.as_mut_ptr().cast()) }?;
        v.truncate(n.min(cap));
        Ok(v)
    }

    /// How many descriptors attribute `name` holds (e.g. heuristic results).
    pub fn count_descs(&self, name: Attr) -> Result<usize> {
        // SAFETY: a zero-capacity query writes only the count.
        unsafe { self.get_raw(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, std::ptr::null_mut()) }
    }

    /// Reads up to `n` descriptors of `kind` from attribute `name` into fresh descriptors.
    pub fn get_descs(&self, name: Attr, kind: Kind, n: usize) -> Result<Vec<Descriptor>> {
        let out: Vec<Descriptor> = (0..n).map(|_| Descriptor::new(self.api, kind)).collect::<Result<_>>()?;
        let mut raws: Vec<c::cudnnBackendDescriptor_t> = out.iter().map(|d| d.raw).collect();
        // SAFETY: raws holds n created descriptors of the kind cuDNN fills in.
        let got = unsafe { self.get_raw(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, n, raws.as_mut_ptr().cast()) }?;
        let mut out = out;
        out.truncate(got.min(n));
        Ok(out)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        let r = self.api.cudnnBackendDestroyDescriptor().and_then(|f| {
            // SAFETY: created in new(), destroyed once.
            check(self.api, unsafe { (f.f)(self.raw) }, f.name)
        });
        if let Err(e) = r {
            crate::logging::error(format!("graphsafe: cudnnBackendDestroyDescriptor failed in drop: {e}"));
        }
    }
}

/// A tensor of an operation graph, as cuDNN sees it.
#[derive(Clone, Debug)]
pub(crate) struct TensorSpec {
    pub uid: i64,
    pub dtype: c::cudnnDataType_t,
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    pub is_virtual: bool,
    pub by_value: bool,
    pub reordering: Option<c::cudnnBackendTensorReordering_t>,
}

/// Byte alignment declared for every non-virtual tensor (validation requires it of each pointer).
pub(crate) const TENSOR_ALIGNMENT: i64 = 16;

impl TensorSpec {
    pub fn io(uid: i64, dtype: c::cudnnDataType_t, dims: &[i64], strides: &[i64]) -> TensorSpec {
        TensorSpec { uid, dtype, dims: dims.to_vec(), strides: strides.to_vec(), is_virtual: false, by_value: false, reordering: None }
    }

    pub fn virt(uid: i64, dtype: c::cudnnDataType_t, dims: &[i64], strides: &[i64]) -> TensorSpec {
        TensorSpec { is_virtual: true, ..TensorSpec::io(uid, dtype, dims, strides) }
    }

    pub fn build(&self, api: &'static Api) -> Result<Descriptor> {
        let d = Descriptor::new(api, Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set_dtype(Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, self.dtype)?;
        d.set_i64s(Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, &self.dims)?;
        d.set_i64s(Attr::CUDNN_ATTR_TENSOR_STRIDES, &self.strides)?;
        d.set_i64s(Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[self.uid])?;
        d.set_i64s(Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[TENSOR_ALIGNMENT])?;
        if self.is_virtual {
            d.set_bool(Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL, true)?;
        }
        if self.by_value {
            d.set_bool(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
        }
        if let Some(r) = self.reordering {
            d.set_reordering(Attr::CUDNN_ATTR_TENSOR_REORDERING_MODE, r)?;
        }
        d.finalize()?;
        let mut d = d;
        d.tensor = Some((self.uid, self.bytes(), self.is_virtual));
        Ok(d)
    }

    /// Bytes from the first element to one past the last (`None`: a data type of unknown size,
    /// or dimensions that are negative or overflow).
    pub fn bytes(&self) -> Option<u64> {
        let bits = bits(self.dtype)?;
        let dims: Option<Vec<(u64, u64)>> = self.dims.iter().zip(&self.strides).map(|(&d, &s)| Some((u64::try_from(d).ok()?, u64::try_from(s).ok()?))).collect();
        extent(1, &dims?)?.checked_mul(bits).map(|b| b.div_ceil(8))
    }
}

/// Bits per element of the cuDNN data types graphsafe declares.
fn bits(d: c::cudnnDataType_t) -> Option<u64> {
    use c::cudnnDataType_t as D;
    Some(match d {
        D::CUDNN_DATA_FLOAT | D::CUDNN_DATA_INT32 => 32,
        D::CUDNN_DATA_HALF | D::CUDNN_DATA_BFLOAT16 => 16,
        D::CUDNN_DATA_FP8_E4M3 | D::CUDNN_DATA_FP8_E5M2 | D::CUDNN_DATA_INT8 | D::CUDNN_DATA_UINT8 => 8,
        D::CUDNN_DATA_FP4_E2M1 => 4,
        D::CUDNN_DATA_DOUBLE | D::CUDNN_DATA_INT64 => 64,
        _ => return None,
    })
}

/// A finalized operation graph and every descriptor it references (kept alive with it).
pub(crate) struct OpGraph {
    pub graph: Descriptor,
    // Dropped after `graph` (declaration order): operations, then tensors.
    _parts: Vec<Descriptor>,
    /// The uids of the non-virtual tensors, in the order a variant pack lists their pointers.
    pub io_uids: Vec<i64>,
    /// Bytes each of them spans, in the same order (what [`check_io`] holds the pointers to).
    io_bytes: Vec<u64>,
}

impl OpGraph {
    /// Finalizes a graph of `ops`; `tensors` (and the other descriptors the ops reference) are kept
    /// alive with it. Each of `io_uids` must be a non-virtual tensor among `tensors` made by
    /// [`TensorSpec::build`], of a data type whose size is known.
    pub fn new(api: &'static Api, handle: &Handle, ops: Vec<Descriptor>, tensors: Vec<Descriptor>, io_uids: Vec<i64>) -> Result<OpGraph> {
        let io_bytes = io_uids
            .iter()
            .map(|&uid| match tensors.iter().find_map(|d| d.tensor.filter(|t| t.0 == uid)) {
                Some((_, Some(bytes), false)) => Ok(bytes),
                _ => Err(Error::invalid(format!("tensor uid {uid}"), "a non-virtual tensor of the graph with a known size", "none")),
            })
            .collect::<Result<Vec<u64>>>()?;
        let graph = Descriptor::new(api, Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set_handle(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
        graph.set_descs(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops.iter().collect::<Vec<_>>())?;
        graph.finalize()?;
        let mut parts = ops;
        parts.extend(tensors);
        Ok(OpGraph { graph, _parts: parts, io_uids, io_bytes })
    }
}

/// Checks one execute's memory: a span per non-virtual tensor (in `io_uids` order) holding its
/// extent at the declared alignment, and a workspace of at least `ws_bytes` (else
/// [`Error::WorkspaceTooSmall`] naming both sizes).
pub(crate) fn check_io(graph: &OpGraph, ptrs: &[DeviceSpan], ws: DeviceSpan, ws_bytes: u64) -> Result<()> {
    if ptrs.len() != graph.io_uids.len() {
        return Err(Error::invalid("tensor pointers", format!("{} (one per graph tensor)", graph.io_uids.len()), ptrs.len()));
    }
    for ((uid, bytes), span) in graph.io_uids.iter().zip(&graph.io_bytes).zip(ptrs) {
        span.require(&format!("tensor uid {uid}"), *bytes, TENSOR_ALIGNMENT as u64)?;
    }
    if ws_bytes > ws.len() {
        return Err(Error::WorkspaceTooSmall { needed: ws_bytes, capacity: ws.len() });
    }
    ws.require("workspace", ws_bytes, 1)?;
    Ok(())
}

/// Which heuristic list an engine config came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// `CUDNN_HEUR_MODE_A`, cuDNN's preferred decision-tree heuristic.
    HeuristicA,
    /// `CUDNN_HEUR_MODE_FALLBACK`: functional engines, no performance promise.
    Fallback,
}

/// Numerical notes that disqualify an engine: it would not compute what the op promises (fp32
/// accumulation of the inputs as given, the same bits on every run, which replay-equals-eager needs).
const EXCLUDED_NOTES: [c::cudnnBackendNumericalNote_t; 3] = [
    c::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
    c::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
    c::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
];

/// A finalized execution plan with everything it was made from.
pub(crate) struct ExecPlan {
    pub plan: Descriptor,
    _cfg: Descriptor,
    pub graph: std::sync::Arc<OpGraph>,
    /// `CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE`: the bytes every execute of this plan uses.
    pub workspace_bytes: u64,
    /// The engine's global index.
    pub engine: i64,
    pub source: Source,
    /// Position in its heuristic list.
    pub rank: usize,
}

/// Builds up to `max` execution plans for `graph`: the engine configs of heuristic mode A in
/// order, then those of the fallback list, skipping engines whose numerical notes disqualify them
/// and configs that do not finalize. The first is what an unprompted caller gets.
pub(crate) fn build_plans(api: &'static Api, handle: &Handle, graph: &std::sync::Arc<OpGraph>, max: usize) -> Result<Vec<ExecPlan>> {
    let mut plans: Vec<ExecPlan> = Vec::new();
    let mut last_err: Option<Error> = None;
    let mut seen_engines = Vec::new();
    for (mode, source) in [
        (c::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A, Source::HeuristicA),
        (c::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK, Source::Fallback),
    ] {
        if plans.len() >= max {
            break;
        }
        let heur = Descriptor::new(api, Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heur.set_descs(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph.graph])?;
        heur.set_heur_mode(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, mode)?;
        if let Err(e) = heur.finalize() {
            last_err = Some(e);
            continue;
        }
        let n = heur.count_descs(Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS)?;
        if n == 0 {
            continue;
        }
        let cfgs = heur.get_descs(Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS, Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, n)?;
        for (rank, cfg) in cfgs.into_iter().enumerate() {
            if plans.len() >= max {
                break;
            }
            let engine = match cfg.get_descs(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1) {
                Ok(mut v) if !v.is_empty() => v.remove(0),
                Ok(_) => continue,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let notes = engine.get_enums(Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, Ty::CUDNN_TYPE_NUMERICAL_NOTE, 16).unwrap_or_default();
            if notes.iter().any(|n| EXCLUDED_NOTES.iter().any(|x| x.0 == *n)) {
                continue;
            }
            let index = engine.get_i64(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX).unwrap_or(-1);
            let plan = Descriptor::new(api, Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set_handle(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
            plan.set_descs(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&cfg])?;
            if let Err(e) = plan.finalize() {
                last_err = Some(e);
                continue;
            }
            let ws = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
            // The same engine from the fallback list (or twice with other knobs) adds nothing to
            // choose from when tuning; keep the first.
            if seen_engines.contains(&(index, ws)) {
                continue;
            }
            seen_engines.push((index, ws));
            plans.push(ExecPlan {
                plan,
                _cfg: cfg,
                graph: graph.clone(),
                workspace_bytes: ws.max(0) as u64,
                engine: index,
                source,
                rank,
            });
        }
    }
    if plans.is_empty() {
        let status = match last_err {
            Some(Error::Cudnn { status, .. }) => status,
            _ => c::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED.0 as i32,
        };
        return Err(Error::Cudnn {
            call: "building an execution plan (no engine config of heuristic mode A or the fallback list finalized)",
            status,
        });
    }
    Ok(plans)
}

/// A finalized variant pack: the data pointers (by uid) and the workspace of one execute, made by
/// [`Handle::execute`] after [`check_io`] (or [`VariantPack::new`], which checks too).
pub(crate) struct VariantPack {
    desc: Descriptor,
    graph: Arc<OpGraph>,
    ptrs: Vec<u64>,
    workspace: u64,
}

impl VariantPack {
    /// A pack for `plan` over checked spans (the benchmarks' prebuilt pack).
    pub fn new(api: &'static Api, plan: &ExecPlan, ptrs: &[DeviceSpan], ws: DeviceSpan) -> Result<VariantPack> {
        check_io(&plan.graph, ptrs, ws, plan.workspace_bytes)?;
        VariantPack::build(api, &plan.graph, ptrs, ws)
    }

    fn build(api: &'static Api, graph: &Arc<OpGraph>, ptrs: &[DeviceSpan], ws: DeviceSpan) -> Result<VariantPack> {
        let d = Descriptor::new(api, Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        let raw: Vec<*mut c_void> = ptrs.iter().map(|p| p.ptr() as usize as *mut c_void).collect();
        d.set_ptrs(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, &raw)?;
        d.set_i64s(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &graph.io_uids)?;
        d.set_ptrs(Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &[ws.ptr() as usize as *mut c_void])?;
        d.finalize()?;
        Ok(VariantPack { desc: d, graph: graph.clone(), ptrs: ptrs.iter().map(|p| p.ptr()).collect(), workspace: ws.ptr() })
    }

    fn matches(&self, graph: &Arc<OpGraph>, ptrs: &[DeviceSpan], ws: DeviceSpan) -> bool {
        Arc::ptr_eq(&self.graph, graph) && self.workspace == ws.ptr() && self.ptrs.iter().copied().eq(ptrs.iter().map(|p| p.ptr()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use c::cudnnDataType_t as D;

    #[test]
    fn a_tensors_extent_is_what_the_ops_bounds_check_allows() {
        // Packed FP4 [2, 3, 32] row-major: 2·3·32 values, two per byte.
        assert_eq!(TensorSpec::io(1, D::CUDNN_DATA_FP4_E2M1, &[2, 3, 32], &[96, 32, 1]).bytes(), Some(96));
        // A broadcast weight (batch stride 0) spans one batch; a column-major one its leading dim.
        assert_eq!(TensorSpec::io(2, D::CUDNN_DATA_BFLOAT16, &[4, 8, 16], &[0, 16, 1]).bytes(), Some(8 * 16 * 2));
        assert_eq!(TensorSpec::io(3, D::CUDNN_DATA_HALF, &[1, 8, 16], &[128, 1, 10]).bytes(), Some((7 + 15 * 10 + 1) * 2));
        assert_eq!(TensorSpec::io(4, D::CUDNN_DATA_FLOAT, &[1, 1, 1], &[1, 1, 1]).bytes(), Some(4));
        assert_eq!(TensorSpec::io(5, D::CUDNN_DATA_FLOAT, &[1, -1, 1], &[1, 1, 1]).bytes(), None, "negative dims");
        assert_eq!(TensorSpec::io(6, D::CUDNN_DATA_FLOAT, &[2, 1, 1], &[i64::MAX, 1, 1]).bytes(), None, "overflow");
    }
}

//! cuDNN GEMM through the backend graph API, with workspaces sized before capture.
//!
//! ```text
//!   Cudnn::new(&ctx)                      one per device, for the life of the process
//!     │  plan_workspace(&dnn, &problems)  builds + caches every plan, returns the largest workspace
//!     │  ws.ensure_size(bytes)            the one pre-grow
//!     ▼
//!   matmul(&dnn, &args, &mut ws, &stream)              eager: may build a plan, may grow ws
//!   matmul_captured(&dnn, &args, &captured_ws, &cap)   captured: cached plans only, never grows
//! ```
//!
//! cuDNN's GEMM engines each ask for their own workspace, and some keep split-K semaphores in it. A
//! shared workspace that grows during a capture leaves the graph pointing at freed memory (a 32 MiB
//! buffer that needed 32 MiB + 256 bytes did exactly that, minutes into serving). Here the plan and
//! its workspace size are fixed before the capture: the captured path only looks plans up, and a
//! captured workspace smaller than the plan's `CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE` is
//! [`Error::WorkspaceTooSmall`] with nothing executed.
//!
//! **Plans outlive graphs.** A captured `cudnnBackendExecute` launches the plan's kernels; engines
//! that compile kernels at run time (NVRTC) free that code with the plan (cuDNN < 9.28 gives graphs
//! no reference to it). So a [`Cudnn`] never drops a plan it has handed out: the cache only grows,
//! [`autotune`] retires the plan it replaces instead of freeing it, and `Cudnn` itself lives in a
//! per-device registry until the process exits. Graphs made from any plan therefore stay valid,
//! the same guarantee [`crate::graph::Graph`] gives for buffers. The cost is one plan (a few KiB of
//! host memory, plus any run-time-compiled module) per distinct problem: engines capture a bounded
//! set of shapes.
//!
//! **Which engines.** Heuristic mode A's list in order, then the fallback list; the first config that
//! finalizes wins. Engines whose numerical notes say they down-convert inputs, reduce in reduced
//! precision or are non-deterministic are skipped: the op promises fp32 accumulation, and captured
//! replays must equal eager runs bit for bit. [`autotune`] times the candidates on the caller's
//! buffers and pins the fastest.
//!
//! Loading: see [`crate::sys::cudnn`] (`GRAPHSAFE_CUDNN_LIB`, the loader path, Python wheels);
//! without cuDNN every entry point returns [`Error::CudnnNotFound`].

pub mod matmul;
pub mod nvfp4;

pub use crate::sys::cudnn::{Source, Version};
pub use matmul::{
    autotune, matmul, matmul_captured, plan_workspace, require_workspace, workspace_size, AutotuneReport, MatmulArgs,
    MatmulOperand, MatmulProblem,
};
pub use nvfp4::{nvfp4_matmul, nvfp4_matmul_captured, nvfp4_workspace_size, Nvfp4MatmulArgs, Nvfp4Problem, NVFP4_BLOCK, NVFP4_MIN_VERSION};

use crate::driver::Context;
use crate::error::{Error, Result};
use crate::locks::Locked;
use crate::sys::cudnn::backend::{self, ExecPlan, Handle, OpGraph, VariantPack};
use crate::sys::cudnn::{self as sys, ffi as c, Api};
use crate::sys::DeviceSpan;
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The version of the cuDNN graphsafe would use, and where it was found (for `graphsafe doctor`);
/// needs no GPU.
pub fn library_info() -> Result<(Version, String)> {
    let api = sys::api()?;
    Ok((api.version, api.location.clone()))
}

/// Everything that changes which plan cuDNN builds. Two problems with equal keys share a plan
/// (and so a workspace size); any difference builds a new one.
///
/// Constant for the life of a process and so not in the key: the cuDNN library, the engine
/// filter above, and the declared pointer alignment (16 bytes; validation requires it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PlanKey {
    /// Device ordinal.
    pub device: usize,
    /// Its compute capability (what the engines are chosen for).
    pub compute_capability: (i32, i32),
    /// The operation graph.
    pub op: OpKey,
}

/// The operation-graph part of a [`PlanKey`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKey {
    /// C = A·B.
    Matmul(MatmulProblem),
    /// NVFP4 block-scaled C = alpha · dequant(A)·dequant(B).
    Nvfp4Matmul(Nvfp4Problem),
}

impl PlanKey {
    /// The key of a matmul problem on a device.
    pub fn matmul(device: usize, compute_capability: (i32, i32), p: &MatmulProblem) -> PlanKey {
        PlanKey { device, compute_capability, op: OpKey::Matmul(*p) }
    }
    /// The key of an NVFP4 matmul problem on a device.
    pub fn nvfp4(device: usize, compute_capability: (i32, i32), p: &Nvfp4Problem) -> PlanKey {
        PlanKey { device, compute_capability, op: OpKey::Nvfp4Matmul(*p) }
    }
}

/// What a plan is: reported by every execute and by the planning calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PlanInfo {
    /// Workspace bytes every execute of the plan uses (cuDNN's own number, not rounded).
    pub workspace_bytes: u64,
    /// cuDNN's global engine index.
    pub engine: i64,
    /// Which heuristic list it came from.
    pub source: Source,
    /// Its position there.
    pub rank: usize,
    /// Whether [`autotune`] picked it.
    pub autotuned: bool,
}

/// One cached execution plan.
pub(crate) struct Plan {
    exec: ExecPlan,
    info: PlanInfo,
    // The variant pack of the last execute, reused while the pointers stay the same (a decode loop
    // over fixed buffers builds none after the first).
    last_pack: Mutex<Option<VariantPack>>,
}

impl Plan {
    fn new(exec: ExecPlan, autotuned: bool) -> Plan {
        let info = PlanInfo { workspace_bytes: exec.workspace_bytes, engine: exec.engine, source: exec.source, rank: exec.rank, autotuned };
        Plan { exec, info, last_pack: Mutex::new(None) }
    }
    pub(crate) fn info(&self) -> PlanInfo {
        self.info
    }
}

struct State {
    handle: Handle,
    /// The stream last given to `cudnnSetStream` (as an address).
    stream: usize,
    plans: HashMap<PlanKey, Arc<Plan>>,
    /// Plans replaced by `autotune`: graphs may have captured them, so they are never freed.
    retired: Vec<Arc<Plan>>,
}

/// cuDNN on one device: a handle, the plan cache, and the execute path.
///
/// One per device for the life of the process ([`Cudnn::new`] returns the same one each time), so
/// plans outlive every graph that captured them (see the module docs). Calls from several threads
/// are serialized on the handle.
pub struct Cudnn {
    api: &'static Api,
    ctx: Arc<Context>,
    state: Mutex<State>,
}

/// Runs a cuDNN call that may allocate device memory (creating a handle, building plans) unless
/// a graphsafe capture forbids allocating to this thread (a GLOBAL-mode one anywhere, a
/// THREAD_LOCAL one of this thread): then `StreamCapturing`, nothing called, as for graphsafe's
/// own allocations (`driver::captures::outside_forbidding_capture`).
pub(crate) fn may_allocate<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::driver::captures::outside_forbidding_capture(f)
}

static REGISTRY: Lazy<Mutex<Vec<Arc<Cudnn>>>> = Lazy::new(|| Mutex::new(Vec::new()));

impl std::fmt::Debug for Cudnn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cudnn").field("version", &self.api.version).field("library", &self.api.location).field("device", &self.ctx.device().ordinal()).finish()
    }
}

impl Cudnn {
    /// cuDNN for the device of `ctx`: opens the library (once), checks its version (≥ 9.0), and
    /// creates the device's handle on first use; later calls return the same value. The value,
    /// and with it `ctx`, lives until the process exits (an adopted context must too).
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Cudnn>> {
        let api = sys::api()?;
        let mut reg = Locked::new(REGISTRY.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(d) = reg.iter().find(|d| d.ctx.raw() == ctx.raw()) {
            return Ok(d.clone());
        }
        let _current = ctx.enter()?;
        // cudnnCreate allocates device memory: refused like an allocation while a GLOBAL-mode
        // capture is open anywhere in the process (the capture survives).
        let handle = may_allocate(|| Handle::new(api))?;
        let dnn = Arc::new(Cudnn {
            api,
            ctx: ctx.clone(),
            state: Mutex::new(State { handle, stream: 0, plans: HashMap::new(), retired: Vec::new() }),
        });
        // Resolved now, so that the execute path never fails on a missing symbol.
        api.cudnnBackendExecute()?;
        api.cudnnSetStream()?;
        reg.push(dnn.clone());
        Ok(dnn)
    }

    /// The value [`Cudnn::new`] made for `ctx`'s device, if it ever did; never loads the library
    /// or creates a handle. What a captured op looks up: creating a handle allocates, which a
    /// thread-local capture on this thread does not survive, and a capture only takes plans built
    /// before it anyway.
    pub fn existing(ctx: &Context) -> Option<Arc<Cudnn>> {
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|d| d.ctx.raw() == ctx.raw()).cloned()
    }

    /// The library's version.
    pub fn version(&self) -> Version {
        self.api.version
    }

    /// Where the library was loaded from.
    pub fn library(&self) -> &str {
        &self.api.location
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// How many plans are cached (plus those retired by [`autotune`]).
    pub fn plan_count(&self) -> usize {
        let s = self.lock();
        s.plans.len() + s.retired.len()
    }

    /// cuDNN's text for the last error on this thread (its error log), for diagnostics.
    pub fn last_error_text(&self) -> String {
        self.api.last_error_string()
    }

    fn lock(&self) -> Locked<MutexGuard<'_, State>> {
        // A panic while holding the lock cannot leave the cache inconsistent (inserts are single
        // operations), so a poisoned lock is still usable. Counted (`crate::logging`): cuDNN's
        // failures are logged while plans are built under it.
        Locked::new(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The key of `op` on this device.
    pub(crate) fn key(&self, op: OpKey) -> PlanKey {
        PlanKey { device: self.ctx.device().ordinal(), compute_capability: self.ctx.compute_capability(), op }
    }

    /// The cached plan for `key`, if any (never builds: the captured path).
    pub(crate) fn cached(&self, key: &PlanKey) -> Option<Arc<Plan>> {
        self.lock().plans.get(key).cloned()
    }

    /// The plan for `key`, built with `graph` and cached when missing.
    pub(crate) fn plan(&self, key: &PlanKey, graph: impl FnOnce(&'static Api, &Handle) -> Result<OpGraph>) -> Result<Arc<Plan>> {
        let mut s = self.lock();
        if let Some(p) = s.plans.get(key) {
            return Ok(p.clone());
        }
        let _current = self.ctx.enter()?;
        let g = Arc::new(graph(self.api, &s.handle)?);
        let exec = may_allocate(|| backend::build_plans(self.api, &s.handle, &g, 1))?.remove(0);
        let plan = Arc::new(Plan::new(exec, false));
        s.plans.insert(key.clone(), plan.clone());
        Ok(plan)
    }

    /// Up to `max` candidate plans for `key` (not cached), for tuning.
    pub(crate) fn candidates(&self, graph: impl FnOnce(&'static Api, &Handle) -> Result<OpGraph>, max: usize) -> Result<Vec<Arc<Plan>>> {
        let s = self.lock();
        let _current = self.ctx.enter()?;
        let g = Arc::new(graph(self.api, &s.handle)?);
        Ok(may_allocate(|| backend::build_plans(self.api, &s.handle, &g, max))?.into_iter().map(|e| Arc::new(Plan::new(e, true))).collect())
    }

    /// Makes `plan` the cached plan of `key`; the one it replaces is retired, never freed.
    pub(crate) fn install(&self, key: &PlanKey, plan: Arc<Plan>) {
        let mut s = self.lock();
        if let Some(old) = s.plans.insert(key.clone(), plan) {
            s.retired.push(old);
        }
    }

    /// Only checks that `graph` builds and finalizes (no engine needed): for tests and tools.
    pub(crate) fn finalize_graph_only(&self, graph: impl FnOnce(&'static Api, &Handle) -> Result<OpGraph>) -> Result<()> {
        let s = self.lock();
        let _current = self.ctx.enter()?;
        graph(self.api, &s.handle).map(drop)
    }

    /// Executes `plan` on `stream` with `ptrs` (one span per graph I/O tensor, in `io_uids`
    /// order) and the workspace `ws`; the handle checks both against the plan
    /// ([`Handle::execute`]). `stream` must be a live stream of this device (the op's target's).
    pub(crate) fn execute(&self, plan: &Plan, ptrs: &[DeviceSpan], ws: DeviceSpan, stream: crate::sys::cuda::CUstream) -> Result<()> {
        let mut s = self.lock();
        let _current = self.ctx.enter()?;
        if s.stream != stream as usize {
            s.handle.set_stream(stream)?;
            s.stream = stream as usize;
        }
        let mut pack = Locked::new(plan.last_pack.lock().unwrap_or_else(|e| e.into_inner()));
        s.handle.execute(&plan.exec, ptrs, ws, &mut pack)
    }

    /// Checks that `stream_ctx` is this device's context.
    pub(crate) fn same_context(&self, stream_ctx: &Context) -> Result<()> {
        if stream_ctx.raw() != self.ctx.raw() {
            return Err(Error::other_context("stream", "a stream", "the cuDNN handle's", self.ctx.raw(), stream_ctx.raw()));
        }
        Ok(())
    }
}

/// cuDNN data type of a graphsafe dtype (`None` for one cuDNN's matmul has no use for).
pub(crate) fn data_type(d: crate::ops::tensor::DType) -> Option<c::cudnnDataType_t> {
    use crate::ops::tensor::DType;
    #[allow(unreachable_patterns)] // DType may grow
    Some(match d {
        DType::Bf16 => c::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        DType::Fp16 => c::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::Fp8E4m3 => c::cudnnDataType_t::CUDNN_DATA_FP8_E4M3,
        DType::F32 => c::cudnnDataType_t::CUDNN_DATA_FLOAT,
        _ => return None,
    })
}

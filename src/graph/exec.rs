//! Graphs and executable graphs: each owns a reference to every allocation its capture baked in.

use super::KeepList;
use crate::driver::memory::Allocation;
use crate::driver::{check, init, log_drop_error, Context, Module, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::sync::{Arc, Mutex, MutexGuard};

/// Kinds of graph nodes (the driver's `CUgraphNodeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A kernel launch.
    Kernel,
    /// A memcpy.
    Memcpy,
    /// A memset.
    Memset,
    /// Anything else, with the driver's number.
    Other(u32),
}

/// The lock of a graph's family: the graph and every executable instantiated from it.
///
/// The driver does not treat an executable as independent of its source graph: on the H200
/// (driver 580) `cuGraphExecDestroy` crashes inside libcuda when it overlaps `cuGraphInstantiate`
/// of the source graph or another executable's destroy of the same family (a driver-only program,
/// graphs instantiated and destroyed on 8 threads: SIGSEGV within a second; the same with these
/// calls under one lock: 210,000 operations clean). So instantiating, uploading and destroying
/// hold it; `GraphExec::launch` does not (the replay hot path; concurrent launches were part of
/// that clean run).
#[derive(Clone, Default)]
pub(crate) struct Family(Arc<Mutex<()>>);

impl Family {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) fn destroy_graph(g: c::CUgraph) {
    let r = (|| {
        let f = init()?.cuGraphDestroy()?;
        // SAFETY: g came from cuStreamEndCapture and is destroyed once.
        check(unsafe { (f.f)(g) }, f.name)
    })();
    log_drop_error("cuGraphDestroy", r);
}

/// A captured graph. Owns a reference to every buffer bound during its capture.
///
/// `Send` but not `Sync`: CUDA graph objects are not internally synchronized (every call on one
/// graph, `cuGraphInstantiate` and the read-only looking ones included, must be serialized), so
/// only one thread may use a `Graph` at a time. Wrap it in a `Mutex` to share it.
pub struct Graph {
    raw: c::CUgraph,
    keep: Arc<[Arc<Allocation>]>,
    modules: Arc<[Arc<Module>]>,
    ctx: Arc<Context>,
    family: Family,
}

// SAFETY: the handle may move between threads; `!Sync` keeps calls on it from overlapping, and
// the family lock keeps them from overlapping its executables' destroys on other threads.
unsafe impl Send for Graph {}

impl Graph {
    pub(super) fn new(raw: c::CUgraph, kept: KeepList, ctx: Arc<Context>) -> Graph {
        // Every captured op adds what it bakes in, so the list repeats allocations: keep each once.
        let mut keep = kept.allocations;
        keep.sort_by_key(|a| Arc::as_ptr(a) as usize);
        keep.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Graph { raw, keep: Arc::from(keep), modules: Arc::from(kept.modules), ctx, family: Family::default() }
    }

    /// The kinds of the graph's nodes, in the driver's order.
    pub fn node_kinds(&self) -> Result<Vec<NodeKind>> {
        let _family = self.family.lock();
        let _current = self.ctx.enter()?;
        let a = init()?;
        let get = a.cuGraphGetNodes()?;
        let mut n = 0usize;
        // SAFETY: a null node array asks for the count.
        check(unsafe { (get.f)(self.raw, std::ptr::null_mut(), &mut n) }, get.name)?;
        if n == 0 {
            // The driver refuses a (dangling) array pointer with a count of zero.
            return Ok(Vec::new());
        }
        let mut nodes: Vec<c::CUgraphNode> = vec![std::ptr::null_mut(); n];
        // SAFETY: the array holds n entries.
        check(unsafe { (get.f)(self.raw, nodes.as_mut_ptr(), &mut n) }, get.name)?;
        let ty = a.cuGraphNodeGetType()?;
        nodes
            .iter()
            .take(n)
            .map(|&node| {
                let mut t = c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                // SAFETY: node belongs to this graph; out-pointer to a local.
                check(unsafe { (ty.f)(node, &mut t) }, ty.name)?;
                Ok(match t {
                    c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => NodeKind::Kernel,
                    c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => NodeKind::Memcpy,
                    c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => NodeKind::Memset,
                    other => NodeKind::Other(other.0),
                })
            })
            .collect()
    }

    /// How many buffers the graph keeps alive.
    pub fn kept_alive(&self) -> usize {
        self.keep.len()
    }

    /// How many modules (of kernels it launches) the graph keeps loaded.
    pub fn kept_modules(&self) -> usize {
        self.modules.len()
    }

    /// Instantiates an executable graph; it also keeps every captured buffer alive.
    pub fn instantiate(&self) -> Result<GraphExec> {
        let _current = self.ctx.enter()?;
        // Resolve everything the executable needs first: nothing can fail after the instantiation,
        // whose result would then leak.
        let launch = init()?.cuGraphLaunch()?;
        let f = init()?.cuGraphInstantiateWithFlags()?;
        let mut exec: c::CUgraphExec = std::ptr::null_mut();
        {
            let _family = self.family.lock();
            // SAFETY: live graph, used by this thread only (`!Sync`) and by no destroy of its
            // family (the lock); out-pointer to a local.
            check(unsafe { (f.f)(&mut exec, self.raw, 0) }, f.name)?;
        }
        Ok(GraphExec {
            raw: exec,
            keep: self.keep.clone(),
            modules: self.modules.clone(),
            ctx: self.ctx.clone(),
            family: self.family.clone(),
            launch: launch.f,
            launch_name: launch.name,
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUgraph {
        self.raw
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _family = self.family.lock();
        match self.ctx.enter() {
            Ok(_current) => destroy_graph(self.raw),
            Err(e) => {
                log::error!("graphsafe: making the context current to destroy a graph failed: {e}");
                destroy_graph(self.raw);
            }
        }
    }
}

/// An executable graph. Owns a reference to every buffer its graph captured.
///
/// `Send` but not `Sync`, like [`Graph`]: launches of one executable are serialized by the type
/// checker (or by the C ABI's lock), never left to the driver.
pub struct GraphExec {
    raw: c::CUgraphExec,
    keep: Arc<[Arc<Allocation>]>,
    // Dropped after the executable (field order): its kernels' code stays loaded while it lives.
    modules: Arc<[Arc<Module>]>,
    ctx: Arc<Context>,
    family: Family,
    // Resolved once: replay is the hot path of a decode loop (benches/overhead.rs measures it).
    launch: <c::PFN_cuGraphLaunch_v10000 as crate::sys::driver::OptionInner>::Inner,
    launch_name: &'static str,
}

// SAFETY: the handle may move between threads; `!Sync` keeps calls on it from overlapping.
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Launches (replays) the graph on `stream`.
    ///
    /// No context switch and no driver query: the executable and the stream carry their context,
    /// and a replay must cost what a raw `cuGraphLaunch` costs. The stream must belong to the
    /// graph's context and must not have a graphsafe capture open ([`Error::StreamCapturing`]).
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::invalid("stream", "a stream of the graph's device", "a stream of another context"));
        }
        stream.ensure_no_open_capture()?;
        // SAFETY: live handles; every captured buffer is alive (self.keep).
        check(unsafe { (self.launch)(self.raw, stream.raw()) }, self.launch_name)
    }

    /// Uploads the graph's work to the device ahead of the first launch (takes that cost off it).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::invalid("stream", "a stream of the graph's device", "a stream of another context"));
        }
        stream.ensure_eager()?;
        let _family = self.family.lock();
        let _current = stream.context().enter()?;
        let f = init()?.cuGraphUpload()?;
        // SAFETY: live handles.
        check(unsafe { (f.f)(self.raw, stream.raw()) }, f.name)
    }

    /// How many buffers the executable keeps alive.
    pub fn kept_alive(&self) -> usize {
        self.keep.len()
    }

    /// How many modules (of kernels it launches) the executable keeps loaded.
    pub fn kept_modules(&self) -> usize {
        self.modules.len()
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUgraphExec {
        self.raw
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let r = (|| {
            let _family = self.family.lock();
            let _current = self.ctx.enter()?;
            let f = init()?.cuGraphExecDestroy()?;
            // SAFETY: we instantiated it; an in-flight launch is freed by the driver on completion,
            // and the buffers it uses are freed after this, each once graphsafe's streams have drained.
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuGraphExecDestroy", r);
        // self.keep drops after this body: buffers are released after the executable.
    }
}

//! Graphs and executable graphs: each owns a reference to every allocation its capture baked in.

use super::KeepList;
use crate::driver::graph::{DriverExec, DriverGraph};
use crate::driver::memory::Allocation;
use crate::driver::order::{self, StreamOrder};
use crate::driver::{Module, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::sync::Arc;

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

/// A captured graph. Owns a reference to every buffer bound during its capture.
///
/// `Send` but not `Sync`: CUDA graph objects are not internally synchronized (every call on one
/// graph, `cuGraphInstantiate` and the read-only looking ones included, must be serialized), so
/// only one thread may use a `Graph` at a time. Wrap it in a `Mutex` to share it.
pub struct Graph {
    graph: DriverGraph,
    keep: Arc<[Arc<Allocation>]>,
    modules: Arc<[Arc<Module>]>,
    // The use orders of the workspace buffers the capture bound: sorted by address, no repeats.
    orders: Arc<[Arc<StreamOrder>]>,
}

impl Graph {
    pub(super) fn new(graph: DriverGraph, kept: KeepList) -> Graph {
        // Every captured op adds what it bakes in, so the list repeats allocations: keep each once.
        let mut keep = kept.allocations;
        keep.sort_by_key(|a| Arc::as_ptr(a) as usize);
        keep.dedup_by(|a, b| Arc::ptr_eq(a, b));
        let mut orders = kept.orders;
        orders.sort_by_key(|o| Arc::as_ptr(o) as usize);
        orders.dedup_by(|a, b| Arc::ptr_eq(a, b));
        Graph { graph, keep: Arc::from(keep), modules: Arc::from(kept.modules), orders: Arc::from(orders) }
    }

    /// The kinds of the graph's nodes, in the driver's order.
    pub fn node_kinds(&self) -> Result<Vec<NodeKind>> {
        Ok(self
            .graph
            .node_types()?
            .into_iter()
            .map(|t| match t {
                c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => NodeKind::Kernel,
                c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => NodeKind::Memcpy,
                c::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => NodeKind::Memset,
                other => NodeKind::Other(other.0),
            })
            .collect())
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
        Ok(GraphExec { exec: self.graph.instantiate()?, keep: self.keep.clone(), modules: self.modules.clone(), orders: self.orders.clone() })
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUgraph {
        self.graph.raw()
    }
}

/// An executable graph. Owns a reference to every buffer its graph captured.
///
/// `Send` but not `Sync`, like [`Graph`]: launches of one executable are serialized by the type
/// checker (or by the C ABI's lock), never left to the driver.
pub struct GraphExec {
    // Field order is drop order: the executable goes first, then the buffers it used (released
    // once graphsafe's streams drained), then the modules of its kernels.
    exec: DriverExec,
    keep: Arc<[Arc<Allocation>]>,
    modules: Arc<[Arc<Module>]>,
    orders: Arc<[Arc<StreamOrder>]>,
}

impl GraphExec {
    /// Launches (replays) the graph on `stream`.
    ///
    /// No context switch for the launch itself: the executable and the stream carry their context,
    /// and a replay of a graph with no workspace costs what a raw `cuGraphLaunch` costs. For each
    /// workspace buffer the graph captured, the replay also records that buffer's event on
    /// `stream` after the launch (and, when the buffer's last use was on another stream, waits for
    /// it first): see `src/driver/order.rs`. The stream must belong to the graph's context and
    /// must not be capturing ([`Error::StreamCapturing`]): a graphsafe capture is an atomic load;
    /// on a stream other code holds the handle of (adopted, cudarc's, or handed out by the C ABI)
    /// the driver is asked too, since a replay recorded into a foreign capture would give that
    /// graph this one's memory without keeping any of it alive.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.exec.context().raw() {
            return Err(Error::other_context("stream", "a stream", "the graph's", self.exec.context().raw(), stream.context().raw()));
        }
        stream.ensure_replayable()?;
        // After the previous use of each workspace buffer it captured, on whatever stream; held
        // until the replay is enqueued. Nothing to wait for while the stream does not change.
        let _uses = order::hold_all(&self.orders, stream)?;
        self.exec.launch(stream)
    }

    /// Uploads the graph's work to the device ahead of the first launch (takes that cost off it).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.exec.context().raw() {
            return Err(Error::other_context("stream", "a stream", "the graph's", self.exec.context().raw(), stream.context().raw()));
        }
        stream.ensure_eager()?;
        self.exec.upload(stream)
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
        self.exec.raw()
    }
}

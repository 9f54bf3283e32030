//! The driver's graph objects, owned: stream capture (`begin_capture`, `end_capture`), a captured
//! graph (`DriverGraph`) and an executable (`DriverExec`), with every driver call graphsafe makes on
//! them. What makes replaying one safe is the graph layer's (`crate::graph`): the allocations and
//! modules a capture baked in, kept beside these for as long as they live. `DriverExec`s are made
//! only from `DriverGraph`s, and `DriverGraph`s only by `end_capture`; the graph layer keeps every
//! one next to its keep list, which is what `DriverExec::launch`'s safety rests on.

use super::{check, driver_error, init, log_drop_error, Context, Stream};
use crate::error::{Error, Result};
use crate::locks::Locked;
use crate::sys::cuda as c;
use std::sync::{Arc, Mutex, MutexGuard};

/// The lock of a graph's family: the graph and every executable instantiated from it.
///
/// The driver does not treat an executable as independent of its source graph: on the H200
/// (driver 580) `cuGraphExecDestroy` crashes inside libcuda when it overlaps `cuGraphInstantiate`
/// of the source graph or another executable's destroy of the same family (a driver-only program,
/// graphs instantiated and destroyed on 8 threads: SIGSEGV within a second; the same with these
/// calls under one lock: 210,000 operations clean). So instantiating, uploading, reading the nodes
/// and destroying hold it; `DriverExec::launch` does not (the replay hot path; concurrent launches
/// were part of that clean run).
#[derive(Clone, Default)]
struct Family(Arc<Mutex<()>>);

impl Family {
    /// Records logged while it is held reach the logger once this thread holds no lock of
    /// graphsafe's (a logger dropping an executable of this family would take it again).
    fn lock(&self) -> Locked<MutexGuard<'_, ()>> {
        Locked::new(self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Begins the driver's capture of `stream` (its context current for the call).
pub(crate) fn begin_capture(stream: &Stream, mode: c::CUstreamCaptureMode) -> Result<()> {
    let _current = stream.context().enter()?;
    let f = init()?.cuStreamBeginCapture()?;
    // SAFETY: live stream; the mode is a valid enum value.
    check(unsafe { (f.f)(stream.handle(), mode) }, f.name)
}

/// Ends the driver's capture of `stream`; an invalidated capture becomes `CaptureInvalidated`.
pub(crate) fn end_capture(stream: &Stream) -> Result<DriverGraph> {
    let _current = stream.context().enter()?;
    let f = init()?.cuStreamEndCapture()?;
    let mut g: c::CUgraph = std::ptr::null_mut();
    // SAFETY: live stream; out-pointer to a local.
    let r = unsafe { (f.f)(stream.handle(), &mut g) };
    // Owned from here: whatever the driver returned is destroyed once, by this value's drop.
    let graph = (!g.is_null()).then(|| DriverGraph { raw: g, ctx: stream.context().clone(), family: Family::default() });
    match (r, graph) {
        (c::CUresult::CUDA_SUCCESS, Some(graph)) => Ok(graph),
        (c::CUresult::CUDA_SUCCESS | c::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, _) => Err(Error::CaptureInvalidated {
            reason: "the driver invalidated the capture (an operation not permitted during capture was called)".into(),
        }),
        _ => Err(driver_error(r, f.name)),
    }
}

/// Whether the driver reports `raw` in the middle of a capture: one graphsafe began, an
/// invalidated one not yet ended, or one begun outside graphsafe. The one place graphsafe asks.
///
/// # Safety
/// `raw` is a live stream of `ctx`'s context (or the legacy stream, null).
pub(crate) unsafe fn stream_is_capturing(ctx: &Context, raw: c::CUstream) -> Result<bool> {
    let _current = ctx.enter()?;
    // SAFETY: the caller's contract; `ctx` is current.
    unsafe { stream_is_capturing_current(raw) }
}

/// [`stream_is_capturing`] with the stream's context already current.
///
/// # Safety
/// `raw` is a live stream of the current context (or the legacy stream, null).
pub(crate) unsafe fn stream_is_capturing_current(raw: c::CUstream) -> Result<bool> {
    let f = init()?.cuStreamIsCapturing()?;
    let mut status = c::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream (the caller's contract); out-pointer to a local.
    check(unsafe { (f.f)(raw, &mut status) }, f.name)?;
    Ok(status != c::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A captured graph, destroyed on drop.
pub(crate) struct DriverGraph {
    raw: c::CUgraph,
    ctx: Arc<Context>,
    family: Family,
}

// SAFETY: a graph handle may be used from any thread; `DriverGraph` is not `Sync` (the raw
// pointer), so calls on it never overlap, and the family lock keeps them from overlapping its
// executables' destroys on other threads.
unsafe impl Send for DriverGraph {}

impl DriverGraph {
    /// The driver's types of the graph's nodes, in its order.
    pub(crate) fn node_types(&self) -> Result<Vec<c::CUgraphNodeType>> {
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
                Ok(t)
            })
            .collect()
    }

    /// Instantiates an executable of the graph (in its family).
    pub(crate) fn instantiate(&self) -> Result<DriverExec> {
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
        Ok(DriverExec { raw: exec, ctx: self.ctx.clone(), family: self.family.clone(), launch: launch.f, launch_name: launch.name })
    }

    /// The raw handle.
    pub(crate) fn raw(&self) -> c::CUgraph {
        self.raw
    }
}

impl Drop for DriverGraph {
    fn drop(&mut self) {
        let _family = self.family.lock();
        let r = (|| {
            let _current = self.ctx.enter()?;
            let f = init()?.cuGraphDestroy()?;
            // SAFETY: the graph came from cuStreamEndCapture and is destroyed once, here.
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuGraphDestroy", r);
    }
}

/// An executable graph, destroyed on drop.
pub(crate) struct DriverExec {
    raw: c::CUgraphExec,
    ctx: Arc<Context>,
    family: Family,
    // Resolved once: replay is the hot path of a decode loop (benches/overhead.rs measures it).
    launch: <c::PFN_cuGraphLaunch_v10000 as crate::sys::driver::OptionInner>::Inner,
    launch_name: &'static str,
}

// SAFETY: as for DriverGraph: movable between threads, not `Sync`, destroys under the family lock.
unsafe impl Send for DriverExec {}

impl DriverExec {
    /// Launches the executable on `stream`, which the caller checked is of the executable's
    /// context. No context switch and no driver query: a replay must cost what a raw
    /// `cuGraphLaunch` costs.
    pub(crate) fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: live handles. What the graph baked in is alive: every DriverExec is owned by a
        // crate::graph::GraphExec beside the keep list of the capture it came from (module docs).
        check(unsafe { (self.launch)(self.raw, stream.handle()) }, self.launch_name)
    }

    /// Uploads the executable's work to the device ahead of its first launch.
    pub(crate) fn upload(&self, stream: &Stream) -> Result<()> {
        let _family = self.family.lock();
        let _current = stream.context().enter()?;
        let f = init()?.cuGraphUpload()?;
        // SAFETY: live handles.
        check(unsafe { (f.f)(self.raw, stream.handle()) }, f.name)
    }

    /// The context the executable runs in.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw handle.
    pub(crate) fn raw(&self) -> c::CUgraphExec {
        self.raw
    }
}

impl Drop for DriverExec {
    fn drop(&mut self) {
        let r = (|| {
            let _family = self.family.lock();
            let _current = self.ctx.enter()?;
            let f = init()?.cuGraphExecDestroy()?;
            // SAFETY: we instantiated it and destroy it once; an in-flight launch is freed by the
            // driver on completion, and the buffers it uses are released after this (the graph
            // layer drops its keep list after the executable), once graphsafe's streams drained.
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuGraphExecDestroy", r);
    }
}

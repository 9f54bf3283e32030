//! Stream capture as a typestate, and graphs that own what they captured.
//!
//! ```text
//!   Stream ──begin_capture(&mut)──▶ Capture<'c> ──end()──▶ Graph ──instantiate()──▶ GraphExec
//!                                     │  bind_workspace(&'c mut Workspace) → Captured<'c>
//!                                     │  bind_buffer(&DeviceBuffer)        → CapturedBuffer<'c>
//! ```
//!
//! * The capture borrows the stream mutably: no eager call can reach it until the capture ends, and
//!   [`Capture::stream`] hands out a [`CaptureStream`], a type eager APIs do not accept.
//! * Binding a workspace borrows it mutably for the whole capture, so growing it there is a
//!   compile error (tests/compile_fail). Kernels see a [`Captured`] view: pointer and capacity,
//!   and a [`Captured::require`] that fails with [`Error::WorkspaceTooSmall`] rather than grow.
//! * Every bound buffer's allocation is kept alive by the capture, then by the [`Graph`], then by
//!   every [`GraphExec`] made from it, until the last of them is dropped (invariant 1).

use crate::driver::memory::{copy_d2d_raw, memset_u8_raw, Allocation};
use crate::driver::{check, driver_error, init, log_drop_error, Context, DeviceBuffer, DevicePtr, Function, LaunchConfig, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use crate::workspace::Workspace;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

/// Which other threads' calls a capture forbids (the driver's `CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CaptureMode {
    /// Potentially unsafe calls (e.g. `cuMemAlloc`) are refused on every thread while this
    /// capture is open.
    Global,
    /// Refused on this thread only: the default, what engines capturing per thread want.
    #[default]
    ThreadLocal,
    /// Nothing is refused; only for code that knows what it does.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> c::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

impl Stream {
    /// Begins capturing this stream into a graph (see [`Capture`]).
    pub fn begin_capture(&mut self, mode: CaptureMode) -> Result<Capture<'_>> {
        begin_capture(self, mode)?;
        Ok(Capture { stream: self, mode, keep: Vec::new(), ended: false, _not_send: PhantomData })
    }
}

fn begin_capture(stream: &Stream, mode: CaptureMode) -> Result<()> {
    stream.context().bind()?;
    let f = init()?.cuStreamBeginCapture()?;
    // SAFETY: live stream; mode is a valid enum value.
    check(unsafe { (f.f)(stream.raw(), mode.raw()) }, f.name)
}

/// A capture whose lifetime the type checker cannot follow: the C ABI's. Same driver calls and
/// the same keep-alive rule as [`Capture`]; the borrow rules (no growth of a bound workspace, no
/// eager work on the stream) are enforced at run time by `capi`.
pub(crate) struct DetachedCapture {
    stream: Arc<Stream>,
    keep: Vec<Arc<Allocation>>,
    ended: bool,
}

impl DetachedCapture {
    pub(crate) fn begin(stream: Arc<Stream>, mode: CaptureMode) -> Result<DetachedCapture> {
        begin_capture(&stream, mode)?;
        Ok(DetachedCapture { stream, keep: Vec::new(), ended: false })
    }
    pub(crate) fn keep(&mut self, a: Arc<Allocation>) {
        self.keep.push(a);
    }
    pub(crate) fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }
    pub(crate) fn end(mut self) -> Result<Graph> {
        self.ended = true;
        let raw = end_capture(&self.stream)?;
        Ok(Graph { raw, keep: Arc::from(std::mem::take(&mut self.keep)), ctx: self.stream.context().clone() })
    }
}

impl Drop for DetachedCapture {
    fn drop(&mut self) {
        if !self.ended {
            abandon(&self.stream);
        }
    }
}

/// Ends an abandoned capture so the stream is usable again, throwing the graph away.
fn abandon(stream: &Stream) {
    match end_capture(stream) {
        Ok(g) => destroy_graph(g),
        Err(Error::CaptureInvalidated { .. }) => {}
        Err(e) => log::error!("graphsafe: ending an abandoned capture failed: {e}"),
    }
}

/// An open stream capture. End it with [`Capture::end`]; dropping it ends the capture and throws
/// the graph away, leaving the stream usable.
pub struct Capture<'c> {
    stream: &'c mut Stream,
    mode: CaptureMode,
    keep: Vec<Arc<Allocation>>,
    ended: bool,
    // Thread-local and global captures must end on the thread that began them.
    _not_send: PhantomData<*const ()>,
}

/// The capturing stream, as captured ops see it. Eager APIs take `&Stream` and so cannot be given
/// this: nothing can be issued to a capturing stream outside the capture's rules.
#[derive(Clone, Copy)]
pub struct CaptureStream<'a> {
    stream: &'a Stream,
}

impl CaptureStream<'_> {
    /// The raw stream handle (for glue that launches through the CUDA runtime).
    pub fn raw(&self) -> c::CUstream {
        self.stream.raw()
    }
    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        self.stream.context()
    }
}

/// A workspace bound to an open capture: its address and capacity, fixed until the capture ends.
/// It has no way to grow; kernels that need more get [`Error::WorkspaceTooSmall`].
#[derive(Clone, Copy, Debug)]
pub struct Captured<'c> {
    ptr: DevicePtr,
    capacity: u64,
    _borrow: PhantomData<&'c mut Workspace>,
}

impl Captured<'_> {
    /// The captured capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// The captured address (0 when the capacity is 0).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The address to launch with, if `needed` bytes fit; else `WorkspaceTooSmall` naming both.
    pub fn require(&self, needed: u64) -> Result<DevicePtr> {
        if needed > self.capacity {
            return Err(Error::WorkspaceTooSmall { needed, capacity: self.capacity });
        }
        Ok(self.ptr)
    }
}

/// A device buffer bound to an open capture (kept alive by it and the graphs made from it).
#[derive(Clone, Copy, Debug)]
pub struct CapturedBuffer<'c> {
    ptr: DevicePtr,
    len: usize,
    ctx: c::CUcontext,
    _capture: PhantomData<&'c ()>,
}

impl CapturedBuffer<'_> {
    /// Device address.
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (device buffers are never empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The context the buffer lives in.
    pub fn context_raw(&self) -> c::CUcontext {
        self.ctx
    }
}

impl<'c> Capture<'c> {
    /// The capture mode.
    pub fn mode(&self) -> CaptureMode {
        self.mode
    }

    /// The capturing stream, for captured ops.
    pub fn stream(&self) -> CaptureStream<'_> {
        CaptureStream { stream: self.stream }
    }

    fn same_context(&self, ctx: &Context) -> Result<()> {
        if ctx.raw() != self.stream.context().raw() {
            return Err(Error::invalid("device", "memory of the capturing stream's device", "memory of another device"));
        }
        Ok(())
    }

    /// Binds `ws` for the rest of the capture. The workspace stays mutably borrowed until
    /// [`Capture::end`], so it cannot grow (or be dropped) while the capture is open, and the graph
    /// keeps its current buffer alive even after it later grows.
    pub fn bind_workspace(&mut self, ws: &'c mut Workspace) -> Result<Captured<'c>> {
        self.same_context(ws.context())?;
        if let Some(a) = ws.allocation() {
            self.keep.push(a.clone());
        }
        Ok(Captured { ptr: ws.device_ptr(), capacity: ws.capacity(), _borrow: PhantomData })
    }

    /// Binds a device buffer a captured kernel touches; the graph keeps it alive.
    pub fn bind_buffer(&mut self, buf: &DeviceBuffer) -> Result<CapturedBuffer<'c>> {
        self.same_context(buf.context())?;
        self.keep.push(buf.allocation().clone());
        Ok(CapturedBuffer { ptr: buf.device_ptr(), len: buf.len(), ctx: buf.context().raw(), _capture: PhantomData })
    }

    /// Captures a memset of the whole buffer (a memset node of the graph).
    pub fn memset_u8(&self, buf: &CapturedBuffer<'c>, value: u8) -> Result<()> {
        memset_u8_raw(buf.ptr, value, buf.len, self.stream)
    }

    /// Captures a copy of all of `src` to the start of `dst` (a memcpy node of the graph).
    pub fn copy(&self, dst: &CapturedBuffer<'c>, src: &CapturedBuffer<'c>) -> Result<()> {
        if src.len > dst.len {
            return Err(Error::invalid("source length", format!("at most {} bytes", dst.len), src.len));
        }
        copy_d2d_raw(dst.ptr, src.ptr, src.len, self.stream)
    }

    /// Captures a kernel launch.
    ///
    /// # Safety
    /// As [`Function::launch`]; every device address in `params` must come from a workspace or
    /// buffer bound to this capture (or otherwise outlive every graph made from it).
    pub unsafe fn launch(&self, f: &Function, cfg: &LaunchConfig, params: &mut [*mut c_void]) -> Result<()> {
        f.launch(cfg, self.stream, params)
    }

    /// Ends the capture. Returns the graph, or [`Error::CaptureInvalidated`] when the driver
    /// invalidated the capture (an illegal call inside it); either way the stream is usable again.
    pub fn end(mut self) -> Result<Graph> {
        self.ended = true;
        let raw = end_capture(self.stream)?;
        Ok(Graph {
            raw,
            keep: Arc::from(std::mem::take(&mut self.keep)),
            ctx: self.stream.context().clone(),
        })
    }
}

/// Ends the capture on `stream`; an invalidated capture becomes `CaptureInvalidated`.
fn end_capture(stream: &Stream) -> Result<c::CUgraph> {
    stream.context().bind()?;
    let f = init()?.cuStreamEndCapture()?;
    let mut g: c::CUgraph = std::ptr::null_mut();
    // SAFETY: live stream in capture mode; out-pointer to a local.
    let r = unsafe { (f.f)(stream.raw(), &mut g) };
    if r == c::CUresult::CUDA_SUCCESS && !g.is_null() {
        return Ok(g);
    }
    if !g.is_null() {
        destroy_graph(g);
    }
    if r == c::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == c::CUresult::CUDA_SUCCESS {
        return Err(Error::CaptureInvalidated {
            reason: "the driver invalidated the capture (an operation not permitted during capture was called)".into(),
        });
    }
    Err(driver_error(r, f.name))
}

fn destroy_graph(g: c::CUgraph) {
    let r = (|| {
        let f = init()?.cuGraphDestroy()?;
        // SAFETY: g came from cuStreamEndCapture and is destroyed once.
        check(unsafe { (f.f)(g) }, f.name)
    })();
    log_drop_error("cuGraphDestroy", r);
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Abandoned (early return, `?`, panic): end the capture so the stream is usable again.
        abandon(self.stream);
    }
}

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
pub struct Graph {
    raw: c::CUgraph,
    keep: Arc<[Arc<Allocation>]>,
    ctx: Arc<Context>,
}

// SAFETY: graph handles may be used from any thread; the driver serializes graph calls per graph,
// and we only read it through &self.
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl Graph {
    /// The kinds of the graph's nodes, in the driver's order.
    pub fn node_kinds(&self) -> Result<Vec<NodeKind>> {
        self.ctx.bind()?;
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

    /// Instantiates an executable graph; it also keeps every captured buffer alive.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.ctx.bind()?;
        let f = init()?.cuGraphInstantiateWithFlags()?;
        let mut exec: c::CUgraphExec = std::ptr::null_mut();
        // SAFETY: live graph; out-pointer to a local.
        check(unsafe { (f.f)(&mut exec, self.raw, 0) }, f.name)?;
        let launch = init()?.cuGraphLaunch()?;
        Ok(GraphExec { raw: exec, keep: self.keep.clone(), ctx: self.ctx.clone(), launch: launch.f, launch_name: launch.name })
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUgraph {
        self.raw
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            log::error!("graphsafe: binding the context to destroy a graph failed: {e}");
        }
        destroy_graph(self.raw);
    }
}

/// An executable graph. Owns a reference to every buffer its graph captured.
pub struct GraphExec {
    raw: c::CUgraphExec,
    keep: Arc<[Arc<Allocation>]>,
    ctx: Arc<Context>,
    // Resolved once: replay is the hot path of a decode loop (benches/overhead.rs measures it).
    launch: <c::PFN_cuGraphLaunch_v10000 as crate::sys::driver::OptionInner>::Inner,
    launch_name: &'static str,
}

// SAFETY: executable graph handles may be launched from any thread.
unsafe impl Send for GraphExec {}
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Launches (replays) the graph on `stream`.
    ///
    /// No context switch: the executable and the stream carry their context, and a replay must
    /// cost what a raw `cuGraphLaunch` costs. The stream must belong to the graph's context.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::invalid("stream", "a stream of the graph's device", "a stream of another context"));
        }
        // SAFETY: live handles; every captured buffer is alive (self.keep).
        check(unsafe { (self.launch)(self.raw, stream.raw()) }, self.launch_name)
    }

    /// Uploads the graph's work to the device ahead of the first launch (takes that cost off it).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        let f = init()?.cuGraphUpload()?;
        // SAFETY: live handles.
        check(unsafe { (f.f)(self.raw, stream.raw()) }, f.name)
    }

    /// How many buffers the executable keeps alive.
    pub fn kept_alive(&self) -> usize {
        self.keep.len()
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUgraphExec {
        self.raw
    }

    fn same_context(&self, stream: &Stream) -> Result<()> {
        if stream.context().raw() != self.ctx.raw() {
            return Err(Error::invalid("stream", "a stream of the graph's device", "a stream of another context"));
        }
        stream.context().bind()
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let r = (|| {
            self.ctx.bind()?;
            let f = init()?.cuGraphExecDestroy()?;
            // SAFETY: we instantiated it; an in-flight launch is freed by the driver on completion,
            // and the buffers it uses are freed after this (cuMemFree waits for that work).
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuGraphExecDestroy", r);
        // self.keep drops after this body: buffers are released after the executable.
    }
}

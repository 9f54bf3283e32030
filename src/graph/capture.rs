//! Captures: the branded Rust capture ([`Capture`]), its views ([`CapturedWorkspace`], [`CapturedBuffer`]),
//! and the run-time-checked capture of the C ABI ([`DetachedCapture`]).

use super::exec::Graph;
use super::op_target::CaptureSite;
use super::{Brand, CaptureId, CaptureMode, KeepList};
use crate::driver::captures::Forbids;
use crate::driver::graph::DriverGraph;
use crate::driver::memory::{copy_d2d_raw, memset_u8_raw, Allocation};
use crate::driver::{Context, DeviceBuffer, DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use crate::workspace::Workspace;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

impl Stream {
    /// Captures the work `body` issues through its [`Capture`] into a graph, and returns the graph
    /// with `body`'s value. This is the form to prefer: the capture is *branded*, so its views
    /// ([`CapturedWorkspace`], [`CapturedBuffer`]) cannot leave `body` or be used by an op of another capture
    /// (a compile error), and the capture always ends, however `body` returns.
    ///
    /// If `body` fails, the capture is abandoned (the stream is usable again) and its error is
    /// returned. A workspace bound inside `body` stays borrowed until this returns.
    ///
    /// ```no_run
    /// # use graphsafe::{driver::{Context, Stream}, graph::CaptureMode, workspace::Workspace};
    /// # fn main() -> graphsafe::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let mut stream = Stream::new(&ctx)?;
    /// let mut ws = Workspace::new(&stream, 1 << 20)?;
    /// let (graph, capacity) = stream.capture(CaptureMode::ThreadLocal, |cap| {
    ///     let w = cap.bind_workspace(&mut ws)?;
    ///     // ... captured ops take `&w` and `cap` here ...
    ///     Ok(w.capacity())
    /// })?;
    /// let exec = graph.instantiate()?;
    /// exec.launch(&stream)?;
    /// # let _ = capacity; Ok(()) }
    /// ```
    pub fn capture<'s, R>(&'s mut self, mode: CaptureMode, body: impl for<'id> FnOnce(&mut Capture<'s, 'id>) -> Result<R>) -> Result<(Graph, R)> {
        let mut cap: Capture<'s, 's> = self.begin_capture(mode)?;
        let value = body(&mut cap)?;
        Ok((cap.end()?, value))
    }

    /// Begins capturing this stream into a graph (see [`Capture`]). Views of this capture are
    /// checked against it at run time; [`Stream::capture`] checks them at compile time.
    ///
    /// Refused ([`Error::StreamCapturing`]) when the stream is already capturing: a graphsafe
    /// capture still open (or leaked with `mem::forget`), or one the driver reports.
    pub fn begin_capture(&mut self, mode: CaptureMode) -> Result<Capture<'_, '_>> {
        let id = begin_capture(self, mode)?;
        Ok(Capture { stream: self, id, mode, keep: RefCell::new(KeepList::default()), ended: false, _brand: PhantomData, _borrow: PhantomData, _not_send: PhantomData })
    }
}

/// Marks the stream, then begins the driver's capture (unmarking if that fails).
fn begin_capture(stream: &Stream, mode: CaptureMode) -> Result<CaptureId> {
    stream.ensure_eager()?;
    let id = CaptureId::fresh();
    stream.mark_capturing(id.get())?;
    // Opened under the context's free gate (which records the work queued before the capture, for
    // frees) and in the process-wide registry of what each capture forbids (a GLOBAL one: every
    // thread's allocations, so none may be in flight as it begins).
    let forbids = match mode {
        CaptureMode::Global => Forbids::EveryThread,
        CaptureMode::ThreadLocal => Forbids::ThisThread,
        CaptureMode::Relaxed => Forbids::Nothing,
    };
    let begun = crate::driver::captures::open(stream, id.get(), forbids, || crate::driver::graph::begin_capture(stream, mode.driver_mode()));
    if let Err(e) = begun {
        stream.clear_capturing(id.get());
        return Err(e);
    }
    Ok(id)
}

/// Ends graphsafe capture `id` on `stream`. Returns the driver's graph, and whether the capture is
/// over: after a failed end the driver may still be capturing (e.g. a thread-local capture ended
/// from another thread); then the stream stays marked, so eager work keeps being refused.
fn finish(stream: &Stream, id: CaptureId) -> (Result<DriverGraph>, bool) {
    let r = crate::driver::graph::end_capture(stream);
    let over = r.is_ok() || !stream.is_capturing().unwrap_or(true);
    if over {
        stream.clear_capturing(id.get());
        crate::driver::captures::close(stream.context(), id.get(), false);
        // Frees deferred meanwhile (an engine's capture on another stream, a failed wait) may go
        // through now.
        crate::driver::memory::retry_deferred_frees(stream.context());
    }
    (r, over)
}

/// Ends an abandoned capture so the stream is usable again, throwing the graph away.
fn abandon(stream: &Stream, id: CaptureId) {
    match finish(stream, id).0 {
        Ok(graph) => drop(graph),
        Err(Error::CaptureInvalidated { .. }) => {}
        Err(e) => crate::logging::error(format!("graphsafe: ending an abandoned capture failed: {e}")),
    }
}


/// An open stream capture. End it with [`Capture::end`]; dropping it ends the capture and throws
/// the graph away, leaving the stream usable.
///
/// `'s` is the borrow of the stream (and of every workspace bound to the capture); `'id` is the
/// capture's brand: views carry it, and ops accept only views of their own capture's brand.
pub struct Capture<'s, 'id> {
    stream: &'s mut Stream,
    id: CaptureId,
    mode: CaptureMode,
    // Every allocation whose address the capture may bake in (and every module whose kernels it
    // launches). Captured ops append to it through
    // `&Capture` (they take the capture shared), so it needs interior mutability; the capture is
    // neither Send nor Sync.
    keep: RefCell<KeepList>,
    ended: bool,
    _brand: Brand<'id>,
    // `'s` is invariant too: otherwise the capture could be seen with a shorter stream borrow and
    // lend a workspace for less than the capture lives (its views would outlive the borrow).
    _borrow: Brand<'s>,
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
    /// The raw stream handle (for glue that launches through the CUDA runtime). As with
    /// [`Stream::raw`], the handle may now be held by other code, so the stream is marked shared:
    /// every later replay or eager op on it also asks the driver whether something else is
    /// capturing it (a capture graphsafe did not begin would record graphsafe's work into a graph
    /// that keeps none of its memory alive).
    pub fn raw(&self) -> c::CUstream {
        self.stream.raw()
    }
    /// The stream itself, for the driver layer (`CaptureStream::raw_unshared` lives there, with
    /// the crate's other `unsafe`); never handed to safe code, which would reach it eagerly.
    pub(crate) fn inner(&self) -> &Stream {
        self.stream
    }
    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        self.stream.context()
    }
}

/// A workspace region fixed for one capture: what a captured op may use, and what the capture
/// must keep alive. The unbranded core of [`CapturedWorkspace`] (the C ABI keeps these per binding).
#[derive(Clone, Debug)]
pub(crate) struct WorkspaceView {
    pub ptr: DevicePtr,
    pub capacity: u64,
    pub capture: CaptureId,
    // The workspace's context, as an identity (compared, never used as a handle).
    pub ctx: usize,
    pub alloc: Option<Arc<Allocation>>,
}


impl WorkspaceView {
    fn of(ws: &Workspace, capture: CaptureId) -> WorkspaceView {
        WorkspaceView { ptr: ws.device_ptr(), capacity: ws.capacity(), capture, ctx: ws.context().raw() as usize, alloc: ws.allocation().cloned() }
    }
}

/// A workspace bound to an open capture: its address and capacity, fixed until the capture ends.
/// It has no way to grow; kernels that need more get [`Error::WorkspaceTooSmall`]. It belongs to
/// the capture that bound it (brand `'id`, and its [`CaptureId`]).
#[derive(Clone, Debug)]
pub struct CapturedWorkspace<'id> {
    view: WorkspaceView,
    _brand: Brand<'id>,
}

impl CapturedWorkspace<'_> {
    /// The captured capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.view.capacity
    }
    /// The captured address (0 when the capacity is 0).
    pub fn device_ptr(&self) -> DevicePtr {
        self.view.ptr
    }
    /// The capture that bound it.
    pub fn capture_id(&self) -> CaptureId {
        self.view.capture
    }
    /// The address to launch with, if `needed` bytes fit; else `WorkspaceTooSmall` naming both.
    pub fn require(&self, needed: u64) -> Result<DevicePtr> {
        if needed > self.view.capacity {
            return Err(Error::WorkspaceTooSmall { needed, capacity: self.view.capacity });
        }
        Ok(self.view.ptr)
    }
    pub(crate) fn view(&self) -> &WorkspaceView {
        &self.view
    }
}

/// A device buffer bound to an open capture. It holds the buffer's allocation, which the capture
/// (and every graph made from it) keeps alive; it belongs to the capture that bound it.
#[derive(Clone, Debug)]
pub struct CapturedBuffer<'id> {
    alloc: Arc<Allocation>,
    capture: CaptureId,
    _brand: Brand<'id>,
}

impl CapturedBuffer<'_> {
    /// Device address.
    pub fn device_ptr(&self) -> DevicePtr {
        self.alloc.ptr()
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }
    /// Always false (device buffers are never empty).
    pub fn is_empty(&self) -> bool {
        self.alloc.is_empty()
    }
    /// The context the buffer lives in.
    pub fn context_raw(&self) -> c::CUcontext {
        self.alloc.context().raw()
    }
    /// The capture that bound it.
    pub fn capture_id(&self) -> CaptureId {
        self.capture
    }
    pub(crate) fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }
}

impl<'s, 'id> Capture<'s, 'id> {
    /// The capture mode.
    pub fn mode(&self) -> CaptureMode {
        self.mode
    }

    /// This capture's identity (what its views carry).
    pub fn id(&self) -> CaptureId {
        self.id
    }

    /// The capturing stream, for captured ops.
    pub fn stream(&self) -> CaptureStream<'_> {
        CaptureStream { stream: self.stream }
    }

    /// Where captured ops record: the stream, this capture's identity and keep list.
    pub(crate) fn site(&self) -> CaptureSite<'_> {
        CaptureSite::new(self.id, self.stream, &self.keep)
    }

    fn same_context(&self, ctx: &Context) -> Result<()> {
        if ctx.raw() != self.stream.context().raw() {
            return Err(Error::other_context("device", "memory", "the capturing stream's", self.stream.context().raw(), ctx.raw()));
        }
        Ok(())
    }

    /// Binds `ws` for the rest of the capture. The workspace stays mutably borrowed until the
    /// capture ends, so it cannot grow (or be dropped) while the capture is open, and the graph
    /// keeps its current buffer alive even after it later grows.
    pub fn bind_workspace(&mut self, ws: &'s mut Workspace) -> Result<CapturedWorkspace<'id>> {
        self.same_context(ws.context())?;
        if let Some(a) = ws.allocation() {
            self.keep.get_mut().allocations.push(a.clone());
        }
        if let Some(o) = ws.order() {
            self.keep.get_mut().orders.push(o.clone());
        }
        Ok(CapturedWorkspace { view: WorkspaceView::of(ws, self.id), _brand: PhantomData })
    }

    /// Binds a device buffer a captured kernel touches; the graph keeps it alive.
    pub fn bind_buffer(&mut self, buf: &DeviceBuffer) -> Result<CapturedBuffer<'id>> {
        self.same_context(buf.context())?;
        self.keep.get_mut().allocations.push(buf.allocation().clone());
        Ok(CapturedBuffer { alloc: buf.allocation().clone(), capture: self.id, _brand: PhantomData })
    }

    /// Captures a memset of the whole buffer (a memset node of the graph).
    pub fn memset_u8(&self, buf: &CapturedBuffer<'id>, value: u8) -> Result<()> {
        let site = self.site();
        site.admit_buffer("buf", buf)?;
        site.keep(buf.allocation());
        memset_u8_raw(buf.device_ptr(), value, buf.len(), self.stream)
    }

    /// Captures a copy of all of `src` to the start of `dst` (a memcpy node of the graph).
    pub fn copy(&self, dst: &CapturedBuffer<'id>, src: &CapturedBuffer<'id>) -> Result<()> {
        let site = self.site();
        site.admit_buffer("dst", dst)?;
        site.admit_buffer("src", src)?;
        if src.len() > dst.len() {
            return Err(Error::invalid("source length", format!("at most {} bytes", dst.len()), src.len()));
        }
        crate::driver::memory::refuse_overlapping_copy(dst.device_ptr(), src.device_ptr(), src.len())?;
        site.keep(dst.allocation());
        site.keep(src.allocation());
        copy_d2d_raw(dst.device_ptr(), src.device_ptr(), src.len(), self.stream)
    }


    /// How many allocations the capture keeps alive so far.
    pub fn kept_alive(&self) -> usize {
        self.keep.borrow().allocations.len()
    }

    /// Ends the capture. Returns the graph, or [`Error::CaptureInvalidated`] when the driver
    /// invalidated the capture (an illegal call inside it); either way the stream is usable again.
    /// If ending fails and the driver still reports the stream capturing (a transient driver
    /// error), the end is tried once more as the capture is dropped, so one failed call does not
    /// leave the stream refusing eager work for good.
    pub fn end(mut self) -> Result<Graph> {
        let (r, over) = finish(self.stream, self.id);
        self.ended = over;
        Ok(Graph::new(r?, std::mem::take(self.keep.get_mut())))
    }
}

impl Drop for Capture<'_, '_> {
    fn drop(&mut self) {
        if !self.ended {
            // Abandoned (early return, `?`, panic): end the capture so the stream is usable again.
            abandon(self.stream, self.id);
        }
    }
}

/// A capture whose lifetime the type checker cannot follow: the C ABI's. Same driver calls, the
/// same identity and keep-alive rules as [`Capture`]; the borrow rules (no growth of a bound
/// workspace, no eager work on the stream) are enforced at run time by `capi`.
pub(crate) struct DetachedCapture {
    stream: Arc<Stream>,
    id: CaptureId,
    keep: RefCell<KeepList>,
    ended: bool,
}

impl DetachedCapture {
    pub(crate) fn begin(stream: Arc<Stream>, mode: CaptureMode) -> Result<DetachedCapture> {
        let id = begin_capture(&stream, mode)?;
        Ok(DetachedCapture { stream, id, keep: RefCell::new(KeepList::default()), ended: false })
    }

    pub(crate) fn site(&self) -> CaptureSite<'_> {
        CaptureSite::new(self.id, &self.stream, &self.keep)
    }

    fn same_context(&self, ctx: c::CUcontext) -> Result<()> {
        if ctx != self.stream.context().raw() {
            return Err(Error::other_context("device", "memory", "the capturing stream's", self.stream.context().raw(), ctx));
        }
        Ok(())
    }

    /// Binds a workspace: the capture keeps its current buffer; the view is what captured ops use.
    pub(crate) fn bind_workspace(&mut self, ws: &Workspace) -> Result<WorkspaceView> {
        self.same_context(ws.context().raw())?;
        if let Some(a) = ws.allocation() {
            self.keep.get_mut().allocations.push(a.clone());
        }
        if let Some(o) = ws.order() {
            self.keep.get_mut().orders.push(o.clone());
        }
        Ok(WorkspaceView::of(ws, self.id))
    }

    pub(crate) fn bind_buffer(&mut self, buf: &DeviceBuffer) -> Result<()> {
        self.same_context(buf.context().raw())?;
        self.keep.get_mut().allocations.push(buf.allocation().clone());
        Ok(())
    }

    /// Ends the capture. `Err` with the capture still open (`is_open()`) leaves it usable, e.g.
    /// for ending from the right thread; any other outcome ends it for good.
    pub(crate) fn end(&mut self) -> Result<Graph> {
        let (r, over) = finish(&self.stream, self.id);
        self.ended = over;
        let raw = r?;
        Ok(Graph::new(raw, std::mem::take(self.keep.get_mut())))
    }

    /// Whether the capture is still open (not ended, or a failed end left it open).
    pub(crate) fn is_open(&self) -> bool {
        !self.ended
    }
}

impl Drop for DetachedCapture {
    fn drop(&mut self) {
        if !self.ended {
            abandon(&self.stream, self.id);
        }
    }
}

impl crate::driver::launch::sealed::Sealed for Capture<'_, '_> {}

/// A capture as the target of [`Function::launch`](crate::driver::Function::launch) (raw kernel
/// parameters, so the launch is `unsafe`): the kernel is recorded into the graph, and the graph
/// keeps its module loaded.
impl crate::driver::LaunchTarget for Capture<'_, '_> {
    fn launch_stream(&self, _: crate::driver::LaunchToken) -> &Stream {
        self.stream
    }
    fn keep_module(&self, module: &Arc<crate::driver::Module>, _: crate::driver::LaunchToken) {
        self.site().keep_module(module);
    }
}

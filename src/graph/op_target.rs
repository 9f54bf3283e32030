//! Where an op's work goes — eagerly on a stream (the workspace may grow) or into a capture (the
//! workspace is a fixed view) — and the rules each entails. Every op (Rust eager, Rust captured,
//! C ABI) launches through an [`OpTarget`], so the rules live here once:
//!
//! * eager: the stream must not be capturing (checked when the target is made);
//! * captured: every view must belong to this capture (its [`CaptureId`]) and this device, the
//!   workspace never grows, and every allocation the op bakes in is added to the capture's keep
//!   list ([`OpTarget::commit`], right before the launch, after every check passed).

use super::capture::{CapturedBuffer, WorkspaceView};
use super::{CaptureId, KeepList};
use crate::driver::memory::Allocation;
use crate::driver::order::UseToken;
use crate::driver::{Context, DevicePtr, KernelLaunch, Module, Stream};
use crate::error::{Error, Result};
use super::DeviceMemory;
use crate::sys::{cuda as c, DeviceSpan};
use crate::workspace::Workspace;
use std::cell::RefCell;
use std::sync::Arc;

/// A capture as its ops see it: the stream to enqueue on, the capture's identity, its keep list.
pub(crate) struct CaptureSite<'a> {
    id: CaptureId,
    stream: &'a Stream,
    keep: &'a RefCell<KeepList>,
}

impl<'a> CaptureSite<'a> {
    pub(crate) fn new(id: CaptureId, stream: &'a Stream, keep: &'a RefCell<KeepList>) -> Self {
        CaptureSite { id, stream, keep }
    }

    /// Refuses memory bound to another capture, or of another device.
    pub(crate) fn admit<M: DeviceMemory + ?Sized>(&self, what: &str, m: &M) -> Result<()> {
        if let Some(other) = m.capture_id() {
            if other != self.id {
                return Err(Error::invalid(what, format!("memory bound to this capture ({})", self.id), format!("memory bound to {other}")));
            }
        }
        if m.context_raw() != self.stream.context().raw() {
            return Err(Error::other_context(format!("{what}.device"), "memory", "the capturing stream's", self.stream.context().raw(), m.context_raw()));
        }
        Ok(())
    }

    pub(crate) fn admit_buffer(&self, what: &str, b: &CapturedBuffer<'_>) -> Result<()> {
        self.admit(what, b)
    }

    fn admit_workspace(&self, w: &WorkspaceView) -> Result<()> {
        if w.capture != self.id {
            return Err(Error::invalid("workspace", format!("a workspace bound to this capture ({})", self.id), format!("one bound to {}", w.capture)));
        }
        if w.ctx != self.stream.context().raw() as usize {
            return Err(Error::other_context("workspace.device", "a workspace", "the capturing stream's", self.stream.context().raw(), w.ctx as c::CUcontext));
        }
        Ok(())
    }

    pub(crate) fn keep(&self, a: &Arc<Allocation>) {
        self.keep.borrow_mut().allocations.push(a.clone());
    }

    pub(crate) fn keep_module(&self, m: &Arc<Module>) {
        let mut k = self.keep.borrow_mut();
        if !k.modules.iter().any(|x| Arc::ptr_eq(x, m)) {
            k.modules.push(m.clone());
        }
    }
}

/// The memory one op call was given, as [`OpTarget::commit`] checks it: every admitted operand's
/// span, and the workspace's. No operand may lie in the workspace the same call uses (the kernels
/// write scratch there while reading or writing the operand: a race). Safe Rust cannot build such
/// an operand; a C caller can, with an address from graphsafe_workspace_info.
#[derive(Default)]
pub(crate) struct Spans {
    operands: Vec<(String, u64, u64)>,
    workspace: Option<(u64, u64)>,
}

impl Spans {
    fn operand(&mut self, what: &str, s: &DeviceSpan) {
        self.operands.push((what.to_string(), s.ptr(), s.ptr().saturating_add(s.len())));
    }
    fn check(&self) -> Result<()> {
        if let Some((w0, w1)) = self.workspace {
            for (what, start, end) in &self.operands {
                if *start < w1 && w0 < *end {
                    return Err(Error::invalid(
                        what.as_str(),
                        "memory outside the workspace this call uses (its kernels write scratch there)",
                        format!("[{start:#x}, {end:#x}) overlapping the workspace [{w0:#x}, {w1:#x})"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where one op call's work goes. Made per call; see the module docs for the rules.
pub(crate) enum OpTarget<'a> {
    /// On a stream, now; the workspace (if the op has one) grows when it must. `using` holds the
    /// workspace buffer's use order from [`OpTarget::workspace`] until the target drops (after the
    /// op enqueued its work: the drop records the use); [`OpTarget::commit`] orders the use after
    /// the buffer's previous one. `memoryless`: made by [`OpTarget::eager_memoryless`], which
    /// admits no memory.
    Eager { stream: &'a Stream, ws: Option<&'a mut Workspace>, using: Option<UseToken<'a>>, spans: Spans, memoryless: bool },
    /// Into a capture; the workspace is the view bound to it and never grows.
    Captured { site: CaptureSite<'a>, ws: Option<&'a WorkspaceView>, pending: Vec<Arc<Allocation>>, spans: Spans },
}

impl<'a> OpTarget<'a> {
    /// An eager target: refused while the stream is capturing; the workspace must be of its device.
    pub(crate) fn eager(stream: &'a Stream, ws: Option<&'a mut Workspace>) -> Result<OpTarget<'a>> {
        stream.ensure_eager()?;
        if let Some(w) = &ws {
            if w.context().raw() != stream.context().raw() {
                return Err(Error::other_context("workspace", "a workspace", "the stream's", stream.context().raw(), w.context().raw()));
            }
        }
        Ok(OpTarget::Eager { stream, ws, using: None, spans: Spans::default(), memoryless: false })
    }

    /// An eager target for work that touches no memory (no operand, no workspace: the empty test
    /// kernel, the overhead bench's eager launch), checked as a replay is
    /// (`Stream::ensure_replayable`: an atomic load, and a driver query only on a stream whose
    /// handle other code holds) rather than with every eager API's driver query: work that bakes
    /// in no address harms no capture it might land in. It refuses every [`OpTarget::admit`], and
    /// [`OpTarget::workspace`] gives it only the empty span.
    pub(crate) fn eager_memoryless(stream: &'a Stream) -> Result<OpTarget<'a>> {
        stream.ensure_replayable()?;
        Ok(OpTarget::Eager { stream, ws: None, using: None, spans: Spans::default(), memoryless: true })
    }

    /// A captured target: the workspace view must belong to this capture and device.
    pub(crate) fn captured(site: CaptureSite<'a>, ws: Option<&'a WorkspaceView>) -> Result<OpTarget<'a>> {
        if let Some(w) = ws {
            site.admit_workspace(w)?;
        }
        Ok(OpTarget::Captured { site, ws, pending: Vec::new(), spans: Spans::default() })
    }

    /// The stream the work is enqueued on.
    pub(crate) fn stream(&self) -> &Stream {
        match self {
            OpTarget::Eager { stream, .. } => stream,
            OpTarget::Captured { site, .. } => site.stream,
        }
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        self.stream().context()
    }

    /// Whether the work is being captured.
    pub(crate) fn is_captured(&self) -> bool {
        matches!(self, OpTarget::Captured { .. })
    }

    /// Checks one piece of memory the op will bake in (captured: its capture and device),
    /// remembers its allocation for [`OpTarget::commit`], and returns its span: the only way an op
    /// gets a [`DeviceSpan`] for the kernel wrappers in `sys`, so every address a kernel is given
    /// went through these checks (and, captured, is kept alive by the capture once committed).
    pub(crate) fn admit<M: DeviceMemory + ?Sized>(&mut self, what: &str, m: &M) -> Result<DeviceSpan> {
        match self {
            OpTarget::Eager { memoryless: true, .. } => {
                return Err(Error::invalid(what, "no memory (a target for work that touches none)", "memory"));
            }
            OpTarget::Eager { stream, .. } => {
                if m.context_raw() != stream.context().raw() {
                    return Err(Error::other_context(format!("{what}.device"), "memory", "the stream's", stream.context().raw(), m.context_raw()));
                }
            }
            OpTarget::Captured { site, pending, .. } => {
                site.admit(what, m)?;
                if let Some(a) = m.allocation() {
                    pending.push(a.clone());
                }
            }
        }
        // The memory is of this target's context; graphsafe's own allocations are borrowed for
        // the call (eager: their frees wait for graphsafe's streams) or kept by the capture, and
        // caller memory (the C ABI) is vouched for by its entry point's contract.
        let span = DeviceSpan::vouched(m.device_ptr(), m.len() as u64);
        self.spans().operand(what, &span);
        Ok(span)
    }

    fn spans(&mut self) -> &mut Spans {
        match self {
            OpTarget::Eager { spans, .. } | OpTarget::Captured { spans, .. } => spans,
        }
    }

    /// The workspace to launch with, for `needed` bytes (its span holds the whole capacity):
    /// eager grows the workspace (retiring, zero-filled) when it must; captured fails with
    /// `WorkspaceTooSmall` naming both sizes. No workspace and `needed == 0`: the empty span.
    pub(crate) fn workspace(&mut self, needed: u64) -> Result<DeviceSpan> {
        let (ptr, capacity): (DevicePtr, u64) = match self {
            OpTarget::Eager { stream, ws: Some(ws), using, .. } => {
                // A second call of the same op lets its first hold go first.
                *using = None;
                let ptr = ws.prepare(needed, stream)?;
                *using = ws.hold_use();
                if let Some(u) = using {
                    u.check()?;
                }
                (ptr, ws.capacity())
            }
            OpTarget::Captured { ws: Some(w), pending, .. } => {
                if needed > w.capacity {
                    return Err(Error::WorkspaceTooSmall { needed, capacity: w.capacity });
                }
                if let Some(a) = &w.alloc {
                    pending.push(a.clone());
                }
                (w.ptr, w.capacity)
            }
            _ if needed == 0 => return Ok(DeviceSpan::empty()),
            _ => return Err(Error::invalid("workspace", format!("a workspace of at least {needed} bytes"), "none")),
        };
        // The workspace's current buffer: borrowed mutably for the call (eager), or fixed for the
        // capture and kept by it (captured).
        if capacity > 0 {
            self.spans().workspace = Some((ptr, ptr.saturating_add(capacity)));
        }
        Ok(DeviceSpan::vouched(ptr, capacity))
    }

    /// Refuses a launch this target's stream cannot take (a kernel of another context, empty
    /// dimensions): call it before [`OpTarget::commit`], so the refusal leaves nothing captured or
    /// enqueued (a split-K op's zero-fill comes before its launch).
    pub(crate) fn check_launch(&self, l: &KernelLaunch<'_>) -> Result<()> {
        l.check_for(self.stream())
    }

    /// Refuses an operand lying in the workspace this call uses ([`Spans`]). Then, captured:
    /// records, in the capture, every allocation admitted so far. Eager: orders the use of the
    /// workspace buffer after its previous use (a stream wait when that was on another stream).
    /// Call it after the last check and before the first enqueue: a refusal before it leaves the
    /// capture untouched and the stream without anything enqueued. What it returns is the only
    /// way to the raw stream, so an op cannot enqueue without committing; it borrows the target,
    /// so nothing is admitted after the commit.
    pub(crate) fn commit(&mut self) -> Result<Launch<'_, 'a>> {
        self.spans().check()?;
        match self {
            OpTarget::Captured { site, pending, .. } => {
                for a in pending.drain(..) {
                    site.keep(&a);
                }
            }
            OpTarget::Eager { stream, using: Some(u), .. } => u.enter(stream)?,
            OpTarget::Eager { .. } => {}
        }
        Ok(Launch { target: self, committed: Committed(()) })
    }
}

/// An op call past [`OpTarget::commit`]: every check passed and its memory recorded (captured: in
/// the capture; eager: its workspace use ordered). The one value that enqueues the op's work: it
/// alone gives out the raw stream, with the context current, so a forgotten commit does not
/// compile.
pub(crate) struct Launch<'t, 'a> {
    target: &'t OpTarget<'a>,
    committed: Committed,
}

/// The proof of a commit that the driver layer's enqueue paths outside it ask for
/// (`Stream::committed_handle`, `KernelLaunch::enqueue`). Its field is private to this module and
/// only [`OpTarget::commit`] makes one, kept inside the [`Launch`] it returns: so no code of the
/// crate outside this module and the driver layer (whose own raw paths are private to it) can
/// enqueue on a stream without committing first. The visibility is the guarantee: there is no
/// other constructor to forget.
pub(crate) struct Committed(());

impl Launch<'_, '_> {
    /// Calls `f` (the kernel glue, cuDNN) with the raw stream, the target's context current.
    pub(crate) fn glue<R>(&self, f: impl FnOnce(c::CUstream) -> Result<R>) -> Result<R> {
        let stream = self.target.stream();
        let _current = stream.context().enter()?;
        f(stream.committed_handle(&self.committed))
    }

    /// The stream the work is enqueued on (for events around it).
    pub(crate) fn stream(&self) -> &Stream {
        self.target.stream()
    }

    /// Launches a kernel of a loaded module on the target's stream; captured, the capture also
    /// keeps the module loaded (its graphs replay the kernel's code). The launch was built by a
    /// typed constructor of the driver layer over spans this target admitted; checked
    /// ([`OpTarget::check_launch`]) before the module is kept.
    pub(crate) fn kernel(&self, l: KernelLaunch<'_>) -> Result<()> {
        self.target.check_launch(&l)?;
        if let OpTarget::Captured { site, .. } = self.target {
            site.keep_module(l.function().module());
        }
        l.enqueue(self.target.stream(), &self.committed)
    }

    /// Zero-fills `bytes` bytes at `offset` into `span` (a span this target gave out: admitted
    /// memory or its workspace) on the target's stream: a memset node when captured. For kernels
    /// that keep semaphores in a workspace other ops share (invariant 3).
    pub(crate) fn zero(&self, span: DeviceSpan, offset: u64, bytes: u64) -> Result<()> {
        let ptr = span.skip("zero-filled range", offset)?.require("zero-filled range", bytes, 1)?;
        let bytes = usize::try_from(bytes).map_err(|_| Error::invalid("zero-filled range", "a size that fits in usize", bytes))?;
        crate::driver::memory::memset_u8_raw(ptr, 0, bytes, self.target.stream())
    }
}

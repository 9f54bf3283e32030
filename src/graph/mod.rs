//! Stream capture as a typestate, and graphs that own what they captured.
//!
//! ```text
//!   Stream ──capture(mode, |cap| …)──▶ (Graph, R)              branded: views cannot leave `|cap|`
//!   Stream ──begin_capture(&mut)─────▶ Capture ──end()──▶ Graph ──instantiate()──▶ GraphExec
//!                                        │  bind_workspace(&mut Workspace) → CapturedWorkspace<'id>
//!                                        │  bind_buffer(&DeviceBuffer)     → CapturedBuffer<'id>
//! ```
//!
//! * The capture borrows the stream mutably: no eager call can reach it until the capture ends, and
//!   [`Capture::stream`] hands out a [`CaptureStream`], a type eager APIs do not accept. The stream
//!   also remembers the open capture until it ends or is dropped, so a capture leaked with
//!   `mem::forget` still makes every eager API refuse the stream.
//! * Binding a workspace borrows it mutably for the whole capture, so growing it there is a
//!   compile error (tests/compile_fail). Kernels see a [`CapturedWorkspace`] view: pointer and
//!   capacity, and a [`CapturedWorkspace::require`] that fails with
//!   [`Error::WorkspaceTooSmall`](crate::Error::WorkspaceTooSmall) rather than grow.
//! * **A view belongs to one capture** (invariant 8). Every view carries its capture's identity
//!   (a process-unique [`CaptureId`]) and, in the closure form [`Stream::capture`](crate::driver::Stream::capture), a *brand*: an
//!   invariant lifetime `'id` that the type checker treats as distinct for every capture, so a
//!   view of one capture given to an op of another does not compile (tests/compile_fail). With
//!   [`Stream::begin_capture`](crate::driver::Stream::begin_capture) the brand is the stream borrow, which the type checker may unify
//!   between two captures; there the ops refuse a view of another capture at run time
//!   ([`Error::InvalidArgument`](crate::Error::InvalidArgument), nothing captured).
//! * Every bound buffer's allocation is kept alive by the capture, then by the [`Graph`], then by
//!   every [`GraphExec`] made from it, until the last of them is dropped (invariant 1). Belt and
//!   braces: every captured op also adds the allocation of every view it bakes in to its own
//!   capture, so no path can leave a graph without its memory.

mod capture;
mod exec;
mod memory;
pub(crate) mod op_target;

pub use capture::{Capture, CaptureStream, CapturedBuffer, CapturedWorkspace};

/// The former name of [`CapturedWorkspace`].
#[deprecated(note = "renamed CapturedWorkspace (a workspace bound to a capture)")]
pub type Captured<'id> = CapturedWorkspace<'id>;
pub(crate) use capture::{DetachedCapture, WorkspaceView};
pub use exec::{Graph, GraphExec, NodeKind};
pub use memory::DeviceMemory;

use crate::driver::memory::Allocation;
use crate::driver::Module;
use crate::sys::cuda as c;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a capture, and then its graph and executables, keep alive: every allocation whose address
/// it baked in, and every module whose kernels it launches (a replay runs their code); and the
/// use orders of the workspace buffers it bound (every replay is ordered after their previous use).
#[derive(Default)]
pub(crate) struct KeepList {
    pub allocations: Vec<Arc<Allocation>>,
    pub modules: Vec<Arc<Module>>,
    pub orders: Vec<Arc<crate::driver::order::StreamOrder>>,
}

/// Which other threads' calls a capture forbids (after the driver's `CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CaptureMode {
    /// graphsafe refuses its own potentially unsafe calls (allocations, module loads, cuDNN handle
    /// creation and plan building: `StreamCapturing`) on every thread while this capture is open,
    /// as well as the capturing thread's.
    ///
    /// The driver capture itself is begun thread-local: NVIDIA's driver 580 (CUDA 13.0, seen on
    /// an H200) crashes inside libcuda (SIGSEGV in `cuGraphExecDestroy`, `cuGraphInstantiate`,
    /// `cuMemAlloc`, `cuStreamSynchronize`) when two threads each capture in the driver's global
    /// mode and instantiate or destroy graphs; `tests/capi/driver_global_capture.cpp` is the
    /// driver-only program that shows it. So the driver does not refuse calls made outside
    /// graphsafe on other threads during this capture; none of them can make a graphsafe graph
    /// touch memory it does not keep.
    Global,
    /// Refused on this thread only: the default, what engines capturing per thread want.
    #[default]
    ThreadLocal,
    /// Nothing is refused; only for code that knows what it does.
    Relaxed,
}

impl CaptureMode {
    /// The mode the driver's capture is begun in (see [`CaptureMode::Global`]).
    fn driver_mode(self) -> c::CUstreamCaptureMode {
        match self {
            CaptureMode::Global | CaptureMode::ThreadLocal => c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// The identity of one capture: unique in the process, never reused (a 64-bit counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaptureId(u64);

impl CaptureId {
    fn fresh() -> CaptureId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        CaptureId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number (≥ 1).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for CaptureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capture #{}", self.0)
    }
}

/// An invariant lifetime: `Brand<'a>` and `Brand<'b>` are one type only when `'a == 'b`.
type Brand<'id> = std::marker::PhantomData<fn(&'id ()) -> &'id ()>;

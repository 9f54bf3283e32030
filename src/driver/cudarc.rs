//! Interop with [cudarc](https://docs.rs/cudarc/0.19) 0.19 (feature `cudarc`): an engine that
//! manages its GPU through cudarc hands graphsafe its context, streams and slices, and graphsafe's
//! graphs keep cudarc memory alive exactly as they keep their own.
//!
//! ```text
//!   Arc<CudaContext> ──Context::from_cudarc──────▶ Arc<Context>   holds the Arc: cudarc's context outlives it
//!   Arc<CudaStream>  ──Stream::from_cudarc───────▶ Stream         holds the Arc; same CUstream, not destroyed
//!   CudaSlice<T> / Arc<CudaSlice<T>>
//!                    ──DeviceBuffer::from_cudarc─▶ DeviceBuffer   holds the slice; the engine may drop its handles
//! ```
//!
//! Each graphsafe value holds the cudarc `Arc` it was made from, so the handle it wraps stays valid
//! for as long as graphsafe uses it. [`Stream::from_cudarc`] alone is `unsafe`: the engine keeps
//! its own handle of the stream and cudarc's safe API can issue work to it while a graphsafe capture
//! is open, and that work (with memory no graph keeps alive) would be recorded into the graph.
//!
//! # One driver
//!
//! graphsafe opens `libcuda.so.1` with `dlopen` ([`crate::sys::driver`]). cudarc reaches the
//! driver whichever way the engine's build chose: `dynamic-loading` (cudarc `dlopen`s `libcuda.so`,
//! …, `libcuda.so.1`), or `dynamic-linking`/`static-linking` (the program is linked against
//! `libcuda.so`, whose soname is `libcuda.so.1`). Either way the dynamic loader returns the object
//! it already loaded for the same file (it matches names, sonames and the file's device and inode),
//! so both crates call into one copy of the driver and share its contexts, streams and pointers.
//! [`shares_driver`](crate::driver::cudarc::shares_driver) checks it, through cudarc's own entry
//! points whatever its linking mode, and every `from_cudarc` constructor refuses to mix two drivers
//! (which happens only when `GRAPHSAFE_CUDA_DRIVER` points graphsafe at another library).
//!
//! # Memory: handing a slice to graphsafe
//!
//! [`DeviceBuffer::from_cudarc`] takes a `CudaSlice<T>` (or an `Arc` of one, so the engine may keep
//! using it through cudarc) and returns a [`DeviceBuffer`] whose [`Allocation`](crate::driver::memory::Allocation) owns a share of
//! the slice. Eager ops take it as `&DeviceBuffer`, [`crate::graph::Capture::bind_buffer`] binds it
//! unchanged, and every graph and executable that captured it keeps the slice alive: the engine
//! may drop every cudarc handle it had, and replays still read and write the same memory. The
//! slice is dropped (cudarc then frees it: `cuMemFreeAsync` on its stream, or a synchronous free)
//! when the last graphsafe holder goes, after the wait for graphsafe's streams that precedes every
//! free graphsafe does, so no work of graphsafe's can still be using it.
//!
//! A region of a slice (what a `CudaView` names) is a [`crate::ops::tensor::Tensor`] with an
//! offset over the adopted slice: a view borrows its slice, so it cannot be handed over for a
//! graph to keep; the slice it borrows from can.
//!
//! ## cudarc's event tracking
//!
//! In multi-stream mode cudarc orders its own uses of a slice across its streams with two events
//! per slice (a read and a write event, recorded by cudarc's calls). graphsafe does not record
//! into them. The scheme is still correct, because:
//!
//! 1. adoption waits for every pending use: [`DeviceBuffer::from_cudarc`] synchronizes the
//!    context, so the slice's allocation and every cudarc copy or kernel touching it are done;
//! 2. afterwards the slice is shared (`Arc`), and cudarc writes only through `&mut CudaSlice`: while
//!    graphsafe holds its share, cudarc can only read it, and a read issued on the stream graphsafe
//!    used (a [`Stream::from_cudarc`] stream is the same `CUstream`) is ordered after graphsafe's
//!    work by stream order. graphsafe itself writes the memory (a memset, a copy, a kernel's
//!    output) with any bytes, so what cudarc reads back as `T` must be valid for every bit
//!    pattern: only [`DeviceCopy`](crate::driver::memory::DeviceCopy) element types can be
//!    adopted (a `CudaSlice<bool>` holding 167 would read back as a `bool` that is neither true
//!    nor false);
//! 3. the free happens after graphsafe's streams drained (graphsafe dropping the last share), or later,
//!    by cudarc, if the engine still holds one: either way after all of graphsafe's work.
//!
//! What stays the engine's job is what it is for graphsafe's own buffers: to read a buffer on
//! another stream than the one graphsafe wrote it on, record an event after graphsafe's work and
//! wait for it on the reader's stream.
//!
//! # cudarc's graphs keep only the stream alive
//!
//! cudarc's own capture (`CudaStream::begin_capture` / `end_capture` → `CudaGraph`) holds an
//! `Arc<CudaStream>` and nothing else: every slice a cudarc graph baked in can be dropped (and its
//! address handed to the next allocation) while the graph lives, and a replay then writes into
//! someone else's memory. A graph captured through graphsafe holds every buffer it bakes in,
//! cudarc slices included (tests/gpu_cudarc.rs shows both on the same allocator).
//!
//! # The one rule the engine keeps
//!
//! An adopted stream is still the engine's: graphsafe cannot see cudarc's calls. While a graphsafe
//! capture is open on a stream made by [`Stream::from_cudarc`], issue no cudarc work to that
//! `CudaStream` (from this thread or another): it would be captured into graphsafe's graph without
//! its memory, as into a cudarc graph. graphsafe's own calls on the stream are refused meanwhile
//! ([`crate::Error::StreamCapturing`]), as on every stream. The other way round, graphsafe refuses
//! to replay (or enqueue anything) into a *cudarc* capture of the stream, which would give
//! cudarc's graph graphsafe's memory without keeping it alive; only a cudarc capture that begins
//! during a graphsafe call on another thread cannot be seen, so do not race the two.
//!
//! # Build
//!
//! graphsafe asks cudarc 0.19 for what it uses, `std` and `driver` (`default-features = false`),
//! and leaves the linking mode and the CUDA version to the engine's own cudarc dependency, which
//! cargo unifies with graphsafe's: candle's and mistral.rs's `dynamic-linking` with
//! `cuda-version-from-build-system`, or `dynamic-loading` with `cuda-12080`, all build. cudarc
//! needs one of each; graphsafe's own builds (its tests, examples and docs) use the feature
//! `cudarc-13000` (CUDA 13.0, the pinned toolkit's, and cudarc's fallback `dynamic-loading`). With
//! this feature the minimum Rust is 1.88 (cudarc's `libloading` 0.9); without it, the crate's
//! `rust-version`.

use super::memory::DeviceCopy;
use super::{Context, DeviceBuffer, ForeignOwner, ForeignStream, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use ::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr as _};
use once_cell::sync::OnceCell;
use std::sync::Arc;

/// Whether graphsafe and cudarc call into one loaded copy of the driver.
///
/// Each crate asks its driver for the text of one error code: a driver returns a pointer to its
/// own static string, so the two pointers are equal exactly when both calls reached the same
/// loaded library. Asked through cudarc's `cuGetErrorString`, which exists in every cudarc linking
/// mode and CUDA version (graphsafe cannot know which ones the engine's build chose), and which
/// needs neither `cuInit` nor a context. `Ok(false)` when the pointers differ, or when cudarc
/// (dynamic loading) finds no driver library: cudarc panics then, and the panic, which it prints,
/// is caught here.
pub fn shares_driver() -> Result<bool> {
    let probe = c::CUresult::CUDA_ERROR_INVALID_VALUE;
    let mut ours: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: an error code and an out-pointer to a local; the driver writes a static string.
    let r = unsafe { (crate::sys::driver::api()?.cuGetErrorString()?.f)(probe, &mut ours) };
    super::check(r, "cuGetErrorString")?;
    let theirs = std::panic::catch_unwind(|| {
        let mut p: *const std::os::raw::c_char = std::ptr::null();
        // SAFETY: as above, through cudarc's binding of the same entry point.
        let r = unsafe { ::cudarc::driver::sys::cuGetErrorString(::cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE, &mut p) };
        (r == ::cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(p as usize)
    });
    Ok(matches!(theirs, Ok(Some(p)) if p != 0 && p == ours as usize))
}

/// [`shares_driver`], asked once; an error unless it holds.
fn one_driver() -> Result<()> {
    static SHARED: OnceCell<std::result::Result<bool, Error>> = OnceCell::new();
    match SHARED.get_or_init(shares_driver).clone()? {
        true => Ok(()),
        false => Err(Error::invalid(
            "cudarc",
            "cudarc and graphsafe on one driver library",
            format!("two drivers (graphsafe opened {})", crate::sys::driver::api().map_or("none", |a| a.library)),
        )),
    }
}

/// Refuses a cudarc stream that is being captured (by graphsafe, cudarc or anyone).
fn refuse_capturing(ctx: &Context, stream: &CudaStream) -> Result<()> {
    // SAFETY: a live stream of `ctx` (the caller checked the context; cudarc's Arc keeps it alive),
    // possibly the legacy stream (null), which the call accepts.
    if unsafe { super::graph::stream_is_capturing(ctx, stream.cu_stream().cast()) }? {
        return Err(Error::StreamCapturing { detail: "the cudarc slice's stream is being captured".into() });
    }
    Ok(())
}

impl Context {
    /// graphsafe's view of a cudarc context (primary or not). It holds `ctx`, so cudarc's context
    /// lives at least as long as this value and everything made from it; it is not released by
    /// graphsafe, and the calling thread's current context is left as it was.
    pub fn from_cudarc(ctx: &Arc<CudaContext>) -> Result<Arc<Context>> {
        one_driver()?;
        let raw: c::CUcontext = ctx.cu_ctx().cast();
        // SAFETY: `raw` is the live context of `ctx`, which the returned value holds (the owner),
        // so it stays valid for as long as the value and everything made from it (each holds it).
        unsafe { Context::adopt_owned(raw, Some(ForeignOwner(ctx.clone(), None))) }
    }
}

impl Stream {
    /// graphsafe's view of a cudarc stream of `ctx`'s context: the same `CUstream`, held through
    /// `stream` (never destroyed by graphsafe). Work graphsafe issues on it is ordered with the
    /// engine's cudarc work on it by stream order. cudarc's default (legacy) and per-thread streams
    /// are refused: they cannot be captured safely.
    ///
    /// # Safety
    ///
    /// While a graphsafe capture is open on the returned stream, the engine must not issue work to
    /// `stream` through cudarc (or any other handle of the same `CUstream`): graphsafe cannot see
    /// those calls, the capture would record them, and the graph would keep none of their memory
    /// alive. Outside captures, cudarc work on `stream` is fine and ordered with graphsafe's.
    /// A cudarc capture of `stream` is refused by graphsafe's calls (replays included: one would
    /// put a graphsafe graph's memory into cudarc's graph), but one must not *begin* during a
    /// graphsafe call on the stream on another thread, which cannot see it.
    pub unsafe fn from_cudarc(ctx: &Arc<Context>, stream: &Arc<CudaStream>) -> Result<Stream> {
        one_driver()?;
        let stream_ctx: c::CUcontext = stream.context().cu_ctx().cast();
        if stream_ctx != ctx.raw() {
            return Err(Error::other_context("stream", "a cudarc stream", "the", ctx.raw(), stream_ctx));
        }
        let raw: c::CUstream = stream.cu_stream().cast();
        // SAFETY: `raw` is a live stream of `ctx` (checked above) that the returned value keeps
        // alive by holding `stream`; adopt_owned refuses the legacy and per-thread handles. The
        // rest of Stream::adopt's contract (no foreign work during a graphsafe capture) is this
        // function's own `# Safety` contract, which the caller accepted.
        unsafe { Stream::adopt_owned(ctx, raw, Some(ForeignOwner(stream.clone(), None))) }
    }
}

impl DeviceBuffer {
    /// Hands a cudarc slice of `ctx`'s context to graphsafe: the buffer, its clones and every graph
    /// (and executable) that captures it hold the slice, so the engine may drop its own handles
    /// while a graph still uses the memory. Pass an `Arc` clone to keep using the slice through
    /// cudarc, or the slice itself. The element type is a [`DeviceCopy`] one (every bit pattern
    /// valid): graphsafe writes the memory with arbitrary bytes, which cudarc then reads as `T`.
    ///
    /// Waits for the context first, so every pending cudarc use of the slice (its allocation, its
    /// copies and kernels on any stream) is finished before graphsafe can touch it. Call it when
    /// setting up, not per step. See the module docs for why cudarc's event tracking needs nothing
    /// more. Refused: an empty slice, a slice of another context, a size that overflows `usize`, a
    /// slice whose stream is being captured, and (`StreamCapturing`) any graphsafe capture open in
    /// the context, whose capture the context-wide wait would invalidate. A capture graphsafe did
    /// not begin is the caller's to keep clear of it: by CUDA's rules the context-wide wait
    /// invalidates the engine's own GLOBAL-mode captures on other threads, and its non-relaxed
    /// captures on this one.
    ///
    /// ```no_run
    /// use cudarc::driver::CudaContext;
    /// use graphsafe::prelude::*;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // The engine's cudarc objects.
    /// let cu_ctx = CudaContext::new(0)?;
    /// let cu_stream = cu_ctx.new_stream()?;
    /// let slice = cu_stream.alloc_zeros::<f32>(1 << 20)?;
    /// // graphsafe's views of them: the buffer (and every graph that captures it) holds the slice.
    /// let ctx = Context::from_cudarc(&cu_ctx)?;
    /// let buf = DeviceBuffer::from_cudarc(&ctx, slice)?;
    /// // SAFETY: no cudarc work goes to `cu_stream` while a graphsafe capture is open on it.
    /// let mut stream = unsafe { Stream::from_cudarc(&ctx, &cu_stream) }?;
    /// let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| {
    ///     let b = cap.bind_buffer(&buf)?;
    ///     cap.memset_u8(&b, 0)
    /// })?;
    /// drop(buf); // the graph still holds the slice
    /// graph.instantiate()?.launch(&stream)?;
    /// # Ok(()) }
    /// ```
    pub fn from_cudarc<T: DeviceCopy>(ctx: &Arc<Context>, slice: impl Into<Arc<CudaSlice<T>>>) -> Result<DeviceBuffer> {
        one_driver()?;
        let slice: Arc<CudaSlice<T>> = slice.into();
        let slice_ctx: c::CUcontext = slice.context().cu_ctx().cast();
        if slice_ctx != ctx.raw() {
            return Err(Error::other_context("slice", "a cudarc slice", "the", ctx.raw(), slice_ctx));
        }
        let bytes = slice
            .len()
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid("slice", "a size in bytes that fits in usize", format!("{} elements of {} bytes", slice.len(), std::mem::size_of::<T>())))?;
        if bytes == 0 {
            return Err(Error::invalid("slice", "at least 1 byte", 0));
        }
        // Reading the address makes cudarc wait for and record events on the slice's stream: that
        // must not land in a capture, and `Context::synchronize` is refused while any is open.
        refuse_capturing(ctx, slice.stream())?;
        // All the context's work: the slice's pending uses may be on any stream, and graphsafe's
        // own streams (all `synchronize` waits for while a capture is open elsewhere) are not
        // where cudarc's are.
        ctx.synchronize_all()?;
        // cudarc hands the address out only with its event bookkeeping: on the slice's own stream
        // it waits for the slice's last write and records a read, both already complete. Inside
        // our guard, so the context cudarc makes current is undone afterwards (invariant 12).
        let ptr = {
            let _current = ctx.enter()?;
            let (ptr, _record) = slice.device_ptr(slice.stream());
            ptr
        };
        // SAFETY: [ptr, ptr + bytes) is the slice's allocation in `ctx` (checked above); it stays
        // allocated while the slice lives, which the owner (an Arc of it) guarantees, and only the
        // slice's Drop frees it, which runs when the last owner share is dropped.
        let stream = ForeignStream(slice.stream().cu_stream().cast());
        // SAFETY: as above.
        Ok(unsafe { DeviceBuffer::from_foreign(ctx, ptr, bytes, ForeignOwner(slice, Some(stream))) })
    }
}

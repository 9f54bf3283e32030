//! Streams through the C ABI: made, adopted, synchronized, destroyed (closed under the stream's
//! lock first: capi/mod.rs, rule 5).

use super::core::{closed, lock, lock_eager, new_stream_obj, stream_obj, GraphsafeContext, GraphsafeStream, StreamObj};
use super::handles::{self, Tag};
use super::{busy, guard, null, put};
use crate::driver::{Context, Stream};
use std::ffi::{c_int, c_void};

/// A new non-blocking stream on `ctx`'s device.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeStream`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_create(ctx: GraphsafeContext, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        let id = handles::insert(Tag::Stream, new_stream_obj(Stream::new(&c)?))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeStream { id }) }
    })
}

/// Wraps the caller's existing `CUstream` of `ctx` (not destroyed by graphsafe). The legacy and
/// per-thread default streams are refused.
///
/// Frees of graphsafe memory in the context (buffer, workspace, executable and stream destroys,
/// workspace growth, a capture's end, on any thread) wait for every graphsafe stream of it, this
/// one included: work on it that waits for the host (`cuStreamWaitValue32`, a collective) must not
/// wait for something the freeing thread does only after the free, or the free never returns. A
/// free asks the driver whether the stream is capturing before it waits: a capture the caller
/// begins on it meanwhile, on another thread, is invalidated by that wait; so the caller begins no
/// capture of its own on it while such a call may run.
///
/// # Safety
/// `cu_stream` is a valid stream of `ctx` that outlives the handle; while a graphsafe capture on
/// it is open the caller issues no work to it, and the caller never begins a capture on it itself
/// while graphsafe uses it; `out` is null (refused) or points to a writable `GraphsafeStream`.
/// Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_adopt(ctx: GraphsafeContext, cu_stream: *mut c_void, out: *mut GraphsafeStream) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let c = handles::get::<Context>(Tag::Context, ctx.id)?;
        // SAFETY: the caller's contract (above); null/legacy handles are refused inside.
        let s = unsafe { Stream::adopt(&c, cu_stream.cast()) }?;
        let id = handles::insert(Tag::Stream, new_stream_obj(s))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeStream { id }) }
    })
}

/// The raw `CUstream` (for the caller's own launches). From then on every replay on the stream
/// also asks the driver whether a capture graphsafe did not begin is open (and refuses, BUSY).
/// What graphsafe_stream_adopt says of frees (they wait for this stream; a capture the caller
/// begins on it during one is invalidated) holds for this handle too.
///
/// # Safety
/// `out` is null (refused) or points to writable storage for a pointer. Thread-safe. The caller
/// issues no work to the handle while a graphsafe capture is open on the stream, and begins no
/// capture on it during a graphsafe call on the stream on another thread.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_raw(stream: GraphsafeStream, out: *mut *mut c_void) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        // `raw` marks the stream shared: replays on it then ask the driver first.
        let raw = s.stream.raw();
        // SAFETY: the caller's contract (null is refused inside).
        unsafe { put(out, "out", raw.cast()) }
    })
}

/// Waits for all work on the stream. Refused (BUSY) while the stream is capturing.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_synchronize(stream: GraphsafeStream) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        let _st = lock_eager(&s, stream.id)?;
        Ok(s.stream.synchronize()?)
    })
}

/// Destroys a stream handle (and the stream, unless adopted). BUSY while it is capturing: a
/// graphsafe capture, or, for a stream graphsafe made, one the caller began on its raw handle
/// (the handle stays valid). An adopted stream's handle may be destroyed during the caller's own
/// capture of it: the context's frees then wait for graphsafe_context_synchronize.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_stream_destroy(stream: GraphsafeStream) -> c_int {
    guard(|| {
        let s = stream_obj(stream)?;
        {
            let mut st = lock(&s.state);
            if st.closed {
                return Err(closed("stream", stream.id));
            }
            if st.capturing.is_some() {
                return Err(busy("the stream is capturing: end or destroy the capture first".into()));
            }
            // A capture the caller began itself on the raw handle of a stream graphsafe made
            // (graphsafe_stream_raw): destroying the stream would break that capture. An adopted
            // stream is the caller's, and stays: its handle may go mid-capture (the stream is
            // unlisted unwaited and the context's frees wait for a context synchronize).
            if s.stream.is_owned() && s.stream.is_capturing().unwrap_or(false) {
                return Err(busy("the driver reports a capture on the stream (one graphsafe did not begin): end it first".into()));
            }
            st.closed = true;
        }
        handles::remove::<StreamObj>(Tag::Stream, stream.id).map(drop)
    })
}

use super::{check, init, log_drop_error, Context};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::sync::Arc;

/// A CUDA stream. Never the legacy (null) stream: every memset, copy and launch of the crate goes
/// to a `Stream` the caller passed, so it is ordered and, during a capture, captured.
///
/// Beginning a capture borrows the stream mutably (see [`crate::graph::Capture`]), so nothing
/// eager can be issued to it until the capture ends.
#[derive(Debug)]
pub struct Stream {
    raw: c::CUstream,
    ctx: Arc<Context>,
    owned: bool,
}

// SAFETY: stream handles may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream (it does not synchronize with the legacy stream).
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.bind()?;
        let f = init()?.cuStreamCreate()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut raw, c::CUstream_flags::CU_STREAM_NON_BLOCKING.0) }, f.name)?;
        Ok(Stream { raw, ctx: ctx.clone(), owned: true })
    }

    /// Wraps a stream the caller owns (an engine's existing `CUstream`); it is not destroyed on drop.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `ctx` that outlives the returned value, and no other code may
    /// issue work to it while a graphsafe capture on it is open.
    pub unsafe fn adopt(ctx: &Arc<Context>, raw: c::CUstream) -> Result<Stream> {
        if raw.is_null() || raw as usize == 1 || raw as usize == 2 {
            return Err(Error::invalid(
                "stream",
                "a created stream (the legacy and per-thread default streams cannot be captured safely)",
                format!("{raw:?}"),
            ));
        }
        Ok(Stream { raw, ctx: ctx.clone(), owned: false })
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUstream {
        self.raw
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Blocks until all work on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        let f = init()?.cuStreamSynchronize()?;
        // SAFETY: raw is a live stream.
        check(unsafe { (f.f)(self.raw) }, f.name)
    }

    /// Whether the stream is in the middle of a capture.
    pub fn is_capturing(&self) -> Result<bool> {
        self.ctx.bind()?;
        let f = init()?.cuStreamIsCapturing()?;
        let mut status = c::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(self.raw, &mut status) }, f.name)?;
        Ok(status != c::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let r = (|| {
            self.ctx.bind()?;
            let f = init()?.cuStreamDestroy()?;
            // SAFETY: we created it.
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuStreamDestroy", r);
    }
}

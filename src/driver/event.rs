use super::{check, init, log_drop_error, Context, Stream};
use crate::error::Result;
use crate::sys::cuda as c;
use std::sync::Arc;

/// A CUDA event, for timing and for ordering between streams.
#[derive(Debug)]
pub struct Event {
    raw: c::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as for Send: the driver's event calls are thread-safe.
unsafe impl Sync for Event {}

impl Event {
    /// A new event; `timing` enables [`Event::elapsed_ms`].
    pub fn new(ctx: &Arc<Context>, timing: bool) -> Result<Event> {
        let _current = ctx.enter()?;
        let f = init()?.cuEventCreate()?;
        let flags = if timing { c::CUevent_flags::CU_EVENT_DEFAULT.0 } else { c::CUevent_flags::CU_EVENT_DISABLE_TIMING.0 };
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { (f.f)(&mut raw, flags) }, f.name)?;
        Ok(Event { raw, ctx: ctx.clone() })
    }

    /// Records the event on `stream` (refused while it is capturing: a record there would be a
    /// node of someone's graph).
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.ensure_eager()?;
        if stream.context().raw() != self.ctx.raw() {
            return Err(crate::Error::other_context("stream", "a stream", "the event's", self.ctx.raw(), stream.context().raw()));
        }
        let _current = self.ctx.enter()?;
        let f = init()?.cuEventRecord()?;
        // SAFETY: both handles are live.
        check(unsafe { (f.f)(self.raw, stream.handle()) }, f.name)
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        let _current = self.ctx.enter()?;
        let f = init()?.cuEventSynchronize()?;
        // SAFETY: live handle.
        check(unsafe { (f.f)(self.raw) }, f.name)
    }

    /// Milliseconds between `start` and `self` (both recorded and completed, timing enabled).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let _current = self.ctx.enter()?;
        let f = init()?.cuEventElapsedTime()?;
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; live handles.
        check(unsafe { (f.f)(&mut ms, start.raw, self.raw) }, f.name)?;
        Ok(ms)
    }

    /// The raw handle.
    pub fn raw(&self) -> c::CUevent {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let r = (|| {
            let _current = self.ctx.enter()?;
            let f = init()?.cuEventDestroy()?;
            // SAFETY: we created it.
            check(unsafe { (f.f)(self.raw) }, f.name)
        })();
        log_drop_error("cuEventDestroy", r);
    }
}

//! Engine memory handed to graphsafe from Rust, without the `cudarc` feature:
//! [`DeviceBuffer::adopt`].
//!
//! An engine that manages its own device memory (a caching allocator, a KV-cache pool, tensors of
//! another framework) gives graphsafe a pointer, its size, its context and an *owner*: any value
//! whose life keeps the memory allocated (a handle of the engine's allocator, an `Arc` of its
//! tensor). The owner moves into the buffer's allocation, which every graph and executable that
//! captures the buffer holds, so the memory outlives every replay that can touch it (invariant 1),
//! as graphsafe's own memory and cudarc slices ([`DeviceBuffer::from_cudarc`](crate::driver::cudarc))
//! do. Where cudarc's slice is a type graphsafe can check, a raw pointer is not: what graphsafe
//! cannot check is the caller's promise, written in `# Safety`; what it can check (the pointer's
//! device and context, that the range is allocated, that the range does not wrap) is refused at
//! run time.

use super::memory::{holder, query_pointer, Holder};
use super::{Context, DeviceBuffer, DevicePtr, ForeignOwner};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

impl DeviceBuffer {
    /// A buffer over `bytes` of device memory at `ptr` that another library allocated in `ctx`'s
    /// context, kept allocated by `owner`. graphsafe holds `owner` for as long as this buffer, its
    /// clones, and every graph and executable that captured it live; when the last of them goes it
    /// drops `owner` in place of a free, after waiting for graphsafe's streams of the context (the
    /// wait that precedes every free graphsafe does). The engine may drop its own handles at any
    /// time: a graph that captured the buffer still holds the memory.
    ///
    /// The buffer is used like any other: eager ops take `&DeviceBuffer`,
    /// [`Capture::bind_buffer`](crate::graph::Capture::bind_buffer) binds it, and
    /// [`Tensor::strided`](crate::ops::tensor::Tensor::strided) names a region of it.
    ///
    /// Refused ([`Error::InvalidArgument`], naming the argument), with `owner` dropped before this
    /// returns and nothing kept: `bytes` of 0; a null `ptr`; a range that runs past the end of the
    /// address space; an address the driver does not know as device memory; memory of another
    /// device, or of another context of `ctx`'s device; a range longer than what the driver's
    /// allocation holds from `ptr` to its end; an address inside a live buffer graphsafe allocated
    /// (bind that buffer instead: graphsafe frees it, which this contract forbids). Errors from
    /// the driver query itself (no driver: [`Error::DriverNotFound`]) are returned as they are.
    ///
    /// # Safety
    ///
    /// The caller promises, for as long as `owner` has not been dropped:
    ///
    /// 1. **Allocated.** `[ptr, ptr + bytes)` is device memory that graphsafe's kernels and copies
    ///    may read and write from `ctx`'s context (allocated in it, or in memory no single context
    ///    owns, such as a memory pool or a virtual-memory mapping of `ctx`'s device, mapped with
    ///    read and write access), every byte of it, and it stays so.
    /// 2. **Owned by `owner`.** Nothing frees, unmaps or shrinks the range, and no allocator hands
    ///    any of it out again, except as a consequence of dropping `owner` (graphsafe drops it once,
    ///    after its last use). A caching allocator must count the block as in use while `owner`
    ///    lives. In particular the range is not memory of a graphsafe buffer that graphsafe itself
    ///    may free (one whose free is already pending is not refused at run time).
    /// 3. **Writable by graphsafe.** graphsafe writes what its API is asked to write through the
    ///    buffer (the outputs of the ops it is passed to, memsets and copies into it), any bytes,
    ///    anywhere in the range: it is not a read-only mapping, and nothing else relies on its
    ///    contents staying as they are while such graphsafe work can run.
    ///
    /// No promise about the contents is needed: every type graphsafe reads device bytes as is valid
    /// for every bit pattern (the integers and floats of [`DeviceCopy`](super::memory::DeviceCopy)),
    /// and device data that indexes memory (MLA lengths and page indices) is clamped by the
    /// kernels (invariant 10). Ordering the engine's own kernels on the memory with graphsafe's
    /// work (stream order, or an event) stays the engine's job, as for graphsafe's own buffers.
    ///
    /// `owner` is dropped once, on whichever thread gives the memory back (the one that drops the
    /// last holder, or a later free or synchronize of the context when the wait had to be put
    /// off), with `ctx` current and the capture mode relaxed. Its `Drop` runs inside graphsafe's
    /// release path, so it should not call back into graphsafe, and work it enqueues must not go
    /// to a stream that may be capturing.
    ///
    /// # Example
    ///
    /// An engine's block, freed by its own allocator when graphsafe is done with it:
    ///
    /// ```no_run
    /// use graphsafe::prelude::*;
    ///
    /// /// What keeps the engine's block allocated: dropping it gives the block back.
    /// struct EngineBlock {
    ///     ptr: u64,
    /// }
    /// impl Drop for EngineBlock {
    ///     fn drop(&mut self) {
    ///         // e.g. engine_allocator.release(self.ptr)
    ///     }
    /// }
    ///
    /// # fn engine_alloc(_: usize) -> u64 { 0 }
    /// # fn main() -> graphsafe::Result<()> {
    /// let ctx = Context::new(0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let bytes = 1 << 20;
    /// let ptr = engine_alloc(bytes);
    /// // SAFETY: `ptr` is `bytes` of device memory of `ctx`, given back only when the block drops.
    /// let buf = unsafe { DeviceBuffer::adopt(&ctx, ptr, bytes, EngineBlock { ptr }) }?;
    /// buf.memset_u8(0, &stream)?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn adopt<O: Send + 'static>(ctx: &Arc<Context>, ptr: DevicePtr, bytes: usize, owner: O) -> Result<DeviceBuffer> {
        check_adoptable(ctx, ptr, bytes)?;
        // graphsafe never touches the owner, only drops it, so a `Send` owner is enough: the
        // mutex makes it shareable between the threads that hold the allocation without
        // asking the engine's type for `Sync`.
        let owner = ForeignOwner(Arc::new(Mutex::new(owner)), None);
        // SAFETY: the range is device memory of `ctx` that stays allocated while `owner` lives and
        // that only dropping `owner` gives back: this function's own contract, which the caller
        // accepted; `bytes` > 0 was checked above.
        Ok(unsafe { DeviceBuffer::from_foreign(ctx, ptr, bytes, owner) })
    }
}

/// The run-time half of [`DeviceBuffer::adopt`]'s contract: what the driver can say about the
/// range.
fn check_adoptable(ctx: &Arc<Context>, ptr: DevicePtr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Err(Error::invalid("bytes", "at least 1", 0));
    }
    if ptr == 0 {
        return Err(Error::invalid("ptr", "a device address", "null"));
    }
    if ptr.checked_add(bytes as u64).is_none() {
        return Err(Error::invalid("bytes", format!("a range that ends inside the address space (at most {} bytes from {ptr:#x})", u64::MAX - ptr), bytes));
    }
    // Graphsafe's own memory would be freed by graphsafe while the adopted buffer's graphs still
    // use it. Adopted memory adopted again is fine: each owner keeps it. Memory whose owner is
    // being dropped (graphsafe's, or an adopted block's owner whose drop waits for a capture) is
    // given back whatever the new owner promises.
    match holder(ctx, ptr) {
        Holder::Live(a) if !a.is_foreign() => {
            return Err(Error::invalid(
                "ptr",
                "memory graphsafe did not allocate (bind the DeviceBuffer that owns this address instead)",
                format!("{ptr:#x}, inside a live graphsafe buffer"),
            ))
        }
        Holder::Dropped => {
            return Err(Error::invalid(
                "ptr",
                "memory graphsafe is not giving back",
                format!("{ptr:#x}, inside a buffer already dropped whose memory graphsafe is giving back"),
            ))
        }
        Holder::Live(_) | Holder::Nothing => {}
    }
    let Some(p) = query_pointer(ctx, ptr)? else {
        return Err(Error::invalid("ptr", "device memory the driver knows", format!("{ptr:#x}, an address the driver does not know")));
    };
    let ordinal = ctx.device().ordinal();
    if usize::try_from(p.device).ok() != Some(ordinal) {
        return Err(Error::invalid("ptr.device", format!("memory of the context's device {ordinal}"), format!("memory of device {}", p.device)));
    }
    // A context of null is memory no single context owns (pools, mappings): the device decides.
    if p.context != 0 && p.context != ctx.raw() as usize {
        return Err(Error::invalid("ptr.context", "memory allocated in the context passed", format!("memory of another context of device {ordinal}")));
    }
    if let Some(n) = p.bytes_to_end {
        if (bytes as u64) > n {
            return Err(Error::invalid("bytes", format!("at most {n} (what the allocation holds from ptr to its end)"), bytes));
        }
    }
    Ok(())
}

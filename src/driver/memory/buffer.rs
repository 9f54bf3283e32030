//! [`DeviceBuffer`]: a handle to device memory (allocation, fills and copies on a stream), the
//! element types it copies ([`DeviceCopy`]), and [`MemInfo`].

use super::Allocation;
use crate::driver::{check, init, Context, DevicePtr, ForeignOwner, Stream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Plain element types that may be copied between host and device as raw bytes: every bit
/// pattern of their size is a valid value. Device memory holds whatever a kernel, a memset or a
/// copy wrote there, so reading it back as `T` (here, or through another library that shares the
/// memory: `DeviceBuffer::from_cudarc`, feature `cudarc`) is sound only for such types; `bool`, `char`, enums and
/// references are not. Sealed: the list cannot grow outside this crate.
pub trait DeviceCopy: Copy + Send + Sync + 'static + sealed::Sealed {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! device_copy {
    ($($t:ty),*) => { $( impl sealed::Sealed for $t {} impl DeviceCopy for $t {} )* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, half::f16, half::bf16);

/// A handle to device memory. Clones share the memory; it is freed when the last handle, and
/// every graph that captured it, is gone.
#[derive(Clone, Debug)]
pub struct DeviceBuffer {
    alloc: Arc<Allocation>,
}

impl DeviceBuffer {
    /// Allocates `bytes` (> 0) of uninitialized device memory (it may hold a previous owner's data).
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::invalid("bytes", "at least 1", 0));
        }
        let _current = ctx.enter()?;
        let f = init()?.cuMemAlloc()?;
        let mut ptr = 0;
        crate::driver::captures::outside_forbidding_capture(|| {
            // SAFETY: out-pointer to a local.
            check(unsafe { (f.f)(&mut ptr, bytes) }, f.name)
        })?;
        Ok(DeviceBuffer { alloc: Allocation::new_registered(Allocation { ptr, bytes, ctx: ctx.clone(), owner: None, scratch: Default::default() }) })
    }

    /// A buffer over memory another library allocated, kept alive by `owner` (the library's handle)
    /// for as long as this buffer, its clones and every graph that captured it live; `owner` is
    /// dropped, in place of the free, after the wait for graphsafe's streams that precedes every free.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` (`bytes` > 0) must be device memory of `ctx` that stays allocated while
    /// `owner` lives and that nothing but dropping `owner` frees.
    pub(crate) unsafe fn from_foreign(ctx: &Arc<Context>, ptr: DevicePtr, bytes: usize, owner: ForeignOwner) -> DeviceBuffer {
        DeviceBuffer { alloc: Allocation::new_registered(Allocation { ptr, bytes, ctx: ctx.clone(), owner: Some(owner), scratch: Default::default() }) }
    }

    /// Allocates `bytes` and zero-fills them on `stream` (ordered before anything issued after).
    pub fn alloc_zeroed(stream: &Stream, bytes: usize) -> Result<DeviceBuffer> {
        stream.ensure_eager()?;
        let b = DeviceBuffer::alloc(stream.context(), bytes)?;
        b.memset_u8(0, stream)?;
        Ok(b)
    }

    /// Allocates a buffer holding a copy of `data` (the copy is finished when this returns).
    pub fn from_host<T: DeviceCopy>(stream: &Stream, data: &[T]) -> Result<DeviceBuffer> {
        stream.ensure_eager()?;
        let b = DeviceBuffer::alloc(stream.context(), std::mem::size_of_val(data).max(1))?;
        b.copy_from_host(data, stream)?; // waits for the stream
        Ok(b)
    }

    /// The device address.
    pub fn device_ptr(&self) -> DevicePtr {
        self.alloc.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.alloc.bytes
    }
    /// Always false (zero-byte buffers are refused).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The owning context.
    pub fn context(&self) -> &Arc<Context> {
        &self.alloc.ctx
    }
    /// The shared allocation (what a graph keeps alive).
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }

    /// The checks of every eager method: the stream is of the buffer's context, and it is not
    /// capturing (the work would land in someone's graph).
    fn same_context(&self, stream: &Stream) -> Result<()> {
        stream.ensure_eager()?;
        if stream.context().raw() != self.alloc.ctx.raw() {
            return Err(Error::other_context("stream", "a stream", "the buffer's", self.alloc.ctx.raw(), stream.context().raw()));
        }
        Ok(())
    }

    /// Sets every byte to `value`, on `stream`.
    pub fn memset_u8(&self, value: u8, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        memset_u8_raw(self.alloc.ptr, value, self.alloc.bytes, stream)
    }

    /// Sets every 32-bit word to `value`, on `stream` (the size must be a multiple of 4).
    pub fn memset_u32(&self, value: u32, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        if self.alloc.bytes % 4 != 0 {
            return Err(Error::invalid("buffer size", "a multiple of 4 bytes", self.alloc.bytes));
        }
        let _current = stream.context().enter()?;
        let f = init()?.cuMemsetD32Async()?;
        // SAFETY: the range lies inside our allocation.
        check(unsafe { (f.f)(self.alloc.ptr, value, self.alloc.bytes / 4, stream.handle()) }, f.name)
    }

    /// Copies `src` to the start of the buffer, on `stream`, and waits for `stream`: `src` may be
    /// reused or dropped on return. (The driver stages pageable memory before returning, but reads
    /// page-locked memory asynchronously, later; a `&[T]` may be either, e.g. a pinned staging
    /// buffer the caller refills next.)
    pub fn copy_from_host<T: DeviceCopy>(&self, src: &[T], stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        let bytes = std::mem::size_of_val(src);
        if bytes > self.alloc.bytes {
            return Err(Error::invalid("source length", format!("at most {} bytes", self.alloc.bytes), bytes));
        }
        if bytes == 0 {
            return Ok(());
        }
        let _current = stream.context().enter()?;
        let (f, sync) = (init()?.cuMemcpyHtoDAsync()?, init()?.cuStreamSynchronize()?);
        // SAFETY: src is valid for `bytes` and stays borrowed until the copy is over (the wait
        // below returns only then); the destination range is inside our allocation.
        check(unsafe { (f.f)(self.alloc.ptr, src.as_ptr().cast(), bytes, stream.handle()) }, f.name)?;
        stream.wait_for_host_copy(&sync)
    }

    /// Copies the start of the buffer into `dst` and waits for `stream`, so `dst` is filled on return.
    pub fn copy_to_host<T: DeviceCopy>(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        let bytes = std::mem::size_of_val(dst);
        if bytes > self.alloc.bytes {
            return Err(Error::invalid("destination length", format!("at most {} bytes", self.alloc.bytes), bytes));
        }
        if bytes == 0 {
            return Ok(());
        }
        let _current = stream.context().enter()?;
        let (f, sync) = (init()?.cuMemcpyDtoHAsync()?, init()?.cuStreamSynchronize()?);
        // SAFETY: dst is valid for `bytes` and stays borrowed until the copy is over (the wait
        // below returns only then).
        check(unsafe { (f.f)(dst.as_mut_ptr().cast(), self.alloc.ptr, bytes, stream.handle()) }, f.name)?;
        stream.wait_for_host_copy(&sync)
    }

    /// Copies `src` into the buffer at byte `offset`, on `stream`, and waits for `stream` (`src`
    /// may be reused or dropped on return, page-locked or not: see [`DeviceBuffer::copy_from_host`]).
    pub fn copy_from_host_at(&self, offset: usize, src: &[u8], stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        if offset.checked_add(src.len()).is_none_or(|e| e > self.alloc.bytes) {
            return Err(Error::invalid("offset + length", format!("at most {} bytes", self.alloc.bytes), format!("{offset} + {}", src.len())));
        }
        if src.is_empty() {
            return Ok(());
        }
        let _current = stream.context().enter()?;
        let (f, sync) = (init()?.cuMemcpyHtoDAsync()?, init()?.cuStreamSynchronize()?);
        // SAFETY: the range is inside our allocation; src is valid for its length and stays
        // borrowed until the copy is over (the wait below returns only then).
        check(unsafe { (f.f)(self.alloc.ptr + offset as u64, src.as_ptr().cast(), src.len(), stream.handle()) }, f.name)?;
        stream.wait_for_host_copy(&sync)
    }

    /// Copies the buffer's bytes at `offset` into `dst` and waits for `stream`.
    pub fn copy_to_host_at(&self, offset: usize, dst: &mut [u8], stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.alloc.bytes) {
            return Err(Error::invalid("offset + length", format!("at most {} bytes", self.alloc.bytes), format!("{offset} + {}", dst.len())));
        }
        if dst.is_empty() {
            return Ok(());
        }
        let _current = stream.context().enter()?;
        let (f, sync) = (init()?.cuMemcpyDtoHAsync()?, init()?.cuStreamSynchronize()?);
        // SAFETY: dst is valid for its length and borrowed until the copy is over (the wait below
        // returns only then).
        check(unsafe { (f.f)(dst.as_mut_ptr().cast(), self.alloc.ptr + offset as u64, dst.len(), stream.handle()) }, f.name)?;
        stream.wait_for_host_copy(&sync)
    }

    /// Reads the whole buffer as `T`s (waits for `stream`).
    pub fn to_host_vec<T: DeviceCopy + Default>(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.alloc.bytes / std::mem::size_of::<T>()];
        self.copy_to_host(&mut v, stream)?;
        Ok(v)
    }

    /// Copies all of `src` to the start of this buffer, on `stream`.
    pub fn copy_from_device(&self, src: &DeviceBuffer, stream: &Stream) -> Result<()> {
        self.same_context(stream)?;
        if src.alloc.ctx.raw() != self.alloc.ctx.raw() {
            return Err(Error::other_context("src", "a buffer", "the destination's", self.alloc.ctx.raw(), src.alloc.ctx.raw()));
        }
        if src.len() > self.len() {
            return Err(Error::invalid("source length", format!("at most {} bytes", self.len()), src.len()));
        }
        refuse_overlapping_copy(self.device_ptr(), src.device_ptr(), src.len())?;
        copy_d2d_raw(self.device_ptr(), src.device_ptr(), src.len(), stream)
    }
}

/// Refuses a device copy of `bytes` from `src` to `dst` whose ranges overlap (a buffer copied onto
/// itself, or two adoptions of one foreign block): cuMemcpy's result is undefined for them.
pub(crate) fn refuse_overlapping_copy(dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    let end = |p: DevicePtr| p.saturating_add(bytes as u64);
    if bytes > 0 && dst < end(src) && src < end(dst) {
        return Err(Error::invalid(
            "src",
            "memory that does not overlap the destination",
            format!("[{src:#x}, {:#x}) overlapping the destination [{dst:#x}, {:#x})", end(src), end(dst)),
        ));
    }
    Ok(())
}

pub(crate) fn memset_u8_raw(ptr: DevicePtr, value: u8, bytes: usize, stream: &Stream) -> Result<()> {
    let _current = stream.context().enter()?;
    let f = init()?.cuMemsetD8Async()?;
    // SAFETY: callers pass a range inside a live allocation.
    check(unsafe { (f.f)(ptr, value, bytes, stream.handle()) }, f.name)
}

pub(crate) fn copy_d2d_raw(dst: DevicePtr, src: DevicePtr, bytes: usize, stream: &Stream) -> Result<()> {
    let _current = stream.context().enter()?;
    let f = init()?.cuMemcpyDtoDAsync()?;
    // SAFETY: callers pass ranges inside live allocations.
    check(unsafe { (f.f)(dst, src, bytes, stream.handle()) }, f.name)
}

/// Free and total device memory of a context's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

impl MemInfo {
    /// Asks the driver.
    pub fn query(ctx: &Context) -> Result<MemInfo> {
        let _current = ctx.enter()?;
        let f = init()?.cuMemGetInfo()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check(unsafe { (f.f)(&mut free, &mut total) }, f.name)?;
        Ok(MemInfo { free: free as u64, total: total as u64 })
    }
}

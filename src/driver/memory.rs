use super::{check, init, log_drop_error, Context, DevicePtr, ForeignOwner, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// Device memory from `cuMemAlloc`, freed when the last reference goes away (once the work of
/// graphsafe's streams of its context drained; deferred while an engine's capture on one of them
/// cannot be waited for, see `release`); or memory another
/// library allocated (a cudarc slice: `DeviceBuffer::from_cudarc`, feature `cudarc`), whose owner
/// it holds and drops, in place of the free, at that same point.
///
/// This is the unit of ownership the graph layer counts: a [`crate::graph::Graph`] keeps an
/// `Arc<Allocation>` of every buffer bound to its capture, so the address it baked in stays valid
/// for as long as any graph or executable made from it lives (invariant 1).
#[derive(Debug)]
pub struct Allocation {
    ptr: DevicePtr,
    bytes: usize,
    ctx: Arc<Context>,
    // Memory graphsafe did not allocate: what owns it (and frees it when dropped). None: ours.
    owner: Option<ForeignOwner>,
}

impl Allocation {
    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// Whether the allocation is empty (never: zero-byte allocations are refused).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The owning context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
    /// Whether another library allocated it (graphsafe holds its owner and never frees it).
    pub(crate) fn is_foreign(&self) -> bool {
        self.owner.is_some()
    }
}

// Every live graphsafe allocation by its first address (several for one foreign block adopted
// twice), so that the C ABI can find the allocation behind a raw pointer into graphsafe memory (an
// address a caller read with graphsafe_buffer_info) and keep it like a bound buffer. Weak: the
// registry owns nothing. A leaf lock.
//
// Each entry carries the extent and context beside its weak reference, so a lookup tests them
// without upgrading: a strong reference made under the lock and dropped there could be the last
// one (another thread dropped its handle meanwhile), and the allocation's drop would then take
// this lock again on the same thread: a deadlock (tests/standin_stress.rs,
// raw_pointer_lookups_against_the_last_drop_of_the_allocation_below). Only the entry that holds
// the address is upgraded, and that reference leaves the lock with the caller.
struct LiveEntry {
    alloc: Weak<Allocation>,
    bytes: usize,
    ctx: usize,
}
static LIVE: Mutex<BTreeMap<DevicePtr, Vec<LiveEntry>>> = Mutex::new(BTreeMap::new());

impl Allocation {
    fn new_registered(a: Allocation) -> Arc<Allocation> {
        let a = Arc::new(a);
        let entry = LiveEntry { alloc: Arc::downgrade(&a), bytes: a.bytes, ctx: a.ctx.raw() as usize };
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).entry(a.ptr).or_default().push(entry);
        a
    }
}

// Graphsafe allocations whose last owner is gone but whose memory is not given back yet: a free
// waiting for a capture of the context to end (deferred), one in progress, or memory leaked after
// a failed wait. The driver still reports such an address allocated, so without this list the C
// ABI would take it as the caller's own memory (`capi::CallerMemory::pointer`), and a graph
// captured with it would replay into memory freed when the capture ends. An entry is made before
// the allocation leaves `LIVE` (no moment where the address is in neither) and removed once the
// memory is given back; never for leaked memory. Keyed by first address; the id tells apart two
// entries at one address (freed, reallocated, released again before the first entry left). A leaf
// lock.
static RELEASED: Mutex<BTreeMap<DevicePtr, Vec<ReleasedEntry>>> = Mutex::new(BTreeMap::new());

/// One entry of [`RELEASED`]: its id, the allocation's bytes and its context.
type ReleasedEntry = (u64, usize, usize);

/// `ptr`'s place in [`RELEASED`] until dropped (when its memory has been given back); forgotten
/// with leaked memory, whose address then stays refused.
struct Released {
    ptr: DevicePtr,
    id: u64,
}

impl Released {
    fn new(ptr: DevicePtr, bytes: usize, ctx: &Context) -> Released {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RELEASED.lock().unwrap_or_else(|p| p.into_inner()).entry(ptr).or_default().push((id, bytes, ctx.raw() as usize));
        Released { ptr, id }
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        let mut r = RELEASED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = r.get_mut(&self.ptr) {
            v.retain(|e| e.0 != self.id);
            if v.is_empty() {
                r.remove(&self.ptr);
            }
        }
    }
}

/// Whether `ptr` lies in a graphsafe allocation of `ctx`'s context that has been dropped but whose
/// memory is not given back yet (see [`RELEASED`]). Check [`allocation_containing`] first: a new
/// allocation may take the address before the old entry leaves.
pub(crate) fn released_containing(ctx: &Context, ptr: DevicePtr) -> bool {
    let r = RELEASED.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = ctx.raw() as usize;
    r.range(..=ptr).next_back().is_some_and(|(&start, v)| v.iter().any(|e| ptr - start < e.1 as u64 && e.2 == ctx))
}

/// The live graphsafe allocation of `ctx`'s context that holds `ptr`, if any.
pub(crate) fn allocation_containing(ctx: &Context, ptr: DevicePtr) -> Option<Arc<Allocation>> {
    let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    // Allocations never overlap, so only the one starting last at or below `ptr` can hold it.
    let (&start, v) = live.range(..=ptr).next_back()?;
    let ctx = ctx.raw() as usize;
    v.iter().filter(|e| ptr - start < e.bytes as u64 && e.ctx == ctx).find_map(|e| e.alloc.upgrade())
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let released = Released::new(self.ptr, self.bytes, &self.ctx);
        {
            // Unlisted before the memory can be given back (and its address reused).
            let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = live.get_mut(&self.ptr) {
                v.retain(|e| e.alloc.strong_count() > 0);
                if v.is_empty() {
                    live.remove(&self.ptr);
                }
            }
        }
        let block = match self.owner.take() {
            Some(owner) => Block::Foreign(owner, released),
            None => Block::Ours(self.ptr, released),
        };
        release(block, &self.ctx);
    }
}

/// What giving an allocation back means: `cuMemFree` for graphsafe's own, dropping the owner for
/// another library's (cudarc frees the slice, on its stream, when its last `Arc` goes); and for a
/// loaded module, `cuModuleUnload` (a kernel or replay still queued may run its code, so it is
/// given back under the same rules as memory).
/// A block of memory carries its place in the released list, left once it is given back.
enum Block {
    Ours(DevicePtr, Released),
    Foreign(ForeignOwner, Released),
    Module(ModuleHandle),
}

/// A module handle on its way to `cuModuleUnload` (a raw pointer: moved between threads only
/// through the deferred list, and unloaded once).
struct ModuleHandle(c::CUmodule);
// SAFETY: a module handle may be unloaded from any thread; nothing else holds this one.
unsafe impl Send for ModuleHandle {}

/// Unloads `module` (loaded into `ctx`, with no graphsafe owner left) once no work can still run
/// its code: after the work of the context's streams drained (see `release`).
pub(crate) fn unload_module_when_idle(module: c::CUmodule, ctx: &Arc<Context>) {
    release(Block::Module(ModuleHandle(module)), ctx);
}

/// A block whose free must wait, with its context (held: the primary context is not released
/// under memory the driver still has allocated) and whether its failure was already reported.
struct Deferred {
    block: Block,
    ctx: Arc<Context>,
    reported: bool,
}

// Frees that could not happen yet (see `release`), retried at the next free or synchronize of the
// context: never freed before the work that used them finished, never lost. A leaf lock.
static DEFERRED: Mutex<Vec<Deferred>> = Mutex::new(Vec::new());

fn defer(block: Block, ctx: &Arc<Context>, reported: bool) {
    DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).push(Deferred { block, ctx: ctx.clone(), reported });
}

/// What a free under the gate leaves for after it: the owners of foreign memory, whose drop is
/// their library's code (and takes its own locks), are dropped once the gate is released. Declare
/// it before taking the gate, so that it drops after it.
#[derive(Default)]
pub(crate) struct AfterGate(Vec<(ForeignOwner, Released, Arc<Context>)>);

impl Drop for AfterGate {
    fn drop(&mut self) {
        for (owner, released, ctx) in self.0.drain(..) {
            // Dropped with the context current and the capture mode relaxed: whatever the owner
            // makes current is undone by the guard (invariant 12).
            let guards = ctx.enter().and_then(|c| RelaxedCaptureMode::enter().map(|r| (c, r)));
            drop(owner);
            drop(guards);
            // The owner's library may hand the address out again from now on.
            drop(released);
        }
    }
}

/// Returns a block to the driver once no work can still use it.
///
/// Work in flight may use the block (a kernel queued before a workspace grew, the last replay of a
/// graph just dropped), and `cuMemFree` is not documented to wait for it. So the free first waits,
/// under the context's free gate (`FreeGate`), with this thread's capture mode relaxed, for the
/// work of every graphsafe stream of the context — graphsafe enqueues work, and replays graphs,
/// only on those: a stream that is not capturing is synchronized; one in a graphsafe capture is
/// not (that would invalidate the capture), its work queued before the capture is waited for
/// through the event recorded then (nothing of it runs during the capture, and the capture keeps
/// what it bound); a dropped stream's work through the event it left. Then it frees. A capture open
/// elsewhere, leaked or not, does not hold the free up. It never synchronizes the whole context.
///
/// The block is deferred, and given back at the next free or synchronize of the context that can
/// wait, when a stream of the context is in a capture graphsafe did not begin (an engine's), when
/// a stream was dropped with no way to wait for it, or when the wait or the free itself fails (a
/// transient driver error: reported to the log once, never freed early, never dropped). Frees are
/// rare (growth, graph teardown); a decode loop does none.
fn release(block: Block, ctx: &Arc<Context>) {
    let mut later = AfterGate::default();
    let mut gate = ctx.free_gate();
    let waited = ctx.enter().and_then(|_current| gate.wait_for_streams());
    match waited {
        Ok(true) if !gate.has_unwaited() => {
            // What was deferred first: a block this free fails to give back is retried at the
            // next free, not again at once.
            free_deferred_after_synchronize(ctx, &mut later);
            give_back(block, ctx, false, &mut later);
        }
        Ok(_) => defer(block, ctx, false),
        Err(e) => {
            // Work may still use the block: kept (for foreign memory: its owner is not dropped,
            // which would free it), and its address stays refused as an op's pointer.
            defer(block, ctx, true);
            crate::logging::error(format!(
                "graphsafe: waiting for the context's streams before a free failed: {e}; the memory is kept and given back at the next free or synchronize of the context"
            ));
        }
    }
}

/// Frees what was deferred in `ctx`, if its work can be waited for now (called when a capture of
/// the context ends; cheap when nothing is deferred).
pub(crate) fn retry_deferred_frees(ctx: &Context) {
    let any = DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|d| d.ctx.raw() == ctx.raw());
    if !any {
        return;
    }
    let mut later = AfterGate::default();
    let mut gate = ctx.free_gate();
    if let Ok(true) = ctx.enter().and_then(|_current| gate.wait_for_streams()) {
        if !gate.has_unwaited() {
            free_deferred_after_synchronize(ctx, &mut later);
        }
    }
}

/// Gives `block` back; `ctx`'s work was just waited for, under the gate the caller holds. A
/// failure defers it again, reported once (`reported`: already).
fn give_back(block: Block, ctx: &Arc<Context>, reported: bool, later: &mut AfterGate) {
    match block {
        // A cuMemFree that fails has not freed the block (a CUDA call that fails has no effect),
        // unless the failure is the context's sticky error, after which every retry fails too: so
        // a retry never frees memory handed out again meanwhile.
        Block::Ours(ptr, released) => match free_relaxed(ptr, ctx) {
            Ok(()) => drop(released),
            Err(e) => {
                if !reported && !refused_by_capture(&e) {
                    crate::logging::error(format!("graphsafe: {e}; the memory is kept and freed at the next free or synchronize of the context"));
                }
                defer(Block::Ours(ptr, released), ctx, reported || !refused_by_capture(&e));
            }
        },
        Block::Module(m) => {
            let r = (|| {
                let _current = ctx.enter()?;
                let _relaxed = RelaxedCaptureMode::enter()?;
                let f = init()?.cuModuleUnload()?;
                // SAFETY: a module graphsafe loaded, with no owner left and no work that can still
                // run its code (the streams were just waited for); unloaded once.
                check(unsafe { (f.f)(m.0) }, f.name)
            })();
            if let Err(e) = r {
                if !reported && !refused_by_capture(&e) {
                    crate::logging::error(format!("graphsafe: {e}; the module is kept and unloaded at the next free or synchronize of the context"));
                }
                defer(Block::Module(m), ctx, reported || !refused_by_capture(&e));
            }
        }
        Block::Foreign(owner, released) => {
            if owner.stream_is_capturing(ctx) {
                return defer(Block::Foreign(owner, released), ctx, reported);
            }
            later.0.push((owner, released, ctx.clone()));
        }
    }
}

/// Gives back every deferred block of `ctx`'s CUcontext (whichever `Context` value deferred it:
/// they share the gate). Call only under the gate, right after the context's work was waited for:
/// a deferred block has no owner left, so no work enqueued since can use it.
pub(crate) fn free_deferred_after_synchronize(ctx: &Context, later: &mut AfterGate) {
    let mine: Vec<Deferred> = {
        let mut d = DEFERRED.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_empty() {
            return;
        }
        let (mine, rest) = std::mem::take(&mut *d).into_iter().partition(|d| d.ctx.raw() == ctx.raw());
        *d = rest;
        mine
    };
    for d in mine {
        give_back(d.block, &d.ctx, d.reported, later);
    }
}

fn refused_by_capture(e: &Error) -> bool {
    // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) … CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908).
    matches!(e, Error::Driver { code, .. } if (900..=908).contains(code))
}

/// This thread's capture mode set to relaxed until dropped (then restored).
pub(crate) struct RelaxedCaptureMode(c::CUstreamCaptureMode);

impl RelaxedCaptureMode {
    pub(crate) fn enter() -> Result<RelaxedCaptureMode> {
        let f = init()?.cuThreadExchangeStreamCaptureMode()?;
        let mut mode = c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in/out pointer to a local holding a valid mode.
        check(unsafe { (f.f)(&mut mode) }, f.name)?;
        Ok(RelaxedCaptureMode(mode))
    }
}

impl Drop for RelaxedCaptureMode {
    fn drop(&mut self) {
        let r = (|| {
            let f = init()?.cuThreadExchangeStreamCaptureMode()?;
            let mut mode = self.0;
            // SAFETY: in/out pointer to a local holding the mode saved by `enter`.
            check(unsafe { (f.f)(&mut mode) }, f.name)
        })();
        log_drop_error("cuThreadExchangeStreamCaptureMode (restoring)", r);
    }
}


fn free_relaxed(ptr: DevicePtr, ctx: &Context) -> Result<()> {
    let _current = ctx.enter()?;
    let _relaxed = RelaxedCaptureMode::enter()?;
    let f = init()?.cuMemFree()?;
    // SAFETY: we allocated ptr, nothing else frees it, and no work can use it any more.
    check(unsafe { (f.f)(ptr) }, f.name)
}

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
        super::captures::outside_forbidding_capture(|| {
            // SAFETY: out-pointer to a local.
            check(unsafe { (f.f)(&mut ptr, bytes) }, f.name)
        })?;
        Ok(DeviceBuffer { alloc: Allocation::new_registered(Allocation { ptr, bytes, ctx: ctx.clone(), owner: None }) })
    }

    /// A buffer over memory another library allocated, kept alive by `owner` (the library's handle)
    /// for as long as this buffer, its clones and every graph that captured it live; `owner` is
    /// dropped, in place of the free, after the wait for graphsafe's streams that precedes every free.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` (`bytes` > 0) must be device memory of `ctx` that stays allocated while
    /// `owner` lives and that nothing but dropping `owner` frees.
    pub(crate) unsafe fn from_foreign(ctx: &Arc<Context>, ptr: DevicePtr, bytes: usize, owner: ForeignOwner) -> DeviceBuffer {
        DeviceBuffer { alloc: Allocation::new_registered(Allocation { ptr, bytes, ctx: ctx.clone(), owner: Some(owner) }) }
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

/// What the driver reports about a device address graphsafe did not allocate (the C ABI's raw
/// pointers): the ordinal of the device it lives on, the context it was allocated in (null for
/// memory no single context owns: pools, virtual-memory mappings), and how many bytes of its
/// allocation lie from it to the end (`None` when the driver reports no range for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ForeignPointer {
    pub device: i32,
    pub context: usize,
    pub bytes_to_end: Option<u64>,
}

/// Asks the driver about `ptr` (`cuPointerGetAttribute`, `ctx` current). `Ok(None)` when the
/// driver does not know it as memory a device can address (`CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn query_pointer(ctx: &Context, ptr: DevicePtr) -> Result<Option<ForeignPointer>> {
    let _current = ctx.enter()?;
    let f = init()?.cuPointerGetAttribute()?;
    let mut device: i32 = -1;
    // SAFETY: the device-ordinal attribute writes one int into the local; any address is allowed.
    let r = unsafe { (f.f)((&mut device as *mut i32).cast(), c::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) };
    if r == c::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(r, f.name)?;
    let mut context: c::CUcontext = std::ptr::null_mut();
    // SAFETY: the context attribute writes one CUcontext into the local. A failure (none to report)
    // leaves it null, which means "no single context".
    let _ = unsafe { (f.f)((&mut context as *mut c::CUcontext).cast(), c::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT, ptr) };
    let (mut start, mut size): (c::CUdeviceptr, usize) = (0, 0);
    // SAFETY: the range attributes write a CUdeviceptr and a size_t into the locals.
    let ranged = unsafe {
        (f.f)((&mut start as *mut c::CUdeviceptr).cast(), c::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr) == c::CUresult::CUDA_SUCCESS
            && (f.f)((&mut size as *mut usize).cast(), c::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr) == c::CUresult::CUDA_SUCCESS
    };
    // An end past the address space (a driver answer no allocation can have) counts as unknown.
    let bytes_to_end = (ranged && start <= ptr).then(|| start.checked_add(size as u64).map(|end| end.saturating_sub(ptr))).flatten();
    Ok(Some(ForeignPointer { device, context: context as usize, bytes_to_end }))
}

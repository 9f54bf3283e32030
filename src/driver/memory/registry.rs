//! What graphsafe knows about a device address: its live allocations and those dropped but not
//! given back yet, by address (both leaf locks), and what the driver reports about an address
//! graphsafe did not allocate. The C ABI asks these about the raw pointers it is given.

use super::Allocation;
use crate::driver::{check, init, Context, DevicePtr};
use crate::error::Result;
use crate::sys::cuda as c;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

// Every live graphsafe allocation by its first address (several for one foreign block adopted
// twice), so that the C ABI can find the allocation behind a raw pointer into graphsafe memory (an
// address a caller read with graphsafe_buffer_info) and keep it like a bound buffer. Weak: the
// registry owns nothing. A leaf lock (`crate::locks`).
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
    pub(super) fn new_registered(a: Allocation) -> Arc<Allocation> {
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
// the allocation leaves `LIVE` (no moment where the address is in neither; before it is made, the
// `LIVE` entry's weak reference is already dead, which [`holder`] reads as dropped too) and
// removed once the memory is given back; never for leaked memory. Keyed by first address; the id
// tells apart two entries at one address (freed, reallocated, released again before the first
// entry left). A leaf lock.
static RELEASED: Mutex<BTreeMap<DevicePtr, Vec<ReleasedEntry>>> = Mutex::new(BTreeMap::new());

/// One entry of [`RELEASED`]: its id, the allocation's bytes and its context.
type ReleasedEntry = (u64, usize, usize);

/// `ptr`'s place in [`RELEASED`] until dropped (when its memory has been given back); forgotten
/// with leaked memory, whose address then stays refused.
pub(super) struct Released {
    ptr: DevicePtr,
    id: u64,
}

impl Released {
    pub(super) fn new(ptr: DevicePtr, bytes: usize, ctx: &Context) -> Released {
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

/// What graphsafe holds at a device address of a context ([`holder`]).
pub(crate) enum Holder {
    /// A live graphsafe allocation; the reference returned keeps it alive.
    Live(Arc<Allocation>),
    /// A graphsafe allocation whose last owner is gone: its drop is under way, or its free waits
    /// for a capture to end. The driver still reports the memory allocated, but graphsafe is
    /// giving it back.
    Dropped,
    /// No graphsafe allocation: memory of another library, or memory graphsafe already gave back.
    Nothing,
}

/// What graphsafe holds at `ptr` in `ctx`'s context.
pub(crate) fn holder(ctx: &Context, ptr: DevicePtr) -> Holder {
    holder_in(ctx.raw() as usize, ptr)
}

fn holder_in(ctx: usize, ptr: DevicePtr) -> Holder {
    {
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        // Allocations never overlap (one foreign block adopted twice starts at one address), so
        // only the entries starting last at or below `ptr` can hold it.
        if let Some((&start, v)) = live.range(..=ptr).next_back() {
            let mut covering = v.iter().filter(|e| ptr - start < e.bytes as u64 && e.ctx == ctx).peekable();
            if covering.peek().is_some() {
                // An entry whose weak reference is dead belongs to an allocation whose drop has
                // begun but not yet listed it as released (Allocation::drop does that first thing):
                // dropped, not nothing, or the address would read as foreign memory for that moment.
                return covering.find_map(|e| e.alloc.upgrade()).map_or(Holder::Dropped, Holder::Live);
            }
        }
    }
    let released = RELEASED.lock().unwrap_or_else(|p| p.into_inner());
    if released.range(..=ptr).next_back().is_some_and(|(&start, v)| v.iter().any(|e| ptr - start < e.1 as u64 && e.2 == ctx)) {
        Holder::Dropped
    } else {
        Holder::Nothing
    }
}

/// Takes `ptr`'s dropped allocations out of the live list (an allocation's drop, before its
/// memory can be given back and its address reused).
pub(super) fn unlist(ptr: DevicePtr) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = live.get_mut(&ptr) {
        v.retain(|e| e.alloc.strong_count() > 0);
        if v.is_empty() {
            live.remove(&ptr);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Between an allocation's last owner letting go and its drop listing it as released, the
    /// live list still holds its entry, with a dead weak reference. An address in it is memory
    /// graphsafe is about to give back: the C ABI must refuse it, not take it for the caller's own
    /// memory (which a graph would then replay into after the free).
    #[test]
    fn an_address_whose_allocation_is_being_dropped_is_not_taken_for_foreign_memory() {
        let (ctx, start, bytes) = (0x5eed_usize, 0xfff0_0000_0000_0000_u64, 4096_usize);
        LIVE.lock().unwrap().entry(start).or_default().push(LiveEntry { alloc: Weak::new(), bytes, ctx });
        let (inside, past) = (holder_in(ctx, start + 100), holder_in(ctx, start + bytes as u64));
        LIVE.lock().unwrap().remove(&start);
        assert!(matches!(inside, Holder::Dropped), "an address in an allocation whose drop has begun reads as {}", name(&inside));
        assert!(matches!(past, Holder::Nothing), "the address just past it reads as {}", name(&past));
    }

    fn name(h: &Holder) -> &'static str {
        match h {
            Holder::Live(_) => "live",
            Holder::Dropped => "dropped",
            Holder::Nothing => "nothing graphsafe holds",
        }
    }
}

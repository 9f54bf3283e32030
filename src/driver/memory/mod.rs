//! Device memory: [`DeviceBuffer`] handles over shared [`Allocation`]s, and the rules for giving
//! memory back. One file per job:
//!
//! * this file: [`Allocation`], the unit of ownership graphs count, and its drop;
//! * `buffer.rs`: [`DeviceBuffer`] (allocate, fill, copy), [`DeviceCopy`], [`MemInfo`];
//! * `registry.rs`: the live and the released allocations by address, and what the driver reports
//!   about an address graphsafe did not allocate (the C ABI's raw pointers);
//! * `release.rs`: giving a block back (a free, a foreign owner's drop, a module's unload) once no
//!   work can use it, deferred while that cannot be waited for.

mod buffer;
mod registry;
mod release;

pub use buffer::{DeviceBuffer, DeviceCopy, MemInfo};
pub(crate) use buffer::{copy_d2d_raw, memset_u8_raw, refuse_overlapping_copy};
pub(crate) use registry::{holder, query_pointer, Holder};
pub(crate) use release::{free_deferred_after_synchronize, retry_deferred_frees, unload_module_when_idle, AfterGate};

use super::{Context, DevicePtr, ForeignOwner};
use std::sync::Arc;

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
    // Set once a workspace takes it, and never cleared (a retired buffer stays a workspace's
    // scratch for the graphs that captured it): the C ABI refuses operands inside it.
    scratch: std::sync::atomic::AtomicBool,
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
    /// Marks it a workspace's buffer, for the rest of its life ([`Allocation::is_workspace`]).
    pub(crate) fn mark_workspace(&self) {
        self.scratch.store(true, std::sync::atomic::Ordering::Release);
    }
    /// Whether a workspace took it, now or before it retired it: its kernels write scratch there
    /// (batch schedules, split partials) ordered only with the uses of that workspace.
    pub(crate) fn is_workspace(&self) -> bool {
        self.scratch.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        let released = registry::Released::new(self.ptr, self.bytes, &self.ctx);
        // Unlisted before the memory can be given back (and its address reused).
        registry::unlist(self.ptr);
        let block = match self.owner.take() {
            Some(owner) => release::Block::Foreign(owner, released),
            None => release::Block::Ours(self.ptr, released),
        };
        release::release(block, &self.ctx);
    }
}

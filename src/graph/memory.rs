//! What an op argument's memory is to the graph layer: its address, extent and context, the
//! graphsafe allocation a capture that bakes it in must keep alive, and the capture a view of it
//! belongs to. The ops take tensors over it (`crate::ops::tensor`, which re-exports the trait);
//! the C ABI implements it for caller-owned pointers.

use super::{CaptureId, CapturedBuffer};
use crate::driver::memory::Allocation;
use crate::driver::{DeviceBuffer, DevicePtr};
use crate::sys::cuda as c;
use std::sync::Arc;

/// Device memory an op argument can live in.
pub trait DeviceMemory {
    /// Base address.
    fn device_ptr(&self) -> DevicePtr;
    /// Size in bytes.
    fn len(&self) -> usize;
    /// Whether the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The context the memory belongs to.
    fn context_raw(&self) -> c::CUcontext;
    /// The graphsafe allocation behind the memory, if graphsafe owns it: what a capture that
    /// bakes in its address keeps alive. `None` for memory the caller owns (the C ABI's raw
    /// pointers).
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        None
    }
    /// The capture this memory was bound to, for views of a capture ([`CapturedBuffer`]).
    fn capture_id(&self) -> Option<CaptureId> {
        None
    }
}

impl DeviceMemory for &DeviceBuffer {
    fn device_ptr(&self) -> DevicePtr {
        DeviceBuffer::device_ptr(self)
    }
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }
    fn context_raw(&self) -> c::CUcontext {
        self.context().raw()
    }
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        Some(DeviceBuffer::allocation(self))
    }
}

impl DeviceMemory for CapturedBuffer<'_> {
    fn device_ptr(&self) -> DevicePtr {
        CapturedBuffer::device_ptr(self)
    }
    fn len(&self) -> usize {
        CapturedBuffer::len(self)
    }
    fn context_raw(&self) -> c::CUcontext {
        CapturedBuffer::context_raw(self)
    }
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        Some(CapturedBuffer::allocation(self))
    }
    fn capture_id(&self) -> Option<CaptureId> {
        Some(CapturedBuffer::capture_id(self))
    }
}

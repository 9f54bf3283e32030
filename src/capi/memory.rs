//! Device memory through the C ABI: graphsafe-owned buffers, and workspaces that retire instead of
//! resizing (BUSY while bound to an open capture).

use super::core::{lock_eager, lock_workspace, stream_obj, workspace_obj, GraphsafeBuffer, GraphsafeStream, GraphsafeWorkspace, WorkspaceObj, WsState};
use super::handles::{self, Tag};
use super::{busy, guard, null, put, Fail};
use crate::driver::DeviceBuffer;
use crate::workspace::Workspace;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// Allocates `bytes` (> 0) of device memory owned by graphsafe; `zeroed` != 0 zero-fills it on
/// `stream`. Graphs that bind it keep it alive after graphsafe_buffer_destroy.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeBuffer`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_create(stream: GraphsafeStream, bytes: u64, zeroed: c_int, out: *mut GraphsafeBuffer) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = stream_obj(stream)?;
        let len = usize::try_from(bytes).map_err(|_| crate::Error::invalid("bytes", "a size that fits in memory", bytes))?;
        let b = {
            let _st = lock_eager(&s, stream.id)?;
            if zeroed != 0 {
                DeviceBuffer::alloc_zeroed(&s.stream, len)?
            } else {
                DeviceBuffer::alloc(s.stream.context(), len)?
            }
        };
        let id = handles::insert(Tag::Buffer, Arc::new(b))?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeBuffer { id }) }
    })
}

/// The buffer's device address and size. Either output may be null to skip it.
///
/// # Safety
/// Each output is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_info(buffer: GraphsafeBuffer, device_ptr: *mut u64, bytes: *mut u64) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        // SAFETY: each is written only when non-null; the caller's contract.
        unsafe {
            if !device_ptr.is_null() {
                put(device_ptr, "device_ptr", b.device_ptr())?;
            }
            if !bytes.is_null() {
                put(bytes, "bytes", b.len() as u64)?;
            }
        }
        Ok(())
    })
}

fn check_range(b: &DeviceBuffer, offset: u64, bytes: u64) -> Result<(), Fail> {
    if offset.checked_add(bytes).is_none_or(|end| end > b.len() as u64) {
        return Err(crate::Error::invalid("offset + bytes", format!("at most the buffer's {} bytes", b.len()), format!("{offset} + {bytes}")).into());
    }
    Ok(())
}

/// Copies `bytes` from host memory `src` into the buffer at byte `offset`, on `stream`, and waits
/// for `stream`: `src` may be reused when this returns, page-locked memory included (which the
/// driver would otherwise read after the call). Refused while the stream is capturing.
///
/// # Safety
/// `src` points to `bytes` readable bytes (it may be null only when `bytes` is 0). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_write(buffer: GraphsafeBuffer, offset: u64, src: *const c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = stream_obj(stream)?;
        if src.is_null() && bytes > 0 {
            return Err(null("src"));
        }
        check_range(&b, offset, bytes)?;
        let data: &[u8] = if bytes == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `bytes` readable bytes at src (non-null, checked).
            unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes as usize) }
        };
        let _st = lock_eager(&s, stream.id)?;
        Ok(b.copy_from_host_at(offset as usize, data, &s.stream)?)
    })
}

/// Copies `bytes` from the buffer at byte `offset` into host memory `dst` and waits for `stream`.
/// Refused while the stream is capturing.
///
/// # Safety
/// `dst` points to `bytes` writable bytes (it may be null only when `bytes` is 0). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_read(buffer: GraphsafeBuffer, offset: u64, dst: *mut c_void, bytes: u64, stream: GraphsafeStream) -> c_int {
    guard(|| {
        let b = handles::get::<DeviceBuffer>(Tag::Buffer, buffer.id)?;
        let s = stream_obj(stream)?;
        if dst.is_null() && bytes > 0 {
            return Err(null("dst"));
        }
        check_range(&b, offset, bytes)?;
        let data: &mut [u8] = if bytes == 0 {
            &mut []
        } else {
            // SAFETY: the caller passes `bytes` writable bytes at dst (non-null, checked).
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes as usize) }
        };
        let _st = lock_eager(&s, stream.id)?;
        Ok(b.copy_to_host_at(offset as usize, data, &s.stream)?)
    })
}

/// Drops the handle's reference; the memory is freed when no graph holds it either.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_buffer_destroy(buffer: GraphsafeBuffer) -> c_int {
    guard(|| handles::remove::<DeviceBuffer>(Tag::Buffer, buffer.id).map(drop))
}

/// A workspace of at least `bytes` (0 allowed), zero-filled on `stream`.
///
/// # Safety
/// `out` is null (refused) or points to a writable `GraphsafeWorkspace`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_create(stream: GraphsafeStream, bytes: u64, out: *mut GraphsafeWorkspace) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let s = stream_obj(stream)?;
        let ws = {
            let _st = lock_eager(&s, stream.id)?;
            Workspace::new(&s.stream, bytes)?
        };
        let obj = Arc::new(WorkspaceObj { state: Mutex::new(WsState { ws, bound_to: None, closed: false }) });
        let id = handles::insert(Tag::Workspace, obj)?;
        // SAFETY: non-null; the caller's contract.
        unsafe { put(out, "out", GraphsafeWorkspace { id }) }
    })
}

/// Grows the workspace to at least `bytes` by allocating a new zero-filled buffer on `stream` and
/// retiring the old one (graphs that captured it keep it alive). `grew` (nullable) receives 1 if it
/// grew. BUSY while the workspace is bound to an open capture or the stream is capturing. If growing
/// fails, the workspace is unchanged.
///
/// # Safety
/// `grew` is null or points to a writable `int`. Thread-safe (calls on one workspace serialize).
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_ensure_size(ws: GraphsafeWorkspace, bytes: u64, stream: GraphsafeStream, grew: *mut c_int) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let s = stream_obj(stream)?;
        let g = {
            let _st = lock_eager(&s, stream.id)?;
            let mut st = lock_workspace(&w, ws.id)?;
            if let Some(c) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {c:#x}: it cannot grow until the capture ends")));
            }
            st.ws.ensure_size(bytes, &s.stream)?
        };
        if !grew.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { put(grew, "grew", g as c_int)? };
        }
        Ok(())
    })
}

/// Capacity and current device address (0 while empty); either output may be null. The address
/// is for the caller's own kernels (read it when launching them: the next growth retires the
/// buffer); no graphsafe op takes an operand inside a workspace, current or retired
/// (INVALID_ARGUMENT): the workspace's kernels keep scratch there.
///
/// # Safety
/// Each output is null or points to a writable `uint64_t`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_info(ws: GraphsafeWorkspace, capacity: *mut u64, device_ptr: *mut u64) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        let (cap, ptr) = {
            let st = lock_workspace(&w, ws.id)?;
            (st.ws.capacity(), st.ws.device_ptr())
        };
        // SAFETY: each is written only when non-null; the caller's contract.
        unsafe {
            if !capacity.is_null() {
                put(capacity, "capacity", cap)?;
            }
            if !device_ptr.is_null() {
                put(device_ptr, "device_ptr", ptr)?;
            }
        }
        Ok(())
    })
}

/// Destroys a workspace handle (its memory lives on in graphs that captured it). BUSY while bound
/// to an open capture.
///
/// # Safety
/// None (any value is checked). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn graphsafe_workspace_destroy(ws: GraphsafeWorkspace) -> c_int {
    guard(|| {
        let w = workspace_obj(ws)?;
        {
            let mut st = lock_workspace(&w, ws.id)?;
            if let Some(c) = st.bound_to {
                return Err(busy(format!("the workspace is bound to open capture {c:#x}")));
            }
            st.closed = true;
        }
        handles::remove::<WorkspaceObj>(Tag::Workspace, ws.id).map(drop)
    })
}

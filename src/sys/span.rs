//! [`DeviceSpan`]: a range of device memory as the safe wrappers in `sys` (kernel glue, cuDNN) and
//! the driver's typed launches receive it.
//!
//! The wrappers re-check every access a kernel makes against the spans it is given (bounds,
//! alignment, the workspace's size); what they cannot check, and so trust, is the span itself:
//! that the bytes exist and stay allocated while the work may run. That claim is made in exactly
//! two places: [`DeviceSpan::from_raw`] (`unsafe`: its caller promises it) and the crate's own
//! `DeviceSpan::vouched`, called only by `graph::op_target::OpTarget` for memory it admitted — a
//! [`DeviceBuffer`](crate::driver::DeviceBuffer) or captured view (an allocation graphsafe owns,
//! borrowed for the call or kept by the capture), or caller memory of the C ABI (whose entry
//! points' `# Safety` contracts make the promise).

use crate::error::{Error, Result};

/// `len` bytes of device memory starting at `ptr`.
///
/// The invariant every span carries: the bytes are device memory of the context the work is
/// issued in, and they stay allocated until the work enqueued with the span has finished — or,
/// when the work is captured, for as long as any graph made from the capture can run.
/// `len` may be larger than what is really there only for memory whose size nobody knows (C
/// callers' raw pointers): then the caller vouches for the extent the op's documented shapes imply.
/// The default is the empty span ([`DeviceSpan::empty`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceSpan {
    ptr: u64,
    len: u64,
}

impl DeviceSpan {
    /// A span over raw device memory.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be device memory of the context it is used in, allocated until every
    /// piece of work enqueued with the span (or with a span narrowed from it) has finished, and,
    /// if that work is captured, for as long as any graph made from the capture can run.
    pub unsafe fn from_raw(ptr: u64, len: u64) -> DeviceSpan {
        DeviceSpan { ptr, len }
    }

    /// A span the crate vouches for: memory `OpTarget::admit` (graph/op_target.rs) checked and kept.
    /// Nothing else in the crate calls this; see the module docs for the argument.
    pub(crate) fn vouched(ptr: u64, len: u64) -> DeviceSpan {
        DeviceSpan { ptr, len }
    }

    /// The span of no memory (address 0, no bytes): what an op with no workspace passes.
    pub const fn empty() -> DeviceSpan {
        DeviceSpan { ptr: 0, len: 0 }
    }

    /// The first address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The number of bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part that starts `offset` bytes in (a tensor's first element within its buffer).
    pub fn skip(self, what: &str, offset: u64) -> Result<DeviceSpan> {
        match (self.len.checked_sub(offset), self.ptr.checked_add(offset)) {
            (Some(len), Some(ptr)) => Ok(DeviceSpan { ptr, len }),
            _ => Err(Error::invalid(format!("{what}.offset"), format!("at most the {} bytes of its memory", self.len), offset)),
        }
    }

    /// The address, after checking that the first `bytes` bytes lie in the span (and in the
    /// address space) and that the address is a multiple of `align`: what a wrapper checks before
    /// it hands the address to a kernel that touches those bytes.
    pub(crate) fn require(&self, what: &str, bytes: u64, align: u64) -> Result<u64> {
        if bytes > self.len || self.ptr.checked_add(bytes).is_none() {
            return Err(Error::invalid(what, format!("at least {bytes} bytes"), format!("{} bytes at {:#x}", self.len, self.ptr)));
        }
        if align > 1 && self.ptr % align != 0 {
            return Err(Error::invalid(format!("{what}.address"), format!("{align}-byte aligned"), format!("{:#x}", self.ptr)));
        }
        Ok(self.ptr)
    }
}

/// Bytes from a strided view's first element to one past its last: `elem_bytes · (1 + Σ (dᵢ − 1)·sᵢ)`
/// over `(dim, stride)` pairs in elements, 0 when a dimension is 0; `None` when it overflows.
pub(crate) fn extent(elem_bytes: u64, dims: &[(u64, u64)]) -> Option<u64> {
    if dims.iter().any(|&(d, _)| d == 0) {
        return Some(0);
    }
    let last = dims.iter().try_fold(0u64, |acc, &(d, s)| acc.checked_add((d - 1).checked_mul(s)?))?;
    last.checked_add(1)?.checked_mul(elem_bytes)
}

/// [`extent`], or `InvalidArgument` naming `what` when it overflows.
pub(crate) fn extent_of(what: &str, elem_bytes: u64, dims: &[(u64, u64)]) -> Result<u64> {
    extent(elem_bytes, dims).ok_or_else(|| Error::invalid(what, "an extent that fits in 64 bits", format!("{dims:?} of {elem_bytes}-byte elements")))
}

/// A stride (or size) in the `i64` the glue takes, as the unsigned count [`extent`] needs.
pub(crate) fn unsigned(what: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::invalid(what, "a value >= 0", v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extent_counts_the_last_element_and_refuses_overflow() {
        assert_eq!(extent(2, &[(3, 10), (4, 1)]), Some(2 * (1 + 2 * 10 + 3)));
        assert_eq!(extent(4, &[(0, 7), (5, 1)]), Some(0));
        assert_eq!(extent(1, &[(2, u64::MAX)]), None);
    }

    #[test]
    fn require_checks_bounds_alignment_and_wrap() {
        let s = DeviceSpan::vouched(0x1000, 64);
        assert_eq!(s.require("x", 64, 16), Ok(0x1000));
        assert!(s.require("x", 65, 1).is_err());
        assert!(s.skip("x", 8).unwrap().require("x", 8, 16).is_err());
        assert_eq!(s.skip("x", 16).unwrap().require("x", 48, 16), Ok(0x1010));
        assert!(s.skip("x", 65).is_err());
        let top = DeviceSpan::vouched(u64::MAX - 4, u64::MAX);
        assert!(top.require("x", 8, 1).is_err(), "an extent past the address space");
    }
}

//! The crate's one error type. Every variant carries what a person needs to act on it.

use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in graphsafe. Nothing on a user-reachable path panics; it returns
/// one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call returned an error.
    #[error("{call} failed: {name} ({text})")]
    Driver {
        /// The driver function, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The raw `CUresult`.
        code: u32,
        /// The `CUresult` name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of it.
        text: String,
    },

    /// `libcuda.so.1` could not be opened: no NVIDIA driver on this machine.
    #[error("CUDA driver not found (tried: {})", tried.join("; "))]
    DriverNotFound {
        /// Each library name tried, with the loader's reason.
        tried: Vec<String>,
    },

    /// A required symbol is missing from a loaded library (the driver or cuDNN is too old).
    #[error("symbol {name} not found in {library} (tried: {})", tried.join(", "))]
    MissingSymbol {
        /// The symbol asked for (its base name).
        name: String,
        /// The library it was looked up in.
        library: String,
        /// Every versioned name tried, newest first.
        tried: Vec<String>,
    },

    /// `libcudnn.so.9` could not be found or opened.
    #[error("cuDNN not found (tried: {})", tried.join("; "))]
    CudnnNotFound {
        /// Each place looked, with the loader's reason.
        tried: Vec<String>,
    },

    /// A cuDNN call returned an error status.
    #[error("cuDNN {call} failed with status {status}")]
    Cudnn {
        /// The cuDNN function.
        call: &'static str,
        /// The raw `cudnnStatus_t`.
        status: i32,
    },

    /// A CUTLASS operation refused the arguments or failed.
    #[error("CUTLASS {op}: {status}")]
    Cutlass {
        /// Which operation.
        op: &'static str,
        /// What CUTLASS said.
        status: String,
    },

    /// A CUDA runtime call inside the kernel glue failed.
    #[error("CUDA runtime error {code} in {op}")]
    CudaRuntime {
        /// Which glue operation.
        op: &'static str,
        /// The raw `cudaError_t`.
        code: i32,
    },

    /// The operation has no kernel for this GPU's architecture (or it was not built).
    #[error("{op} needs {need}, but this is {have}")]
    ArchUnsupported {
        /// The operation.
        op: &'static str,
        /// The architectures it supports.
        need: String,
        /// The device's architecture (or what the build lacks).
        have: String,
    },

    /// A kernel needs more workspace than the (captured) workspace holds. Nothing was launched.
    #[error("workspace too small: the kernel needs {needed} bytes but the workspace holds {capacity} bytes")]
    WorkspaceTooSmall {
        /// Bytes the kernel needs.
        needed: u64,
        /// Bytes the workspace has.
        capacity: u64,
    },

    /// An argument is wrong: shape, dtype, stride, alignment, device, range.
    #[error("invalid argument `{what}`: expected {expected}, got {got}")]
    InvalidArgument {
        /// The argument (e.g. `batch`, `q_nope.shape[1]`).
        what: String,
        /// What is allowed.
        expected: String,
        /// What was passed.
        got: String,
    },

    /// Eager work was refused because the stream is capturing: a capture is open on it (or was
    /// leaked with `mem::forget`, or was begun outside graphsafe on an adopted stream). Nothing was
    /// enqueued: eager work on a capturing stream would land in someone's graph.
    #[error("the stream is capturing ({detail}): eager work on it is refused; end the capture first")]
    StreamCapturing {
        /// Which capture, or how the driver reported it.
        detail: String,
    },

    /// A stream capture was invalidated by the driver (an illegal call inside it). The stream is
    /// usable again; the capture produced no graph.
    #[error("stream capture invalidated: {reason}")]
    CaptureInvalidated {
        /// What the driver reported.
        reason: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>, expected: impl Into<String>, got: impl fmt::Display) -> Self {
        Error::InvalidArgument { what: what.into(), expected: expected.into(), got: got.to_string() }
    }

    /// `what` (a `thing`: "memory", "a stream") belongs to context `got` where one of `whose`
    /// context `expected` was needed. Both handles are named: two contexts of one device (the
    /// primary one and an engine's own) differ only there.
    pub(crate) fn other_context(what: impl Into<String>, thing: &str, whose: &str, expected: crate::sys::cuda::CUcontext, got: crate::sys::cuda::CUcontext) -> Self {
        Error::invalid(what, format!("{thing} of {whose} context {expected:?}"), format!("{thing} of another context, {got:?}"))
    }
}

/// Rejects zero and negative sizes with an [`Error::InvalidArgument`] naming the argument.
pub(crate) fn positive(what: &str, v: i64) -> Result<i32> {
    if v <= 0 || v > i32::MAX as i64 {
        return Err(Error::invalid(what, format!("an integer in 1..={}", i32::MAX), v));
    }
    Ok(v as i32)
}

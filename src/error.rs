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
    #[error("{op}: CUTLASS {status}")]
    Cutlass {
        /// The public operation, e.g. `nvfp4::gemm`.
        op: &'static str,
        /// What CUTLASS said.
        status: String,
    },

    /// A CUDA runtime call of a kernel launch failed. graphsafe's kernels run on the CUDA runtime
    /// linked into them (`build_info::runtime_version`), whose errors are `cudaError_t`s.
    #[error("{op}: CUDA runtime error {name} ({code}){}", runtime_advice(*code))]
    CudaRuntime {
        /// The public operation, e.g. `nvfp4::global_scale`.
        op: &'static str,
        /// The `cudaError_t`'s name, e.g. `cudaErrorInsufficientDriver`, or `"an unknown
        /// cudaError_t"` for a code CUDA 13.0 does not have ([`crate::sys::cuda_errors`]).
        name: &'static str,
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

/// What to do about a runtime error the kernels commonly meet, after its name.
fn runtime_advice(code: i32) -> &'static str {
    match code {
        34 => ": the runtime found a stub libcuda.so, not a driver; put the driver's library first on the loader path",
        35 => ": the driver is older than the CUDA runtime the kernels are linked with; `graphsafe doctor` names the driver they need",
        100 => ": the CUDA runtime sees no GPU (CUDA_VISIBLE_DEVICES?)",
        209 => ": this build has no kernel for the GPU; build for its arch (GRAPHSAFE_CUDA_ARCHS)",
        _ => "",
    }
}

impl Error {
    /// [`Error::CudaRuntime`] for `cudaError_t` `code` from the public operation `op`, named by
    /// [`crate::sys::cuda_errors`].
    pub fn cuda_runtime(op: &'static str, code: i32) -> Self {
        Error::CudaRuntime { op, name: crate::sys::cuda_errors::name(code).unwrap_or("an unknown cudaError_t"), code }
    }

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

#[cfg(test)]
mod tests {
    use super::Error;

    /// The error a kernel launch gets when the driver is too old for the bundled runtime, as it
    /// reads: the public operation and the runtime's name for the code, the code kept for programs.
    #[test]
    fn runtime_errors_name_the_operation_and_the_cuda_error() {
        let e = Error::cuda_runtime("nvfp4::global_scale", 35);
        assert_eq!(e, Error::CudaRuntime { op: "nvfp4::global_scale", name: "cudaErrorInsufficientDriver", code: 35 });
        let text = e.to_string();
        assert!(text.starts_with("nvfp4::global_scale: CUDA runtime error cudaErrorInsufficientDriver (35)"), "{text}");
        assert!(text.contains("graphsafe doctor"), "{text}");
        let text = Error::cuda_runtime("mla::decode", 700).to_string();
        assert_eq!(text, "mla::decode: CUDA runtime error cudaErrorIllegalAddress (700)");
        assert!(Error::cuda_runtime("mla::decode", 123_456).to_string().contains("an unknown cudaError_t (123456)"));
    }
}

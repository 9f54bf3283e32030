//! Raw FFI: the kernel glue in `cuda-src/` (bindgen over `include/graphsafe_kernels.h`), the CUDA
//! driver API types (bindgen over the toolkit's `cuda.h`), and the fatbins build.rs embeds.
//!
//! Both bindgen outputs are checked in; `--features bindgen` regenerates them and fails on drift.
//! Nothing in here is safe to call without reading the C header's contract.

/// bindgen output for `include/graphsafe_kernels.h`; the header documents every item.
#[path = "kernels_bindings.rs"]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::all)] // generated
pub mod kernels;

/// bindgen output for the toolkit's `cuda.h` and `cudaTypedefs.h`: types, constants, `PFN_` typedefs.
#[path = "cuda_bindings.rs"]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::all)] // generated
pub mod cuda;

pub mod driver;

/// `libcudnn.so.9` loaded at run time (lazy per symbol) and its bindgen output (`cudnn::ffi`).
pub mod cudnn;

/// Fatbins compiled from `cuda-src/` files marked `kind=fatbin`, for `driver::Module`.
/// Each is `None` when none of its archs was selected by `GRAPHSAFE_CUDA_ARCHS`.
pub mod modules {
    include!(concat!(env!("OUT_DIR"), "/modules.rs"));
}

use crate::error::{Error, Result};

/// Turns a glue status code into a `Result`. `op` names the glue function for the message.
pub(crate) fn check_glue(status: i32, op: &'static str) -> Result<()> {
    use kernels::GsStatus as S;
    let s = S(status as u32);
    if s == S::GS_OK {
        return Ok(());
    }
    Err(if s == S::GS_ERR_INVALID_ARGUMENT {
        Error::invalid(op, "arguments the kernel glue accepts", "a value it rejected")
    } else if s == S::GS_ERR_UNSAFE_SPLIT {
        Error::invalid("num_splits", "a count allowed by the split-KV safety rule", "a larger count")
    } else if s == S::GS_ERR_CUTLASS_CANNOT_IMPLEMENT {
        Error::Cutlass { op, status: "can_implement() refused the arguments".into() }
    } else if s == S::GS_ERR_CUTLASS_INTERNAL {
        Error::Cutlass { op, status: "internal error".into() }
    } else if s == S::GS_ERR_CUDA {
        // SAFETY: reads a thread-local int in the glue.
        Error::CudaRuntime { op, code: unsafe { kernels::gs_last_cuda_error() } }
    } else if s == S::GS_ERR_WORKSPACE_TOO_SMALL {
        Error::WorkspaceTooSmall { needed: 0, capacity: 0 }
    } else {
        Error::Cutlass { op, status: format!("unknown glue status {status}") }
    })
}

//! # graphsafe
//!
//! Run the kernels of an LLM decode step (MLA attention, NVFP4 GEMM, cuDNN GEMM) inside CUDA
//! graphs without ever letting a captured pointer dangle.
//!
//! A CUDA graph bakes in the raw address of every buffer current at capture. If a workspace later
//! grows by `resize` (freeing the old block) every replay touches memory that belongs to someone
//! else. graphsafe turns the conventions that avoid this (retire never resize, zero-fill, size
//! before capture) into types. See `ARCHITECTURE.md` in the shared design notes and README.md.
//!
//! Layers, each depending only on those below it:
//!
//! * [`capi`]: the C ABI (`include/graphsafe.h`);
//! * [`ops`]: safe kernel wrappers (validate, size, launch) and their planners;
//! * [`graph`]: stream capture as a typestate; graphs own every buffer they captured;
//! * [`workspace`]: [`workspace::Workspace`] (retire, never resize; zero-filled) and the planner;
//! * [`driver`]: the CUDA driver API, loaded at run time;
//! * [`sys`]: raw FFI (kernel glue, driver entry points, embedded fatbins).

#![warn(missing_docs)]
// Every unsafe operation states its own justification, also inside `unsafe fn`s.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod capi;
pub mod driver;
pub mod error;
pub mod graph;
pub mod ops;
pub mod sys;
pub mod workspace;

pub use error::{Error, Result};

/// Facts about how this copy of the crate was built (what `graphsafe doctor` reports).
pub mod build_info {
    /// The GPU archs the kernels were compiled for (GRAPHSAFE_CUDA_ARCHS, default all three).
    pub fn archs() -> Vec<&'static str> {
        env!("GRAPHSAFE_BUILD_ARCHS").split(',').filter(|s| !s.is_empty()).collect()
    }
    /// Whether kernels for `arch` (e.g. "sm_100a") are in this build.
    pub fn has_arch(arch: &str) -> bool {
        archs().contains(&arch)
    }
    /// The nvcc version used, e.g. "13.0.88".
    pub const CUDA_VERSION: &str = env!("GRAPHSAFE_BUILD_CUDA_VERSION");
    /// Where the CUDA toolkit came from (a variable, PATH, or the provisioned wheels).
    pub const CUDA_SOURCE: &str = env!("GRAPHSAFE_BUILD_CUDA_SOURCE");
    /// The toolkit folder.
    pub const CUDA_HOME: &str = env!("GRAPHSAFE_BUILD_CUDA_HOME");
    /// The CUTLASS version used, e.g. "4.2.0".
    pub const CUTLASS_VERSION: &str = env!("GRAPHSAFE_BUILD_CUTLASS_VERSION");
    /// Where CUTLASS came from.
    pub const CUTLASS_SOURCE: &str = env!("GRAPHSAFE_BUILD_CUTLASS_SOURCE");
    /// `cuda-src` units left out because none of their archs was selected, as `stem(archs)`.
    pub fn skipped_units() -> Vec<&'static str> {
        env!("GRAPHSAFE_BUILD_SKIPPED_UNITS").split(',').filter(|s| !s.is_empty()).collect()
    }
}

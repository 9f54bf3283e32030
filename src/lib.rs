//! # graphsafe
//!
//! Run the kernels of an LLM decode step (MLA attention, NVFP4 GEMM, cuDNN GEMM) inside CUDA
//! graphs without ever letting a captured pointer dangle.
//!
//! A CUDA graph bakes in the raw address of every buffer current at capture. If a workspace later
//! grows by `resize` (freeing the old block) every replay touches memory that belongs to someone
//! else. graphsafe turns the conventions that avoid this (retire never resize, zero-fill, size
//! before capture) into types; README.md has the invariants and what enforces each.
//!
//! # Quick start
//!
//! Size the workspace before capture, capture with every buffer bound, grow whenever you like
//! afterwards, replay:
//!
//! ```no_run
//! use graphsafe::driver::{Context, DeviceBuffer, Stream};
//! use graphsafe::graph::CaptureMode;
//! use graphsafe::ops::testing::{SplitKShape, TestKernels};
//! use graphsafe::workspace::Workspace;
//!
//! # fn main() -> graphsafe::Result<()> {
//! let ctx = Context::new(0)?;
//! let mut stream = Stream::new(&ctx)?;
//! let kernels = TestKernels::load(&ctx)?; // a split-K kernel with semaphores in the workspace
//! let shape = SplitKShape { m: 1024, k: 1024, splits: 8 };
//! let a = DeviceBuffer::from_host(&stream, &vec![1.0f32; 1024 * 1024])?;
//! let x = DeviceBuffer::from_host(&stream, &vec![0.5f32; 1024])?;
//! let y = DeviceBuffer::alloc_zeroed(&stream, 1024 * 4)?;
//!
//! let mut ws = Workspace::new(&stream, shape.workspace_bytes()?)?; // size before capture
//! let (graph, ()) = stream.capture(CaptureMode::ThreadLocal, |cap| {
//!     let w = cap.bind_workspace(&mut ws)?; // borrowed: growing it here does not compile
//!     let (a, x, y) = (cap.bind_buffer(&a)?, cap.bind_buffer(&x)?, cap.bind_buffer(&y)?);
//!     kernels.split_k_gemv_captured(&a, &x, &y, shape, &w, cap)
//! })?;
//! let exec = graph.instantiate()?;
//! ws.ensure_size(64 << 20, &stream)?; // retires the captured buffer; the graph keeps it alive
//! exec.launch(&stream)?;
//! assert_eq!(y.to_host_vec::<f32>(&stream)?[0], 512.0);
//! # Ok(()) }
//! ```
//!
//! The same shape holds for the real ops: [`ops::mla::decode_captured`],
//! [`ops::nvfp4::w4a16_gemm_captured`], [`ops::cudnn::matmul_captured`]; their planners
//! ([`ops::mla::sm90::worst_case`], [`workspace::WorkspacePlanner`], …) give the pre-grow size.
//! C and C++ engines use the same rules through [`capi`] (`include/graphsafe.h`).
//!
//! Layers, each depending only on those below it:
//!
//! * [`capi`]: the C ABI (`include/graphsafe.h`);
//! * [`ops`]: safe kernel wrappers (validate, size, launch) and their planners;
//! * [`graph`]: stream capture as a typestate; graphs own every buffer they captured;
//! * [`workspace`]: [`workspace::Workspace`] (retire, never resize; zero-filled) and the planner;
//! * [`driver`]: the CUDA driver API, loaded at run time;
//! * [`sys`]: raw FFI (kernel glue, driver entry points, embedded fatbins).
//!
//! [`arch`] is the table of GPU targets (shared with `build.rs`) that dispatch, planning and the
//! build all read: which arch runs on which GPU, and which back-end each op uses there.

#![cfg_attr(
    graphsafe_no_kernels,
    doc = "\n\n**This copy was built without kernels** (a documentation build: docs.rs, or no CUDA \
           toolkit with `GRAPHSAFE_OFFLINE=1`). The API documented here is complete; a normal build \
           compiles the CUDA kernels for every row of [`arch::TARGETS`] (see README.md)."
)]
#![warn(missing_docs)]
// Every unsafe operation states its own justification, also inside `unsafe fn`s.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod arch;
pub mod capi;
pub mod driver;
pub mod error;
pub mod graph;
mod logging;
pub mod ops;
pub mod sys;
pub mod workspace;

pub use error::{Error, Result};

/// Facts about how this copy of the crate was built (what `graphsafe doctor` reports).
pub mod build_info {
    /// The GPU archs the kernels were compiled for: rows of [`crate::arch::TARGETS`]
    /// (GRAPHSAFE_CUDA_ARCHS, default all of them).
    pub fn archs() -> Vec<&'static str> {
        env!("GRAPHSAFE_BUILD_ARCHS").split(',').filter(|s| !s.is_empty()).collect()
    }
    /// Whether kernels for `arch` (a row name, e.g. "sm_100f") are in this build.
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

    /// The CUDA runtime linked into the kernels (`cudart_static`: the provisioned toolkit's 13.0,
    /// or the toolkit the build found), as (major, minor); `None` in a build without kernels.
    pub fn runtime_version() -> Option<(i32, i32)> {
        let v: i32 = env!("GRAPHSAFE_BUILD_CUDART_VERSION").parse().unwrap_or(0);
        (v > 0).then_some((v / 1000, v % 1000 / 10))
    }

    /// The oldest Linux driver release that supports CUDA `major`.0, which is what a runtime of
    /// that major version needs (CUDA's minor version compatibility: any 13.x runtime runs on a
    /// driver for 13.0 or newer). From NVIDIA's CUDA toolkit release notes.
    pub fn min_linux_driver(major: i32) -> Option<&'static str> {
        match major {
            11 => Some("450.80.02"),
            12 => Some("525.60.13"),
            13 => Some("580.65.06"),
            _ => None,
        }
    }

    /// How an installed driver fits the bundled runtime ([`driver_fit`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum DriverFit {
        /// The driver supports the runtime's CUDA version, or a newer one.
        Supported,
        /// The driver supports the runtime's major version, but an older minor one: the runtime
        /// runs (minor version compatibility), without what that minor version added to the driver.
        MinorVersionCompatible,
        /// The driver is older than the runtime's major version: every runtime call, so every
        /// kernel launch, fails (`cudaErrorInsufficientDriver`). Update the driver.
        TooOld,
        /// A build without kernels has no runtime to fit.
        NoRuntime,
    }

    /// How a driver that supports CUDA `driver` (`cuDriverGetVersion`, e.g. (12, 8), as
    /// [`crate::driver::driver_version`] returns it) fits this build's runtime.
    pub fn driver_fit(driver: (i32, i32)) -> DriverFit {
        runtime_version().map_or(DriverFit::NoRuntime, |runtime| fit(runtime, driver))
    }

    pub(crate) fn fit(runtime: (i32, i32), driver: (i32, i32)) -> DriverFit {
        if driver >= runtime {
            DriverFit::Supported
        } else if driver.0 == runtime.0 {
            DriverFit::MinorVersionCompatible
        } else {
            DriverFit::TooOld
        }
    }

    #[cfg(test)]
    mod tests {
        use super::{fit, min_linux_driver, DriverFit};

        #[test]
        fn a_driver_fits_the_runtime_by_cuda_version() {
            assert_eq!(fit((13, 0), (13, 0)), DriverFit::Supported);
            assert_eq!(fit((13, 0), (13, 1)), DriverFit::Supported);
            assert_eq!(fit((13, 0), (14, 0)), DriverFit::Supported);
            assert_eq!(fit((13, 2), (13, 0)), DriverFit::MinorVersionCompatible);
            // A 570 driver (CUDA 12.8) cannot run the 13.0 runtime.
            assert_eq!(fit((13, 0), (12, 8)), DriverFit::TooOld);
            assert_eq!(fit((12, 8), (12, 9)), DriverFit::Supported);
            assert_eq!(min_linux_driver(13), Some("580.65.06"));
            assert_eq!(min_linux_driver(10), None);
        }
    }
}

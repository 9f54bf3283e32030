//! # graphsafe
//!
//! Run the kernels of an LLM decode step (MLA attention, NVFP4 GEMM, cuDNN GEMM) inside CUDA
//! graphs without ever letting a captured pointer dangle.
//!
//! A CUDA graph bakes in the raw address of every buffer current at capture. If a workspace later
//! grows by `resize` (freeing the old block) every replay touches memory that belongs to someone
//! else. graphsafe turns the conventions that avoid this (retire never resize, zero-fill, size
//! before capture) into types; docs/ARCHITECTURE.md has the invariants and what enforces each.
//!
//! # Quick start
//!
//! An MLA decode step as an engine runs it: size the workspace for every shape the engine will
//! capture, capture the decode with every buffer bound, grow the workspace whenever you like
//! afterwards, replay:
//!
//! ```no_run
//! use graphsafe::prelude::*;
//!
//! # fn main() -> graphsafe::Result<()> {
//! let ctx = Context::new(0)?;
//! let mut stream = Stream::new(&ctx)?;
//! // DeepSeek V3 at TP 8 (16 heads), up to 64 requests of up to 4096 tokens, pages of 64 tokens.
//! let (batch, heads, page, max_seq) = (64, 16, 64, 4096);
//! let (max_pages, pages) = (max_seq / page, batch * max_seq / page);
//! let q_nope = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 512 * 2)?;
//! let q_pe = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 64 * 2)?;
//! let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
//! let seq_lens = DeviceBuffer::from_host(&stream, &vec![max_seq as i32; batch])?;
//! let page_table = DeviceBuffer::from_host(&stream, &(0..pages as i32).collect::<Vec<_>>())?;
//! let out = DeviceBuffer::alloc_zeroed(&stream, batch * heads * 512 * 2)?;
//! let args = MlaDecodeArgs::new(
//!     Tensor::contiguous(&q_nope, DType::Bf16, &[batch, heads, 512]),
//!     Tensor::contiguous(&q_pe, DType::Bf16, &[batch, heads, 64]),
//!     Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
//!     Tensor::contiguous(&seq_lens, DType::I32, &[batch]),
//!     Tensor::contiguous(&page_table, DType::I32, &[batch, max_pages]),
//!     Tensor::contiguous(&out, DType::Bf16, &[batch, heads, 512]),
//! )
//! .with_max_seq_len(max_seq as u32);
//!
//! // 1. Size before capture: the most any batch 1..=64 and length 1..=4096 needs on this GPU.
//! let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
//! let limits = MlaLimits::new(heads as u32, batch as u32, max_seq as u32, ctx.sm_count());
//! let mut ws = Workspace::new(&stream, mla::worst_case(arch, &limits)?.workspace_bytes)?;
//!
//! // 2. Capture: every buffer bound (the graph keeps it alive); the workspace borrowed by the
//! //    capture, so growing it in here does not compile.
//! let (graph, plan) = stream.capture(CaptureMode::ThreadLocal, |cap| {
//!     let w = cap.bind_workspace(&mut ws)?;
//!     mla::decode_captured(&args.bind(cap)?, &w, cap)
//! })?;
//! let exec = graph.instantiate()?;
//!
//! // 3. Grow whenever you like: the captured buffer is retired, and the graph keeps it alive.
//! ws.ensure_size(plan.workspace_bytes + (64 << 20), &stream)?;
//!
//! // 4. Replay each step (the engine rewrites seq_lens and page_table in place between them).
//! for _ in 0..3 {
//!     exec.launch(&stream)?;
//! }
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! The other ops have the same shape, with a planner for the pre-grow size:
//! [`ops::nvfp4::gemm_captured`] / [`ops::nvfp4::w4a16_gemm_captured`] with
//! [`ops::nvfp4::worst_case`] over the batch sizes captured, and [`ops::cudnn::matmul_captured`]
//! with [`ops::cudnn::plan_workspace`]; [`workspace::WorkspacePlanner`] takes the largest of
//! several ops sharing one workspace, and [`arch::sm_count_of`] gives a GPU's SM count by name for
//! planning without it. [`prelude`] has what the example imports. Engine memory is handed to
//! graphsafe with [`driver::DeviceBuffer::adopt`] (or `from_cudarc`, feature `cudarc`). C and C++
//! engines use the same rules through [`capi`] (`include/graphsafe.h`).
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
// Feature-gated items (`cudarc`) carry a badge on docs.rs, whose nightly rustdoc sets `docsrs`
// (Cargo.toml); `doc_cfg` is the feature that now also derives those badges from `#[cfg]`
// (`doc_auto_cfg` was merged into it in Rust 1.92).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
// `unsafe` lives in three layers, opted in below: `sys` (the FFI and its safe wrappers), `driver`
// (the driver API's safe types) and `capi` (raw pointers from C). Everything above them (graph,
// workspace, ops) is safe code by construction; each unsafe operation states its own
// justification, also inside `unsafe fn`s.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod arch;
#[allow(unsafe_code)]
pub mod capi;
#[allow(unsafe_code)]
pub mod driver;
pub mod error;
pub mod graph;
mod locks;
mod logging;
pub mod ops;
#[allow(unsafe_code)]
pub mod sys;
pub mod workspace;

pub use error::{Error, Result};

/// What a captured decode step needs, in one import: `use graphsafe::prelude::*;`.
///
/// The driver objects, the capture and its views, the workspace and its planner, tensor
/// arguments, and the ops: their modules (`mla`, `nvfp4`, `cudnn`, whose planners share names:
/// `mla::worst_case`, `nvfp4::worst_case`), their argument types and limits, and MLA's `decode`
/// and `decode_captured`.
pub mod prelude {
    pub use crate::arch::sm_count_of;
    pub use crate::driver::{Context, DeviceBuffer, Stream};
    pub use crate::error::{Error, Result};
    pub use crate::graph::{Capture, CaptureMode, CapturedWorkspace, CapturedBuffer, Graph, GraphExec};
    pub use crate::ops::cudnn::{self, Cudnn, MatmulArgs, MatmulProblem, Nvfp4MatmulArgs, Nvfp4Problem};
    pub use crate::ops::mla::{self, decode, decode_captured, KvFormat, KvFormatKind, MlaArch, MlaDecodeArgs, MlaDecodePlan, MlaLimits};
    pub use crate::ops::nvfp4::{self, Nvfp4Arch, Nvfp4GemmArgs, Nvfp4Limits, Nvfp4Matrix, Nvfp4Plan, Nvfp4QuantizeArgs, PreparedWeight, W4a16GemmArgs};
    pub use crate::ops::tensor::{DType, Tensor};
    pub use crate::workspace::{Workspace, WorkspacePlanner};
}

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

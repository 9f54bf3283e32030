//! Safe wrappers of the kernel glue (`include/graphsafe_kernels*.h`, bindgen: [`super::kernels`]),
//! one per C function, in the shape of cudarc's `result` level: checked arguments in, `Result`
//! with real values out. Every `unsafe` call of a glue function is here; the ops (`src/ops`) call
//! only these.
//!
//! # What a wrapper checks, and what it trusts
//!
//! **Planners** (workspace sizes, split counts, tiles, layouts) are host-only C functions that
//! write through out-pointers: the wrapper passes a local and returns the value, or the glue's
//! status as an [`Error`]. They run without a GPU.
//!
//! **Launches** take their device memory as [`DeviceSpan`]s and, before the glue sees anything,
//! check every access the header documents for the sizes given: each operand's extent (from its
//! shape and strides) lies inside its span and inside the address space, with the alignment the
//! kernel relies on; the workspace holds what the glue's own planner says these arguments need
//! (else [`Error::WorkspaceTooSmall`] naming both sizes, nothing launched). A wrapper trusts, and
//! does not check:
//!
//! 1. each span's own invariant ([`DeviceSpan`]): the memory exists in the stream's context and
//!    stays allocated while the work may run (spans come from `graph::op_target::OpTarget::admit`,
//!    which also records them in a capture, or from the `unsafe` [`DeviceSpan::from_raw`]);
//! 2. `stream` is a live stream whose context is current on the calling thread (the op enters
//!    it: `Context::enter`);
//! 3. device data the header says the kernel never trusts (MLA lengths and page indices) needs
//!    nothing: the kernels clamp it.
//!
//! A refusal by the glue itself (`GS_ERR_*`) becomes the matching [`Error`]; the glue refuses
//! before it enqueues anything, so a failed launch never leaves half its work on the stream.

pub mod mla;
pub mod nvfp4;

use super::kernels as k;
pub use super::span::DeviceSpan;
use crate::error::{Error, Result};

/// The raw stream handle the glue takes (`cudaStream_t`, the driver's `CUstream`).
pub type RawStream = super::cuda::CUstream;

/// Element types of the glue (`GsDtype`). The default is bf16, `GS_DTYPE_BF16` (0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GlueDtype {
    /// bfloat16
    #[default]
    Bf16,
    /// float16
    Fp16,
    /// float8 e4m3
    Fp8E4m3,
}

impl GlueDtype {
    pub(crate) fn code(self) -> i32 {
        (match self {
            GlueDtype::Bf16 => k::GsDtype::GS_DTYPE_BF16,
            GlueDtype::Fp16 => k::GsDtype::GS_DTYPE_FP16,
            GlueDtype::Fp8E4m3 => k::GsDtype::GS_DTYPE_FP8_E4M3,
        })
        .0 as i32
    }

    pub(crate) fn bytes(self) -> u64 {
        match self {
            GlueDtype::Bf16 | GlueDtype::Fp16 => 2,
            GlueDtype::Fp8E4m3 => 1,
        }
    }
}

/// The workspace sizes a launch was checked with: what [`check`] reports if the glue still says
/// its workspace is too small.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WsSizes {
    pub needed: u64,
    pub capacity: u64,
}

/// Refuses a workspace smaller than `needed` before anything is enqueued.
pub(crate) fn require_workspace(ws: &DeviceSpan, needed: u64, align: u64) -> Result<WsSizes> {
    let sizes = WsSizes { needed, capacity: ws.len() };
    if needed > ws.len() {
        return Err(Error::WorkspaceTooSmall { needed, capacity: ws.len() });
    }
    if needed > 0 {
        ws.require("workspace", needed, align)?;
    }
    Ok(sizes)
}

/// The public operation behind a glue function, as errors name it: the glue's symbols
/// (`gs_nvfp4_global_scale`) are internal, the caller called `nvfp4::global_scale`.
pub(crate) fn public_op(glue: &str) -> &'static str {
    match glue {
        "gs_mla_sm90_decode" | "gs_mla_sm100_decode" | "gs_mla_sm100_kernel_args" | "gs_mla_sanitize" | "gs_mla_sanitize_finish" => "mla::decode",
        "gs_mla_sm90_num_splits" | "gs_mla_sm90_workspace_bytes" => "mla::sm90::plan",
        "gs_mla_sm100_num_splits" | "gs_mla_sm100_max_safe_splits" | "gs_mla_sm100_scheduler" | "gs_mla_sm100_workspace_bytes" | "gs_mla_sanitize_layout" => "mla::sm100::plan",
        "gs_nvfp4_scale_bytes" => "nvfp4::scale_bytes",
        "gs_nvfp4_gemm_tile" => "nvfp4::gemm_tile",
        "gs_nvfp4_cutlass_scale_offset" => "nvfp4 scale layout",
        "gs_nvfp4_gemm_workspace_bytes" | "gs_nvfp4_w4a16_check_shape" | "gs_nvfp4_w4a16_workspace_bytes" | "gs_nvfp4_w4a16_schedule" | "gs_nvfp4_w4a16_prepared_bytes" => "nvfp4::plan",
        "gs_nvfp4_global_scale" => "nvfp4::global_scale",
        "gs_nvfp4_quantize" => "nvfp4::quantize",
        "gs_nvfp4_dequantize" => "nvfp4::dequantize",
        "gs_nvfp4_w4a16_prepare" => "nvfp4::prepare_weight",
        "gs_nvfp4_w4a16_gemm" => "nvfp4::w4a16_gemm",
        "gs_nvfp4_gemm" | "gs_nvfp4_gemm_sm100" | "gs_nvfp4_gemm_sm120" => "nvfp4::gemm",
        _ => "a graphsafe kernel",
    }
}

/// Turns a glue status code into a `Result`; `glue` names the glue function (errors name the
/// public operation behind it, [`public_op`]). `ws` is the workspace a launch passed (the glue's
/// too-small check uses the same planner the wrapper asked, so these are the sizes it compared).
pub(crate) fn check(status: i32, glue: &'static str, ws: Option<WsSizes>) -> Result<()> {
    use k::GsStatus as S;
    let s = S(status as u32);
    if s == S::GS_OK {
        return Ok(());
    }
    let op = public_op(glue);
    Err(if s == S::GS_ERR_INVALID_ARGUMENT {
        Error::invalid(op, "arguments its kernel accepts", "a value the kernel's own checks rejected")
    } else if s == S::GS_ERR_UNSAFE_SPLIT {
        Error::invalid("num_splits", "a count allowed by the split-KV safety rule", "a larger count")
    } else if s == S::GS_ERR_CUTLASS_CANNOT_IMPLEMENT {
        Error::Cutlass { op, status: "can_implement() refused the arguments".into() }
    } else if s == S::GS_ERR_CUTLASS_INTERNAL {
        Error::Cutlass { op, status: "internal error".into() }
    } else if s == S::GS_ERR_CUDA {
        Error::cuda_runtime(op, last_cuda_error())
    } else if let (true, Some(w)) = (s == S::GS_ERR_WORKSPACE_TOO_SMALL, ws) {
        Error::WorkspaceTooSmall { needed: w.needed, capacity: w.capacity }
    } else {
        Error::Cutlass { op, status: format!("unexpected kernel status {status}") }
    })
}

/// The `cudaError_t` of this thread's last `GS_ERR_CUDA` (0 if none).
pub fn last_cuda_error() -> i32 {
    // SAFETY: reads a thread-local int in the glue; no arguments.
    unsafe { k::gs_last_cuda_error() }
}

/// A host function's out-value: runs `f` with a pointer to a local, checks its status.
fn out<T: Default>(op: &'static str, f: impl FnOnce(*mut T) -> i32) -> Result<T> {
    let mut v = T::default();
    check(f(&mut v), op, None)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_too_small_workspace_is_named_with_both_sizes() {
        let ws = DeviceSpan::vouched(0x1000, 100);
        assert_eq!(require_workspace(&ws, 101, 16), Err(Error::WorkspaceTooSmall { needed: 101, capacity: 100 }));
        assert_eq!(require_workspace(&ws, 100, 16), Ok(WsSizes { needed: 100, capacity: 100 }));
        assert_eq!(require_workspace(&DeviceSpan::empty(), 0, 16), Ok(WsSizes { needed: 0, capacity: 0 }));
        let sizes = WsSizes { needed: 7, capacity: 3 };
        let code = k::GsStatus::GS_ERR_WORKSPACE_TOO_SMALL.0 as i32;
        assert_eq!(check(code, "gs_x", Some(sizes)), Err(Error::WorkspaceTooSmall { needed: 7, capacity: 3 }));
        assert!(matches!(check(code, "gs_x", None), Err(Error::Cutlass { .. })), "a planner never reports it");
        assert_eq!(check(0, "gs_x", None), Ok(()));
    }

    /// A glue failure names the public operation, never the glue's symbol, for every glue
    /// function there is (the bindings list them), and a runtime failure the `cudaError_t`'s name.
    #[test]
    fn glue_failures_name_the_public_operation() {
        const BINDINGS: &str = include_str!("../kernels_bindings.rs");
        let glue: Vec<&str> = BINDINGS.split("pub fn ").skip(1).filter_map(|s| s.split('(').next()).filter(|n| n.starts_with("gs_") && *n != "gs_last_cuda_error").collect();
        assert!(glue.len() > 20, "{glue:?}");
        for g in glue {
            let op = public_op(g);
            assert!(!op.contains("gs_") && op != public_op("gs_not_a_glue_function"), "{g} -> {op}");
        }
        let code = k::GsStatus::GS_ERR_CUDA.0 as i32;
        match check(code, "gs_nvfp4_global_scale", None) {
            Err(Error::CudaRuntime { op, name, code }) => {
                assert_eq!(op, "nvfp4::global_scale");
                assert_eq!(Some(name), crate::sys::cuda_errors::name(code).or(Some("an unknown cudaError_t")));
            }
            other => panic!("{other:?}"),
        }
        let invalid = k::GsStatus::GS_ERR_INVALID_ARGUMENT.0 as i32;
        let e = check(invalid, "gs_mla_sm90_decode", None).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "mla::decode"), "{e}");
        let e = check(k::GsStatus::GS_ERR_CUTLASS_INTERNAL.0 as i32, "gs_nvfp4_gemm", None).unwrap_err();
        assert_eq!(e.to_string(), "nvfp4::gemm: CUTLASS internal error");
    }
}

#[cfg(test)]
mod launch_tests;

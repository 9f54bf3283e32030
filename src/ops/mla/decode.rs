//! The MLA decode op: one graph-safe API over CUTLASS's sm100 kernel and graphsafe's sm90 kernel.
//!
//! ```text
//! q_nope [B, H, 512]   q_pe [B, H, 64]   kv_cache [pages, page_size, 576]
//! seq_lens [B] i32     page_table [B, max_pages] i32
//! out [B, H, 512]      lse [B, H] f32 (optional)
//! ```
//!
//! [`decode`] (eager) grows the workspace when it must; [`decode_captured`] never grows and returns
//! [`Error::WorkspaceTooSmall`](crate::Error::WorkspaceTooSmall) instead, launching nothing. Both
//! validate every argument first ([`MlaDecodeArgs`], in `args.rs`).

use super::plan::MlaDecodePlan;
use super::{KvFormat, MlaDecodeArgs};
use crate::driver::{DeviceBuffer, Stream};
use crate::error::Result;
use crate::graph::op_target::OpTarget;
use crate::graph::{Capture, CapturedBuffer, CapturedWorkspace};
use crate::ops::tensor::{refuse_overlap, DeviceMemory, Tensor};
use crate::sys::glue::mla as glue;
use crate::workspace::Workspace;

pub use crate::arch::MlaArch;

impl MlaArch {
    /// The back-end for a compute capability, if this build has one for it (the arch table's row).
    pub fn for_compute_capability(cc: (i32, i32)) -> Result<MlaArch> {
        crate::arch::mla(cc)
    }
}

/// Validate, size, launch: the one path behind every entry point (Rust eager, Rust captured, C).
/// Everything is checked before anything is enqueued: a refusal captures and launches nothing.
pub(crate) fn decode_on<M: DeviceMemory>(args: &MlaDecodeArgs<M>, mut target: OpTarget<'_>) -> Result<MlaDecodePlan> {
    let ctx = target.context().clone();
    let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
    let sms = ctx.sm_count();
    let plan = args.plan(arch, sms, ctx.raw())?;
    let decode = args.to_glue(&plan, sms, ctx.device().ordinal(), &mut target)?;
    let ws = target.workspace(plan.workspace_bytes)?;
    // Nor the workspace (on sm100 it holds the sanitized copy of the lengths and page table that
    // CUTLASS trusts). A buffer the workspace just grew into is fresh, so only an unchanged one
    // can overlap, and then nothing was enqueued yet.
    if !ws.is_empty() {
        let w = Some((ws.ptr(), ws.ptr().saturating_add(ws.len())));
        refuse_overlap(("out", args.out.byte_range()), ("the workspace", w))?;
        refuse_overlap(("lse", args.lse.as_ref().and_then(Tensor::byte_range)), ("the workspace", w))?;
        // Nor the per-tensor scale: every CTA reads it while the split kernels write partials.
        if let KvFormat::Fp8PerTensor { scale } = &args.kv_format {
            refuse_overlap(("kv_format.scale", scale.byte_range()), ("the workspace", w))?;
        }
    }
    let backend = match arch {
        MlaArch::Sm90 => glue::Backend::Sm90,
        MlaArch::Sm100 => glue::Backend::Sm100,
    };
    target.commit()?.glue(|stream| glue::decode(backend, &decode, ws, stream))?;
    Ok(plan)
}

/// Eager decode on `stream`: validates, grows `ws` if needed (retiring, zero-filled), launches.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// // One request of 16 heads (DeepSeek V3 at TP 8) over two 64-token pages, bf16.
/// let (heads, page, pages) = (16, 64, 2);
/// # let q_nope = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// # let q_pe = DeviceBuffer::alloc_zeroed(&stream, heads * 64 * 2)?;
/// # let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
/// # let seq_lens = DeviceBuffer::from_host(&stream, &[100i32])?;
/// # let page_table = DeviceBuffer::from_host(&stream, &[0i32, 1])?;
/// # let out = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// let args = MlaDecodeArgs::new(
///     Tensor::contiguous(&q_nope, DType::Bf16, &[1, heads, 512]),
///     Tensor::contiguous(&q_pe, DType::Bf16, &[1, heads, 64]),
///     Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
///     Tensor::contiguous(&seq_lens, DType::I32, &[1]),
///     Tensor::contiguous(&page_table, DType::I32, &[1, pages]),
///     Tensor::contiguous(&out, DType::Bf16, &[1, heads, 512]),
/// );
/// let mut ws = Workspace::new(&stream, 0)?; // an eager decode grows it as it needs
/// let plan = mla::decode(&args, &mut ws, &stream)?;
/// assert!(ws.capacity() >= plan.workspace_bytes);
/// let out_host = out.to_host_vec::<u16>(&stream)?; // bf16 bits, [1, 16, 512]
/// # let _ = out_host; Ok(()) }
/// ```
pub fn decode(args: &MlaDecodeArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream) -> Result<MlaDecodePlan> {
    decode_on(args, OpTarget::eager(stream, Some(ws))?)
}

/// Captured decode: validates, checks that every view belongs to `cap`, checks the captured
/// workspace (never grows: `WorkspaceTooSmall` naming both sizes, nothing captured), captures the
/// launch, and adds every buffer it bakes in to the capture.
///
/// Size the workspace before the capture ([`super::worst_case`] over every shape captured); a
/// captured decode never grows it:
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let mut stream = Stream::new(&ctx)?;
/// // One request of 16 heads (DeepSeek V3 at TP 8) over two 64-token pages, bf16.
/// let (heads, page, pages) = (16, 64, 2);
/// # let q_nope = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// # let q_pe = DeviceBuffer::alloc_zeroed(&stream, heads * 64 * 2)?;
/// # let kv = DeviceBuffer::alloc_zeroed(&stream, pages * page * 576 * 2)?;
/// # let seq_lens = DeviceBuffer::from_host(&stream, &[100i32])?;
/// # let page_table = DeviceBuffer::from_host(&stream, &[0i32, 1])?;
/// # let out = DeviceBuffer::alloc_zeroed(&stream, heads * 512 * 2)?;
/// let args = MlaDecodeArgs::new(
///     Tensor::contiguous(&q_nope, DType::Bf16, &[1, heads, 512]),
///     Tensor::contiguous(&q_pe, DType::Bf16, &[1, heads, 64]),
///     Tensor::contiguous(&kv, DType::Bf16, &[pages, page, 576]),
///     Tensor::contiguous(&seq_lens, DType::I32, &[1]),
///     Tensor::contiguous(&page_table, DType::I32, &[1, pages]),
///     Tensor::contiguous(&out, DType::Bf16, &[1, heads, 512]),
/// );
/// let limits = MlaLimits::new(heads as u32, 1, (pages * page) as u32, ctx.sm_count());
/// let arch = MlaArch::for_compute_capability(ctx.compute_capability())?;
/// let mut ws = Workspace::new(&stream, mla::worst_case(arch, &limits)?.workspace_bytes)?;
/// let exec = {
///     let mut cap = stream.begin_capture(CaptureMode::ThreadLocal)?;
///     let w = cap.bind_workspace(&mut ws)?; // ws cannot grow until the capture ends
///     let bound = args.bind(&mut cap)?; // every buffer kept alive by the graph
///     mla::decode_captured(&bound, &w, &cap)?;
///     cap.end()?.instantiate()?
/// };
/// exec.launch(&stream)?;
/// # Ok(()) }
/// ```
pub fn decode_captured<'id>(args: &MlaDecodeArgs<CapturedBuffer<'id>>, ws: &CapturedWorkspace<'id>, cap: &Capture<'_, 'id>) -> Result<MlaDecodePlan> {
    decode_on(args, OpTarget::captured(cap.site(), Some(ws.view()))?)
}

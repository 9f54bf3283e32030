//! [`autotune`]: times a problem's candidate plans on its buffers and caches the fastest, so that
//! later matmuls and captures of the problem run it.

use super::{check_arch, MatmulArgs};
use crate::driver::{DeviceBuffer, Event, Stream};
use crate::error::Result;
use crate::graph::op_target::{Launch, OpTarget};
use crate::ops::cudnn::{Cudnn, OpKey, Plan, PlanInfo};
use crate::sys::DeviceSpan;
use crate::workspace::Workspace;
use std::sync::Arc;

/// What [`autotune`] measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AutotuneReport {
    /// The plan now cached for the problem.
    pub chosen: PlanInfo,
    /// Every candidate with its median µs per execute.
    pub candidates: Vec<(PlanInfo, f64)>,
}

/// Times up to `max_candidates` plans for the problem of `args` on its buffers (eagerly, on
/// `stream`; `c` is overwritten) and caches the fastest for it. Call it before planning the
/// workspace and capturing. A plan it replaces stays alive (graphs may hold it). `ws` grows to the
/// largest candidate's workspace.
///
/// ```no_run
/// # use graphsafe::prelude::*;
/// # fn main() -> graphsafe::Result<()> {
/// let ctx = Context::new(0)?;
/// let stream = Stream::new(&ctx)?;
/// let dnn = Cudnn::new(&ctx)?; // one per device, for the process
/// // y[m, n] = x[m, k] · W[n, k]ᵀ: B = Wᵀ is column-major.
/// let (m, n, k) = (8, 4096, 4096);
/// let (x, w, y) = (DeviceBuffer::alloc_zeroed(&stream, m * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, n * k * 2)?, DeviceBuffer::alloc_zeroed(&stream, m * n * 2)?);
/// let args = MatmulArgs::new(
///     Tensor::contiguous(&x, DType::Bf16, &[m, k]),
///     Tensor::strided(&w, 0, DType::Bf16, &[k, n], &[1, k]),
///     Tensor::contiguous(&y, DType::Bf16, &[m, n]),
/// );
/// let mut ws = Workspace::new(&stream, 0)?;
/// let report = cudnn::autotune(&dnn, &args, &mut ws, &stream, 8)?;
/// // The fastest plan is now the cached one: later matmuls (and captures) of this problem use it.
/// let info = cudnn::matmul(&dnn, &args, &mut ws, &stream)?;
/// assert_eq!(info.engine, report.chosen.engine);
/// # Ok(()) }
/// ```
pub fn autotune(dnn: &Cudnn, args: &MatmulArgs<&DeviceBuffer>, ws: &mut Workspace, stream: &Stream, max_candidates: usize) -> Result<AutotuneReport> {
    dnn.same_context(stream.context())?;
    let p = args.problem(stream.context().raw())?;
    check_arch(dnn, &p)?;
    let cands = dnn.candidates(|api, h| p.graph(api, h), max_candidates.max(1))?;
    let most = cands.iter().map(|c| c.info().workspace_bytes).max().unwrap_or(0);
    let mut target = OpTarget::eager(stream, Some(ws))?;
    let ptrs = args.spans(&mut target)?;
    let w = target.workspace(most)?;
    let timed = match time_candidates(dnn, &cands, &ptrs, w, &target.commit()?) {
        Ok(t) => t,
        Err(e) => {
            // Executes of the candidates may still be queued: their plans (and the code cuDNN
            // compiled for them) go only once the stream has run them; if even that wait fails,
            // they are leaked, never destroyed early.
            if stream.synchronize().is_err() {
                std::mem::forget(cands);
            }
            return Err(e);
        }
    };
    let best = timed.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|(p, _)| p.clone()).expect("at least one candidate");
    dnn.install(&dnn.key(OpKey::Matmul(p)), best.clone());
    Ok(AutotuneReport { chosen: best.info(), candidates: timed.iter().map(|(p, t)| (p.info(), *t)).collect() })
}

/// [`autotune`]'s timing: median µs of five batches of five executes per candidate, after two
/// warm-up ones. On success every execute has finished (the last batch's end event was waited for).
fn time_candidates(dnn: &Cudnn, cands: &[Arc<Plan>], ptrs: &[DeviceSpan; 3], w: DeviceSpan, launch: &Launch<'_, '_>) -> Result<Vec<(Arc<Plan>, f64)>> {
    let stream = launch.stream();
    let ctx = stream.context();
    let (start, end) = (Event::new(ctx, true)?, Event::new(ctx, true)?);
    let mut timed = Vec::new();
    for cand in cands {
        let run = || launch.glue(|s| dnn.execute(cand, ptrs, w, s));
        for _ in 0..2 {
            run()?;
        }
        let mut trials = Vec::new();
        for _ in 0..5 {
            start.record(stream)?;
            for _ in 0..5 {
                run()?;
            }
            end.record(stream)?;
            end.synchronize()?;
            trials.push(end.elapsed_ms(&start)? as f64 * 1e3 / 5.0);
        }
        trials.sort_by(|a, b| a.total_cmp(b));
        timed.push((cand.clone(), trials[trials.len() / 2]));
    }
    Ok(timed)
}

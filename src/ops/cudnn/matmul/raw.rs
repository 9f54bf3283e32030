//! The raw paths beside the safe matmul: an execute on spans the caller vouched for
//! ([`matmul_raw`], for tests), and the bare executor the benchmark measures the safe path against
//! ([`RawExecutor`]).

use super::{check_arch, plan_of, MatmulProblem};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::ops::cudnn::{Cudnn, PlanInfo};
use crate::sys::cudnn::backend::{self, Handle};
use crate::sys::DeviceSpan;
use std::sync::Arc;

#[doc(hidden)]
/// Executes the cached (or newly built) plan of `problem` on raw spans, with `ws` as the
/// workspace: for tests that need an allocation of exactly the plan's size. The spans are checked
/// against the plan's tensors and workspace; the caller vouched for their memory when it made them
/// ([`DeviceSpan::from_raw`]).
pub fn matmul_raw(dnn: &Cudnn, problem: &MatmulProblem, ptrs: [DeviceSpan; 3], ws: DeviceSpan, stream: &Stream) -> Result<PlanInfo> {
    dnn.same_context(stream.context())?;
    stream.ensure_eager()?;
    let p = problem.normalized();
    p.validate()?;
    let plan = plan_of(dnn, &p)?;
    if plan.info().workspace_bytes > ws.len() {
        return Err(Error::WorkspaceTooSmall { needed: plan.info().workspace_bytes, capacity: ws.len() });
    }
    // The caller vouched for the spans: nothing to admit, and the target makes no other check.
    OpTarget::eager(stream, None)?.commit()?.glue(|s| dnn.execute(&plan, &ptrs, ws, s))?;
    Ok(plan.info())
}

#[doc(hidden)]
/// The floor the safe path is measured against (benches/cudnn.rs): a plan on a handle of its own,
/// a prebuilt variant pack and a bare `cudnnBackendExecute`, with no validation, lookup, lock or
/// stream check per call beyond one atomic load. It borrows its stream, so the stream can neither
/// be dropped nor captured (`Stream::capture` takes it mutably) while the executor lives: its
/// executes can never land in a capture, whose graph would keep neither the plan nor the handle.
/// Neither `Send` nor `Sync`: its handle belongs to the creating thread's context.
pub struct RawExecutor<'s> {
    // Given back by `Drop` once the stream has run every execute: the pack and the plan before
    // the handle that made them.
    // (Always Some until the drop takes it.)
    objects: Option<(backend::VariantPack, backend::ExecPlan, Handle)>,
    dnn: Arc<Cudnn>,
    stream: &'s Stream,
    _one_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for RawExecutor<'_> {
    fn drop(&mut self) {
        // Executes may still be queued on the stream, and cuDNN may free code it compiled for the
        // plan with it: wait for them first (as graphsafe's frees wait for its streams). If the
        // wait fails, the plan and handle are leaked, never destroyed early.
        let Some((pack, plan, handle)) = self.objects.take() else { return };
        match self.stream.synchronize() {
            Ok(()) => {
                let _current = self.dnn.ctx.enter();
                drop(pack);
                drop(plan);
                drop(handle);
            }
            Err(e) => {
                std::mem::forget((pack, plan, handle));
                crate::driver::log_drop_error("waiting for a cuDNN raw executor's stream", Err::<(), _>(e));
            }
        }
    }
}

impl<'s> RawExecutor<'s> {
    #[doc(hidden)]
    /// Builds the floor for `problem` with the engine [`matmul`] runs for it (the cached plan's,
    /// autotuned or not), bound to `stream`; the spans are checked against the plan as for
    /// [`matmul_raw`], once. The caller's promise for them ([`DeviceSpan::from_raw`]) must hold for
    /// as long as the executor is used.
    pub fn new(dnn: &Arc<Cudnn>, problem: &MatmulProblem, ptrs: [DeviceSpan; 3], ws: DeviceSpan, stream: &'s Stream) -> Result<RawExecutor<'s>> {
        dnn.same_context(stream.context())?;
        stream.ensure_eager()?;
        let p = problem.normalized();
        p.validate()?;
        check_arch(dnn, &p)?;
        let want = plan_of(dnn, &p)?.info();
        let _current = dnn.ctx.enter()?;
        let handle = crate::ops::cudnn::may_allocate(|| Handle::new(dnn.api))?;
        let graph = Arc::new(p.graph(dnn.api, &handle)?);
        // The same engine on this handle: among the candidates autotune chooses from, else the first.
        let cands = crate::ops::cudnn::may_allocate(|| backend::build_plans(dnn.api, &handle, &graph, 32))?;
        let at = cands.iter().position(|c| c.engine == want.engine && c.workspace_bytes == want.workspace_bytes).unwrap_or(0);
        let plan = cands.into_iter().nth(at).ok_or_else(|| Error::invalid("plan", "an execution plan", "none"))?;
        let pack = backend::VariantPack::new(dnn.api, &plan, &ptrs, ws)?;
        OpTarget::eager(stream, None)?.commit()?.glue(|s| handle.set_stream(s))?;
        Ok(RawExecutor { objects: Some((pack, plan, handle)), dnn: dnn.clone(), stream, _one_thread: std::marker::PhantomData })
    }

    #[doc(hidden)]
    /// One bare `cudnnBackendExecute`; returns the raw status (0 on success), or `u32::MAX`
    /// without executing when a capture is open on the stream: a graphsafe one (leaked with
    /// `mem::forget`: the borrow rules out any other), or, on an adopted stream, one its owner
    /// began.
    pub fn call(&self) -> u32 {
        // The replay path's check: on a stream other code holds (adopted), a capture that code
        // began is refused too; its graph would keep neither the plan nor the handle.
        if self.stream.ensure_replayable().is_err() {
            return u32::MAX;
        }
        let Some((pack, plan, handle)) = &self.objects else { return u32::MAX };
        match handle.execute_pack(plan, pack) {
            Ok(()) => 0,
            Err(Error::Cudnn { status, .. }) => status as u32,
            Err(_) => u32::MAX,
        }
    }
}

//! Giving a block back (graphsafe's memory, a foreign owner, a loaded module) once no work can
//! still use it: after the work of graphsafe's streams of its context drained, deferred while that
//! cannot be waited for, never early, never lost.

use super::registry::Released;
use crate::driver::captures::RelaxedCaptureMode;
use crate::driver::{check, init, Context, DevicePtr, ForeignOwner};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::sync::{Arc, Mutex};

/// What giving an allocation back means: `cuMemFree` for graphsafe's own, dropping the owner for
/// another library's (cudarc frees the slice, on its stream, when its last `Arc` goes); and for a
/// loaded module, `cuModuleUnload` (a kernel or replay still queued may run its code, so it is
/// given back under the same rules as memory).
/// A block of memory carries its place in the released list, left once it is given back.
pub(super) enum Block {
    Ours(DevicePtr, Released),
    Foreign(ForeignOwner, Released),
    Module(ModuleHandle),
}

/// A module handle on its way to `cuModuleUnload` (a raw pointer: moved between threads only
/// through the deferred list, and unloaded once).
pub(super) struct ModuleHandle(c::CUmodule);
// SAFETY: a module handle may be unloaded from any thread; nothing else holds this one.
unsafe impl Send for ModuleHandle {}

/// Unloads `module` (loaded into `ctx`, with no graphsafe owner left) once no work can still run
/// its code: after the work of the context's streams drained (see `release`).
pub(crate) fn unload_module_when_idle(module: c::CUmodule, ctx: &Arc<Context>) {
    release(Block::Module(ModuleHandle(module)), ctx);
}

/// A block whose free must wait, with its context (held: the primary context is not released
/// under memory the driver still has allocated) and whether its failure was already reported.
struct Deferred {
    block: Block,
    ctx: Arc<Context>,
    reported: bool,
}

// Frees that could not happen yet (see `release`), retried at the next free or synchronize of the
// context: never freed before the work that used them finished, never lost. A leaf lock
// (`crate::locks`).
static DEFERRED: Mutex<Vec<Deferred>> = Mutex::new(Vec::new());

fn defer(block: Block, ctx: &Arc<Context>, reported: bool) {
    DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).push(Deferred { block, ctx: ctx.clone(), reported });
}

/// What a free under the gate leaves for after it: the owners of foreign memory, whose drop is
/// their library's code (and takes its own locks), are dropped once the gate is released. Declare
/// it before taking the gate, so that it drops after it.
#[derive(Default)]
pub(crate) struct AfterGate(Vec<(ForeignOwner, Released, Arc<Context>)>);

impl Drop for AfterGate {
    fn drop(&mut self) {
        for (owner, released, ctx) in self.0.drain(..) {
            // Dropped with the context current and the capture mode relaxed: whatever the owner
            // makes current is undone by the guard (invariant 12).
            let guards = ctx.enter().and_then(|c| RelaxedCaptureMode::enter().map(|r| (c, r)));
            drop(owner);
            drop(guards);
            // The owner's library may hand the address out again from now on.
            drop(released);
        }
    }
}

/// Returns a block to the driver once no work can still use it.
///
/// Work in flight may use the block (a kernel queued before a workspace grew, the last replay of a
/// graph just dropped), and `cuMemFree` is not documented to wait for it. So the free first waits,
/// under the context's free gate (`FreeGate`), with this thread's capture mode relaxed, for the
/// work of every graphsafe stream of the context — graphsafe enqueues work, and replays graphs,
/// only on those: a stream that is not capturing is synchronized; one in a graphsafe capture is
/// not (that would invalidate the capture), its work queued before the capture is waited for
/// through the event recorded then (nothing of it runs during the capture, and the capture keeps
/// what it bound); a dropped stream's work through the event it left. Then it frees. A capture open
/// elsewhere, leaked or not, does not hold the free up. It never synchronizes the whole context.
///
/// The block is deferred, and given back at the next free or synchronize of the context that can
/// wait, when a stream of the context is in a capture graphsafe did not begin (an engine's), when
/// a stream was dropped with no way to wait for it, or when the wait or the free itself fails (a
/// transient driver error: reported to the log once, never freed early, never dropped). Frees are
/// rare (growth, graph teardown); a decode loop does none.
pub(super) fn release(block: Block, ctx: &Arc<Context>) {
    let mut later = AfterGate::default();
    let mut gate = ctx.free_gate();
    let waited = ctx.enter().and_then(|_current| gate.wait_for_streams());
    match waited {
        Ok(true) if !gate.has_unwaited() => {
            // What was deferred first: a block this free fails to give back is retried at the
            // next free, not again at once.
            free_deferred_after_synchronize(ctx, &mut later);
            give_back(block, ctx, false, &mut later);
        }
        Ok(_) => defer(block, ctx, false),
        Err(e) => {
            // Work may still use the block: kept (for foreign memory: its owner is not dropped,
            // which would free it), and its address stays refused as an op's pointer.
            defer(block, ctx, true);
            crate::logging::error(format!(
                "graphsafe: waiting for the context's streams before a free failed: {e}; the memory is kept and given back at the next free or synchronize of the context"
            ));
        }
    }
}

/// Frees what was deferred in `ctx`, if its work can be waited for now (called when a capture of
/// the context ends; cheap when nothing is deferred).
pub(crate) fn retry_deferred_frees(ctx: &Context) {
    let any = DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|d| d.ctx.raw() == ctx.raw());
    if !any {
        return;
    }
    let mut later = AfterGate::default();
    let mut gate = ctx.free_gate();
    if let Ok(true) = ctx.enter().and_then(|_current| gate.wait_for_streams()) {
        if !gate.has_unwaited() {
            free_deferred_after_synchronize(ctx, &mut later);
        }
    }
}

/// Gives `block` back; `ctx`'s work was just waited for, under the gate the caller holds. A
/// failure defers it again, reported once (`reported`: already).
fn give_back(block: Block, ctx: &Arc<Context>, reported: bool, later: &mut AfterGate) {
    match block {
        // A cuMemFree that fails has not freed the block (a CUDA call that fails has no effect),
        // unless the failure is the context's sticky error, after which every retry fails too: so
        // a retry never frees memory handed out again meanwhile.
        Block::Ours(ptr, released) => match free_relaxed(ptr, ctx) {
            Ok(()) => drop(released),
            Err(e) => {
                if !reported && !refused_by_capture(&e) {
                    crate::logging::error(format!("graphsafe: {e}; the memory is kept and freed at the next free or synchronize of the context"));
                }
                defer(Block::Ours(ptr, released), ctx, reported || !refused_by_capture(&e));
            }
        },
        Block::Module(m) => {
            let r = (|| {
                let _current = ctx.enter()?;
                let _relaxed = RelaxedCaptureMode::enter()?;
                let f = init()?.cuModuleUnload()?;
                // SAFETY: a module graphsafe loaded, with no owner left and no work that can still
                // run its code (the streams were just waited for); unloaded once.
                check(unsafe { (f.f)(m.0) }, f.name)
            })();
            if let Err(e) = r {
                if !reported && !refused_by_capture(&e) {
                    crate::logging::error(format!("graphsafe: {e}; the module is kept and unloaded at the next free or synchronize of the context"));
                }
                defer(Block::Module(m), ctx, reported || !refused_by_capture(&e));
            }
        }
        Block::Foreign(owner, released) => {
            if owner.stream_is_capturing(ctx) {
                return defer(Block::Foreign(owner, released), ctx, reported);
            }
            later.0.push((owner, released, ctx.clone()));
        }
    }
}

/// Gives back every deferred block of `ctx`'s CUcontext (whichever `Context` value deferred it:
/// they share the gate). Call only under the gate, right after the context's work was waited for:
/// a deferred block has no owner left, so no work enqueued since can use it.
pub(crate) fn free_deferred_after_synchronize(ctx: &Context, later: &mut AfterGate) {
    let mine: Vec<Deferred> = {
        let mut d = DEFERRED.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_empty() {
            return;
        }
        let (mine, rest) = std::mem::take(&mut *d).into_iter().partition(|d| d.ctx.raw() == ctx.raw());
        *d = rest;
        mine
    };
    for d in mine {
        give_back(d.block, &d.ctx, d.reported, later);
    }
}

fn refused_by_capture(e: &Error) -> bool {
    // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) … CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908).
    matches!(e, Error::Driver { code, .. } if (900..=908).contains(code))
}

fn free_relaxed(ptr: DevicePtr, ctx: &Context) -> Result<()> {
    let _current = ctx.enter()?;
    let _relaxed = RelaxedCaptureMode::enter()?;
    let f = init()?.cuMemFree()?;
    // SAFETY: we allocated ptr, nothing else frees it, and no work can use it any more.
    check(unsafe { (f.f)(ptr) }, f.name)
}

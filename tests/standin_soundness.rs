//! The soundness scenarios of tests/soundness on the CPU, over the stand-in driver (tests/standin):
//! the same refusals as on a GPU, and the stand-in's own check that no memset, copy, kernel or
//! replay touched memory outside a live allocation.

mod common;
mod soundness;
mod standin;
#[path = "standin_soundness/streams.rs"]
mod streams;
#[path = "standin_soundness/captures.rs"]
mod captures;
#[path = "standin_soundness/use_orders.rs"]
mod use_orders;
#[path = "standin_soundness/refusals.rs"]
mod refusals;
#[path = "standin_soundness/memory.rs"]
mod memory;

use graphsafe::driver::{Context, Stream};
use standin::exclusive;
use std::sync::Arc;

#[track_caller]
fn no_violations(s: &standin::Standin) {
    assert_eq!(s.violations(), 0, "the stand-in saw a memory-safety violation: {}", s.last_violation());
}

/// Runs a scenario on a stream of the stand-in's device 0, holding the stand-in for the test, and
/// checks that the stand-in saw no memory-safety violation meanwhile.
fn on_standin(scenario: impl FnOnce(&Arc<Context>, &mut Stream)) {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    scenario(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn views_of_another_capture_are_refused_and_graph_b_touches_nothing_in_1000_replays() {
    on_standin(soundness::views_of_another_capture_are_refused);
}

#[test]
fn views_of_an_abandoned_capture_are_refused() {
    on_standin(soundness::views_of_an_abandoned_capture_are_refused);
}

#[test]
fn a_leaked_capture_makes_eager_apis_refuse_the_stream() {
    on_standin(soundness::a_leaked_capture_makes_eager_apis_refuse_the_stream);
}

#[test]
fn calls_restore_the_callers_current_context() {
    on_standin(|ctx, _stream| {
        soundness::calls_restore_the_callers_current_context(ctx, std::ptr::null_mut());
        let other = Context::new(1).unwrap();
        soundness::calls_restore_the_callers_current_context(ctx, other.raw());
    });
}

#[test]
fn a_failed_growth_leaves_the_workspace_and_its_graphs_intact() {
    // More than the stand-in's device memory.
    on_standin(|ctx, stream| soundness::a_failed_growth_leaves_the_workspace_and_its_graphs_intact(ctx, stream, 1 << 50));
}

#[test]
fn a_graph_holds_each_baked_in_allocation_once() {
    on_standin(soundness::a_graph_holds_each_baked_in_allocation_once);
}

#[test]
fn a_graph_keeps_its_kernels_module_loaded() {
    // The stand-in counts a replayed kernel of an unloaded module as a violation.
    on_standin(soundness::a_graph_keeps_its_kernels_module_loaded);
}

#[test]
fn memory_of_another_device_is_refused() {
    let (_g, s) = exclusive();
    let ctx0 = Context::new(0).unwrap();
    let ctx1 = Context::new(1).unwrap();
    soundness::memory_of_another_device_is_refused(&ctx0, &ctx1);
    no_violations(s);
}

#[test]
fn a_context_synchronize_never_disturbs_a_capture() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let before = s.calls("cuCtxSynchronize");
    soundness::a_context_synchronize_never_disturbs_a_capture(&ctx, &mut stream);
    assert_eq!(s.calls("cuCtxSynchronize"), before + 1, "only the synchronize after the capture reached the driver");
    no_violations(s);
}

/// On the stand-in's device 1: an engine's own stream (`raw`, made with cuStreamCreate) adopted
/// as `a`, a graphsafe stream `b`, the test kernels and a split-K problem. The test destroys `raw`
/// (standin::engine::destroy_stream) after `a` is gone.
struct EngineAndOurs {
    ctx: std::sync::Arc<Context>,
    raw: graphsafe::sys::cuda::CUstream,
    a: Stream,
    b: Stream,
    k: graphsafe::ops::testing::TestKernels,
    p: common::SplitKProblem,
}

fn engine_and_ours() -> EngineAndOurs {
    let ctx = Context::new(1).expect("the stand-in's device 1");
    let raw = standin::engine::create_stream(&ctx);
    // SAFETY: raw is a live stream of ctx; each test destroys it only after dropping `a`.
    let a = unsafe { Stream::adopt(&ctx, raw) }.unwrap();
    let b = Stream::new(&ctx).unwrap();
    let k = graphsafe::ops::testing::TestKernels::load(&ctx).unwrap();
    let p = soundness::problem(&b, 5);
    EngineAndOurs { ctx, raw, a, b, k, p }
}

//! The soundness scenarios of tests/soundness on the CPU, over the stand-in driver (tests/standin):
//! the same refusals as on a GPU, and the stand-in's own check that no memset, copy, kernel or
//! replay touched memory outside a live allocation.

mod soundness;
mod standin;

use graphsafe::driver::{Context, Stream};
use standin::exclusive;

fn setup() -> (std::sync::Arc<Context>, Stream) {
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let stream = Stream::new(&ctx).unwrap();
    (ctx, stream)
}

#[track_caller]
fn no_violations(s: &standin::Standin) {
    assert_eq!(s.violations(), 0, "the stand-in saw a memory-safety violation: {}", s.last_violation());
}

#[test]
fn views_of_another_capture_are_refused_and_graph_b_touches_nothing_in_1000_replays() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    soundness::views_of_another_capture_are_refused(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn views_of_an_abandoned_capture_are_refused() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    soundness::views_of_an_abandoned_capture_are_refused(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn a_leaked_capture_makes_eager_apis_refuse_the_stream() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    soundness::a_leaked_capture_makes_eager_apis_refuse_the_stream(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn calls_restore_the_callers_current_context() {
    let (_g, s) = exclusive();
    let (ctx, _stream) = setup();
    soundness::calls_restore_the_callers_current_context(&ctx, std::ptr::null_mut());
    let other = Context::new(1).unwrap();
    soundness::calls_restore_the_callers_current_context(&ctx, other.raw());
    no_violations(s);
}

#[test]
fn a_failed_growth_leaves_the_workspace_and_its_graphs_intact() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    // More than the stand-in's device memory.
    soundness::a_failed_growth_leaves_the_workspace_and_its_graphs_intact(&ctx, &mut stream, 1 << 50);
    no_violations(s);
}

#[test]
fn a_graph_holds_each_baked_in_allocation_once() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    soundness::a_graph_holds_each_baked_in_allocation_once(&ctx, &mut stream);
    no_violations(s);
}

#[test]
fn a_graph_keeps_its_kernels_module_loaded() {
    let (_g, s) = exclusive();
    let (ctx, mut stream) = setup();
    soundness::a_graph_keeps_its_kernels_module_loaded(&ctx, &mut stream);
    // The stand-in counts a replayed kernel of an unloaded module as a violation.
    no_violations(s);
}

#[test]
fn memory_of_another_device_is_refused() {
    let (_g, s) = exclusive();
    let ctx0 = Context::new(0).unwrap();
    let ctx1 = Context::new(1).unwrap();
    soundness::memory_of_another_device_is_refused(&ctx0, &ctx1);
    no_violations(s);
}

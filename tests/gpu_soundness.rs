//! The soundness scenarios of tests/soundness on a real GPU (skipped without one unless
//! GRAPHSAFE_REQUIRE_GPU=1).

mod common;
mod soundness;

use common::gpu;

#[test]
fn views_of_another_capture_are_refused_and_graph_b_touches_nothing_in_1000_replays() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::views_of_another_capture_are_refused(&ctx, &mut stream);
}

#[test]
fn views_of_an_abandoned_capture_are_refused() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::views_of_an_abandoned_capture_are_refused(&ctx, &mut stream);
}

#[test]
fn a_leaked_capture_makes_eager_apis_refuse_the_stream() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::a_leaked_capture_makes_eager_apis_refuse_the_stream(&ctx, &mut stream);
}

#[test]
fn calls_restore_the_callers_current_context_none_current() {
    let Some((ctx, _stream)) = gpu() else { return };
    soundness::calls_restore_the_callers_current_context(&ctx, std::ptr::null_mut());
}

#[test]
fn a_failed_growth_leaves_the_workspace_and_its_graphs_intact() {
    let Some((ctx, mut stream)) = gpu() else { return };
    // Far more than any GPU has: cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY.
    soundness::a_failed_growth_leaves_the_workspace_and_its_graphs_intact(&ctx, &mut stream, 1 << 50);
}

#[test]
fn a_graph_holds_each_baked_in_allocation_once() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::a_graph_holds_each_baked_in_allocation_once(&ctx, &mut stream);
}

#[test]
fn a_graph_keeps_its_kernels_module_loaded() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::a_graph_keeps_its_kernels_module_loaded(&ctx, &mut stream);
}

#[test]
fn a_context_synchronize_never_disturbs_a_capture() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::a_context_synchronize_never_disturbs_a_capture(&ctx, &mut stream);
}

/// Runs on the H200: frees (cuMemFree, relaxed capture mode) and a per-stream context synchronize
/// while a capture is open must not disturb it, and must not wait for it.
#[test]
fn a_forgotten_capture_leaves_frees_and_synchronizes_of_other_streams_alone() {
    let Some((ctx, mut stream)) = gpu() else { return };
    let in_use = || {
        let m = graphsafe::driver::MemInfo::query(&ctx).unwrap();
        m.total - m.free
    };
    soundness::a_forgotten_capture_leaves_frees_and_synchronizes_of_other_streams_alone(&ctx, &mut stream, &in_use);
    drop(stream);
    ctx.synchronize().expect("allowed on this thread once the forgotten capture's stream is gone");
}

#[test]
fn workspace_uses_on_two_streams_do_not_race() {
    let Some((ctx, mut stream)) = gpu() else { return };
    soundness::workspace_uses_on_two_streams_do_not_race(&ctx, &mut stream);
}

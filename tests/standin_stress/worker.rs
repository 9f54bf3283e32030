//! The worker threads of tests/standin_stress.rs: the ops they run on the shared handles, and the
//! captures (begin, a few calls, end) with their checks that no eager work leaked into a capture.

use super::*;

/// One thread's capture: begin on a shared stream, a few capture-safe calls (binds, captured
/// ops, queries), end; then the checks that catch eager work leaking into it.
fn capture_session(sh: &Shared, t: usize, rng: &mut Rng) {
    let stream = GraphsafeStream { id: sh.streams[rng.below(SLOTS as u64) as usize].load(SeqCst) };
    let mode = *rng.pick(&[
        GRAPHSAFE_CAPTURE_THREAD_LOCAL,
        GRAPHSAFE_CAPTURE_THREAD_LOCAL,
        GRAPHSAFE_CAPTURE_THREAD_LOCAL,
        GRAPHSAFE_CAPTURE_RELAXED,
        GRAPHSAFE_CAPTURE_RELAXED,
        GRAPHSAFE_CAPTURE_GLOBAL,
    ]);
    let mut cap = GraphsafeCapture::default();
    if sh.call(t, E::CaptureBegin, || unsafe { graphsafe_capture_begin(stream, mode, &mut cap) }) != OK {
        return;
    }
    let mut captured_ops = 0;
    let mut bound = GraphsafeWorkspace::default();
    let mut log: Vec<String> = Vec::new();
    for _ in 0..rng.below(4) {
        match rng.below(if sh.no_glue { 3 } else { 5 }) {
            0 | 1 => {
                let ws = GraphsafeWorkspace { id: sh.workspaces[rng.below(SLOTS as u64) as usize].load(SeqCst) };
                let (mut p, mut c) = (0u64, 0u64);
                let r = sh.call(t, E::CaptureBindWorkspace, || unsafe { graphsafe_capture_bind_workspace(cap, ws, &mut p, &mut c) });
                log.push(format!("bind_workspace -> {r}"));
                if r == OK {
                    bound = ws;
                }
            }
            2 => {
                let b = *rng.pick(&sh.t.handles);
                sh.call(t, E::CaptureBindBuffer, || unsafe { graphsafe_capture_bind_buffer(cap, b, std::ptr::null_mut()) });
                log.push("bind_buffer".into());
            }
            3 => {
                let mut plan = GraphsafeMlaPlan::default();
                let args = sh.t.mla;
                let r = sh.call(t, E::MlaDecodeCaptured, || unsafe { graphsafe_mla_decode_captured(&args, cap, bound, &mut plan) });
                log.push(format!("mla_decode_captured -> {r}"));
                if r == OK {
                    captured_ops += 1;
                }
            }
            _ => {
                let args = sh.t.w4a16;
                sh.call(t, E::CaptureBindBuffer, || unsafe { graphsafe_capture_bind_buffer(cap, args.weight, std::ptr::null_mut()) });
                let r = sh.call(t, E::W4a16Captured, || unsafe { graphsafe_nvfp4_w4a16_gemm_captured(&args, cap, bound) });
                log.push(format!("w4a16_captured -> {r}"));
                if r == OK {
                    captured_ops += 1;
                }
            }
        }
    }
    if rng.below(8) == 0 {
        sh.call(t, E::CaptureDestroy, || unsafe { graphsafe_capture_destroy(cap) });
        return;
    }
    let mut graph = GraphsafeGraph::default();
    let r = sh.call(t, E::CaptureEnd, || unsafe { graphsafe_capture_end(cap, &mut graph) });
    let strict = mode != GRAPHSAFE_CAPTURE_GLOBAL;
    if r == CI && strict {
        sh.fail(format!(
            "a {} capture this thread used only for captured calls was invalidated: eager work reached the capturing stream ({}; the stand-in: {}; this thread's calls in the capture: {log:?})",
            if mode == GRAPHSAFE_CAPTURE_RELAXED { "relaxed" } else { "thread-local" },
            last_error(),
            standin::standin().last_invalidation()
        ));
    }
    if r != OK {
        return;
    }
    let mut nodes = 0u64;
    sh.call(t, E::GraphNodeCount, || unsafe { graphsafe_graph_node_count(graph, &mut nodes) });
    if captured_ops == 0 && nodes != 0 {
        sh.fail(format!(
            "a capture in which no captured op succeeded has {nodes} node(s): eager work leaked into it (the stand-in's last recorded node: {})",
            standin::standin().last_recorded()
        ));
    }
    let old = swap(&sh.graphs[rng.below(SLOTS as u64) as usize], graph.id);
    sh.call(t, E::GraphDestroy, || unsafe { graphsafe_graph_destroy(GraphsafeGraph { id: old }) });
}

/// One worker thread: random ops of the mix on the shared handles until the call budget is spent
/// or a failure stops the run.
pub(super) fn worker(sh: Arc<Shared>, t: usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) << 32));
    let slot = |rng: &mut Rng, v: &[AtomicU64]| rng.below(v.len() as u64) as usize;
    while !sh.stop.load(Relaxed) && sh.calls.load(Relaxed) < sh.total {
        let stream = GraphsafeStream { id: sh.streams[slot(&mut rng, &sh.streams)].load(SeqCst) };
        let ws = GraphsafeWorkspace { id: sh.workspaces[slot(&mut rng, &sh.workspaces)].load(SeqCst) };
        match sh.pick_op(&mut rng) {
            Op::ContextChurn => {
                let mut c = GraphsafeContext::default();
                if sh.call(t, E::ContextCreate, || unsafe { graphsafe_context_create(0, &mut c) }) == OK {
                    let old = swap(&sh.ctxs[slot(&mut rng, &sh.ctxs)], c.id);
                    sh.call(t, E::ContextDestroy, || unsafe { graphsafe_context_destroy(GraphsafeContext { id: old }) });
                }
            }
            Op::StreamCreate => {
                let ctx = if rng.below(2) == 0 { sh.ctx } else { GraphsafeContext { id: sh.ctxs[slot(&mut rng, &sh.ctxs)].load(SeqCst) } };
                let mut s = GraphsafeStream::default();
                let st = sh.call(t, E::StreamCreate, || unsafe { graphsafe_stream_create(ctx, &mut s) });
                if st == OK {
                    let old = swap(&sh.streams[slot(&mut rng, &sh.streams)], s.id);
                    if sh.call(t, E::StreamDestroy, || unsafe { graphsafe_stream_destroy(GraphsafeStream { id: old }) }) == BUSY {
                        sh.busy.lock().unwrap().push((E::StreamDestroy, old));
                    }
                }
            }
            Op::StreamDestroy => {
                sh.call(t, E::StreamDestroy, || unsafe { graphsafe_stream_destroy(stream) });
            }
            Op::StreamSync => {
                sh.call(t, E::StreamSynchronize, || unsafe { graphsafe_stream_synchronize(stream) });
            }
            Op::BufferCreate => {
                let mut b = GraphsafeBuffer::default();
                let bytes = 256 + rng.below(16 << 10);
                if sh.call(t, E::BufferCreate, || unsafe { graphsafe_buffer_create(stream, bytes, (rng.next() & 1) as i32, &mut b) }) == OK {
                    let old = swap(&sh.buffers[slot(&mut rng, &sh.buffers)], b.id);
                    sh.call(t, E::BufferDestroy, || unsafe { graphsafe_buffer_destroy(GraphsafeBuffer { id: old }) });
                }
            }
            Op::BufferDestroy => {
                let b = GraphsafeBuffer { id: sh.buffers[slot(&mut rng, &sh.buffers)].swap(0, SeqCst) };
                sh.call(t, E::BufferDestroy, || unsafe { graphsafe_buffer_destroy(b) });
            }
            Op::BufferUse => {
                let b = GraphsafeBuffer { id: sh.buffers[slot(&mut rng, &sh.buffers)].load(SeqCst) };
                let mut bytes = [0u8; 64];
                if rng.below(2) == 0 {
                    sh.call(t, E::BufferWrite, || unsafe { graphsafe_buffer_write(b, 0, bytes.as_ptr().cast(), 64, stream) });
                } else {
                    sh.call(t, E::BufferRead, || unsafe { graphsafe_buffer_read(b, 0, bytes.as_mut_ptr().cast(), 64, stream) });
                }
                let mut n = 0u64;
                sh.call(t, E::BufferInfo, || unsafe { graphsafe_buffer_info(b, std::ptr::null_mut(), &mut n) });
            }
            Op::Canary => {
                // This thread's canary: what is written on a stream is what reads back on it.
                let b = sh.t.canaries[t];
                let data: Vec<u8> = (0..256).map(|_| rng.next() as u8).collect();
                let mut back = vec![0u8; 256];
                if sh.call(t, E::BufferWrite, || unsafe { graphsafe_buffer_write(b, 0, data.as_ptr().cast(), 256, stream) }) == OK
                    && sh.call(t, E::BufferRead, || unsafe { graphsafe_buffer_read(b, 0, back.as_mut_ptr().cast(), 256, stream) }) == OK
                    && back != data
                {
                    sh.fail("a buffer read back other bytes than were just written on the same stream (a copy was captured instead of run)".into());
                }
            }
            Op::WorkspaceCreate => {
                let mut w = GraphsafeWorkspace::default();
                let bytes = rng.below(64 << 10);
                if sh.call(t, E::WorkspaceCreate, || unsafe { graphsafe_workspace_create(stream, bytes, &mut w) }) == OK {
                    let old = swap(&sh.workspaces[slot(&mut rng, &sh.workspaces)], w.id);
                    if sh.call(t, E::WorkspaceDestroy, || unsafe { graphsafe_workspace_destroy(GraphsafeWorkspace { id: old }) }) == BUSY {
                        sh.busy.lock().unwrap().push((E::WorkspaceDestroy, old));
                    }
                }
            }
            Op::WorkspaceGrow => {
                let bytes = rng.below(64 << 10);
                let mut grew = 0;
                sh.call(t, E::WorkspaceEnsureSize, || unsafe { graphsafe_workspace_ensure_size(ws, bytes, stream, &mut grew) });
            }
            Op::WorkspaceInfo => {
                let (mut c, mut p) = (0u64, 0u64);
                sh.call(t, E::WorkspaceInfo, || unsafe { graphsafe_workspace_info(ws, &mut c, &mut p) });
            }
            Op::WorkspaceDestroy => {
                sh.call(t, E::WorkspaceDestroy, || unsafe { graphsafe_workspace_destroy(ws) });
            }
            Op::Mla => {
                let args = sh.t.mla;
                let mut plan = GraphsafeMlaPlan::default();
                sh.call(t, E::MlaDecode, || unsafe { graphsafe_mla_decode(&args, ws, stream, &mut plan) });
            }
            Op::W4a16 => {
                let args = sh.t.w4a16;
                sh.call(t, E::W4a16, || unsafe { graphsafe_nvfp4_w4a16_gemm(&args, ws, stream) });
            }
            Op::Instantiate => {
                let g = GraphsafeGraph { id: sh.graphs[slot(&mut rng, &sh.graphs)].load(SeqCst) };
                let mut e = GraphsafeGraphExec::default();
                if sh.call(t, E::GraphInstantiate, || unsafe { graphsafe_graph_instantiate(g, &mut e) }) == OK {
                    let old = swap(&sh.execs[slot(&mut rng, &sh.execs)], e.id);
                    sh.call(t, E::ExecDestroy, || unsafe { graphsafe_graph_exec_destroy(GraphsafeGraphExec { id: old }) });
                }
                let mut n = 0u64;
                sh.call(t, E::GraphNodeCount, || unsafe { graphsafe_graph_node_count(g, &mut n) });
            }
            Op::GraphDestroy => {
                let g = GraphsafeGraph { id: sh.graphs[slot(&mut rng, &sh.graphs)].swap(0, SeqCst) };
                sh.call(t, E::GraphDestroy, || unsafe { graphsafe_graph_destroy(g) });
            }
            Op::ExecLaunch => {
                let e = GraphsafeGraphExec { id: sh.execs[slot(&mut rng, &sh.execs)].load(SeqCst) };
                if rng.below(4) == 0 {
                    sh.call(t, E::ExecUpload, || unsafe { graphsafe_graph_exec_upload(e, stream) });
                } else {
                    sh.call(t, E::ExecLaunch, || unsafe { graphsafe_graph_exec_launch(e, stream) });
                }
            }
            Op::ExecDestroy => {
                let e = GraphsafeGraphExec { id: sh.execs[slot(&mut rng, &sh.execs)].swap(0, SeqCst) };
                sh.call(t, E::ExecDestroy, || unsafe { graphsafe_graph_exec_destroy(e) });
            }
            Op::Capture => capture_session(&sh, t, &mut rng),
        }
    }
}

//! The C ABI under 8 threads on the stand-in driver (tests/standin), on the CPU: at least
//! 1,000,000 calls that create, use and destroy every handle kind on SHARED handles — contexts,
//! streams, buffers, workspaces, captures, graphs, executables — with eager and captured MLA decodes
//! and W4A16 GEMMs (on the CPU they end in the kernel glue's documented CUDA-runtime error, after
//! graphsafe has validated, sized and grown the workspace through the driver), racing
//! capture_begin/capture_end against eager work and growth on the same streams and workspaces.
//!
//! It fails on:
//! * a deadlock: a watchdog thread exits the process (status 3) when no call has completed for
//!   10 s, printing the call each thread is in;
//! * a status an entry point does not document for what the test passed it (never PANIC, never
//!   NULL_POINTER: every argument is well-formed);
//! * eager work reaching a capturing stream: a thread-local or relaxed capture in which this test
//!   issued no captured op must end with a graph of 0 nodes (and must not be invalidated by a
//!   stream synchronize it never asked for); a buffer written then read on one stream must read
//!   back what was written;
//! * any memory-safety violation the stand-in detects, and leaks: after the teardown every
//!   allocation, stream, graph, executable and context reference is gone;
//! * a core entry point the mix exercises that never returned OK (MUST_SUCCEED): a run in which
//!   every call failed with a documented status would pass every check above.
//!
//! A controller cycles the stand-in's delays (around cuStreamBeginCapture, the memsets, copies and
//! graph launches, cuMemAlloc, the graph calls) so the race windows of capture_begin vs destroy,
//! lookups under an object lock, check-then-act on the capture state, and two threads in one
//! (not thread-safe) CUDA graph are wide enough to hit in a few seconds.
//!
//! The C ABI functions are called inside `unsafe {}`: they become `unsafe extern "C"`.
#![allow(unused_unsafe)]

mod standin;
#[path = "standin_stress/worker.rs"]
mod worker;

use graphsafe::capi::*;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker::worker;

const THREADS: usize = 8;
const NO_PROGRESS: Duration = Duration::from_secs(10);
/// How long each delay setting lasts before the controller moves to the next.
const PHASE: Duration = Duration::from_millis(100);

const OK: i32 = GRAPHSAFE_OK;
const IH: i32 = GRAPHSAFE_ERROR_INVALID_HANDLE;
const IA: i32 = GRAPHSAFE_ERROR_INVALID_ARGUMENT;
const BUSY: i32 = GRAPHSAFE_ERROR_BUSY;
const DRV: i32 = GRAPHSAFE_ERROR_DRIVER;
const CI: i32 = GRAPHSAFE_ERROR_CAPTURE_INVALIDATED;
const WTS: i32 = GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL;
const RT: i32 = GRAPHSAFE_ERROR_CUDA_RUNTIME;
const ARCH: i32 = GRAPHSAFE_ERROR_ARCH_UNSUPPORTED;
const CUT: i32 = GRAPHSAFE_ERROR_CUTLASS;

/// An entry point and the statuses it documents for the (well-formed) arguments this test passes.
struct Entry {
    name: &'static str,
    allowed: &'static [i32],
}

macro_rules! entries {
    ($($id:ident = $name:literal [$($s:ident),*];)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        enum E { $($id),* }
        const ENTRIES: &[Entry] = &[$(Entry { name: $name, allowed: &[$($s),*] }),*];
    };
}

entries! {
    ContextCreate = "graphsafe_context_create" [OK, DRV];
    ContextDestroy = "graphsafe_context_destroy" [OK, IH];
    StreamCreate = "graphsafe_stream_create" [OK, IH, DRV];
    StreamDestroy = "graphsafe_stream_destroy" [OK, IH, BUSY];
    StreamSynchronize = "graphsafe_stream_synchronize" [OK, IH, BUSY, DRV];
    BufferCreate = "graphsafe_buffer_create" [OK, IH, BUSY, DRV];
    BufferWrite = "graphsafe_buffer_write" [OK, IH, BUSY, DRV];
    BufferRead = "graphsafe_buffer_read" [OK, IH, BUSY, DRV];
    BufferInfo = "graphsafe_buffer_info" [OK, IH];
    BufferDestroy = "graphsafe_buffer_destroy" [OK, IH];
    WorkspaceCreate = "graphsafe_workspace_create" [OK, IH, BUSY, DRV];
    WorkspaceEnsureSize = "graphsafe_workspace_ensure_size" [OK, IH, BUSY, DRV];
    WorkspaceInfo = "graphsafe_workspace_info" [OK, IH];
    WorkspaceDestroy = "graphsafe_workspace_destroy" [OK, IH, BUSY];
    CaptureBegin = "graphsafe_capture_begin" [OK, IH, BUSY, DRV];
    CaptureBindWorkspace = "graphsafe_capture_bind_workspace" [OK, IH, BUSY];
    CaptureBindBuffer = "graphsafe_capture_bind_buffer" [OK];
    CaptureEnd = "graphsafe_capture_end" [OK, CI];
    CaptureDestroy = "graphsafe_capture_destroy" [OK];
    GraphNodeCount = "graphsafe_graph_node_count" [OK, IH];
    GraphInstantiate = "graphsafe_graph_instantiate" [OK, IH, DRV];
    GraphDestroy = "graphsafe_graph_destroy" [OK, IH];
    ExecLaunch = "graphsafe_graph_exec_launch" [OK, IH, BUSY, DRV];
    ExecUpload = "graphsafe_graph_exec_upload" [OK, IH, BUSY, DRV];
    ExecDestroy = "graphsafe_graph_exec_destroy" [OK, IH];
    MlaDecode = "graphsafe_mla_decode" [OK, IH, BUSY, DRV, RT, ARCH, CUT];
    MlaDecodeCaptured = "graphsafe_mla_decode_captured" [OK, IA, WTS, DRV, RT, ARCH, CUT];
    W4a16 = "graphsafe_nvfp4_w4a16_gemm" [OK, IH, BUSY, DRV, RT, ARCH, CUT];
    W4a16Captured = "graphsafe_nvfp4_w4a16_gemm_captured" [OK, IA, WTS, DRV, RT, ARCH, CUT];
}

fn last_error() -> String {
    // SAFETY: never null; valid until this thread's next failing call.
    unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned()
}

/// Long-lived device memory for the ops' tensors: never destroyed during the run, so every raw
/// pointer an op (or a graph that captured it) holds stays valid, as the C ABI asks of callers.
struct Tensors {
    handles: Vec<GraphsafeBuffer>,
    mla: GraphsafeMlaDecodeArgs,
    w4a16: GraphsafeW4a16Args,
    /// One per thread (also in `handles`): written and read back on a shared stream.
    canaries: Vec<GraphsafeBuffer>,
}

const SLOTS: usize = 4;

/// What a worker does in one step (one or a few C ABI calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    ContextChurn,
    StreamCreate,
    StreamDestroy,
    StreamSync,
    BufferCreate,
    BufferDestroy,
    BufferUse,
    Canary,
    WorkspaceCreate,
    WorkspaceGrow,
    WorkspaceInfo,
    WorkspaceDestroy,
    Mla,
    W4a16,
    Instantiate,
    GraphDestroy,
    ExecLaunch,
    ExecDestroy,
    Capture,
}

/// Every op, weighted (per cent): the full stress.
const ALL_OPS: &[(Op, u32)] = &[
    (Op::ContextChurn, 1),
    (Op::StreamCreate, 3),
    (Op::StreamDestroy, 2),
    (Op::StreamSync, 3),
    (Op::BufferCreate, 5),
    (Op::BufferDestroy, 2),
    (Op::BufferUse, 4),
    (Op::Canary, 5),
    (Op::WorkspaceCreate, 4),
    (Op::WorkspaceGrow, 6),
    (Op::WorkspaceInfo, 2),
    (Op::WorkspaceDestroy, 4),
    (Op::Mla, 10),
    (Op::W4a16, 10),
    (Op::Instantiate, 4),
    (Op::GraphDestroy, 2),
    (Op::ExecLaunch, 8),
    (Op::ExecDestroy, 2),
    (Op::Capture, 23),
];

/// Entry points a run must see return OK at least once (a stress in which every call fails would
/// pass every other check), each with the ops of the mix that OK needs: the op that calls it and
/// the ops that make the handles it is given (graphs come only from captures, executables only
/// from instantiating them, workspaces only from WorkspaceCreate; the buffer and stream slots hold
/// the canaries and setup's stream from the start).
const MUST_SUCCEED: &[(E, &[Op])] = &[
    (E::StreamCreate, &[Op::StreamCreate]),
    (E::StreamSynchronize, &[Op::StreamSync]),
    (E::BufferCreate, &[Op::BufferCreate]),
    (E::BufferWrite, &[Op::Canary]),
    (E::BufferRead, &[Op::Canary]),
    (E::WorkspaceCreate, &[Op::WorkspaceCreate]),
    (E::WorkspaceEnsureSize, &[Op::WorkspaceCreate, Op::WorkspaceGrow]),
    (E::CaptureBegin, &[Op::Capture]),
    (E::CaptureEnd, &[Op::Capture]),
    (E::GraphNodeCount, &[Op::Capture]),
    (E::GraphInstantiate, &[Op::Capture, Op::Instantiate]),
    (E::ExecLaunch, &[Op::Capture, Op::Instantiate, Op::ExecLaunch]),
];

struct Shared {
    ctx: GraphsafeContext,
    ctxs: [AtomicU64; 2],
    streams: [AtomicU64; SLOTS],
    buffers: [AtomicU64; 2 * SLOTS],
    workspaces: [AtomicU64; SLOTS],
    graphs: [AtomicU64; SLOTS],
    execs: [AtomicU64; SLOTS],
    t: Tensors,
    calls: AtomicU64,
    /// Per entry point: calls that returned OK, and all calls.
    ok: Vec<(AtomicU64, AtomicU64)>,
    inflight: [AtomicUsize; THREADS],
    failures: Mutex<Vec<String>>,
    stop: AtomicBool,
    /// Streams and workspaces swapped out of their slot whose destroy was refused (BUSY: capturing
    /// or bound): destroyed again at the teardown, so that leak checks see every handle.
    busy: Mutex<Vec<(E, u64)>>,
    total: u64,
    mix: Vec<(Op, u32)>,
    /// No kernel-glue ops (a real driver is present: see standin::real_driver_present).
    no_glue: bool,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

impl Shared {
    fn pick_op(&self, rng: &mut Rng) -> Op {
        let sum: u32 = self.mix.iter().map(|m| m.1).sum();
        let mut r = rng.below(sum as u64) as u32;
        for &(op, w) in &self.mix {
            if r < w {
                return op;
            }
            r -= w;
        }
        unreachable!("weights sum to {sum}")
    }

    /// The entries of MUST_SUCCEED this run's mix can make return OK.
    fn must_succeed(&self) -> Vec<E> {
        let has = |op: Op| self.mix.iter().any(|m| m.0 == op);
        // Every step takes a stream from the slots: a mix that destroys streams and makes none
        // can run out of them, and then nothing needs to succeed.
        if has(Op::StreamDestroy) && !has(Op::StreamCreate) {
            return Vec::new();
        }
        MUST_SUCCEED.iter().filter(|(_, needs)| needs.iter().all(|&op| has(op))).map(|&(e, _)| e).collect()
    }

    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < 20 {
            eprintln!("standin_stress: FAILED: {what}");
            f.push(what);
        }
        self.stop.store(true, SeqCst);
    }

    /// One C ABI call: marks it in flight for the watchdog, counts it, checks its status.
    fn call(&self, thread: usize, e: E, f: impl FnOnce() -> i32) -> i32 {
        self.inflight[thread].store(e as usize + 1, SeqCst);
        let s = f();
        self.inflight[thread].store(0, SeqCst);
        self.calls.fetch_add(1, Relaxed);
        let (ok, all) = &self.ok[e as usize];
        all.fetch_add(1, Relaxed);
        if s == OK {
            ok.fetch_add(1, Relaxed);
        }
        let entry = &ENTRIES[e as usize];
        if !entry.allowed.contains(&s) {
            self.fail(format!("{} returned {s}, which it does not document here: {}", entry.name, last_error()));
        }
        s
    }
}

/// Puts `id` in `slot` and returns what was there (to be destroyed by the caller).
fn swap(slot: &AtomicU64, id: u64) -> u64 {
    slot.swap(id, SeqCst)
}

fn setup(total: u64, mix: &'static [(Op, u32)]) -> Arc<Shared> {
    let s = standin::standin();
    s.reset();
    let mut ctx = GraphsafeContext::default();
    assert_eq!(unsafe { graphsafe_context_create(0, &mut ctx) }, OK, "{}", last_error());
    let mut stream = GraphsafeStream::default();
    assert_eq!(unsafe { graphsafe_stream_create(ctx, &mut stream) }, OK, "{}", last_error());
    let mut handles = Vec::new();
    let mut buffer = |bytes: u64| -> (GraphsafeBuffer, u64) {
        let mut b = GraphsafeBuffer::default();
        assert_eq!(unsafe { graphsafe_buffer_create(stream, bytes, 1, &mut b) }, OK, "{}", last_error());
        let mut ptr = 0u64;
        assert_eq!(unsafe { graphsafe_buffer_info(b, &mut ptr, std::ptr::null_mut()) }, OK);
        handles.push(b);
        (b, ptr)
    };
    // MLA on the stand-in's sm_90: bf16, 16 heads, one request of 64 tokens in one page of 64.
    let (heads, page) = (16i64, 64i64);
    let (_, q_nope) = buffer((heads * 512 * 2) as u64);
    let (_, q_pe) = buffer((heads * 64 * 2) as u64);
    let (_, kv) = buffer((page * 576 * 2) as u64);
    let (seq_b, seq_lens) = buffer(4);
    let (_, page_table) = buffer(4);
    let (_, out) = buffer((heads * 512 * 2) as u64);
    let (_, lse) = buffer((heads * 4) as u64);
    let v = 64i32.to_ne_bytes();
    assert_eq!(unsafe { graphsafe_buffer_write(seq_b, 0, v.as_ptr().cast(), 4, stream) }, OK);
    let mla = GraphsafeMlaDecodeArgs {
        dtype: GRAPHSAFE_DTYPE_BF16,
        batch: 1,
        num_heads: heads as i32,
        s_q: 1,
        causal: 0,
        num_kv_heads: 0,
        q_nope,
        q_nope_stride_batch: heads * 512,
        q_nope_stride_token: heads * 512,
        q_nope_stride_head: 512,
        q_pe,
        q_pe_stride_batch: heads * 64,
        q_pe_stride_token: heads * 64,
        q_pe_stride_head: 64,
        kv_cache: kv,
        num_pages: 1,
        page_size: page as i32,
        seq_lens,
        page_table,
        max_pages: 1,
        out,
        out_stride_batch: heads * 512,
        out_stride_token: heads * 512,
        out_stride_head: 512,
        lse,
        sm_scale: 0.0721,
        max_seq_len: 64,
        num_splits: 0,
    };
    // W4A16 on a weight buffer of the size its plan asks for.
    let (m, n, k) = (4, 256, 256);
    let mut plan = GraphsafeNvfp4Plan::default();
    assert_eq!(unsafe { graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, m, n, k, GRAPHSAFE_DTYPE_BF16, 132, &mut plan) }, OK, "{}", last_error());
    let (weight, _) = buffer(plan.prepared_weight_bytes.max(256));
    let (_, a) = buffer((m * k * 2) as u64);
    let (alpha_b, alpha) = buffer(4);
    let one = 1.0f32.to_ne_bytes();
    assert_eq!(unsafe { graphsafe_buffer_write(alpha_b, 0, one.as_ptr().cast(), 4, stream) }, OK);
    let (_, d) = buffer((m * n * 2) as u64);
    let w4a16 = GraphsafeW4a16Args { a, lda: k as i64, weight, n, k, alpha, d, ldd: n as i64, m };
    let canaries = (0..THREADS).map(|_| buffer(256).0).collect();
    assert_eq!(unsafe { graphsafe_stream_synchronize(stream) }, OK);
    // On a machine with a real driver the glue-backed ops are left out of the mix (and of the
    // captures), and the run says so: it no longer covers what those ops race against.
    let no_glue = standin::real_driver_present();
    let glue_op = |op: &Op| matches!(op, Op::Mla | Op::W4a16);
    if no_glue {
        let mut dropped: Vec<String> = mix.iter().filter(|(op, _)| glue_op(op)).map(|(op, w)| format!("the {op:?} steps ({w}% of the mix)")).collect();
        if mix.iter().any(|(op, _)| *op == Op::Capture) {
            dropped.push("mla_decode_captured and nvfp4_w4a16_gemm_captured inside the captures".into());
        }
        if !dropped.is_empty() {
            eprintln!(
                "standin_stress: SKIP: left out of this run: {}. A real libcuda.so.1 is present: the kernel glue's CUDA runtime opens it by itself and would be handed the stand-in's handles",
                dropped.join(", ")
            );
        }
    }
    let shared = Shared {
        ctx,
        ctxs: Default::default(),
        streams: Default::default(),
        buffers: Default::default(),
        workspaces: Default::default(),
        graphs: Default::default(),
        execs: Default::default(),
        t: Tensors { handles, mla, w4a16, canaries },
        calls: AtomicU64::new(0),
        ok: ENTRIES.iter().map(|_| Default::default()).collect(),
        inflight: Default::default(),
        failures: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        busy: Mutex::new(Vec::new()),
        total,
        no_glue,
        mix: mix.iter().copied().filter(|m| !(no_glue && glue_op(&m.0))).collect(),
    };
    shared.streams[0].store(stream.id, SeqCst);
    Arc::new(shared)
}

/// Delay settings cycled by the controller: each widens one race window.
const PHASES: &[&[(&str, i32)]] = &[
    &[],
    // capture_begin holds its locks across cuStreamBeginCapture: destroys and ops queue behind it.
    &[("cuStreamBeginCapture", 150)],
    // Eager work that has checked "not capturing" sleeps before its memset/copy/launch lands.
    &[("cuMemsetD8Async", 100), ("cuMemcpyHtoDAsync", 100), ("cuMemcpyDtoHAsync", 100), ("cuGraphLaunch", 100), ("cuStreamSynchronize", 100)],
    // Growth holds the workspace lock across cuMemAlloc: lookups and destroys queue behind it.
    &[("cuMemAlloc", 150)],
    // Calls on one graph or executable last long enough for a second thread to arrive.
    &[("cuGraphInstantiateWithFlags", 100), ("cuGraphGetNodes", 100), ("cuGraphLaunch", 100), ("cuGraphUpload", 100)],
];

fn set_phase(s: &standin::Standin, phases: &[&[(&str, i32)]], phase: usize) {
    for p in phases {
        for (entry, _) in *p {
            s.delay(entry, 0);
        }
    }
    for (entry, us) in phases[phase] {
        s.delay(entry, *us);
    }
}

/// Runs `total` calls of `mix` on 8 threads with the delay `phases` cycling, then tears down and
/// checks that nothing failed, deadlocked, violated memory or leaked.
fn run(total: u64, mix: &'static [(Op, u32)], phases: &'static [&'static [(&'static str, i32)]]) {
    let (_g, s) = standin::exclusive();
    let sh = setup(total, mix);
    let start = Instant::now();
    let workers: Vec<_> = (0..THREADS).map(|t| {
        let sh = sh.clone();
        std::thread::Builder::new().name(format!("stress-{t}")).spawn(move || worker(sh, t)).unwrap()
    }).collect();

    // Controller and watchdog.
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (sh, done) = (sh.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut last, mut since, mut phase_at, mut phase) = (0u64, Instant::now(), Instant::now(), 0usize);
            set_phase(s, phases, 0);
            while !done.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
                if phase_at.elapsed() > PHASE {
                    phase = (phase + 1) % phases.len();
                    set_phase(s, phases, phase);
                    phase_at = Instant::now();
                }
                let n = sh.calls.load(SeqCst);
                if n != last {
                    (last, since) = (n, Instant::now());
                } else if since.elapsed() > NO_PROGRESS {
                    eprintln!("standin_stress: DEADLOCK: no call completed for {NO_PROGRESS:?} after {n} calls; in flight:");
                    for (t, e) in sh.inflight.iter().enumerate() {
                        let e = e.load(SeqCst);
                        eprintln!("  thread {t}: {}", if e == 0 { "(between calls)" } else { ENTRIES[e - 1].name });
                    }
                    eprintln!("  delays (phase {phase}): {:?}", phases[phase]);
                    std::process::exit(3);
                }
            }
            set_phase(s, phases, 0);
        })
    };
    for w in workers {
        if w.join().is_err() {
            sh.fail("a worker thread panicked".into());
        }
    }
    done.store(true, SeqCst);
    watchdog.join().unwrap();
    let calls = sh.calls.load(SeqCst);
    eprintln!(
        "standin_stress: {calls} calls in {:.1} s; stand-in: {} nodes recorded, {} captures invalidated, {} unsafe calls refused",
        start.elapsed().as_secs_f64(),
        s.stat("nodes_recorded"),
        s.stat("invalidated_captures"),
        s.stat("refused_unsafe_calls"),
    );

    let summary: Vec<String> = ENTRIES
        .iter()
        .zip(&sh.ok)
        .filter(|(_, (_, all))| all.load(SeqCst) > 0)
        .map(|(e, (ok, all))| format!("{} {}/{}", e.name.trim_start_matches("graphsafe_"), ok.load(SeqCst), all.load(SeqCst)))
        .collect();
    eprintln!("standin_stress: OK/calls per entry point: {}", summary.join(", "));
    let required = sh.must_succeed();
    let never_ok: Vec<&str> = required.iter().filter(|&&e| sh.ok[e as usize].0.load(SeqCst) == 0).map(|&e| ENTRIES[e as usize].name).collect();
    eprintln!(
        "standin_stress: required to return OK at least once in this mix: {}",
        required.iter().map(|&e| ENTRIES[e as usize].name.trim_start_matches("graphsafe_")).collect::<Vec<_>>().join(", ")
    );

    // Teardown: every handle, shared and persistent; then nothing may be left in the driver.
    let destroy_all = |v: &[AtomicU64], f: &dyn Fn(u64) -> i32| {
        for a in v {
            let id = a.swap(0, SeqCst);
            let r = f(id);
            assert!(r == OK || r == IH, "teardown: {r} {}", last_error());
        }
    };
    destroy_all(&sh.execs, &|id| unsafe { graphsafe_graph_exec_destroy(GraphsafeGraphExec { id }) });
    destroy_all(&sh.graphs, &|id| unsafe { graphsafe_graph_destroy(GraphsafeGraph { id }) });
    destroy_all(&sh.workspaces, &|id| unsafe { graphsafe_workspace_destroy(GraphsafeWorkspace { id }) });
    destroy_all(&sh.buffers, &|id| unsafe { graphsafe_buffer_destroy(GraphsafeBuffer { id }) });
    destroy_all(&sh.streams, &|id| unsafe { graphsafe_stream_destroy(GraphsafeStream { id }) });
    destroy_all(&sh.ctxs, &|id| unsafe { graphsafe_context_destroy(GraphsafeContext { id }) });
    for (e, id) in sh.busy.lock().unwrap().drain(..) {
        let r = match e {
            E::StreamDestroy => unsafe { graphsafe_stream_destroy(GraphsafeStream { id }) },
            _ => unsafe { graphsafe_workspace_destroy(GraphsafeWorkspace { id }) },
        };
        assert!(r == OK || r == IH, "teardown of a handle once BUSY: {r} {}", last_error());
    }
    for b in &sh.t.handles {
        assert_eq!(unsafe { graphsafe_buffer_destroy(*b) }, OK);
    }
    assert_eq!(unsafe { graphsafe_context_destroy(sh.ctx) }, OK);

    let failures = sh.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{} failure(s), the first: {}", failures.len(), failures[0]);
    assert!(calls >= total, "only {calls} calls");
    assert!(never_ok.is_empty(), "never returned OK in {calls} calls (every call of them failed): {}", never_ok.join(", "));
    assert_eq!(s.violations(), 0, "the stand-in saw a memory-safety violation: {}", s.last_violation());
    assert_eq!(s.stat("open_captures"), 0, "a capture was left open in the driver");
    // Frees the driver refused during a global capture leak by design (the memory may be in use).
    assert_eq!(s.live_allocations(), s.stat("orphaned_allocations"), "allocations leaked");
    for gauge in ["live_streams", "live_graphs", "live_execs", "primary_ctx_refs"] {
        assert_eq!(s.stat(gauge), 0, "{gauge} after teardown");
    }
}

#[test]
fn eight_threads_one_million_calls_on_shared_handles() {
    run(1_000_000, ALL_OPS, PHASES);
}

/// Bug class 1 alone: capture_begin (holding the stream's lock across cuStreamBeginCapture and the
/// registry insert) against stream_destroy (holding the registry while it locks the stream).
#[test]
fn capture_begin_against_stream_destroy() {
    const MIX: &[(Op, u32)] = &[(Op::Capture, 50), (Op::StreamCreate, 30), (Op::StreamDestroy, 20)];
    run(100_000, MIX, &[&[("cuStreamBeginCapture", 150)], &[]]);
}

/// Bug class 2 alone: W4A16 (looking its weight up in the registry while it holds the workspace
/// lock) against workspace_destroy (holding the registry while it locks the workspace), with the
/// workspace lock held long by growth.
#[test]
fn w4a16_against_workspace_destroy_and_growth() {
    const MIX: &[(Op, u32)] = &[(Op::W4a16, 40), (Op::WorkspaceGrow, 20), (Op::WorkspaceCreate, 20), (Op::WorkspaceDestroy, 20)];
    run(100_000, MIX, &[&[("cuMemAlloc", 150)], &[]]);
}

/// Bug class 4 alone: eager work that checked "not capturing" and then lands in a capture begun
/// meanwhile on another thread, on the same stream.
#[test]
fn eager_work_against_capture_begin_on_the_same_stream() {
    const MIX: &[(Op, u32)] = &[(Op::Capture, 30), (Op::Canary, 20), (Op::BufferCreate, 15), (Op::StreamSync, 10), (Op::ExecLaunch, 10), (Op::Mla, 10), (Op::Instantiate, 5)];
    run(100_000, MIX, &[&[("cuMemsetD8Async", 100), ("cuMemcpyHtoDAsync", 100), ("cuMemcpyDtoHAsync", 100), ("cuGraphLaunch", 100), ("cuStreamSynchronize", 100)], &[]]);
}

/// Two threads in calls on one CUDA graph or executable (instantiate, node count, launch, upload):
/// CUDA graphs are not thread-safe, and the stand-in counts it as a violation.
#[test]
fn concurrent_calls_on_one_graph_or_executable() {
    const MIX: &[(Op, u32)] = &[(Op::Capture, 20), (Op::Instantiate, 35), (Op::ExecLaunch, 35), (Op::GraphDestroy, 5), (Op::ExecDestroy, 5)];
    run(100_000, MIX, &[&[("cuGraphInstantiateWithFlags", 100), ("cuGraphGetNodes", 100), ("cuGraphLaunch", 100), ("cuGraphUpload", 100)], &[]]);
}

/// A raw pointer the C ABI resolves (`CallerMemory::pointer`: is it inside a graphsafe allocation?)
/// against the last drop of the graphsafe allocation just below it, on another thread. The lookup
/// once upgraded the registry's weak reference of that allocation under the registry lock to test
/// its bounds; when the other thread dropped its handle meanwhile, the lookup's temporary became
/// the last reference and the allocation's drop re-entered the registry lock on the same thread:
/// a deadlock of both threads, and of every later allocation and free in the process.
///
/// Engine memory X (1 MiB: mmap'd, at a high address) is allocated first; a churning thread
/// creates and destroys 1 MiB graphsafe buffers, which land below X; the lookup thread calls
/// graphsafe_nvfp4_quantize with X as the output's codes and a null scales pointer, so every call
/// looks X up and then fails with NULL_POINTER, before any launch (nothing reaches the kernel glue).
#[test]
fn raw_pointer_lookups_against_the_last_drop_of_the_allocation_below() {
    const RUN: Duration = Duration::from_secs(3);
    let (_g, _s) = standin::exclusive();
    let rust_ctx = graphsafe::driver::Context::new(0).unwrap();
    let x = standin::engine_memory::alloc(&rust_ctx, 1 << 20);
    let mut ctx = GraphsafeContext { id: 0 };
    let mut stream = GraphsafeStream { id: 0 };
    // SAFETY: out-pointers to locals.
    unsafe {
        assert_eq!(graphsafe_context_create(0, &mut ctx), OK, "{}", last_error());
        assert_eq!(graphsafe_stream_create(ctx, &mut stream), OK, "{}", last_error());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (lookups, churns, below) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let churn = {
        let (stop, churns, below) = (stop.clone(), churns.clone(), below.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                let mut b = GraphsafeBuffer { id: 0 };
                let (mut ptr, mut bytes) = (0u64, 0u64);
                // SAFETY: out-pointers to locals; handles this thread made.
                unsafe {
                    assert_eq!(graphsafe_buffer_create(stream, 1 << 20, 0, &mut b), OK, "{}", last_error());
                    assert_eq!(graphsafe_buffer_info(b, &mut ptr, &mut bytes), OK);
                    assert_eq!(graphsafe_buffer_destroy(b), OK);
                }
                if ptr + bytes <= x {
                    below.fetch_add(1, Relaxed);
                }
                churns.fetch_add(1, Relaxed);
            }
        })
    };
    let lookup = {
        let (stop, lookups) = (stop.clone(), lookups.clone());
        std::thread::spawn(move || {
            let out = GraphsafeNvfp4Matrix { packed: x, scales: 0, global_scale: 0, rows: 16, k: 64 };
            while !stop.load(Relaxed) {
                // SAFETY: `out` is a valid matrix description; x is live device memory of the device.
                let r = unsafe { graphsafe_nvfp4_quantize(x, GRAPHSAFE_DTYPE_BF16, 16, 64, 64, &out, stream) };
                assert_eq!(r, GRAPHSAFE_ERROR_NULL_POINTER, "{}", last_error());
                lookups.fetch_add(1, Relaxed);
            }
        })
    };
    // Watchdog: both threads keep making progress until told to stop, then end; a deadlock cannot
    // be unwound, so it exits the process.
    let start = Instant::now();
    let mut last = (0, 0, Instant::now());
    while !(churn.is_finished() && lookup.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        if start.elapsed() >= RUN {
            stop.store(true, Relaxed);
        }
        let now = (lookups.load(Relaxed), churns.load(Relaxed));
        if now.0 != last.0 && now.1 != last.1 {
            last = (now.0, now.1, Instant::now());
        } else if last.2.elapsed() > Duration::from_secs(2) {
            eprintln!("deadlock: a thread made no progress for 2 s ({} lookups, {} buffers so far)", now.0, now.1);
            std::process::exit(3);
        }
    }
    churn.join().unwrap();
    lookup.join().unwrap();
    let (n_lookups, n_churns, n_below) = (lookups.load(Relaxed), churns.load(Relaxed), below.load(Relaxed));
    // The race needs both loops to have run many times, with the buffers below X.
    assert!(n_lookups > 1000 && n_churns > 1000, "too few iterations to race: {n_lookups} lookups, {n_churns} buffers");
    assert!(n_below * 2 > n_churns, "the churned buffers should lie below X: {n_below} of {n_churns}");
    // SAFETY: handles made above; X is no longer used.
    unsafe {
        assert_eq!(graphsafe_stream_destroy(stream), OK);
        assert_eq!(graphsafe_context_destroy(ctx), OK);
        standin::engine_memory::free(&rust_ctx, x);
    }
}

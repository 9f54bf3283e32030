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
#[path = "standin_stress/run.rs"]
mod run;
#[path = "standin_stress/raw_pointers.rs"]
mod raw_pointers;

use graphsafe::capi::*;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use run::run;
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

// The C ABI under many threads racing on SHARED handles: contexts, streams, buffers, workspaces,
// captures, graphs and executables are created, used and destroyed at random while other threads
// capture on the same streams, run eager and captured MLA decodes and W4A16 GEMMs on the same
// workspaces, and grow them. The same stress as tests/standin_stress.rs, for helgrind/drd (small
// counts) and for the real driver on a GPU.
//
//   capi_stress [calls=200000] [threads=8]
//
// Fails (exit 1) on a status an entry point does not document for the well-formed arguments it is
// given, on a core entry point that never returned OK although its steps ran (kMustSucceed; the
// per-entry OK counts are printed at the end), on eager work that reaches a capturing stream (a thread-local or relaxed capture in which
// no captured op succeeded must give a graph of 0 nodes and must not be invalidated; a buffer
// written then read on one stream reads back what was written), and, on the stand-in driver, on a
// memory-safety violation or a leak after the teardown. A watchdog exits with status 3 when no call
// has completed for 10 s (a deadlock), printing the call each thread is in.
//
// Driver: whatever graphsafe opens (GRAPHSAFE_CUDA_DRIVER, else libcuda.so.1). When that is the
// stand-in (tests/standin/cuda_standin.c), its control API is used too: delays that widen the race
// windows, and its violation and leak counters.
//
// Build: g++ -std=c++17 -Iinclude tests/capi/capi_stress.cpp target/debug/libgraphsafe.a
//            -lstdc++ -ldl -lrt -lpthread -lm -o capi_stress
#include "capi_stress.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace capi_stress;

namespace {

// One capture: begin on a shared stream, a few capture-safe calls, end; then the leak checks.
void capture_session(int t, Rng& rng) {
  // CAPI_STRESS_SERIAL_CAPTURES=1: one capture at a time across threads (everything else
  // stays concurrent), to tell concurrent captures apart from a capture racing other calls.
  static const bool serial = std::getenv("CAPI_STRESS_SERIAL_CAPTURES") != nullptr;
  static std::mutex one_at_a_time;
  std::unique_lock<std::mutex> l(one_at_a_time, std::defer_lock);
  if (serial) l.lock();
  GraphsafeStream stream{pick(g.streams, rng).load()};
  // CAPI_STRESS_OWN_CAPTURE_STREAM=1: each thread captures only a stream of its own (made at its
  // first capture, destroyed at the teardown), never one the other threads use eagerly.
  static const bool own = std::getenv("CAPI_STRESS_OWN_CAPTURE_STREAM") != nullptr;
  if (own) {
    if (g.own_streams[t] == 0) {
      GraphsafeStream s{};
      if (graphsafe_stream_create(g.ctx, &s) != OK) return fail(std::string("stream_create: ") + graphsafe_last_error());
      g.own_streams[t] = s.id;
    }
    stream = GraphsafeStream{g.own_streams[t]};
  }
  // CAPI_STRESS_EMPTY_CAPTURES=1: begin and end only, nothing bound or captured in between.
  static const bool empty = std::getenv("CAPI_STRESS_EMPTY_CAPTURES") != nullptr;
  const int modes[] = {GRAPHSAFE_CAPTURE_THREAD_LOCAL, GRAPHSAFE_CAPTURE_THREAD_LOCAL, GRAPHSAFE_CAPTURE_THREAD_LOCAL,
                       GRAPHSAFE_CAPTURE_RELAXED,      GRAPHSAFE_CAPTURE_RELAXED,      GRAPHSAFE_CAPTURE_GLOBAL};
  // CAPI_STRESS_NO_GLOBAL=1 leaves GLOBAL-mode captures out (to tell their effect apart).
  static const bool no_global = std::getenv("CAPI_STRESS_NO_GLOBAL") != nullptr;
  int mode = modes[rng.below(no_global ? 5 : 6)];
  // CAPI_STRESS_MODE=<GRAPHSAFE_CAPTURE_*>: every capture in that one mode.
  static const char* one_mode = std::getenv("CAPI_STRESS_MODE");
  if (one_mode != nullptr) mode = std::atoi(one_mode);
  GraphsafeCapture cap{};
  if (call(t, CaptureBegin, [&] { return graphsafe_capture_begin(stream, mode, &cap); }) != OK) return;
  int captured_ops = 0;
  GraphsafeWorkspace bound{};
  std::string log;
  for (uint64_t i = 0, n = empty ? 0 : rng.below(4); i < n; ++i) {
    switch (rng.below(g.no_glue ? 3 : 5)) {
      case 0:
      case 1: {
        GraphsafeWorkspace ws{pick(g.workspaces, rng).load()};
        uint64_t p = 0, c = 0;
        int r = call(t, CaptureBindWorkspace, [&] { return graphsafe_capture_bind_workspace(cap, ws, &p, &c); });
        log += " bind_workspace:" + std::to_string(r);
        if (r == OK) bound = ws;
        break;
      }
      case 2: {
        GraphsafeBuffer b = g.tensors[rng.below(g.tensors.size())];
        call(t, CaptureBindBuffer, [&] { return graphsafe_capture_bind_buffer(cap, b, nullptr); });
        log += " bind_buffer";
        break;
      }
      case 3: {
        GraphsafeMlaPlan plan{};
        int r = call(t, MlaDecodeCaptured, [&] { return graphsafe_mla_decode_captured(&g.mla, cap, bound, &plan); });
        log += " mla_decode_captured:" + std::to_string(r);
        captured_ops += r == OK;
        break;
      }
      default: {
        call(t, CaptureBindBuffer, [&] { return graphsafe_capture_bind_buffer(cap, g.w4a16.weight, nullptr); });
        int r = call(t, W4a16Captured, [&] { return graphsafe_nvfp4_w4a16_gemm_captured(&g.w4a16, cap, bound); });
        log += " w4a16_captured:" + std::to_string(r);
        captured_ops += r == OK;
        break;
      }
    }
  }
  if (rng.below(8) == 0) {
    call(t, CaptureDestroy, [&] { return graphsafe_capture_destroy(cap); });
    return;
  }
  GraphsafeGraph graph{};
  int r = call(t, CaptureEnd, [&] { return graphsafe_capture_end(cap, &graph); });
  if (r == CI && mode != GRAPHSAFE_CAPTURE_GLOBAL) {
    fail(std::string("a ") + (mode == GRAPHSAFE_CAPTURE_RELAXED ? "relaxed" : "thread-local") +
         " capture this thread used only for captured calls was invalidated: eager work reached the capturing stream (" +
         graphsafe_last_error() + "; the stand-in: " + g_standin.text(g_standin.last_invalidation) +
         "; this thread's calls in the capture:" + log + ")");
  }
  if (r != OK) return;
  uint64_t nodes = 0;
  call(t, GraphNodeCount, [&] { return graphsafe_graph_node_count(graph, &nodes); });
  if (captured_ops == 0 && nodes != 0)
    fail("a capture in which no captured op succeeded has " + std::to_string(nodes) +
         " node(s): eager work leaked into it (the stand-in's last recorded node: " +
         g_standin.text(g_standin.last_recorded) + ")");
  uint64_t old = pick(g.graphs, rng).exchange(graph.id);
  call(t, GraphDestroy, [&] { return graphsafe_graph_destroy(GraphsafeGraph{old}); });
}

// The worker's kinds of step, by the upper bound of their share of `op` (0..100), with the names
// CAPI_STRESS_SKIP takes (a comma-separated list: those steps are left out, to tell apart which
// calls a crash on a real driver needs).
constexpr struct { uint64_t below; const char* name; } kSteps[] = {
    {1, "context"},   {4, "stream_create"}, {6, "stream_destroy"}, {9, "sync"},       {14, "buffer_create"},
    {16, "buffer_destroy"}, {20, "buffer_rw"}, {25, "canary"},     {29, "workspace_create"}, {35, "grow"},
    {37, "workspace_info"}, {41, "workspace_destroy"}, {61, "glue"}, {65, "instantiate"}, {67, "graph_destroy"},
    {75, "launch"},   {77, "exec_destroy"}, {100, "capture"}};

// Whether the steps named `name` (kSteps) are left out: CAPI_STRESS_SKIP names them, or, for
// "capture", CAPI_STRESS_NO_CAPTURE is set.
bool step_skipped(const char* name) {
  static const std::string skip = [] {
    const char* s = std::getenv("CAPI_STRESS_SKIP");
    return std::string(",") + (s ? s : "") + ",";
  }();
  if (std::strcmp(name, "capture") == 0 && std::getenv("CAPI_STRESS_NO_CAPTURE") != nullptr) return true;
  return skip.find(std::string(",") + name + ",") != std::string::npos;
}

bool skipped(uint64_t op) {
  for (const auto& k : kSteps)
    if (op < k.below) return step_skipped(k.name);
  return false;
}

// Entry points a run must see return OK at least once (a stress in which every call failed with a
// documented status would pass every other check), each with the steps (kSteps) that OK needs: the
// step that calls it and those that make the handles it is given (graphs come only from captures,
// executables only from instantiating them, workspaces only from workspace_create; the stream and
// canary slots hold setup's from the start). An entry whose steps were left out is not required.
struct MustSucceed {
  E entry;
  std::vector<const char*> steps;
};
const MustSucceed kMustSucceed[] = {
    {StreamCreate, {"stream_create"}},
    {StreamSynchronize, {"sync"}},
    {BufferCreate, {"buffer_create"}},
    {BufferWrite, {"canary"}},
    {BufferRead, {"canary"}},
    {WorkspaceCreate, {"workspace_create"}},
    {WorkspaceEnsureSize, {"workspace_create", "grow"}},
    {CaptureBegin, {"capture"}},
    {CaptureEnd, {"capture"}},
    {GraphNodeCount, {"capture"}},
    {GraphInstantiate, {"capture", "instantiate"}},
    {ExecLaunch, {"capture", "instantiate", "launch"}},
};

// An entry point's name without its "graphsafe_" prefix.
const char* short_name(int e) { return kEntry[e].name + std::strlen("graphsafe_"); }

// Below this many calls a healthy run can miss one (1,000 calls on 8 threads: 3 runs in 30 saw no
// workspace_ensure_size OK on the stand-in; 10,000: 0 in 40), so the check is skipped, saying so.
constexpr uint64_t kMinCallsForOkCheck = 10000;

std::vector<E> must_succeed() {
  // Every step takes a stream from the slots: with streams destroyed and none made they can run
  // out, and then nothing needs to succeed.
  if (step_skipped("stream_create") && !step_skipped("stream_destroy")) return {};
  std::vector<E> out;
  for (const auto& m : kMustSucceed)
    if (std::none_of(m.steps.begin(), m.steps.end(), step_skipped)) out.push_back(m.entry);
  return out;
}

void worker(int t) {
  Rng rng(0x9E3779B97F4A7C15ull ^ (uint64_t(t + 1) << 32));
  while (!g.stop.load(std::memory_order_relaxed) && g.calls.load(std::memory_order_relaxed) < g.total) {
    GraphsafeStream stream{pick(g.streams, rng).load()};
    GraphsafeWorkspace ws{pick(g.workspaces, rng).load()};
    uint64_t op = rng.below(100);
    if (skipped(op)) continue;
    if (op < 1) {
      GraphsafeContext c{};
      if (call(t, ContextCreate, [&] { return graphsafe_context_create(0, &c); }) == OK) {
        uint64_t old = pick(g.ctxs, rng).exchange(c.id);
        call(t, ContextDestroy, [&] { return graphsafe_context_destroy(GraphsafeContext{old}); });
      }
    } else if (op < 4) {
      GraphsafeContext ctx = rng.below(2) ? g.ctx : GraphsafeContext{pick(g.ctxs, rng).load()};
      GraphsafeStream s{};
      if (call(t, StreamCreate, [&] { return graphsafe_stream_create(ctx, &s); }) == OK) {
        uint64_t old = pick(g.streams, rng).exchange(s.id);
        if (call(t, StreamDestroy, [&] { return graphsafe_stream_destroy(GraphsafeStream{old}); }) == BUSY) {
          std::lock_guard<std::mutex> l(g.mu);
          g.busy.emplace_back(StreamDestroy, old);
        }
      }
    } else if (op < 6) {
      call(t, StreamDestroy, [&] { return graphsafe_stream_destroy(stream); });
    } else if (op < 9) {
      call(t, StreamSynchronize, [&] { return graphsafe_stream_synchronize(stream); });
    } else if (op < 14) {
      GraphsafeBuffer b{};
      uint64_t bytes = 256 + rng.below(16 << 10);
      int zeroed = int(rng.next() & 1);
      if (call(t, BufferCreate, [&] { return graphsafe_buffer_create(stream, bytes, zeroed, &b); }) == OK) {
        uint64_t old = pick(g.buffers, rng).exchange(b.id);
        call(t, BufferDestroy, [&] { return graphsafe_buffer_destroy(GraphsafeBuffer{old}); });
      }
    } else if (op < 16) {
      GraphsafeBuffer b{pick(g.buffers, rng).exchange(0)};
      call(t, BufferDestroy, [&] { return graphsafe_buffer_destroy(b); });
    } else if (op < 20) {
      GraphsafeBuffer b{pick(g.buffers, rng).load()};
      unsigned char bytes[64] = {0};
      if (rng.below(2))
        call(t, BufferWrite, [&] { return graphsafe_buffer_write(b, 0, bytes, 64, stream); });
      else
        call(t, BufferRead, [&] { return graphsafe_buffer_read(b, 0, bytes, 64, stream); });
      uint64_t n = 0;
      call(t, BufferInfo, [&] { return graphsafe_buffer_info(b, nullptr, &n); });
    } else if (op < 25) {
      // This thread's canary: what is written on a stream is what reads back on it.
      GraphsafeBuffer b = g.canaries[t];
      unsigned char data[256], back[256];
      for (auto& d : data) d = uint8_t(rng.next());
      if (call(t, BufferWrite, [&] { return graphsafe_buffer_write(b, 0, data, 256, stream); }) == OK &&
          call(t, BufferRead, [&] { return graphsafe_buffer_read(b, 0, back, 256, stream); }) == OK &&
          std::memcmp(data, back, 256) != 0)
        fail("a buffer read back other bytes than were just written on the same stream (a copy was captured instead of run)");
    } else if (op < 29) {
      GraphsafeWorkspace w{};
      uint64_t bytes = rng.below(64 << 10);
      if (call(t, WorkspaceCreate, [&] { return graphsafe_workspace_create(stream, bytes, &w); }) == OK) {
        uint64_t old = pick(g.workspaces, rng).exchange(w.id);
        if (call(t, WorkspaceDestroy, [&] { return graphsafe_workspace_destroy(GraphsafeWorkspace{old}); }) == BUSY) {
          std::lock_guard<std::mutex> l(g.mu);
          g.busy.emplace_back(WorkspaceDestroy, old);
        }
      }
    } else if (op < 35) {
      uint64_t bytes = rng.below(64 << 10);
      int grew = 0;
      call(t, WorkspaceEnsureSize, [&] { return graphsafe_workspace_ensure_size(ws, bytes, stream, &grew); });
    } else if (op < 37) {
      uint64_t c = 0, p = 0;
      call(t, WorkspaceInfo, [&] { return graphsafe_workspace_info(ws, &c, &p); });
    } else if (op < 41) {
      call(t, WorkspaceDestroy, [&] { return graphsafe_workspace_destroy(ws); });
    } else if (op < 61 && g.no_glue) {
      call(t, StreamSynchronize, [&] { return graphsafe_stream_synchronize(stream); });
    } else if (op < 51) {
      GraphsafeMlaPlan plan{};
      call(t, MlaDecode, [&] { return graphsafe_mla_decode(&g.mla, ws, stream, &plan); });
    } else if (op < 61) {
      call(t, W4a16, [&] { return graphsafe_nvfp4_w4a16_gemm(&g.w4a16, ws, stream); });
    } else if (op < 65) {
      GraphsafeGraph gr{pick(g.graphs, rng).load()};
      GraphsafeGraphExec e{};
      if (call(t, GraphInstantiate, [&] { return graphsafe_graph_instantiate(gr, &e); }) == OK) {
        uint64_t old = pick(g.execs, rng).exchange(e.id);
        call(t, ExecDestroy, [&] { return graphsafe_graph_exec_destroy(GraphsafeGraphExec{old}); });
      }
      uint64_t n = 0;
      call(t, GraphNodeCount, [&] { return graphsafe_graph_node_count(gr, &n); });
    } else if (op < 67) {
      GraphsafeGraph gr{pick(g.graphs, rng).exchange(0)};
      call(t, GraphDestroy, [&] { return graphsafe_graph_destroy(gr); });
    } else if (op < 75) {
      GraphsafeGraphExec e{pick(g.execs, rng).load()};
      if (rng.below(4) == 0)
        call(t, ExecUpload, [&] { return graphsafe_graph_exec_upload(e, stream); });
      else
        call(t, ExecLaunch, [&] { return graphsafe_graph_exec_launch(e, stream); });
    } else if (op < 77) {
      GraphsafeGraphExec e{pick(g.execs, rng).exchange(0)};
      call(t, ExecDestroy, [&] { return graphsafe_graph_exec_destroy(e); });
    } else {
      capture_session(t, rng);  // skipped() above leaves it out under CAPI_STRESS_NO_CAPTURE
    }
  }
}

// Without a driver: every thread calls entry points on forged, zero and destroyed-looking handles
// and the host-only planners. Each call must answer DRIVER_NOT_FOUND (naming libcuda.so.1) or
// INVALID_HANDLE, the planners OK, with this thread's error text: the paths CI machines run, and
// the part of the C ABI race detectors can follow (Rust's futex-based locks are invisible to
// helgrind and drd; without a driver no registry entry is ever written).
void absent_worker(int t) {
  Rng rng(0xA85E47ull ^ (uint64_t(t + 1) << 32));
  const int DNF = GRAPHSAFE_ERROR_DRIVER_NOT_FOUND;
  auto handle = [&] { return rng.below(3) == 0 ? 0 : ((1 + rng.below(7)) << 56) | ((1 + rng.below(3)) << 32) | rng.below(8); };
  auto check = [&](const char* what, int s, std::initializer_list<int> allowed) {
    g.calls.fetch_add(1, std::memory_order_relaxed);
    if (std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      fail(std::string(what) + " returned " + std::to_string(s) + " without a driver: " + graphsafe_last_error());
    else if (s == DNF && !std::strstr(graphsafe_last_error(), "libcuda.so.1"))
      fail(std::string(what) + ": DRIVER_NOT_FOUND whose text does not say where it looked: " + graphsafe_last_error());
    else if (s != OK && graphsafe_last_error()[0] == '\0')
      fail(std::string(what) + ": a failure without error text");
  };
  while (!g.stop.load(std::memory_order_relaxed) && g.calls.load(std::memory_order_relaxed) < g.total) {
    g.inflight[t].store(1);
    switch (rng.below(12)) {
      case 0: { int n = 0; check("device_count", graphsafe_device_count(&n), {DNF}); break; }
      case 1: { GraphsafeContext c{}; check("context_create", graphsafe_context_create(0, &c), {DNF}); break; }
      case 2: { GraphsafeStream s{}; check("stream_create", graphsafe_stream_create(GraphsafeContext{handle()}, &s), {IH}); break; }
      case 3: check("stream_destroy", graphsafe_stream_destroy(GraphsafeStream{handle()}), {IH}); break;
      case 4: { GraphsafeBuffer b{}; check("buffer_create", graphsafe_buffer_create(GraphsafeStream{handle()}, 256, 1, &b), {IH}); break; }
      case 5: check("workspace_destroy", graphsafe_workspace_destroy(GraphsafeWorkspace{handle()}), {IH}); break;
      case 6: { GraphsafeCapture c{}; check("capture_begin", graphsafe_capture_begin(GraphsafeStream{handle()}, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &c), {IH}); break; }
      case 7: { GraphsafeGraph gr{}; check("capture_end", graphsafe_capture_end(GraphsafeCapture{handle()}, &gr), {IH}); break; }
      case 8: check("graph_exec_launch", graphsafe_graph_exec_launch(GraphsafeGraphExec{handle()}, GraphsafeStream{handle()}), {IH}); break;
      case 9: { GraphsafeMlaPlan p{}; check("mla_plan", graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 1 + int(rng.below(64)), 1 + int(rng.below(8192)), 64, 132, 0, &p), {OK}); break; }
      case 10: { GraphsafeNvfp4Plan p{}; check("nvfp4_plan", graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, 1 + int(rng.below(256)), 256, 256, GRAPHSAFE_DTYPE_BF16, 132, &p), {OK}); break; }
      default: { int a = 0, b = 0; check("driver_version", graphsafe_driver_version(&a, &b), {DNF}); break; }
    }
    g.inflight[t].store(0);
  }
}

template <size_t N, class F>
void destroy_all(std::atomic<uint64_t> (&v)[N], F f) {
  for (auto& a : v) {
    int r = f(a.exchange(0));
    if (r != OK && r != IH) fail("teardown: status " + std::to_string(r) + ": " + graphsafe_last_error());
  }
}

}  // namespace

// A crash prints where it happened and which entry point each thread was in, so a crash on a
// machine without a debugger still says what to look at (symbolize the addresses with addr2line
// against the same, unstripped binary).
extern "C" void on_crash(int sig) {
  char line[160];
  int n = std::snprintf(line, sizeof line, "capi_stress: CRASH: signal %d; entry points in flight:", sig);
  (void)!write(2, line, size_t(n));
  for (int t = 0; t < kMaxThreads; ++t) {
    int e = g.inflight[t].load();
    if (e > 0) {
      n = std::snprintf(line, sizeof line, " [thread %d: %s]", t, kEntry[e - 1].name);
      (void)!write(2, line, size_t(n));
    }
  }
  (void)!write(2, "\n", 1);
  void* frames[64];
  int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, 2);
  _exit(139);
}

int main(int argc, char** argv) {
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the watchdog leaves with _exit: nothing may wait in a buffer
  g.total = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000;
  int threads = argc > 2 ? std::atoi(argv[2]) : 8;
  if (threads < 1 || threads > kMaxThreads || g.total == 0) {
    std::fprintf(stderr, "usage: capi_stress [calls] [threads 1..%d]\n", kMaxThreads);
    return 2;
  }
  // Lazy singletons first (the driver, its symbols, the registry), before any thread exists, so
  // race detectors see their one-time initialisation happen before the threads.
  int n = 0;
  int st = graphsafe_version() == nullptr ? -99 : graphsafe_device_count(&n);  // the driver library, cuInit
  graphsafe_stream_destroy(GraphsafeStream{0});                                // the handle registry
  bool absent = st == GRAPHSAFE_ERROR_DRIVER_NOT_FOUND;
  if (!absent && (st != OK || n < 1)) {
    std::fprintf(stderr, "capi_stress: no device (%s)\ncapi_stress: 0 passed, 1 failed\n", graphsafe_last_error());
    return 1;
  }
  if (absent) {
    GraphsafeMlaPlan p{};  // the planners' lazy state too
    graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 1, 64, 64, 132, 0, &p);
    std::printf("capi_stress: %llu calls on %d threads, no driver\n", (unsigned long long)g.total, threads);
    std::vector<std::thread> ws;
    for (int t = 0; t < threads; ++t) ws.emplace_back(absent_worker, t);
    for (auto& w : ws) w.join();
    bool ok = g.failures.empty() && g.calls.load() >= g.total;
    std::printf("capi_stress: %llu calls without a driver\ncapi_stress: %d passed, %d failed\n",
                (unsigned long long)g.calls.load(), ok ? 1 : 0, ok ? 0 : 1);
    return ok ? 0 : 1;
  }
  find_standin();
  if (g_standin.present()) {
    void* real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    g.no_glue = real != nullptr;
    if (real) std::printf("capi_stress: a real libcuda.so.1 is present: MLA and W4A16 calls left out\n");
  }
  // Knobs to tell causes apart on a real driver: CAPI_STRESS_NO_GLUE=1 leaves the MLA/W4A16 calls
  // (the kernel glue, through the CUDA runtime) out, CAPI_STRESS_NO_CAPTURE=1 every capture,
  // CAPI_STRESS_SKIP=name,... the worker's steps of those names (kSteps).
  if (std::getenv("CAPI_STRESS_NO_GLUE") != nullptr) g.no_glue = true;
  if (!setup(threads)) {
    std::printf("capi_stress: 0 passed, 1 failed\n");
    return 1;
  }
  std::printf("capi_stress: %llu calls on %d threads, driver: %s\n", (unsigned long long)g.total, threads,
              g_standin.present() ? "the stand-in" : "the system's");
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ws;
  for (int t = 0; t < threads; ++t) ws.emplace_back(worker, t);
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    uint64_t last = 0;
    size_t phase = 0;
    auto since = std::chrono::steady_clock::now(), phase_at = since;
    set_phase(0);
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      auto now = std::chrono::steady_clock::now();
      if (now - phase_at > kPhase) {
        phase = (phase + 1) % kPhases.size();
        set_phase(phase);
        phase_at = now;
      }
      uint64_t c = g.calls.load();
      if (c != last) {
        last = c;
        since = now;
      } else if (now - since > kNoProgress) {
        std::fprintf(stderr, "capi_stress: DEADLOCK: no call completed for 10 s after %llu calls; in flight:\n",
                     (unsigned long long)c);
        for (int t = 0; t < threads; ++t) {
          int e = g.inflight[t].load();
          std::fprintf(stderr, "  thread %d: %s\n", t, e ? kEntry[e - 1].name : "(between calls)");
        }
        std::fflush(stderr);
        _exit(3);
      }
    }
    set_phase(0);
  });
  for (auto& w : ws) w.join();
  done = true;
  watchdog.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t calls = g.calls.load();
  std::printf("capi_stress: %llu calls in %.1f s\n", (unsigned long long)calls, secs);

  destroy_all(g.execs, [](uint64_t id) { return graphsafe_graph_exec_destroy(GraphsafeGraphExec{id}); });
  destroy_all(g.graphs, [](uint64_t id) { return graphsafe_graph_destroy(GraphsafeGraph{id}); });
  destroy_all(g.workspaces, [](uint64_t id) { return graphsafe_workspace_destroy(GraphsafeWorkspace{id}); });
  destroy_all(g.buffers, [](uint64_t id) { return graphsafe_buffer_destroy(GraphsafeBuffer{id}); });
  destroy_all(g.streams, [](uint64_t id) { return graphsafe_stream_destroy(GraphsafeStream{id}); });
  destroy_all(g.ctxs, [](uint64_t id) { return graphsafe_context_destroy(GraphsafeContext{id}); });
  for (auto& [e, id] : g.busy) {
    int r = e == StreamDestroy ? graphsafe_stream_destroy(GraphsafeStream{id}) : graphsafe_workspace_destroy(GraphsafeWorkspace{id});
    if (r != OK && r != IH) fail("teardown of a handle once BUSY: status " + std::to_string(r) + ": " + graphsafe_last_error());
  }
  for (auto id : g.own_streams)
    if (id != 0 && graphsafe_stream_destroy(GraphsafeStream{id}) != OK) fail(std::string("teardown: own stream: ") + graphsafe_last_error());
  for (auto b : g.tensors)
    if (graphsafe_buffer_destroy(b) != OK) fail(std::string("teardown: buffer_destroy: ") + graphsafe_last_error());
  if (graphsafe_context_destroy(g.ctx) != OK) fail(std::string("teardown: context_destroy: ") + graphsafe_last_error());

  if (calls < g.total) fail("only " + std::to_string(calls) + " calls");
  std::string counts, required, never_ok;
  for (int e = 0; e < kEntries; ++e)
    if (uint64_t all = g.all_calls[e].load())
      counts += std::string(counts.empty() ? "" : ", ") + short_name(e) + " " +
                std::to_string(g.ok_calls[e].load()) + "/" + std::to_string(all);
  for (E e : must_succeed()) {
    required += std::string(required.empty() ? "" : ", ") + short_name(e);
    if (g.ok_calls[e].load() == 0) never_ok += std::string(never_ok.empty() ? "" : ", ") + kEntry[e].name;
  }
  std::printf("capi_stress: OK/calls per entry point: %s\n", counts.c_str());
  if (g.total < kMinCallsForOkCheck) {
    std::printf("capi_stress: SKIP: the minimum-OK check: %llu calls are too few for every core entry point to succeed once (it needs %llu)\n",
                (unsigned long long)g.total, (unsigned long long)kMinCallsForOkCheck);
  } else {
    std::printf("capi_stress: required to return OK at least once (steps not left out): %s\n",
                required.empty() ? "none" : required.c_str());
    if (!never_ok.empty()) fail("never returned OK in " + std::to_string(calls) + " calls (every call of them failed): " + never_ok);
  }
  if (g_standin.present()) {
    if (g_standin.violations() != 0)
      fail("the stand-in saw a memory-safety violation: " + g_standin.text(g_standin.last_violation));
    long live = g_standin.stat("live_allocations"), orphaned = g_standin.stat("orphaned_allocations");
    if (live != orphaned) fail("allocations leaked: " + std::to_string(live - orphaned));
    for (const char* gauge : {"open_captures", "live_streams", "live_graphs", "live_execs", "primary_ctx_refs"})
      if (g_standin.stat(gauge) != 0) fail(std::string(gauge) + " after teardown: " + std::to_string(g_standin.stat(gauge)));
  }
  bool ok = g.failures.empty();
  std::printf("capi_stress: %d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
  return ok ? 0 : 1;
}

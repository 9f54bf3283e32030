// Teardown at thread and process exit: C++ static and thread_local objects whose destructors call
// graphsafe_*_destroy on stale (already destroyed, or never created) handles and read
// graphsafe_last_error(), after the Rust runtime has destroyed its own thread-locals. Also the
// live handles such objects own: their destroys at exit must succeed; and a THREAD_LOCAL or
// GLOBAL capture begun from such a destructor is refused, since graphsafe could not abandon it.
//
// Destructor order is what makes this hard: thread_local destructors run in the reverse order of
// their registration, and graphsafe's thread-local error text is registered on the thread's first
// failing call, so an object constructed before that call is destroyed after Rust's thread-locals
// are gone. For the main thread, exit() runs every thread_local destructor before the static ones,
// so a static object's destructor always runs after them.
//
// Must exit 0 (an abort, 134, is the bug this catches) and print "capi_exit: N passed, M failed".
// Runs with a driver (GRAPHSAFE_CUDA_DRIVER=the stand-in, or a GPU), where the objects also own
// live contexts, streams, buffers, workspaces, captures, graphs and executables, and without one,
// where every handle is forged.
#include "graphsafe.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

std::atomic<int> g_passed{0}, g_failed{0};
bool g_driver = false;

void check(bool ok, const char* what, int status) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    // Not graphsafe_last_error(): reading it is one of the things under test.
    std::fprintf(stderr, "capi_exit: FAILED: %s (status %d)\n", what, status);
  }
}

// Constructed first, destroyed last: reports once every other destructor has run.
struct Report {
  ~Report() {
    std::printf("capi_exit: %d passed, %d failed\n", g_passed.load(), g_failed.load());
    std::fflush(stdout);
    if (g_failed.load() != 0 || g_passed.load() == 0) _exit(1);
  }
} g_report;

// Handles an object owns at exit: `stale` ones were destroyed already (or forged), `live` ones not.
struct Holder {
  const char* where;
  std::vector<GraphsafeStream> stale_streams, live_streams;
  std::vector<GraphsafeBuffer> stale_buffers, live_buffers;
  std::vector<GraphsafeWorkspace> stale_workspaces, live_workspaces;
  std::vector<GraphsafeCapture> stale_captures, live_captures;
  std::vector<GraphsafeGraph> stale_graphs, live_graphs;
  std::vector<GraphsafeGraphExec> stale_execs, live_execs;
  std::vector<GraphsafeContext> stale_contexts, live_contexts;

  explicit Holder(const char* w) : where(w) {}
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;

  void expect_stale(int s, const char* what) {
    std::string w = std::string(where) + ": " + what + " of a stale handle";
    check(s == GRAPHSAFE_ERROR_INVALID_HANDLE, w.c_str(), s);
    const char* e = graphsafe_last_error();
    check(e != nullptr, "graphsafe_last_error() is never null", 0);
  }
  void expect_live(int s, const char* what) {
    std::string w = std::string(where) + ": " + what + " of a live handle";
    check(s == GRAPHSAFE_OK, w.c_str(), s);
  }

  ~Holder() {
    // Captures first: a live capture holds its stream and workspaces.
    for (auto c : live_captures) expect_live(graphsafe_capture_destroy(c), "capture_destroy");
    for (auto c : stale_captures) expect_stale(graphsafe_capture_destroy(c), "capture_destroy");
    for (auto e : live_execs) expect_live(graphsafe_graph_exec_destroy(e), "graph_exec_destroy");
    for (auto e : stale_execs) expect_stale(graphsafe_graph_exec_destroy(e), "graph_exec_destroy");
    for (auto g : live_graphs) expect_live(graphsafe_graph_destroy(g), "graph_destroy");
    for (auto g : stale_graphs) expect_stale(graphsafe_graph_destroy(g), "graph_destroy");
    for (auto w : live_workspaces) expect_live(graphsafe_workspace_destroy(w), "workspace_destroy");
    for (auto w : stale_workspaces) expect_stale(graphsafe_workspace_destroy(w), "workspace_destroy");
    for (auto b : live_buffers) expect_live(graphsafe_buffer_destroy(b), "buffer_destroy");
    for (auto b : stale_buffers) expect_stale(graphsafe_buffer_destroy(b), "buffer_destroy");
    for (auto s : live_streams) expect_live(graphsafe_stream_destroy(s), "stream_destroy");
    for (auto s : stale_streams) expect_stale(graphsafe_stream_destroy(s), "stream_destroy");
    for (auto c : live_contexts) expect_live(graphsafe_context_destroy(c), "context_destroy");
    for (auto c : stale_contexts) expect_stale(graphsafe_context_destroy(c), "context_destroy");
    // A call that fails for another reason than a handle, and the error text after it.
    int n = 0;
    int s = graphsafe_device_count(nullptr);
    check(s == GRAPHSAFE_ERROR_NULL_POINTER, "device_count(nullptr) at exit", s);
    s = graphsafe_device_count(&n);
    // A real driver may already be shutting down (CUDA_ERROR_DEINITIALIZED: GRAPHSAFE_ERROR_DRIVER).
    check(s == GRAPHSAFE_OK || s == GRAPHSAFE_ERROR_DRIVER_NOT_FOUND || s == GRAPHSAFE_ERROR_DRIVER, "device_count at exit", s);
    check(graphsafe_last_error() != nullptr && graphsafe_version() != nullptr, "last_error/version at exit", 0);
  }
};

// Fills `h` with handles of every kind: with a driver, some destroyed at once (stale) and some
// kept (live); without one, forged ids (stale by construction). `open_capture`: also leave a
// capture open for the destructor to end (only in the last fill of a thread: an open thread-local
// capture forbids this thread's allocations, CUDA's rule).
void fill(Holder& h, bool open_capture) {
  if (!g_driver) {
    for (uint64_t i = 1; i <= 3; ++i) {
      uint64_t id = (i << 32) | i;
      h.stale_contexts.push_back({(1ull << 56) | id});
      h.stale_streams.push_back({(2ull << 56) | id});
      h.stale_workspaces.push_back({(3ull << 56) | id});
      h.stale_captures.push_back({(4ull << 56) | id});
      h.stale_graphs.push_back({(5ull << 56) | id});
      h.stale_execs.push_back({(6ull << 56) | id});
      h.stale_buffers.push_back({(7ull << 56) | id});
    }
    GraphsafeContext c{};
    int s = graphsafe_context_create(0, &c);  // the failing call that registers the error text
    check(s == GRAPHSAFE_ERROR_DRIVER_NOT_FOUND, "context_create without a driver", s);
    return;
  }
  auto ok = [&](int s, const char* what) {
    check(s == GRAPHSAFE_OK, what, s);
    return s == GRAPHSAFE_OK;
  };
  GraphsafeContext ctx{}, ctx2{};
  if (!ok(graphsafe_context_create(0, &ctx), "context_create") || !ok(graphsafe_context_create(0, &ctx2), "context_create"))
    return;
  h.live_contexts.push_back(ctx);
  ok(graphsafe_context_destroy(ctx2), "context_destroy");
  h.stale_contexts.push_back(ctx2);
  GraphsafeStream s1{}, s2{}, s3{};
  ok(graphsafe_stream_create(ctx, &s1), "stream_create");
  ok(graphsafe_stream_create(ctx, &s2), "stream_create");
  ok(graphsafe_stream_create(ctx, &s3), "stream_create");
  ok(graphsafe_stream_destroy(s3), "stream_destroy");
  h.live_streams.push_back(s1);
  h.live_streams.push_back(s2);
  h.stale_streams.push_back(s3);
  GraphsafeBuffer b1{}, b2{};
  ok(graphsafe_buffer_create(s1, 4096, 1, &b1), "buffer_create");
  ok(graphsafe_buffer_create(s1, 4096, 0, &b2), "buffer_create");
  ok(graphsafe_buffer_destroy(b2), "buffer_destroy");
  h.live_buffers.push_back(b1);
  h.stale_buffers.push_back(b2);
  GraphsafeWorkspace w1{}, w2{}, w3{};
  ok(graphsafe_workspace_create(s1, 1 << 16, &w1), "workspace_create");
  ok(graphsafe_workspace_create(s1, 1 << 12, &w2), "workspace_create");
  ok(graphsafe_workspace_create(s2, 1 << 12, &w3), "workspace_create");
  ok(graphsafe_workspace_destroy(w2), "workspace_destroy");
  h.live_workspaces.push_back(w1);
  h.stale_workspaces.push_back(w2);
  // A graph and executables from a capture that bound a workspace and a buffer.
  GraphsafeCapture cap{};
  GraphsafeGraph g1{}, g2{};
  ok(graphsafe_capture_begin(s1, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap), "capture_begin");
  ok(graphsafe_capture_bind_workspace(cap, w1, nullptr, nullptr), "capture_bind_workspace");
  ok(graphsafe_capture_bind_buffer(cap, b1, nullptr), "capture_bind_buffer");
  ok(graphsafe_capture_end(cap, &g1), "capture_end");
  h.stale_captures.push_back(cap);
  ok(graphsafe_capture_begin(s1, GRAPHSAFE_CAPTURE_RELAXED, &cap), "capture_begin");
  ok(graphsafe_capture_end(cap, &g2), "capture_end");
  GraphsafeGraphExec e1{}, e2{};
  ok(graphsafe_graph_instantiate(g1, &e1), "graph_instantiate");
  ok(graphsafe_graph_instantiate(g1, &e2), "graph_instantiate");
  ok(graphsafe_graph_exec_launch(e1, s1), "graph_exec_launch");
  ok(graphsafe_graph_exec_destroy(e2), "graph_exec_destroy");
  ok(graphsafe_graph_destroy(g2), "graph_destroy");
  h.live_graphs.push_back(g1);
  h.stale_graphs.push_back(g2);
  h.live_execs.push_back(e1);
  h.stale_execs.push_back(e2);
  ok(graphsafe_workspace_destroy(w3), "workspace_destroy");
  h.stale_workspaces.push_back(w3);
  if (!open_capture) {
    int st = graphsafe_stream_destroy(s3);  // a failing call after the object: the error text
    check(st == GRAPHSAFE_ERROR_INVALID_HANDLE, "a second stream_destroy", st);
    return;
  }
  // A capture still open at exit, on its own stream with its own workspace bound: its owner ends
  // it from the thread that began it (thread-local rule), in the destructor.
  ok(graphsafe_workspace_create(s2, 1 << 12, &w3), "workspace_create");
  GraphsafeCapture open{};
  ok(graphsafe_capture_begin(s2, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &open), "capture_begin");
  ok(graphsafe_capture_bind_workspace(open, w3, nullptr, nullptr), "capture_bind_workspace");
  h.live_captures.push_back(open);
  h.live_workspaces.push_back(w3);
  // And the failing call that registers this thread's error text after the object.
  int st = graphsafe_stream_destroy(s3);
  check(st == GRAPHSAFE_ERROR_INVALID_HANDLE, "a second stream_destroy", st);
}

Holder g_static("static destructor");
thread_local Holder t_main("main thread's thread_local destructor");

void worker(bool holder_first) {
  if (holder_first) {
    // The object exists before this thread's first graphsafe call: destroyed after Rust's TLS.
    thread_local Holder t("worker thread_local destructor (after Rust's thread-locals)");
    fill(t, true);
  } else {
    graphsafe_device_count(nullptr);  // Rust's thread-local first: the object is destroyed before it
    thread_local Holder t("worker thread_local destructor (before Rust's thread-locals)");
    fill(t, true);
  }
}

// A GLOBAL capture begun from a thread_local destructor that runs after graphsafe's own
// thread-locals are gone: graphsafe could no longer abandon it when the thread exits (only the
// beginning thread may end a non-relaxed capture), so it would stay open for good, refusing every
// thread's allocations. Refused instead, and nothing is left open.
constexpr int kNotCalled = 12345;
std::atomic<int> g_late_begin{kNotCalled};
GraphsafeStream g_late_stream{};

struct LateCapture {
  ~LateCapture() {
    GraphsafeCapture cap{};
    g_late_begin = graphsafe_capture_begin(g_late_stream, GRAPHSAFE_CAPTURE_GLOBAL, &cap);
  }
};

void late_capture_worker() {
  thread_local LateCapture late;  // constructed before this thread's first graphsafe call
  (void)late;
  // A capture begun and ended here registers graphsafe's thread-locals after `late`: they are
  // destroyed first.
  GraphsafeCapture cap{};
  GraphsafeGraph g{};
  int s = graphsafe_capture_begin(g_late_stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap);
  check(s == GRAPHSAFE_OK, "late-capture worker: capture_begin", s);
  s = graphsafe_capture_end(cap, &g);
  check(s == GRAPHSAFE_OK, "late-capture worker: capture_end", s);
  graphsafe_graph_destroy(g);
}

void late_capture_is_refused() {
  GraphsafeContext ctx{};
  int s = graphsafe_context_create(0, &ctx);
  check(s == GRAPHSAFE_OK, "late capture: context_create", s);
  s = graphsafe_stream_create(ctx, &g_late_stream);
  check(s == GRAPHSAFE_OK, "late capture: stream_create", s);
  std::thread(late_capture_worker).join();
  int late = g_late_begin.load();
  check(late == GRAPHSAFE_ERROR_INVALID_ARGUMENT, "a GLOBAL capture begun after graphsafe's thread-locals are gone is refused", late);
  // Nothing left open: this thread may allocate (an open GLOBAL capture would forbid it).
  GraphsafeBuffer b{};
  s = graphsafe_buffer_create(g_late_stream, 4096, 0, &b);
  check(s == GRAPHSAFE_OK, "late capture: buffer_create afterwards", s);
  graphsafe_buffer_destroy(b);
  graphsafe_stream_destroy(g_late_stream);
  graphsafe_context_destroy(ctx);
}

}  // namespace

int main() {
  t_main.where = "main thread's thread_local destructor";  // constructs it before any graphsafe call
  int n = 0;
  int s = graphsafe_device_count(&n);
  g_driver = s == GRAPHSAFE_OK && n > 0;
  std::printf("capi_exit: %s\n", g_driver ? "with a driver" : "without a driver");
  fill(g_static, false);
  if (g_driver) late_capture_is_refused();  // before this thread leaves a capture open (t_main)
  fill(t_main, true);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back(worker, i % 2 == 0);
  for (auto& t : threads) t.join();
  return 0;  // the rest happens in destructors
}

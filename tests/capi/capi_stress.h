// The part of tests/capi/capi_stress.cpp that its workers, watchdog and teardown share: the entry
// points with the statuses each documents for the arguments passed, the stand-in's control API,
// the handles every thread shares, the checked call and the setup. Header-only (inline
// definitions): capi_stress.cpp is one translation unit, built by naming it alone.
#pragma once

#include "graphsafe.h"

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
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace capi_stress {

constexpr int kMaxThreads = 64;
constexpr int kSlots = 4;
constexpr auto kNoProgress = std::chrono::seconds(10);
constexpr auto kPhase = std::chrono::milliseconds(100);

constexpr int OK = GRAPHSAFE_OK, IH = GRAPHSAFE_ERROR_INVALID_HANDLE, IA = GRAPHSAFE_ERROR_INVALID_ARGUMENT,
              BUSY = GRAPHSAFE_ERROR_BUSY, DRV = GRAPHSAFE_ERROR_DRIVER, CI = GRAPHSAFE_ERROR_CAPTURE_INVALIDATED,
              WTS = GRAPHSAFE_ERROR_WORKSPACE_TOO_SMALL, RT = GRAPHSAFE_ERROR_CUDA_RUNTIME,
              ARCH = GRAPHSAFE_ERROR_ARCH_UNSUPPORTED, CUT = GRAPHSAFE_ERROR_CUTLASS;

// An entry point and the statuses it documents for the arguments this program passes.
struct Entry {
  const char* name;
  std::vector<int> allowed;
};

enum E {
  ContextCreate, ContextDestroy, StreamCreate, StreamDestroy, StreamSynchronize, BufferCreate, BufferWrite,
  BufferRead, BufferInfo, BufferDestroy, WorkspaceCreate, WorkspaceEnsureSize, WorkspaceInfo, WorkspaceDestroy,
  CaptureBegin, CaptureBindWorkspace, CaptureBindBuffer, CaptureEnd, CaptureDestroy, GraphNodeCount,
  GraphInstantiate, GraphDestroy, ExecLaunch, ExecUpload, ExecDestroy, MlaDecode, MlaDecodeCaptured, W4a16,
  W4a16Captured, kEntries
};

const Entry kEntry[kEntries] = {
    {"graphsafe_context_create", {OK, DRV}},
    {"graphsafe_context_destroy", {OK, IH}},
    {"graphsafe_stream_create", {OK, IH, DRV}},
    {"graphsafe_stream_destroy", {OK, IH, BUSY}},
    {"graphsafe_stream_synchronize", {OK, IH, BUSY, DRV}},
    {"graphsafe_buffer_create", {OK, IH, BUSY, DRV}},
    {"graphsafe_buffer_write", {OK, IH, BUSY, DRV}},
    {"graphsafe_buffer_read", {OK, IH, BUSY, DRV}},
    {"graphsafe_buffer_info", {OK, IH}},
    {"graphsafe_buffer_destroy", {OK, IH}},
    {"graphsafe_workspace_create", {OK, IH, BUSY, DRV}},
    {"graphsafe_workspace_ensure_size", {OK, IH, BUSY, DRV}},
    {"graphsafe_workspace_info", {OK, IH}},
    {"graphsafe_workspace_destroy", {OK, IH, BUSY}},
    {"graphsafe_capture_begin", {OK, IH, BUSY, DRV}},
    {"graphsafe_capture_bind_workspace", {OK, IH, BUSY}},
    {"graphsafe_capture_bind_buffer", {OK}},
    {"graphsafe_capture_end", {OK, CI}},
    {"graphsafe_capture_destroy", {OK}},
    {"graphsafe_graph_node_count", {OK, IH}},
    {"graphsafe_graph_instantiate", {OK, IH, DRV}},
    {"graphsafe_graph_destroy", {OK, IH}},
    {"graphsafe_graph_exec_launch", {OK, IH, BUSY, DRV}},
    {"graphsafe_graph_exec_upload", {OK, IH, BUSY, DRV}},
    {"graphsafe_graph_exec_destroy", {OK, IH}},
    {"graphsafe_mla_decode", {OK, IH, BUSY, DRV, RT, ARCH, CUT}},
    {"graphsafe_mla_decode_captured", {OK, IA, WTS, DRV, RT, ARCH, CUT}},
    {"graphsafe_nvfp4_w4a16_gemm", {OK, IH, BUSY, DRV, RT, ARCH, CUT}},
    {"graphsafe_nvfp4_w4a16_gemm_captured", {OK, IA, WTS, DRV, RT, ARCH, CUT}},
};

// The stand-in's control API, when the driver graphsafe opened is the stand-in.
struct Standin {
  int (*delay)(const char*, int) = nullptr;
  long (*violations)() = nullptr;
  long (*stat)(const char*) = nullptr;
  int (*last_violation)(char*, int) = nullptr;
  int (*last_invalidation)(char*, int) = nullptr;
  int (*last_recorded)(char*, int) = nullptr;
  bool present() const { return delay != nullptr; }
  std::string text(int (*f)(char*, int)) const {
    char buf[1024] = {0};
    if (f) f(buf, sizeof buf);
    return buf;
  }
};
inline Standin g_standin;

inline void find_standin() {
  const char* path = std::getenv("GRAPHSAFE_CUDA_DRIVER");
  if (!path || !*path) return;
  // graphsafe opened it already (RTLD_LOCAL): NOLOAD finds that copy, whose state graphsafe uses.
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (!h || !dlsym(h, "standin_delay")) return;
  g_standin.delay = reinterpret_cast<int (*)(const char*, int)>(dlsym(h, "standin_delay"));
  g_standin.violations = reinterpret_cast<long (*)()>(dlsym(h, "standin_violations"));
  g_standin.stat = reinterpret_cast<long (*)(const char*)>(dlsym(h, "standin_stat"));
  g_standin.last_violation = reinterpret_cast<int (*)(char*, int)>(dlsym(h, "standin_last_violation"));
  g_standin.last_invalidation = reinterpret_cast<int (*)(char*, int)>(dlsym(h, "standin_last_invalidation"));
  g_standin.last_recorded = reinterpret_cast<int (*)(char*, int)>(dlsym(h, "standin_last_recorded"));
}

// Delay settings the controller cycles through (stand-in only); each widens one race window.
struct Delay {
  const char* entry;
  int usec;
};
const std::vector<std::vector<Delay>> kPhases = {
    {},
    {{"cuStreamBeginCapture", 150}},
    {{"cuMemsetD8Async", 100}, {"cuMemcpyHtoDAsync", 100}, {"cuMemcpyDtoHAsync", 100}, {"cuGraphLaunch", 100},
     {"cuStreamSynchronize", 100}},
    {{"cuMemAlloc", 150}},
    {{"cuGraphInstantiateWithFlags", 100}, {"cuGraphGetNodes", 100}, {"cuGraphLaunch", 100}, {"cuGraphUpload", 100}},
};

inline void set_phase(size_t phase) {
  if (!g_standin.present()) return;
  for (auto& p : kPhases)
    for (auto& d : p) g_standin.delay(d.entry, 0);
  for (auto& d : kPhases[phase]) g_standin.delay(d.entry, d.usec);
}

struct Shared {
  GraphsafeContext ctx{};
  std::atomic<uint64_t> ctxs[2]{};
  std::atomic<uint64_t> streams[kSlots]{};
  std::atomic<uint64_t> buffers[2 * kSlots]{};
  std::atomic<uint64_t> workspaces[kSlots]{};
  std::atomic<uint64_t> graphs[kSlots]{};
  std::atomic<uint64_t> execs[kSlots]{};
  std::vector<GraphsafeBuffer> tensors;  // never destroyed during the run (raw pointers stay valid)
  std::vector<GraphsafeBuffer> canaries; // one per thread, also in tensors
  uint64_t own_streams[kMaxThreads]{};   // CAPI_STRESS_OWN_CAPTURE_STREAM: each thread's capture stream
  GraphsafeMlaDecodeArgs mla{};
  GraphsafeW4a16Args w4a16{};
  std::atomic<uint64_t> calls{0};
  // Per entry point: the calls that returned OK, and all calls (call() counts both).
  std::atomic<uint64_t> ok_calls[kEntries]{};
  std::atomic<uint64_t> all_calls[kEntries]{};
  std::atomic<int> inflight[kMaxThreads]{};
  std::atomic<bool> stop{false};
  uint64_t total = 0;
  // The stand-in on a machine that also has a real libcuda.so.1: the kernel glue's CUDA runtime
  // would hand the stand-in's stream handles to the real driver, so MLA/W4A16 calls are left out.
  bool no_glue = false;
  std::mutex mu;  // guards failures and busy
  std::vector<std::string> failures;
  std::vector<std::pair<int, uint64_t>> busy;  // (E, id) whose destroy was refused: retried at the end
};
inline Shared g;

inline void fail(const std::string& what) {
  std::lock_guard<std::mutex> l(g.mu);
  if (g.failures.size() < 20) {
    std::fprintf(stderr, "capi_stress: FAILED: %s\n", what.c_str());
    g.failures.push_back(what);
  }
  g.stop = true;
}

template <class F>
int call(int t, E e, F f) {
  g.inflight[t].store(e + 1);
  int s = f();
  g.inflight[t].store(0);
  g.calls.fetch_add(1, std::memory_order_relaxed);
  g.all_calls[e].fetch_add(1, std::memory_order_relaxed);
  if (s == OK) g.ok_calls[e].fetch_add(1, std::memory_order_relaxed);
  const auto& a = kEntry[e].allowed;
  if (std::find(a.begin(), a.end(), s) == a.end())
    fail(std::string(kEntry[e].name) + " returned " + std::to_string(s) + ", which it does not document here: " +
         graphsafe_last_error());
  return s;
}

struct Rng {
  std::mt19937_64 r;
  explicit Rng(uint64_t seed) : r(seed) {}
  uint64_t below(uint64_t n) { return r() % n; }
  uint64_t next() { return r(); }
};

template <size_t N>
std::atomic<uint64_t>& pick(std::atomic<uint64_t> (&v)[N], Rng& rng) {
  return v[rng.below(N)];
}

inline bool setup(int threads) {
  auto need = [](int s, const char* what) {
    if (s != OK) std::fprintf(stderr, "capi_stress: setup: %s returned %d: %s\n", what, s, graphsafe_last_error());
    return s == OK;
  };
  if (!need(graphsafe_context_create(0, &g.ctx), "context_create")) return false;
  GraphsafeStream stream{};
  if (!need(graphsafe_stream_create(g.ctx, &stream), "stream_create")) return false;
  g.streams[0] = stream.id;
  bool ok = true;
  auto buffer = [&](uint64_t bytes) {
    GraphsafeBuffer b{};
    ok = ok && need(graphsafe_buffer_create(stream, bytes, 1, &b), "buffer_create");
    uint64_t ptr = 0;
    ok = ok && need(graphsafe_buffer_info(b, &ptr, nullptr), "buffer_info");
    g.tensors.push_back(b);
    return std::make_pair(b, ptr);
  };
  // MLA on sm_90: bf16, 16 heads, one request of 64 tokens in one page of 64.
  const int64_t heads = 16, page = 64;
  auto& m = g.mla;
  m.dtype = GRAPHSAFE_DTYPE_BF16;
  m.batch = 1;
  m.num_heads = int(heads);
  m.q_nope = buffer(heads * 512 * 2).second;
  m.q_nope_stride_batch = heads * 512;
  m.q_nope_stride_head = 512;
  m.q_pe = buffer(heads * 64 * 2).second;
  m.q_pe_stride_batch = heads * 64;
  m.q_pe_stride_head = 64;
  m.kv_cache = buffer(page * 576 * 2).second;
  m.num_pages = 1;
  m.page_size = int(page);
  auto seq = buffer(4);
  m.seq_lens = seq.second;
  m.page_table = buffer(4).second;  // zero: page 0
  m.max_pages = 1;
  m.out = buffer(heads * 512 * 2).second;
  m.out_stride_batch = heads * 512;
  m.out_stride_head = 512;
  m.lse = buffer(heads * 4).second;
  m.sm_scale = 0.0721f;
  m.max_seq_len = 64;
  m.num_splits = 0;
  int32_t len = 64;
  ok = ok && need(graphsafe_buffer_write(seq.first, 0, &len, 4, stream), "buffer_write");
  // W4A16 on a weight buffer of the size its plan asks for.
  const int wm = 4, wn = 256, wk = 256;
  GraphsafeNvfp4Plan plan{};
  ok = ok && need(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, wm, wn, wk, GRAPHSAFE_DTYPE_BF16, 132, &plan), "nvfp4_plan");
  auto& w = g.w4a16;
  w.weight = buffer(std::max<uint64_t>(plan.prepared_weight_bytes, 256)).first;
  w.a = buffer(uint64_t(wm) * wk * 2).second;
  w.lda = wk;
  w.n = wn;
  w.k = wk;
  auto alpha = buffer(4);
  w.alpha = alpha.second;
  float one = 1.0f;
  ok = ok && need(graphsafe_buffer_write(alpha.first, 0, &one, 4, stream), "buffer_write");
  w.d = buffer(uint64_t(wm) * wn * 2).second;
  w.ldd = wn;
  w.m = wm;
  for (int t = 0; t < threads; ++t) g.canaries.push_back(buffer(256).first);
  ok = ok && need(graphsafe_stream_synchronize(stream), "stream_synchronize");
  return ok;
}

}  // namespace capi_stress

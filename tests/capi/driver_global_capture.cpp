// A driver-only program (no graphsafe): threads that each capture their own stream in the
// driver's GLOBAL capture mode, then instantiate and destroy the graph. On the H200 with driver
// 580 (CUDA 13.0) it crashes inside libcuda (SIGSEGV in cuGraphExecDestroy) within a second with
// two threads, and never with one; with THREAD_LOCAL or RELAXED captures it runs clean. This is
// why graphsafe begins every driver capture thread-local and enforces GLOBAL mode's cross-thread
// refusals itself (src/graph/mod.rs, CaptureMode::Global). Run it on a GPU machine to see whether
// a new driver still needs that:
//
//   g++ -std=c++17 -O1 -I<cuda>/include tests/capi/driver_global_capture.cpp -ldl -lpthread -o dgc
//   ./dgc [mode=0 (GLOBAL) | 1 (THREAD_LOCAL) | 2 (RELAXED)] [threads=2] [iterations=20000]
//
// Exit 0 with "no crash" when every thread finished; a crash ends it with SIGSEGV (status 139).
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

#define DRIVER_FN(name) decltype(&name) name##_;
struct Driver {
  DRIVER_FN(cuInit) DRIVER_FN(cuDevicePrimaryCtxRetain) DRIVER_FN(cuCtxSetCurrent) DRIVER_FN(cuStreamCreate)
  DRIVER_FN(cuStreamBeginCapture_v2) DRIVER_FN(cuStreamEndCapture) DRIVER_FN(cuMemAlloc_v2)
  DRIVER_FN(cuMemsetD8Async) DRIVER_FN(cuGraphInstantiateWithFlags) DRIVER_FN(cuGraphExecDestroy)
  DRIVER_FN(cuGraphDestroy)
};
#undef DRIVER_FN

bool load(Driver& d) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    ok = ok && fn != nullptr;
  };
  get(d.cuInit_, "cuInit");
  get(d.cuDevicePrimaryCtxRetain_, "cuDevicePrimaryCtxRetain");
  get(d.cuCtxSetCurrent_, "cuCtxSetCurrent");
  get(d.cuStreamCreate_, "cuStreamCreate");
  get(d.cuStreamBeginCapture_v2_, "cuStreamBeginCapture_v2");
  get(d.cuStreamEndCapture_, "cuStreamEndCapture");
  get(d.cuMemAlloc_v2_, "cuMemAlloc_v2");
  get(d.cuMemsetD8Async_, "cuMemsetD8Async");
  get(d.cuGraphInstantiateWithFlags_, "cuGraphInstantiateWithFlags");
  get(d.cuGraphExecDestroy_, "cuGraphExecDestroy");
  get(d.cuGraphDestroy_, "cuGraphDestroy");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 20000;
  Driver d{};
  CUcontext ctx = nullptr;
  CUdeviceptr buf = 0;
  if (!load(d) || d.cuInit_(0) != CUDA_SUCCESS || d.cuDevicePrimaryCtxRetain_(&ctx, 0) != CUDA_SUCCESS ||
      d.cuCtxSetCurrent_(ctx) != CUDA_SUCCESS || d.cuMemAlloc_v2_(&buf, size_t(threads) * 4096) != CUDA_SUCCESS) {
    std::fprintf(stderr, "driver_global_capture: no usable CUDA driver or device\n");
    return 2;
  }
  std::atomic<long> captures{0}, refused{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      d.cuCtxSetCurrent_(ctx);
      CUstream s = nullptr;
      d.cuStreamCreate_(&s, CU_STREAM_NON_BLOCKING);
      for (int i = 0; i < iterations; ++i) {
        if (d.cuStreamBeginCapture_v2_(s, CUstreamCaptureMode(mode)) != CUDA_SUCCESS) {
          ++refused;
          continue;
        }
        d.cuMemsetD8Async_(buf + CUdeviceptr(t) * 4096, 1, 4096, s);
        CUgraph g = nullptr;
        if (d.cuStreamEndCapture_(s, &g) != CUDA_SUCCESS || g == nullptr) {
          ++refused;
          continue;
        }
        CUgraphExec e = nullptr;
        if (d.cuGraphInstantiateWithFlags_(&e, g, 0) == CUDA_SUCCESS) d.cuGraphExecDestroy_(e);
        else ++refused;
        d.cuGraphDestroy_(g);
        ++captures;
      }
    });
  for (auto& p : pool) p.join();
  std::printf("driver_global_capture: mode %d, %d threads: %ld captures, %ld refused calls, no crash\n", mode,
              threads, captures.load(), refused.load());
  return 0;
}

// Fuzz-style robustness test of the C ABI: every exported function, called with null, garbage,
// forged and destroyed handles and random arguments, must return a known status and never crash.
// Run under valgrind in CI (no leak may be reported as definitely lost).
#include "graphsafe.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

static bool known(int s) { return s <= 0 && s >= GRAPHSAFE_ERROR_PANIC; }

int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 12000;
  std::mt19937_64 rng(0x5eed);
  auto handle = [&]() -> uint64_t {
    switch (rng() % 5) {
      case 0: return 0;
      case 1: return rng();
      case 2: return ((rng() % 9) << 56) | ((rng() % 4) << 32) | (rng() % 8);  // plausible tag/gen/slot
      case 3: return ~0ull;
      default: return ((rng() % 8) << 56) | (1ull << 32);
    }
  };
  auto i32 = [&]() -> int {
    switch (rng() % 4) {
      case 0: return 0;
      case 1: return -int(rng() % 1000);
      case 2: return int(rng() % 300);
      default: return int(rng());
    }
  };
  long calls = 0, bad = 0, panics = 0;
  char scratch[1024];
  uint64_t u64 = 0;
  int iv = 0;
  GraphsafeMlaPlan plan;
  GraphsafeMlaDecodeArgs args;
  GraphsafeDeviceInfo info;
  for (long it = 0; it < iterations; ++it) {
    bool null_out = rng() % 2;
    std::memset(&args, 0, sizeof args);
    for (size_t b = 0; b < sizeof args; ++b) reinterpret_cast<unsigned char*>(&args)[b] = rng() % 3 ? 0 : uint8_t(rng());
    int s = 0;
    switch (rng() % 52) {
      case 0: s = graphsafe_driver_version(null_out ? nullptr : &iv, &iv); break;
      case 1: s = graphsafe_device_count(null_out ? nullptr : &iv); break;
      case 2: s = graphsafe_device_info(i32(), null_out ? nullptr : &info); break;
      case 3: { GraphsafeContext c; s = graphsafe_context_create(i32(), null_out ? nullptr : &c); break; }
      case 4: { GraphsafeContext c; s = graphsafe_context_adopt(null_out ? nullptr : scratch, null_out ? nullptr : &c); break; }
      case 5: s = graphsafe_context_destroy(GraphsafeContext{handle()}); break;
      case 6: { GraphsafeStream o; s = graphsafe_stream_create(GraphsafeContext{handle()}, null_out ? nullptr : &o); break; }
      case 7: { GraphsafeStream o; s = graphsafe_stream_adopt(GraphsafeContext{handle()}, scratch, null_out ? nullptr : &o); break; }
      case 8: { void* p; s = graphsafe_stream_raw(GraphsafeStream{handle()}, null_out ? nullptr : &p); break; }
      case 9: s = graphsafe_stream_synchronize(GraphsafeStream{handle()}); break;
      case 10: s = graphsafe_stream_destroy(GraphsafeStream{handle()}); break;
      case 11: { GraphsafeBuffer o; s = graphsafe_buffer_create(GraphsafeStream{handle()}, rng(), i32(), null_out ? nullptr : &o); break; }
      case 12: s = graphsafe_buffer_info(GraphsafeBuffer{handle()}, null_out ? nullptr : &u64, &u64); break;
      case 13: s = graphsafe_buffer_write(GraphsafeBuffer{handle()}, rng() % 64, null_out ? nullptr : scratch, rng() % 1024, GraphsafeStream{handle()}); break;
      case 14: s = graphsafe_buffer_read(GraphsafeBuffer{handle()}, rng() % 64, null_out ? nullptr : scratch, rng() % 1024, GraphsafeStream{handle()}); break;
      case 15: s = graphsafe_buffer_destroy(GraphsafeBuffer{handle()}); break;
      case 16: { GraphsafeWorkspace o; s = graphsafe_workspace_create(GraphsafeStream{handle()}, rng(), null_out ? nullptr : &o); break; }
      case 17: s = graphsafe_workspace_ensure_size(GraphsafeWorkspace{handle()}, rng(), GraphsafeStream{handle()}, null_out ? nullptr : &iv); break;
      case 18: s = graphsafe_workspace_info(GraphsafeWorkspace{handle()}, null_out ? nullptr : &u64, &u64); break;
      case 19: s = graphsafe_workspace_destroy(GraphsafeWorkspace{handle()}); break;
      case 20: { GraphsafeCapture o; s = graphsafe_capture_begin(GraphsafeStream{handle()}, i32(), null_out ? nullptr : &o); break; }
      case 21: s = graphsafe_capture_bind_workspace(GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}, null_out ? nullptr : &u64, &u64); break;
      case 22: s = graphsafe_capture_bind_buffer(GraphsafeCapture{handle()}, GraphsafeBuffer{handle()}, null_out ? nullptr : &u64); break;
      case 23: { GraphsafeGraph g; s = graphsafe_capture_end(GraphsafeCapture{handle()}, null_out ? nullptr : &g); break; }
      case 24: s = graphsafe_capture_destroy(GraphsafeCapture{handle()}); break;
      case 25: s = graphsafe_graph_node_count(GraphsafeGraph{handle()}, null_out ? nullptr : &u64); break;
      case 26: { GraphsafeGraphExec e; s = graphsafe_graph_instantiate(GraphsafeGraph{handle()}, null_out ? nullptr : &e); break; }
      case 27: s = graphsafe_graph_destroy(GraphsafeGraph{handle()}); break;
      case 28: s = graphsafe_graph_exec_launch(GraphsafeGraphExec{handle()}, GraphsafeStream{handle()}); break;
      case 29: s = graphsafe_graph_exec_upload(GraphsafeGraphExec{handle()}, GraphsafeStream{handle()}); break;
      case 30: s = graphsafe_graph_exec_destroy(GraphsafeGraphExec{handle()}); break;
      case 31: s = graphsafe_mla_plan(i32(), i32() % 4, i32(), i32(), i32(), i32(), i32(), i32() % 20, null_out ? nullptr : &plan); break;
      case 32: s = graphsafe_mla_worst_case(rng() % 2 ? 90 : 100, i32() % 3, 16 * int(rng() % 9), int(rng() % 5), int(rng() % 3000), 1 << int(rng() % 9), i32(), null_out ? nullptr : &plan); break;
      case 33: s = graphsafe_mla_decode(null_out ? nullptr : &args, GraphsafeWorkspace{handle()}, GraphsafeStream{handle()}, rng() % 2 ? nullptr : &plan); break;
      case 34: s = graphsafe_mla_decode_captured(null_out ? nullptr : &args, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}, rng() % 2 ? nullptr : &plan); break;
      case 35: s = graphsafe_cudnn_version(null_out ? nullptr : &iv, &iv, &iv); break;
      case 36: { GraphsafeCudnnMatmulArgs ca; std::memcpy(&ca, &args, sizeof ca < sizeof args ? sizeof ca : sizeof args); s = graphsafe_cudnn_plan(GraphsafeContext{handle()}, null_out ? nullptr : &ca, &u64); break; }
      case 37: { GraphsafeCudnnMatmulArgs ca; std::memcpy(&ca, &args, sizeof ca < sizeof args ? sizeof ca : sizeof args); s = graphsafe_cudnn_matmul(GraphsafeContext{handle()}, null_out ? nullptr : &ca, GraphsafeWorkspace{handle()}, GraphsafeStream{handle()}); break; }
      case 38: { GraphsafeCudnnMatmulArgs ca{}; s = graphsafe_cudnn_matmul_captured(GraphsafeContext{handle()}, null_out ? nullptr : &ca, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}); break; }
      case 39: { GraphsafeNvfp4Plan p; s = graphsafe_nvfp4_plan(i32(), i32(), i32(), i32(), i32() % 3, i32(), null_out ? nullptr : &p); break; }
      case 40: s = graphsafe_nvfp4_scale_bytes(i32(), i32(), null_out ? nullptr : &u64); break;
      case 41: { GraphsafeNvfp4Matrix q{rng(), rng(), rng(), i32(), i32()}; s = graphsafe_nvfp4_quantize(rng(), i32() % 3, i32(), i32(), int64_t(rng() % 100000), null_out ? nullptr : &q, GraphsafeStream{handle()}); break; }
      case 42: { GraphsafeNvfp4Matrix q{rng(), rng(), rng(), i32(), i32()}; GraphsafeBuffer o; s = graphsafe_nvfp4_prepare_weight(null_out ? nullptr : &q, GraphsafeStream{handle()}, &o); break; }
      case 43: { GraphsafeW4a16Args g{rng(), int64_t(rng() % 9000), GraphsafeBuffer{handle()}, i32(), i32(), rng(), rng(), int64_t(rng() % 9000), i32()}; s = graphsafe_nvfp4_w4a16_gemm(null_out ? nullptr : &g, GraphsafeWorkspace{handle()}, GraphsafeStream{handle()}); break; }
      case 44: { GraphsafeW4a16Args g{rng(), 0, GraphsafeBuffer{handle()}, i32(), i32(), rng(), rng(), 0, i32()}; s = graphsafe_nvfp4_w4a16_gemm_captured(null_out ? nullptr : &g, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}); break; }
      case 45: { GraphsafeNvfp4GemmArgs g{}; g.alpha = rng(); s = rng() % 2 ? graphsafe_nvfp4_gemm(null_out ? nullptr : &g, GraphsafeWorkspace{handle()}, GraphsafeStream{handle()}) : graphsafe_nvfp4_gemm_captured(null_out ? nullptr : &g, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}); break; }
      case 46: { GraphsafeNvfp4Matrix q{rng(), rng(), rng(), i32(), i32()}; s = graphsafe_nvfp4_quantize_captured(rng(), i32() % 3, i32(), i32(), int64_t(rng() % 100000), null_out ? nullptr : &q, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}); break; }
      case 47: s = graphsafe_mla_plan_kv(rng() % 2 ? 90 : i32(), i32() % 4, i32() % 4, 16 * int(rng() % 9), i32(), i32(), 1 << int(rng() % 9), i32(), i32() % 20, null_out ? nullptr : &plan); break;
      case 48: { GraphsafeMlaKvCache kv{i32() % 4, rng() % 2 ? 0 : rng()}; s = graphsafe_mla_decode_kv(null_out ? nullptr : &args, rng() % 3 ? &kv : nullptr, GraphsafeWorkspace{handle()}, GraphsafeStream{handle()}, rng() % 2 ? nullptr : &plan); break; }
      case 49: { GraphsafeMlaKvCache kv{i32() % 4, rng() % 2 ? 0 : rng()}; s = graphsafe_mla_decode_kv_captured(null_out ? nullptr : &args, rng() % 3 ? &kv : nullptr, GraphsafeCapture{handle()}, GraphsafeWorkspace{handle()}, rng() % 2 ? nullptr : &plan); break; }
      case 50: s = graphsafe_context_synchronize(GraphsafeContext{handle()}); break;
      default: s = (graphsafe_last_error() != nullptr && graphsafe_version() != nullptr && graphsafe_build_archs() != nullptr) ? 0 : -99; break;
    }
    ++calls;
    if (!known(s)) {
      ++bad;
      std::fprintf(stderr, "unknown status %d\n", s);
    }
    panics += s == GRAPHSAFE_ERROR_PANIC;
    if (s != 0 && graphsafe_last_error()[0] == '\0') {
      ++bad;
      std::fprintf(stderr, "status %d without error text\n", s);
    }
  }
  std::printf("capi_fuzz: %ld calls, %ld unknown or textless statuses, %ld panics caught\n", calls, bad, panics);
  bool ok = bad == 0 && panics == 0 && calls >= 10000;
  std::printf("capi_fuzz: %d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
  return ok ? 0 : 1;
}

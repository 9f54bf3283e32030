// The C ABI as a C++ engine uses it: links libgraphsafe.a through include/graphsafe.h.
//
// Without a GPU (CI): driver-absent statuses and texts, argument validation (null pointers, wrong,
// forged and destroyed handles, the fp8 KV-cache descriptions), and MLA planning answers (the fp8
// KV formats included). With a GPU (GRAPHSAFE_REQUIRE_GPU=1 makes a missing one a failure): an MLA
// decode captured through the C ABI, the workspace grown past it afterwards, replays compared with
// the eager result, double destroys, BUSY rules; on sm_90 the fp8 KV caches against bf16.
//
// Build: g++ -std=c++17 -Iinclude tests/capi/capi_test.cpp tests/capi/capi_test/*.cpp target/debug/libgraphsafe.a
//            -lstdc++ -ldl -lrt -lpthread -lm -o capi_test
//
// The parts live in tests/capi/capi_test/ (check.h: counters, macros and shared helpers).
#include "capi_test/check.h"

int main() {
  planning();
  kv_format_planning();
  nvfp4_and_cudnn_planning();
  bad_handles();
  kv_format_decode_refusals();
  int n = 0;
  int st = graphsafe_device_count(&n);
  const char* req = std::getenv("GRAPHSAFE_REQUIRE_GPU");
  bool require = req != nullptr && std::strcmp(req, "1") == 0;
  if (st == GRAPHSAFE_OK && n > 0) {
    gpu(n);
  } else if (require) {
    std::fprintf(stderr, "FAILED: GRAPHSAFE_REQUIRE_GPU=1 but no GPU: %s\n", graphsafe_last_error());
    ++g_failures;
  } else {
    std::string why = graphsafe_last_error();
    no_driver();
    std::printf("SKIP: GPU part (%s)\n", why.c_str());
  }
  std::printf("capi_test: %d passed, %d failed\n", g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}

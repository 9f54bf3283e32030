// What every part of tests/capi/capi_test.cpp shares: the check counters and macros, and the
// helpers of the GPU parts (bf16 conversion, upload, a buffer's address, capture-and-compare).
#pragma once
#include "graphsafe.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// One count for the whole program (C++17 inline variables: every file of it shares them).
inline int g_checks = 0, g_failures = 0;

#define CHECK(cond)                                                                               \
  do {                                                                                            \
    ++g_checks;                                                                                   \
    if (!(cond)) {                                                                                \
      ++g_failures;                                                                               \
      std::fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,    \
                   graphsafe_last_error());                                                       \
    }                                                                                             \
  } while (0)

#define CHECK_STATUS(call, status) CHECK((call) == (status))

inline bool last_error_mentions(const char* needle) { return std::strstr(graphsafe_last_error(), needle) != nullptr; }

#define OK(call) CHECK_STATUS(call, GRAPHSAFE_OK)

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

inline float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Captures `launch` (after binding ws) and checks 10 replays reproduce `out` as the eager call left it.
template <class Eager, class Captured>
void capture_and_compare(GraphsafeStream stream, GraphsafeWorkspace ws, GraphsafeBuffer out, size_t out_bytes,
                                const char* what, Eager eager, Captured captured) {
  OK(eager());
  std::vector<unsigned char> want(out_bytes), got(out_bytes), zeros(out_bytes, 0);
  OK(graphsafe_buffer_read(out, 0, want.data(), out_bytes, stream));
  GraphsafeCapture cap{};
  OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
  OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
  OK(graphsafe_capture_bind_buffer(cap, out, nullptr));
  OK(captured(cap));
  GraphsafeGraph g{};
  OK(graphsafe_capture_end(cap, &g));
  GraphsafeGraphExec e{};
  OK(graphsafe_graph_instantiate(g, &e));
  OK(graphsafe_graph_destroy(g));
  uint64_t cap_bytes = 0;
  OK(graphsafe_workspace_info(ws, &cap_bytes, nullptr));
  OK(graphsafe_workspace_ensure_size(ws, cap_bytes * 2 + (1 << 20), stream, nullptr));  // retire it
  int same = 0;
  for (int i = 0; i < 10; ++i) {
    OK(graphsafe_buffer_write(out, 0, zeros.data(), out_bytes, stream));
    OK(graphsafe_graph_exec_launch(e, stream));
    OK(graphsafe_buffer_read(out, 0, got.data(), out_bytes, stream));
    same += got == want;
  }
  CHECK(same == 10);
  size_t nonzero = 0;
  for (unsigned char b : want) nonzero += b != 0;
  CHECK(nonzero > out_bytes / 4);
  std::printf("%s through the C ABI: captured, workspace grown after, %d/10 replays identical to eager\n", what, same);
  OK(graphsafe_graph_exec_destroy(e));
}

inline GraphsafeBuffer upload(GraphsafeStream stream, const void* data, size_t bytes) {
  GraphsafeBuffer b{};
  OK(graphsafe_buffer_create(stream, bytes, 0, &b));
  OK(graphsafe_buffer_write(b, 0, data, bytes, stream));
  return b;
}

inline uint64_t addr(GraphsafeBuffer b) {
  uint64_t p = 0;
  OK(graphsafe_buffer_info(b, &p, nullptr));
  return p;
}

// The parts of the program, one file each under tests/capi/capi_test/ (main in capi_test.cpp).
void planning();
void kv_format_planning();
void kv_format_decode_refusals();
void nvfp4_and_cudnn_planning();
void bad_handles();
void no_driver();
void gpu(int device_count);
void fp8_kv_caches(GraphsafeStream stream, const GraphsafeDeviceInfo& info, int H);
void cudnn_and_w4a16(GraphsafeContext ctx, GraphsafeStream stream, const GraphsafeDeviceInfo& info);

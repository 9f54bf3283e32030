// The C ABI as a C++ engine uses it: links libgraphsafe.a through include/graphsafe.h.
//
// Without a GPU (CI): driver-absent statuses and texts, argument validation (null pointers, wrong,
// forged and destroyed handles, the fp8 KV-cache descriptions), and MLA planning answers (the fp8
// KV formats included). With a GPU (GRAPHSAFE_REQUIRE_GPU=1 makes a missing one a failure): an MLA
// decode captured through the C ABI, the workspace grown past it afterwards, replays compared with
// the eager result, double destroys, BUSY rules; on sm_90 the fp8 KV caches against bf16.
//
// Build: g++ -std=c++17 -Iinclude tests/capi/capi_test.cpp target/debug/libgraphsafe.a
//            -lstdc++ -ldl -lrt -lpthread -lm -o capi_test
#include "graphsafe.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int g_checks = 0, g_failures = 0;

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

static bool last_error_mentions(const char* needle) { return std::strstr(graphsafe_last_error(), needle) != nullptr; }

static void planning() {
  GraphsafeMlaPlan p{};
  // sm100 workspace = CUTLASS's part (2052 * 128 * splits * batch for splits > 1) + the sanitize
  // region: 256 (lengths) + 256 (kernel lengths) + 4 * batch * columns (page table, columns =
  // 512 tiles * 128 / 64) + 512 (LSE scratch, splits > 1), each rounded up to 256.
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 1, 65536, 64, 148, 0, &p), GRAPHSAFE_OK);
  CHECK(p.num_splits == 16);
  CHECK(p.workspace_bytes == 2052ull * 128 * 16 + 256 + 256 + 4 * 1024 + 512);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_FP8_E4M3, 128, 8, 65536, 64, 148, 0, &p), GRAPHSAFE_OK);
  CHECK(p.num_splits == 1 && p.workspace_bytes == 256 + 256 + 4ull * 8 * 1024);
  // Split-KV with batch > 1 is refused on sm100 (CUTLASS 4.2 hangs there).
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 2, 65536, 64, 148, 2, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("num_splits"));
  // Fewer heads on sm100: padded to CUTLASS's 128 in the workspace, which the plan counts. One
  // request of one token still splits (8 tiles): CUTLASS's part, then lengths, kernel lengths, page
  // table, LSE staging [1, 128], q staging [1, 128, 576] bf16, out staging [1, 128, 512].
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 64, 1, 1024, 64, 148, 0, &p), GRAPHSAFE_OK);
  CHECK(p.num_splits == 8 && p.workspace_bytes == 2052ull * 128 * 8 + 256 + 256 + 256 + 512 + 128 * 576 * 2 + 128 * 512 * 2);
  {
    // s_q tokens on sm100: batch x s_q kernel requests of one token (one split for more than one).
    GraphsafeMlaLimits l{};
    l.arch = GRAPHSAFE_ARCH_SM100;
    l.dtype = GRAPHSAFE_DTYPE_BF16;
    l.num_heads = 16;
    l.s_q = 2;
    l.batch = 64;
    l.max_seq_len = 1000;
    l.page_size = 64;
    l.sm_count = 148;
    CHECK_STATUS(graphsafe_mla_plan_limits(&l, &p), GRAPHSAFE_OK);
    CHECK(p.num_splits == 1 && p.workspace_bytes == 512 + 512 + 4ull * 128 * 16 + 4ull * 128 * 128 + 128ull * 128 * 576 * 2 + 128ull * 128 * 512 * 2);
    l.batch = 32768;  // 65536 kernel requests: one more than CUTLASS's grid takes
    CHECK_STATUS(graphsafe_mla_plan_limits(&l, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    CHECK(last_error_mentions("batch x s_q"));
  }
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 1, 1024, 48, 148, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("page_size"));
  // The limits the decode accepts: batch <= 65535, max_seq_len <= 2^31 - 128.
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 65536, 4096, 64, 148, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("65535"));
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 128, 1, 2147483521, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("max_seq_len"));
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_OK);
  CHECK(p.num_splits == 64);  // 2 waves of 132 SMs, capped by 64 tiles
  CHECK(p.workspace_bytes > 0);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 1, 4096, 32, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_FP8_E4M3, 16, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_mla_plan(80, GRAPHSAFE_DTYPE_BF16, 128, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("arch"));
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, 7, 128, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 128, 0, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("batch"));
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 128, 1, -5, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 128, 1, 4096, 64, 132, 0, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  GraphsafeMlaPlan w{};
  // 16 splits from 2048 tokens on; the longest length has the largest page table.
  CHECK_STATUS(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 128, 65536, 64, 148, &w), GRAPHSAFE_OK);
  CHECK(w.workspace_bytes == 2052ull * 128 * 16 + 256 + 256 + 4 * 1024 + 512 && w.worst_batch == 1 &&
        w.worst_seq_len == 65536 && w.num_splits == 16);
  // The largest accepted inputs answer at once (the planner scans a bounded set of shapes). On
  // sm100 batch x page-table columns must fit int32 (CUTLASS's page-table stride): with 128-token
  // pages that is batch 128 at the longest length, and 4194176 tokens at the largest batch.
  CHECK_STATUS(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 128, 2147483520, 128, 148, &w), GRAPHSAFE_OK);
  CHECK_STATUS(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 65535, 4194176, 128, 148, &w), GRAPHSAFE_OK);
  CHECK_STATUS(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 129, 2147483520, 128, 148, &w), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("page-table columns"));
  CHECK_STATUS(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 65535, 2147483520, 64, 132, &w), GRAPHSAFE_OK);
  CHECK(w.workspace_bytes > 0);
}

// The fp8 KV-cache formats (sm_90 only, bf16 q, every head count sm_90 takes): the same splits and
// workspace as a bf16 cache, and everything else refused naming the argument.
static void kv_format_planning() {
  for (int heads : {16, 32, 48, 64, 128}) {  // 48..128: the M64 kernel
    for (int format : {GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, GRAPHSAFE_MLA_KV_FP8_DS_MLA}) {
      for (int batch : {1, 8, 64}) {
        GraphsafeMlaPlan bf16{}, fp8{};
        CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, heads, batch, 65536, 64, 132, 0, &bf16), GRAPHSAFE_OK);
        CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, format, heads, batch, 65536, 64, 132, 0, &fp8), GRAPHSAFE_OK);
        CHECK(fp8.num_splits == bf16.num_splits && fp8.workspace_bytes == bf16.workspace_bytes);
        CHECK(fp8.worst_batch == batch && fp8.worst_seq_len == 65536);
      }
    }
  }
  GraphsafeMlaPlan p{}, q{};
  // The native format is graphsafe_mla_plan, on both back-ends (sm_100's fp8 q and KV included).
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_FP8_E4M3, GRAPHSAFE_MLA_KV_NATIVE, 128, 8, 65536, 64, 148, 0, &p), GRAPHSAFE_OK);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_FP8_E4M3, 128, 8, 65536, 64, 148, 0, &q), GRAPHSAFE_OK);
  CHECK(p.num_splits == q.num_splits && p.workspace_bytes == q.workspace_bytes);
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_MLA_KV_NATIVE, 64, 4, 4096, 128, 132, 0, &p), GRAPHSAFE_OK);
  CHECK_STATUS(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_FP16, 64, 4, 4096, 128, 132, 0, &q), GRAPHSAFE_OK);
  CHECK(p.num_splits == q.num_splits && p.workspace_bytes == q.workspace_bytes);
  // Refused: a head count outside 1..=128 (every count in it runs since the sm90 kernel took any),
  // fp16 (or fp8) q, sm_100, an unknown format, a null out.
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 0, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("num_heads"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_DS_MLA, 144, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("num_heads"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 16, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("dtype"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_FP8_E4M3, GRAPHSAFE_MLA_KV_FP8_DS_MLA, 16, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("dtype"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 128, 1, 4096, 64, 148, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_format") && last_error_mentions("sm_100"));
  CHECK_STATUS(graphsafe_mla_plan_kv(103, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_DS_MLA, 16, 1, 4096, 64, 148, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_format"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 7, 16, 1, 4096, 64, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_format"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 16, 1, 4096, 32, 132, 0, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("page_size"));
  CHECK_STATUS(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 16, 1, 4096, 64, 132, 0, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES == 656);
}

// graphsafe_mla_decode_kv's refusals that need no device: the KV-cache description and what every
// back-end refuses with an fp8 format are checked before any handle is looked up (the handles
// here are forged), so the status names the argument, not the handle.
static void kv_format_decode_refusals() {
  GraphsafeStream forged_stream{(2ull << 56) | (1ull << 32) | 12345};
  GraphsafeWorkspace forged_ws{(3ull << 56) | (1ull << 32) | 12345};
  GraphsafeCapture forged_cap{(4ull << 56) | (1ull << 32) | 12345};
  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = 1;
  a.num_heads = 16;
  GraphsafeMlaKvCache per_tensor{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 0x7f0000001000ull};
  GraphsafeMlaKvCache ds_mla{GRAPHSAFE_MLA_KV_FP8_DS_MLA, 0};
  CHECK_STATUS(graphsafe_mla_decode_kv(nullptr, &per_tensor, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(last_error_mentions("args"));
  CHECK_STATUS(graphsafe_mla_decode_kv_captured(nullptr, &ds_mla, forged_cap, forged_ws, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(last_error_mentions("args"));
  GraphsafeMlaKvCache bad{7, 0};
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, &bad, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_format"));
  CHECK_STATUS(graphsafe_mla_decode_kv_captured(&a, &bad, forged_cap, forged_ws, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_format"));
  GraphsafeMlaKvCache no_scale{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 0};
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, &no_scale, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(last_error_mentions("kv_scale"));
  CHECK_STATUS(graphsafe_mla_decode_kv_captured(&a, &no_scale, forged_cap, forged_ws, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(last_error_mentions("kv_scale"));
  GraphsafeMlaKvCache stray_scale{GRAPHSAFE_MLA_KV_FP8_DS_MLA, 0x7f0000001000ull};
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, &stray_scale, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_scale"));
  for (const GraphsafeMlaKvCache* kv : {&per_tensor, &ds_mla}) {
    // 64 heads take an fp8 cache too (the M64 kernel): the call gets as far as the handles.
    GraphsafeMlaDecodeArgs h = a;
    h.num_heads = 64;
    CHECK_STATUS(graphsafe_mla_decode_kv(&h, kv, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
    CHECK_STATUS(graphsafe_mla_decode_kv_captured(&h, kv, forged_cap, forged_ws, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
    GraphsafeMlaDecodeArgs d = a;
    d.dtype = GRAPHSAFE_DTYPE_FP16;
    CHECK_STATUS(graphsafe_mla_decode_kv(&d, kv, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    CHECK(last_error_mentions("dtype"));
  }
  // A well-described cache gets as far as the handles (a null kv is the native format).
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, &per_tensor, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, &ds_mla, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_mla_decode_kv(&a, nullptr, forged_ws, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_mla_decode_kv_captured(&a, &per_tensor, forged_cap, forged_ws, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
}

static void nvfp4_and_cudnn_planning() {
  GraphsafeNvfp4Plan p{};
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM100, 1, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 148, &p), GRAPHSAFE_OK);
  CHECK(p.tile_m == 128 && p.tile_n == 128 && p.tile_k == 256 && p.cluster_m == 1 && p.prepared_weight_bytes == 0);
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM100, 4096, 8192, 8192, GRAPHSAFE_DTYPE_FP16, 148, &p), GRAPHSAFE_OK);
  CHECK(p.tile_m == 256 && p.tile_n == 256 && p.cluster_m == 2);
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM120, 300, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 170, &p), GRAPHSAFE_OK);
  CHECK(p.tile_m == 256 && p.tile_n == 128 && p.tile_k == 128);
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, 16, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &p), GRAPHSAFE_OK);
  CHECK(p.tile_m == 0 && p.prepared_weight_bytes >= 8192ull * 8192 / 2);
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM100, 16, 8192, 48, GRAPHSAFE_DTYPE_BF16, 148, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("k"));
  CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, 16, 8192, 8192, GRAPHSAFE_DTYPE_FP16, 132, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_nvfp4_plan(80, 16, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &p), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  // The pre-grow over the batch sizes an engine captures: at least each one's own plan.
  const int ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int sms = 0, worst_m = 0;
  CHECK_STATUS(graphsafe_gpu_sm_count("H200", &sms), GRAPHSAFE_OK);
  CHECK(sms == 132);
  CHECK_STATUS(graphsafe_gpu_sm_count("H300", &sms), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("B200"));
  GraphsafeNvfp4Plan worst{};
  // A 28672 x 8192 weight: stream-K at m 1 needs its fixup's workspace, larger M none.
  CHECK_STATUS(graphsafe_nvfp4_worst_case(GRAPHSAFE_ARCH_SM90, ms, 9, 28672, 8192, GRAPHSAFE_DTYPE_BF16, 132, &worst, &worst_m), GRAPHSAFE_OK);
  bool listed = false;
  for (int m : ms) {
    CHECK_STATUS(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, m, 28672, 8192, GRAPHSAFE_DTYPE_BF16, 132, &p), GRAPHSAFE_OK);
    CHECK(p.workspace_bytes <= worst.workspace_bytes);
    listed = listed || (m == worst_m && p.workspace_bytes == worst.workspace_bytes);
  }
  CHECK(listed && worst.workspace_bytes > 0);
  CHECK_STATUS(graphsafe_nvfp4_worst_case(GRAPHSAFE_ARCH_SM90, ms, 0, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &worst, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  uint64_t sb = 0;
  CHECK_STATUS(graphsafe_nvfp4_scale_bytes(300, 96, &sb), GRAPHSAFE_OK);
  CHECK(sb == 384 * 8);
  // round_up(2147483521, 128) * round_up(1, 4): past int32, computed without wrapping.
  CHECK_STATUS(graphsafe_nvfp4_scale_bytes(2147483521, 16, &sb), GRAPHSAFE_OK);
  CHECK(sb == 8589934592ull);
  int ma = 0, mi = 0, pa = 0;
  int st = graphsafe_cudnn_version(&ma, &mi, &pa);
  CHECK(st == GRAPHSAFE_OK || st == GRAPHSAFE_ERROR_CUDNN_NOT_FOUND);
  CHECK(st != GRAPHSAFE_OK || ma >= 9);
  CHECK_STATUS(graphsafe_cudnn_version(nullptr, &mi, &pa), GRAPHSAFE_ERROR_NULL_POINTER);
}

static void bad_handles() {
  GraphsafeContext zero_ctx{0};
  GraphsafeStream forged_stream{(2ull << 56) | (1ull << 32) | 12345};
  GraphsafeWorkspace wrong_type{(2ull << 56) | (1ull << 32)};  // a stream id passed as a workspace
  CHECK_STATUS(graphsafe_context_destroy(zero_ctx), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK(last_error_mentions("context"));
  CHECK_STATUS(graphsafe_context_synchronize(zero_ctx), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_stream_destroy(forged_stream), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_stream_synchronize(forged_stream), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_workspace_destroy(wrong_type), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_workspace_ensure_size(wrong_type, 1, forged_stream, nullptr), GRAPHSAFE_ERROR_INVALID_HANDLE);
  GraphsafeCapture cap{};
  CHECK_STATUS(graphsafe_capture_begin(forged_stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_capture_begin(forged_stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK_STATUS(graphsafe_capture_begin(forged_stream, 9, &cap), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(graphsafe_capture_end(cap, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  GraphsafeGraph g{};
  CHECK_STATUS(graphsafe_capture_end(cap, &g), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_graph_exec_destroy(GraphsafeGraphExec{~0ull}), GRAPHSAFE_ERROR_INVALID_HANDLE);
  CHECK_STATUS(graphsafe_mla_decode(nullptr, wrong_type, forged_stream, nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
  CHECK(graphsafe_version() != nullptr && std::strlen(graphsafe_version()) > 0);
  CHECK(graphsafe_build_archs() != nullptr);
}

static void no_driver() {
  int n = -1;
  CHECK_STATUS(graphsafe_device_count(&n), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  CHECK(last_error_mentions("libcuda.so.1"));
  GraphsafeContext c{};
  CHECK_STATUS(graphsafe_context_create(0, &c), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  int major = 0, minor = 0;
  CHECK_STATUS(graphsafe_driver_version(&major, &minor), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  CHECK_STATUS(graphsafe_device_count(nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
}

// ---- GPU part -----------------------------------------------------------------------------------

static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

#define OK(call) CHECK_STATUS(call, GRAPHSAFE_OK)

// Captures `launch` (after binding ws) and checks 10 replays reproduce `out` as the eager call left it.
template <class Eager, class Captured>
static void capture_and_compare(GraphsafeStream stream, GraphsafeWorkspace ws, GraphsafeBuffer out, size_t out_bytes,
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

static GraphsafeBuffer upload(GraphsafeStream stream, const void* data, size_t bytes) {
  GraphsafeBuffer b{};
  OK(graphsafe_buffer_create(stream, bytes, 0, &b));
  OK(graphsafe_buffer_write(b, 0, data, bytes, stream));
  return b;
}

static uint64_t addr(GraphsafeBuffer b) {
  uint64_t p = 0;
  OK(graphsafe_buffer_info(b, &p, nullptr));
  return p;
}

static void cudnn_and_w4a16(GraphsafeContext ctx, GraphsafeStream stream, const GraphsafeDeviceInfo& info);
static void fp8_kv_caches(GraphsafeStream stream, const GraphsafeDeviceInfo& info, int H);

static void gpu(int device_count) {
  GraphsafeContext ctx{};
  OK(graphsafe_context_create(0, &ctx));
  GraphsafeDeviceInfo info{};
  OK(graphsafe_device_info(0, &info));
  std::printf("GPU 0: %s, sm_%d%d, %d SMs (%d device(s))\n", info.name, info.cc_major, info.cc_minor, info.sm_count, device_count);
  GraphsafeStream stream{};
  OK(graphsafe_stream_create(ctx, &stream));

  const int B = 4, H = 128, PAGE = 64, MAX_SEQ = 1024, MAX_PAGES = MAX_SEQ / PAGE, PAGES = B * MAX_PAGES;
  const int seq_lens[B] = {1024, 1, 333, 700};
  std::vector<uint16_t> q(size_t(B) * H * 576), kv(size_t(PAGES) * PAGE * 576);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = to_bf16(float((i * 104729) % 997) / 498.f - 1.f);
  std::vector<int> pt(size_t(B) * MAX_PAGES);
  for (int i = 0; i < B * MAX_PAGES; ++i) pt[i] = (i % MAX_PAGES) * B + i / MAX_PAGES;  // interleaved pages

  GraphsafeBuffer bq{}, bkv{}, bsl{}, bpt{}, bout{};
  OK(graphsafe_buffer_create(stream, q.size() * 2, 0, &bq));
  OK(graphsafe_buffer_create(stream, kv.size() * 2, 0, &bkv));
  OK(graphsafe_buffer_create(stream, sizeof seq_lens, 0, &bsl));
  OK(graphsafe_buffer_create(stream, pt.size() * 4, 0, &bpt));
  OK(graphsafe_buffer_create(stream, size_t(B) * H * 512 * 2, 1, &bout));
  OK(graphsafe_buffer_write(bq, 0, q.data(), q.size() * 2, stream));
  OK(graphsafe_buffer_write(bkv, 0, kv.data(), kv.size() * 2, stream));
  OK(graphsafe_buffer_write(bsl, 0, seq_lens, sizeof seq_lens, stream));
  OK(graphsafe_buffer_write(bpt, 0, pt.data(), pt.size() * 4, stream));
  CHECK_STATUS(graphsafe_buffer_write(bq, 8, q.data(), q.size() * 2, stream), GRAPHSAFE_ERROR_INVALID_ARGUMENT);  // past the end

  uint64_t pq, pkv, psl, ppt, pout;
  OK(graphsafe_buffer_info(bq, &pq, nullptr));
  OK(graphsafe_buffer_info(bkv, &pkv, nullptr));
  OK(graphsafe_buffer_info(bsl, &psl, nullptr));
  OK(graphsafe_buffer_info(bpt, &ppt, nullptr));
  OK(graphsafe_buffer_info(bout, &pout, nullptr));
  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = B;
  a.num_heads = H;
  a.q_nope = pq;
  a.q_nope_stride_batch = H * 576;
  a.q_nope_stride_head = 576;
  a.q_pe = pq + 1024;  // rope part of each 576-wide q row
  a.q_pe_stride_batch = H * 576;
  a.q_pe_stride_head = 576;
  a.kv_cache = pkv;
  a.num_pages = PAGES;
  a.page_size = PAGE;
  a.seq_lens = psl;
  a.page_table = ppt;
  a.max_pages = MAX_PAGES;
  a.out = pout;
  a.out_stride_batch = H * 512;
  a.out_stride_head = 512;
  a.sm_scale = 1.f / std::sqrt(192.f);
  a.max_seq_len = MAX_SEQ;
  a.num_splits = 0;

  int arch = info.cc_major == 10 ? GRAPHSAFE_ARCH_SM100 : GRAPHSAFE_ARCH_SM90;
  GraphsafeMlaPlan plan{};
  OK(graphsafe_mla_plan(arch, GRAPHSAFE_DTYPE_BF16, H, B, MAX_SEQ, a.page_size, info.sm_count, 0, &plan));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, plan.workspace_bytes, &ws));

  // Eager reference result.
  GraphsafeMlaPlan ran{};
  int st = graphsafe_mla_decode(&a, ws, stream, &ran);
  if (st == GRAPHSAFE_ERROR_ARCH_UNSUPPORTED) {
    std::printf("SKIP: MLA decode has no kernel here (%s)\n", graphsafe_last_error());
    return;
  }
  CHECK_STATUS(st, GRAPHSAFE_OK);
  CHECK(ran.num_splits == plan.num_splits && ran.workspace_bytes == plan.workspace_bytes);
  std::vector<uint16_t> eager(size_t(B) * H * 512), got(eager.size());
  OK(graphsafe_buffer_read(bout, 0, eager.data(), eager.size() * 2, stream));
  size_t nonzero = 0;
  for (uint16_t v : eager) nonzero += v != 0;
  CHECK(nonzero > eager.size() / 2);

  // Capture through the C ABI.
  GraphsafeCapture cap{};
  OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
  CHECK_STATUS(graphsafe_stream_synchronize(stream), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_stream_destroy(stream), GRAPHSAFE_ERROR_BUSY);
  GraphsafeCapture cap2{};
  CHECK_STATUS(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap2), GRAPHSAFE_ERROR_BUSY);
  uint64_t wptr = 0, wcap = 0;
  OK(graphsafe_capture_bind_workspace(cap, ws, &wptr, &wcap));
  CHECK(wcap >= plan.workspace_bytes);
  for (GraphsafeBuffer b : {bq, bkv, bsl, bpt, bout}) OK(graphsafe_capture_bind_buffer(cap, b, nullptr));
  // The bound workspace can neither grow nor be destroyed; eager work on the stream is refused.
  CHECK_STATUS(graphsafe_workspace_ensure_size(ws, wcap * 4 + (1 << 20), stream, nullptr), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_workspace_destroy(ws), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_mla_decode(&a, ws, stream, nullptr), GRAPHSAFE_ERROR_BUSY);
  OK(graphsafe_mla_decode_captured(&a, cap, ws, nullptr));
  GraphsafeGraph graph{};
  OK(graphsafe_capture_end(cap, &graph));
  CHECK_STATUS(graphsafe_capture_end(cap, &graph), GRAPHSAFE_ERROR_INVALID_HANDLE);  // consumed
  uint64_t nodes = 0;
  OK(graphsafe_graph_node_count(graph, &nodes));
  CHECK(nodes >= 1);
  GraphsafeGraphExec exec{};
  OK(graphsafe_graph_instantiate(graph, &exec));
  OK(graphsafe_graph_destroy(graph));
  CHECK_STATUS(graphsafe_graph_destroy(graph), GRAPHSAFE_ERROR_INVALID_HANDLE);  // double destroy

  // An output given only by its raw address (read with graphsafe_buffer_info), never bound: the
  // address lies in a graphsafe buffer, so the capture keeps that buffer alive like a bound one.
  // The caller then destroys its handle; no new buffer may get that memory while the executable
  // lives, and the replay writes into it, not into whoever would have been given it.
  {
    GraphsafeBuffer bout2{};
    OK(graphsafe_buffer_create(stream, eager.size() * 2, 1, &bout2));
    uint64_t pout2 = 0, n2 = 0;
    OK(graphsafe_buffer_info(bout2, &pout2, &n2));
    GraphsafeMlaDecodeArgs a2 = a;
    a2.out = pout2;
    GraphsafeCapture c2{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &c2));
    OK(graphsafe_capture_bind_workspace(c2, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_captured(&a2, c2, ws, nullptr));
    GraphsafeGraph g2{};
    OK(graphsafe_capture_end(c2, &g2));
    GraphsafeGraphExec e2{};
    OK(graphsafe_graph_instantiate(g2, &e2));
    OK(graphsafe_graph_destroy(g2));
    OK(graphsafe_buffer_destroy(bout2));
    std::vector<GraphsafeBuffer> fresh(8);
    int overlapping = 0;
    for (auto& f : fresh) {
      OK(graphsafe_buffer_create(stream, n2, 0, &f));
      uint64_t p = 0;
      OK(graphsafe_buffer_info(f, &p, nullptr));
      overlapping += p < pout2 + n2 && pout2 < p + n2;
    }
    CHECK(overlapping == 0);
    OK(graphsafe_graph_exec_launch(e2, stream));
    OK(graphsafe_stream_synchronize(stream));
    for (auto f : fresh) OK(graphsafe_buffer_destroy(f));
    OK(graphsafe_graph_exec_destroy(e2));
    std::printf("an unbound raw output address inside a graphsafe buffer: kept by the executable (%d of 8 new buffers overlap it)\n", overlapping);
  }

  // Grow (retire) the workspace and drop graphsafe's handles to the inputs: the executable keeps
  // both alive. Then replay.
  int grew = 0;
  OK(graphsafe_workspace_ensure_size(ws, wcap * 4 + (64 << 20), stream, &grew));
  CHECK(grew == 1);
  OK(graphsafe_buffer_destroy(bq));
  OK(graphsafe_buffer_destroy(bkv));
  CHECK_STATUS(graphsafe_buffer_destroy(bkv), GRAPHSAFE_ERROR_INVALID_HANDLE);
  GraphsafeBuffer churn{};
  OK(graphsafe_buffer_create(stream, kv.size() * 2, 0, &churn));  // likely reuses a freed block if any
  int same = 0;
  for (int i = 0; i < 20; ++i) {
    std::vector<uint16_t> zeros(got.size(), 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), zeros.size() * 2, stream));
    OK(graphsafe_graph_exec_launch(exec, stream));
    OK(graphsafe_buffer_read(bout, 0, got.data(), got.size() * 2, stream));
    same += got == eager;
  }
  CHECK(same == 20);
  std::printf("capture/grow/replay through the C ABI: %d/20 replays identical to eager (%d splits, %llu workspace bytes)\n", same,
              plan.num_splits, (unsigned long long)plan.workspace_bytes);

  OK(graphsafe_graph_exec_destroy(exec));
  CHECK_STATUS(graphsafe_graph_exec_destroy(exec), GRAPHSAFE_ERROR_INVALID_HANDLE);
  if (info.cc_major == 9) {
    for (int heads : {16, 32, 128}) fp8_kv_caches(stream, info, heads);
  }
  cudnn_and_w4a16(ctx, stream, info);
  OK(graphsafe_buffer_destroy(churn));
  for (GraphsafeBuffer b : {bsl, bpt, bout}) OK(graphsafe_buffer_destroy(b));
  OK(graphsafe_workspace_destroy(ws));
  OK(graphsafe_stream_destroy(stream));
  OK(graphsafe_context_destroy(ctx));
  CHECK_STATUS(graphsafe_context_destroy(ctx), GRAPHSAFE_ERROR_INVALID_HANDLE);
}

static float bf16_value(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The e4m3 code of `v`, which must be exactly representable (the values below are k/32 .. k/4).
static uint8_t e4m3_code(float v) {
  for (int c = 0; c < 256; ++c) {
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) continue;  // NaN
    float mag = e == 0 ? m / 8.f * std::ldexp(1.f, -6) : (1.f + m / 8.f) * std::ldexp(1.f, e - 7);
    if ((c & 0x80 ? -mag : mag) == v) return uint8_t(c);
  }
  std::fprintf(stderr, "FAILED: %g has no e4m3 code\n", v);
  ++g_failures;
  return 0;
}

// sm_90's fp8 KV caches through graphsafe_mla_decode_kv (H: 16, 32 (the N kernel) or 128 heads (M64, whose
// native counterpart is the seesaw kernel)): the same K/V values stored as bf16
// (native), as per-tensor fp8 with scale 0.5 and as DeepSeek V3.2 tokens with group scales
// 0.25..2, all exact, give outputs within bf16 rounding of one another; the per-tensor decode
// captured and replayed after the workspace grew equals eager, and a replay reads the scale when
// it runs (a new scale written between replays gives the eager result for that scale).
static void fp8_kv_caches(GraphsafeStream stream, const GraphsafeDeviceInfo& info, int H) {
  const int B = 2, PAGE = 64, MAX_SEQ = 512, MAX_PAGES = MAX_SEQ / PAGE, PAGES = B * MAX_PAGES;
  const size_t TOKENS = size_t(PAGES) * PAGE;
  const int seq_lens[B] = {512, 77};
  std::vector<uint16_t> q(size_t(B) * H * 576), kv_bf16(TOKENS * 576);
  std::vector<uint8_t> kv_fp8(TOKENS * 576), kv_ds(TOKENS * GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  const float group_scales[4] = {0.25f, 0.5f, 1.f, 2.f};
  for (size_t t = 0; t < TOKENS; ++t) {
    uint8_t* tok = &kv_ds[t * GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES];
    float s[4];
    for (int g = 0; g < 4; ++g) s[g] = group_scales[(t + g) % 4];
    std::memcpy(tok + 512, s, 16);
    for (int d = 0; d < 576; ++d) {
      float v = float(int((t * 577 + d * 131) % 33) - 16) / 16.f;  // k/16, k in -16..16: exact in bf16 and e4m3
      kv_bf16[t * 576 + d] = to_bf16(v);
      kv_fp8[t * 576 + d] = e4m3_code(v / 0.5f);
      if (d < 512) {
        tok[d] = e4m3_code(v / s[d / 128]);
      } else {
        uint16_t r = to_bf16(v);
        std::memcpy(tok + 528 + 2 * (d - 512), &r, 2);
      }
    }
  }
  std::vector<int> pt(size_t(B) * MAX_PAGES);
  for (int i = 0; i < B * MAX_PAGES; ++i) pt[i] = (i % MAX_PAGES) * B + i / MAX_PAGES;
  const float half = 0.5f;
  GraphsafeBuffer bq = upload(stream, q.data(), q.size() * 2), bkv = upload(stream, kv_bf16.data(), kv_bf16.size() * 2);
  GraphsafeBuffer bfp8 = upload(stream, kv_fp8.data(), kv_fp8.size()), bds = upload(stream, kv_ds.data(), kv_ds.size());
  GraphsafeBuffer bsl = upload(stream, seq_lens, sizeof seq_lens), bpt = upload(stream, pt.data(), pt.size() * 4);
  GraphsafeBuffer bscale = upload(stream, &half, 4), bout{};
  const size_t out_bytes = size_t(B) * H * 512 * 2;
  OK(graphsafe_buffer_create(stream, out_bytes, 1, &bout));

  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = B;
  a.num_heads = H;
  a.q_nope = addr(bq);
  a.q_nope_stride_batch = H * 576;
  a.q_nope_stride_head = 576;
  a.q_pe = addr(bq) + 1024;
  a.q_pe_stride_batch = H * 576;
  a.q_pe_stride_head = 576;
  a.kv_cache = addr(bkv);
  a.num_pages = PAGES;
  a.page_size = PAGE;
  a.seq_lens = addr(bsl);
  a.page_table = addr(bpt);
  a.max_pages = MAX_PAGES;
  a.out = addr(bout);
  a.out_stride_batch = H * 512;
  a.out_stride_head = 512;
  a.sm_scale = 1.f / std::sqrt(192.f);
  a.max_seq_len = MAX_SEQ;
  GraphsafeMlaDecodeArgs a_fp8 = a, a_ds = a;
  a_fp8.kv_cache = addr(bfp8);
  a_ds.kv_cache = addr(bds);
  const GraphsafeMlaKvCache per_tensor{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, addr(bscale)}, ds_mla{GRAPHSAFE_MLA_KV_FP8_DS_MLA, 0};

  GraphsafeMlaPlan plan{};
  OK(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, H, B, MAX_SEQ, PAGE, info.sm_count, 0, &plan));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, plan.workspace_bytes, &ws));
  auto run = [&](const GraphsafeMlaDecodeArgs& args, const GraphsafeMlaKvCache* kv, std::vector<uint16_t>& out) {
    GraphsafeMlaPlan ran{};
    OK(graphsafe_mla_decode_kv(&args, kv, ws, stream, &ran));
    CHECK(ran.num_splits == plan.num_splits && ran.workspace_bytes == plan.workspace_bytes);
    out.assign(out_bytes / 2, 0);
    OK(graphsafe_buffer_read(bout, 0, out.data(), out_bytes, stream));
  };
  std::vector<uint16_t> native, fp8, ds;
  run(a, nullptr, native);
  run(a_fp8, &per_tensor, fp8);
  run(a_ds, &ds_mla, ds);
  float diff_fp8 = 0, diff_ds = 0;
  size_t nonzero = 0;
  for (size_t i = 0; i < native.size(); ++i) {
    diff_fp8 = std::fmax(diff_fp8, std::fabs(bf16_value(fp8[i]) - bf16_value(native[i])));
    diff_ds = std::fmax(diff_ds, std::fabs(bf16_value(ds[i]) - bf16_value(native[i])));
    nonzero += native[i] != 0;
  }
  CHECK(nonzero > native.size() / 2);
  CHECK(diff_fp8 <= 1.f / 64 && diff_ds <= 1.f / 64);
  std::printf("fp8 KV caches through the C ABI (%d heads): max |out - native bf16| %g (per-tensor), %g (DeepSeek V3.2 tokens)\n", H, diff_fp8,
              diff_ds);

  // The refusals the op adds on the GPU: a cache too small for its format (the bf16 cache's
  // buffer holds the fp8 one, so use the ds-mla args over the smaller fp8 buffer).
  GraphsafeMlaDecodeArgs small = a_ds;
  small.kv_cache = addr(bfp8);
  CHECK_STATUS(graphsafe_mla_decode_kv(&small, &ds_mla, ws, stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_cache"));
  const GraphsafeMlaKvCache unknown_scale{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 0x1000};
  CHECK_STATUS(graphsafe_mla_decode_kv(&a_fp8, &unknown_scale, ws, stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_scale"));

  capture_and_compare(stream, ws, bout, out_bytes, "per-tensor fp8 KV MLA decode", [&] { return graphsafe_mla_decode_kv(&a_fp8, &per_tensor, ws, stream, nullptr); },
                      [&](GraphsafeCapture cap) { return graphsafe_mla_decode_kv_captured(&a_fp8, &per_tensor, cap, ws, nullptr); });
  capture_and_compare(stream, ws, bout, out_bytes, "DeepSeek V3.2 fp8 KV MLA decode", [&] { return graphsafe_mla_decode_kv(&a_ds, &ds_mla, ws, stream, nullptr); },
                      [&](GraphsafeCapture cap) { return graphsafe_mla_decode_kv_captured(&a_ds, &ds_mla, cap, ws, nullptr); });

  // The scale is read when the graph runs.
  {
    GraphsafeCapture cap{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
    OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_kv_captured(&a_fp8, &per_tensor, cap, ws, nullptr));
    GraphsafeGraph g{};
    OK(graphsafe_capture_end(cap, &g));
    GraphsafeGraphExec e{};
    OK(graphsafe_graph_instantiate(g, &e));
    OK(graphsafe_graph_destroy(g));
    const float quarter = 0.25f;
    OK(graphsafe_buffer_write(bscale, 0, &quarter, 4, stream));
    std::vector<uint16_t> eager(out_bytes / 2), replayed(out_bytes / 2);
    OK(graphsafe_mla_decode_kv(&a_fp8, &per_tensor, ws, stream, nullptr));
    OK(graphsafe_buffer_read(bout, 0, eager.data(), out_bytes, stream));
    std::vector<uint16_t> zeros(out_bytes / 2, 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), out_bytes, stream));
    OK(graphsafe_graph_exec_launch(e, stream));
    OK(graphsafe_buffer_read(bout, 0, replayed.data(), out_bytes, stream));
    CHECK(replayed == eager && eager != fp8);
    std::printf("per-tensor fp8 scale changed between replays (%d heads): the replay %s the eager decode at the new scale\n", H,
                replayed == eager ? "equals" : "DIFFERS FROM");
    OK(graphsafe_graph_exec_destroy(e));
  }
  // A scale given only by its raw address, never bound: the capture keeps its buffer alive. The
  // caller destroys its handle; no new buffer may get that memory while the executable lives, and
  // the replay reads the value that was there (0.125 here), not whatever a new owner writes.
  {
    const float eighth = 0.125f;
    GraphsafeBuffer bscale2 = upload(stream, &eighth, 4);
    uint64_t p2 = 0, n2 = 0;
    OK(graphsafe_buffer_info(bscale2, &p2, &n2));
    const GraphsafeMlaKvCache kv2{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, p2};
    std::vector<uint16_t> eager(out_bytes / 2), replayed(out_bytes / 2);
    OK(graphsafe_mla_decode_kv(&a_fp8, &kv2, ws, stream, nullptr));
    OK(graphsafe_buffer_read(bout, 0, eager.data(), out_bytes, stream));
    GraphsafeCapture cap{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
    OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_kv_captured(&a_fp8, &kv2, cap, ws, nullptr));
    GraphsafeGraph g{};
    OK(graphsafe_capture_end(cap, &g));
    GraphsafeGraphExec e{};
    OK(graphsafe_graph_instantiate(g, &e));
    OK(graphsafe_graph_destroy(g));
    OK(graphsafe_buffer_destroy(bscale2));
    std::vector<GraphsafeBuffer> fresh(8);
    int overlapping = 0;
    const float big = 1000.f;
    for (auto& f : fresh) {
      OK(graphsafe_buffer_create(stream, n2, 0, &f));
      uint64_t p = 0;
      OK(graphsafe_buffer_info(f, &p, nullptr));
      overlapping += p < p2 + n2 && p2 < p + n2;
      OK(graphsafe_buffer_write(f, 0, &big, 4, stream));
    }
    std::vector<uint16_t> zeros(out_bytes / 2, 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), out_bytes, stream));
    OK(graphsafe_graph_exec_launch(e, stream));
    OK(graphsafe_buffer_read(bout, 0, replayed.data(), out_bytes, stream));
    CHECK(overlapping == 0 && replayed == eager);
    std::printf("an unbound fp8 scale address: kept by the executable (%d of 8 new buffers overlap it), the replay %s eager\n",
                overlapping, replayed == eager ? "equals" : "DIFFERS FROM");
    for (auto f : fresh) OK(graphsafe_buffer_destroy(f));
    OK(graphsafe_graph_exec_destroy(e));
  }
  for (GraphsafeBuffer x : {bq, bkv, bfp8, bds, bsl, bpt, bscale, bout}) OK(graphsafe_buffer_destroy(x));
  OK(graphsafe_workspace_destroy(ws));
}

static void cudnn_and_w4a16(GraphsafeContext ctx, GraphsafeStream stream, const GraphsafeDeviceInfo& info) {
  const int M = 16, N = 256, K = 512;
  std::vector<uint16_t> a(size_t(M) * K), b(size_t(K) * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(float((i * 104729) % 997) / 498.f - 1.f);
  GraphsafeBuffer ba = upload(stream, a.data(), a.size() * 2), bb = upload(stream, b.data(), b.size() * 2);
  GraphsafeBuffer bc{};
  OK(graphsafe_buffer_create(stream, size_t(M) * N * 2, 1, &bc));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, 0, &ws));

  int ma = 0, mi = 0, pa = 0;
  if (graphsafe_cudnn_version(&ma, &mi, &pa) == GRAPHSAFE_OK) {
    GraphsafeCudnnMatmulArgs m{};
    m.input_dtype = GRAPHSAFE_DTYPE_BF16;
    m.output_dtype = GRAPHSAFE_DTYPE_BF16;
    m.batch = 1, m.m = M, m.n = N, m.k = K;
    m.a = addr(ba), m.a_batch = 1, m.a_strides[0] = int64_t(M) * K, m.a_strides[1] = K, m.a_strides[2] = 1;
    m.b = addr(bb), m.b_batch = 1, m.b_strides[0] = int64_t(K) * N, m.b_strides[1] = N, m.b_strides[2] = 1;
    m.c = addr(bc), m.c_strides[0] = int64_t(M) * N, m.c_strides[1] = N, m.c_strides[2] = 1;
    uint64_t need = 0;
    OK(graphsafe_cudnn_plan(ctx, &m, &need));
    OK(graphsafe_workspace_ensure_size(ws, need, stream, nullptr));
    capture_and_compare(stream, ws, bc, size_t(M) * N * 2, "cuDNN matmul",
                        [&] { return graphsafe_cudnn_matmul(ctx, &m, ws, stream); },
                        [&](GraphsafeCapture cap) { return graphsafe_cudnn_matmul_captured(ctx, &m, cap, ws); });
  } else {
    std::printf("SKIP: cuDNN part (%s)\n", graphsafe_last_error());
  }

  if (info.cc_major == 9) {
    // Quantize a [N, K] weight on the GPU, prepare it, run the W4A16 GEMM D[M, N] = A · Wᵀ.
    std::vector<uint16_t> w(size_t(N) * K);
    for (size_t i = 0; i < w.size(); ++i) w[i] = to_bf16(float((i * 31) % 211) / 105.f - 1.f);
    GraphsafeBuffer bw = upload(stream, w.data(), w.size() * 2);
    const float gs = 1.0f;
    GraphsafeBuffer bgs = upload(stream, &gs, 4), balpha = upload(stream, &gs, 4);
    uint64_t sb = 0;
    OK(graphsafe_nvfp4_scale_bytes(N, K, &sb));
    GraphsafeBuffer bp{}, bs{};
    OK(graphsafe_buffer_create(stream, size_t(N) * K / 2, 0, &bp));
    OK(graphsafe_buffer_create(stream, sb, 0, &bs));
    GraphsafeNvfp4Matrix q{addr(bp), addr(bs), addr(bgs), N, K};
    OK(graphsafe_nvfp4_quantize(addr(bw), GRAPHSAFE_DTYPE_BF16, N, K, K, &q, stream));
    GraphsafeBuffer prepared{};
    OK(graphsafe_nvfp4_prepare_weight(&q, stream, &prepared));
    GraphsafeW4a16Args g{addr(ba), K, prepared, N, K, addr(balpha), addr(bc), N, M};
    GraphsafeNvfp4Plan plan{};
    OK(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, M, N, K, GRAPHSAFE_DTYPE_BF16, info.sm_count, &plan));
    OK(graphsafe_workspace_ensure_size(ws, plan.workspace_bytes, stream, nullptr));
    capture_and_compare(stream, ws, bc, size_t(M) * N * 2, "NVFP4 W4A16 GEMM",
                        [&] { return graphsafe_nvfp4_w4a16_gemm(&g, ws, stream); },
                        [&](GraphsafeCapture cap) {
                          int s = graphsafe_capture_bind_buffer(cap, prepared, nullptr);
                          return s != GRAPHSAFE_OK ? s : graphsafe_nvfp4_w4a16_gemm_captured(&g, cap, ws);
                        });
    {
      // A captured op keeps what it bakes in alive by itself: the prepared weight is a graphsafe
      // buffer the capture never binds explicitly, destroyed right after the capture, its memory
      // churned; the replays still read the weight (before: a use-after-free).
      GraphsafeBuffer own{};
      OK(graphsafe_nvfp4_prepare_weight(&q, stream, &own));
      uint64_t own_bytes = 0;
      OK(graphsafe_buffer_info(own, nullptr, &own_bytes));
      GraphsafeW4a16Args g2 = g;
      g2.weight = own;
      const size_t out_bytes = size_t(M) * N * 2;
      std::vector<unsigned char> want(out_bytes), got(out_bytes), zeros(out_bytes, 0);
      OK(graphsafe_nvfp4_w4a16_gemm(&g2, ws, stream));
      OK(graphsafe_buffer_read(bc, 0, want.data(), out_bytes, stream));
      GraphsafeCapture cap{};
      OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
      OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
      OK(graphsafe_nvfp4_w4a16_gemm_captured(&g2, cap, ws));
      GraphsafeGraph gr{};
      OK(graphsafe_capture_end(cap, &gr));
      GraphsafeGraphExec ex{};
      OK(graphsafe_graph_instantiate(gr, &ex));
      OK(graphsafe_graph_destroy(gr));
      OK(graphsafe_buffer_destroy(own));
      std::vector<GraphsafeBuffer> churn;
      std::vector<unsigned char> junk(own_bytes, 0x7f);
      for (int i = 0; i < 8; ++i) churn.push_back(upload(stream, junk.data(), junk.size()));
      int same = 0;
      for (int i = 0; i < 10; ++i) {
        OK(graphsafe_buffer_write(bc, 0, zeros.data(), out_bytes, stream));
        OK(graphsafe_graph_exec_launch(ex, stream));
        OK(graphsafe_buffer_read(bc, 0, got.data(), out_bytes, stream));
        same += got == want;
      }
      CHECK(same == 10);
      std::printf("W4A16 weight kept by the graph it was never bound to: %d/10 replays identical after destroy + churn\n", same);
      OK(graphsafe_graph_exec_destroy(ex));
      for (GraphsafeBuffer x : churn) OK(graphsafe_buffer_destroy(x));
    }
    // The Blackwell GEMM is refused here by name.
    GraphsafeNvfp4GemmArgs bg{q, q, addr(balpha), addr(bc), GRAPHSAFE_DTYPE_BF16};
    CHECK_STATUS(graphsafe_nvfp4_gemm(&bg, ws, stream), GRAPHSAFE_ERROR_ARCH_UNSUPPORTED);
    for (GraphsafeBuffer x : {bw, bgs, balpha, bp, bs, prepared}) OK(graphsafe_buffer_destroy(x));
  }
  for (GraphsafeBuffer x : {ba, bb, bc}) OK(graphsafe_buffer_destroy(x));
  OK(graphsafe_workspace_destroy(ws));
}

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

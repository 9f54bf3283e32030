// The C ABI without a GPU: MLA, fp8 KV-format, NVFP4 and cuDNN planning answers, argument and handle
// validation, and the statuses and texts when no driver is loaded.
#include "check.h"

void planning() {
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
void kv_format_planning() {
  for (int heads : {16, 32, 48, 64, 128}) {  // 48..128: the seesaw kernel
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
void kv_format_decode_refusals() {
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
    // 64 heads take an fp8 cache too (the seesaw kernel): the call gets as far as the handles.
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

void nvfp4_and_cudnn_planning() {
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

void bad_handles() {
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

void no_driver() {
  int n = -1;
  CHECK_STATUS(graphsafe_device_count(&n), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  CHECK(last_error_mentions("libcuda.so.1"));
  GraphsafeContext c{};
  CHECK_STATUS(graphsafe_context_create(0, &c), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  int major = 0, minor = 0;
  CHECK_STATUS(graphsafe_driver_version(&major, &minor), GRAPHSAFE_ERROR_DRIVER_NOT_FOUND);
  CHECK_STATUS(graphsafe_device_count(nullptr), GRAPHSAFE_ERROR_NULL_POINTER);
}

// graphsafe-build: archs=all kind=object mem_mib=300
// The MLA sanitize pre-pass and post-pass (gs_mla_sanitize, gs_mla_sanitize_finish): device data
// made safe for CUTLASS's sm100 MLA kernel, which trusts seq_lens and page indices (a zero length
// with batch > 1 hangs CUTLASS 4.2's persistent scheduler; a page index is used as an address).
// The rules are in graphsafe_kernels/mla.h ("Device data"); the sm90 kernel applies the same ones
// itself. Plain CUDA, so it builds for every arch: the sm100 decode calls it, and the tests run it
// on Hopper through src/ops/mla/sm100.rs.
//
// Why an empty request runs one token instead of being skipped: CUTLASS decides the split of a
// request from its length alone, so the only way to give it no empty persistent split is a length
// >= 1. Its one token reads column 0 of its (clamped) page-table row, a valid page; the post-pass
// then writes what an empty request must hold (zeros, -inf) over whatever CUTLASS computed.
#include <algorithm>
#include <cmath>
#include "common/status.cuh"
#include "graphsafe_kernels/mla.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksX = 64;  // grid-stride over columns beyond this: a row is never that wide in practice

__global__ void __launch_bounds__(kThreads)
    mla_sanitize_kernel(const int32_t* __restrict__ seq_lens, const int32_t* __restrict__ page_table,
                        int64_t page_table_stride, int max_seq_len, int page_size, int num_pages, int columns,
                        int32_t* __restrict__ lens, int32_t* __restrict__ kernel_lens, int32_t* __restrict__ table) {
  const int b = blockIdx.y;
  const int len = min(max(seq_lens[b], 0), max_seq_len);
  const int run = max(len, 1);
  // Columns holding a token of the length CUTLASS runs (at least one: an empty request's token).
  const int used = run / page_size + (run % page_size != 0);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    lens[b] = len;
    kernel_lens[b] = run;
  }
  const int32_t* src = page_table + int64_t(b) * page_table_stride;
  int32_t* dst = table + int64_t(b) * columns;
  // 64-bit: columns may be up to 2^31 - 1, and a 32-bit j would wrap negative on its last step
  // (then read and write below both tables). Found in review.
  for (int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x; j < columns; j += int64_t(gridDim.x) * kThreads) {
    int32_t v = 0;
    if (j < used) v = min(max(src[j], 0), num_pages - 1);
    dst[j] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    mla_sanitize_finish_kernel(const int32_t* __restrict__ lens, uint16_t* out, int64_t out_stride_batch,
                               int64_t out_stride_head, float* lse) {
  const int b = blockIdx.x;
  if (lens[b] != 0) return;
  uint16_t* row = out + int64_t(b) * out_stride_batch;
  for (int i = threadIdx.x; i < GS_MLA_NUM_HEADS * GS_MLA_LATENT_DIM; i += kThreads) {
    const int h = i / GS_MLA_LATENT_DIM, d = i % GS_MLA_LATENT_DIM;
    row[int64_t(h) * out_stride_head + d] = 0;  // +0.0 in bf16 and fp16
  }
  if (lse != nullptr)
    for (int h = threadIdx.x; h < GS_MLA_NUM_HEADS; h += kThreads) lse[int64_t(b) * GS_MLA_NUM_HEADS + h] = -INFINITY;
}

}  // namespace

extern "C" int gs_mla_sanitize(const int32_t* seq_lens, const int32_t* page_table, int32_t page_table_stride,
                               int32_t batch, int32_t max_seq_len, int32_t page_size, int32_t num_pages,
                               int32_t num_splits, void* region, uint64_t region_bytes, void* stream) {
  GsMlaSanitizeLayout l{};
  if (int st = gs_mla_sanitize_layout(batch, max_seq_len, page_size, num_splits, &l); st != GS_OK) return st;
  if (seq_lens == nullptr || page_table == nullptr || region == nullptr || num_pages <= 0 ||
      int64_t(num_pages) * page_size > INT32_MAX)
    return GS_ERR_INVALID_ARGUMENT;
  // Row b is read at b * stride + [0, used): rows of a batch may not overlap the next one (with
  // one request the stride is never used).
  const int64_t row_need = (int64_t(max_seq_len) + page_size - 1) / page_size;
  if (batch > 1 && page_table_stride < row_need) return GS_ERR_INVALID_ARGUMENT;
  if (region_bytes < l.bytes) return GS_ERR_WORKSPACE_TOO_SMALL;
  // 4-byte aligned int32 arrays at 256-byte aligned offsets.
  if ((reinterpret_cast<uintptr_t>(region) & 3u) != 0 || (reinterpret_cast<uintptr_t>(seq_lens) & 3u) != 0 ||
      (reinterpret_cast<uintptr_t>(page_table) & 3u) != 0)
    return GS_ERR_INVALID_ARGUMENT;
  auto* base = static_cast<uint8_t*>(region);
  const int blocks_x = static_cast<int>(std::min<int64_t>(kMaxBlocksX, (int64_t(l.columns) + kThreads - 1) / kThreads));
  mla_sanitize_kernel<<<dim3(blocks_x, batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      seq_lens, page_table, page_table_stride, max_seq_len, page_size, num_pages, l.columns,
      reinterpret_cast<int32_t*>(base + l.lens_offset), reinterpret_cast<int32_t*>(base + l.kernel_lens_offset),
      reinterpret_cast<int32_t*>(base + l.page_table_offset));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return graphsafe::cuda_failed(e);
  return GS_OK;
}

extern "C" int gs_mla_sanitize_finish(const int32_t* lens, int32_t batch, void* out, int64_t out_stride_batch,
                                      int64_t out_stride_head, float* lse, void* stream) {
  if (lens == nullptr || out == nullptr || batch < 1 || batch > GS_MLA_MAX_BATCH || out_stride_batch < 0 ||
      out_stride_head < 0 || (reinterpret_cast<uintptr_t>(out) & 1u) != 0 || (reinterpret_cast<uintptr_t>(lens) & 3u) != 0 ||
      (reinterpret_cast<uintptr_t>(lse) & 3u) != 0)
    return GS_ERR_INVALID_ARGUMENT;
  mla_sanitize_finish_kernel<<<batch, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      lens, static_cast<uint16_t*>(out), out_stride_batch, out_stride_head, lse);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return graphsafe::cuda_failed(e);
  return GS_OK;
}

// graphsafe-build: archs=all kind=fatbin mem_mib=600
// A deliberately simple MLA decode reference for large shapes (the CPU reference in
// src/ops/mla/reference.rs covers small ones): one CTA per (head, request), fp32 throughout,
// scores kept in a global scratch [B, H, max_seq_len]. Slow and obviously correct.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace {
constexpr int kLatent = 512, kRope = 64, kRow = kLatent + kRope, kThreads = 256;

__device__ float load(const void* p, int64_t i, int dtype) {
  return dtype == 0 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                    : __half2float(static_cast<const __half*>(p)[i]);
}

__device__ int page_of(int index, int num_pages) { return min(max(index, 0), num_pages - 1); }

__device__ float block_reduce(float v, bool is_max, float* smem) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = smem[0];
  for (int i = 1; i < kThreads / 32; ++i) r = is_max ? fmaxf(r, smem[i]) : r + smem[i];
  __syncthreads();
  return r;
}
}  // namespace

// q_nope [B,H,512], q_pe [B,H,64] contiguous; kv [num_pages, page_size, 576]; out/lse fp32 contiguous.
// Device data is read as the decode kernels read it (include/graphsafe_kernels/mla.h): lengths
// clamped to 0..=max_seq_len, page indices clamped into 0..num_pages, so no value of them takes
// the reference outside its buffers (the driver layer's typed launch relies on this).
extern "C" __global__ void __launch_bounds__(kThreads)
gs_mla_reference(const void* q_nope, const void* q_pe, const void* kv, const int* seq_lens, const int* page_table,
                 int page_table_stride, int page_size, int num_heads, int dtype, float sm_scale, float* scratch,
                 int max_seq_len, float* out, float* lse, int num_pages) {
  __shared__ float q[kRow];
  __shared__ float red[kThreads / 32];
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t qi = (int64_t)b * num_heads + h;
  for (int d = threadIdx.x; d < kRow; d += kThreads)
    q[d] = d < kLatent ? load(q_nope, qi * kLatent + d, dtype) : load(q_pe, qi * kRope + (d - kLatent), dtype);
  __syncthreads();
  const int seq = min(max(seq_lens[b], 0), max_seq_len);
  float* s = scratch + qi * max_seq_len;
  float mx = -INFINITY;
  for (int64_t t = threadIdx.x; t < seq; t += kThreads) {  // 64-bit: seq may be near 2^31
    const int64_t row = (int64_t)page_of(page_table[(int64_t)b * page_table_stride + t / page_size], num_pages) * page_size + t % page_size;
    float acc = 0.f;
    for (int d = 0; d < kRow; ++d) acc += q[d] * load(kv, row * kRow + d, dtype);
    acc *= sm_scale;
    s[t] = acc;
    mx = fmaxf(mx, acc);
  }
  __syncthreads();
  mx = block_reduce(mx, true, red);
  float sum = 0.f;
  for (int64_t t = threadIdx.x; t < seq; t += kThreads) {  // 64-bit: seq may be near 2^31
    float p = expf(s[t] - mx);
    s[t] = p;
    sum += p;
  }
  __syncthreads();
  sum = block_reduce(sum, false, red);
  for (int d = threadIdx.x; d < kLatent; d += kThreads) {
    float acc = 0.f;
    for (int t = 0; t < seq; ++t) {
      const int64_t row = (int64_t)page_of(page_table[(int64_t)b * page_table_stride + t / page_size], num_pages) * page_size + t % page_size;
      acc += s[t] * load(kv, row * kRow + d, dtype);
    }
    out[qi * kLatent + d] = seq > 0 ? acc / sum : 0.f;
  }
  if (threadIdx.x == 0) lse[qi] = seq > 0 ? mx + logf(sum) : INFINITY;  // no key: +inf, the decode's convention
}

// The sm90 MLA combine kernel: adds the splits' partial O by their LSE (splits > 1).
#pragma once

#include "mla/sm90/primitives.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// Combine: out[b, h] = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s). One block per
// (h, b, 128-dim chunk); warp w sums splits s = w, w + 4, ... (lane = 4 dims), the four warps are
// added in a fixed order: deterministic. Splits with LSE = -inf (empty) are skipped, never read.
// =================================================================================================
constexpr int kCombineChunks = 4;  // 512 dims = 4 blocks of 128

template <bool F16>
__global__ void __launch_bounds__(128) mla_sm90_combine_kernel(const Params p) {
  __shared__ float s_w[256];
  __shared__ float s_red[4];
  __shared__ float4 s_acc[3][32];
  const int h = blockIdx.x, b = blockIdx.y, chunk = blockIdx.z;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int S = p.num_splits, H = p.num_heads;
  const float* lse = p.ws_lse + int64_t(b) * S * H + h;
  float mx = -INFINITY;
  int nan = 0;
  for (int s = t; s < S; s += 128) {
    const float v = lse[int64_t(s) * H];
    mx = fmaxf(mx, v);
    nan |= v != v;
  }
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  if (lane == 0) s_red[warp] = mx;
  // A NaN partial (NaN in the cache, or an fp8 scale that is NaN) makes the head NaN. fmaxf drops
  // NaN, so without this a head whose every split is NaN would look empty and come out as zeros.
  const bool any_nan = __syncthreads_or(nan) != 0;
  mx = fmaxf(fmaxf(s_red[0], s_red[1]), fmaxf(s_red[2], s_red[3]));
  const int d = chunk * 128 + lane * 4;
  uint16_t* dst = p.out + b * p.out_sb + h * p.out_sh + d;
  if (any_nan) {
    if (warp == 0) {
      const uint32_t q = pack2<F16>(NAN, NAN);
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[k] = uint16_t(q & 0xFFFFu);
    }
    if (t == 0 && chunk == 0 && p.lse != nullptr) p.lse[int64_t(b) * H + h] = NAN;
    return;
  }
  if (mx == -INFINITY) {  // every split empty: seq_len 0
    if (warp == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[k] = 0;
    }
    if (t == 0 && chunk == 0 && p.lse != nullptr) p.lse[int64_t(b) * H + h] = -INFINITY;
    return;
  }
  __syncthreads();  // s_red is reused below
  float sum = 0.f;
  for (int s = t; s < S; s += 128) {
    const float v = lse[int64_t(s) * H];
    const float wgt = v == -INFINITY ? 0.f : expf(v - mx);
    s_w[s] = wgt;
    sum += wgt;
  }
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  sum = (s_red[0] + s_red[1]) + (s_red[2] + s_red[3]);

  const float* src = p.ws_o + (int64_t(b) * S * H + h) * kNope + d;
  const int64_t split_stride = int64_t(H) * kNope;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto fma4 = [](float4& a, float w, const float4& v) {
    a.x = fmaf(w, v.x, a.x);
    a.y = fmaf(w, v.y, a.y);
    a.z = fmaf(w, v.z, a.z);
    a.w = fmaf(w, v.w, a.w);
  };
  int s = warp;
  for (; s + 12 < S; s += 16) {  // four loads in flight per thread
    float wg[4];
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wg[k] = s_w[s + 4 * k];
      v[k] = wg[k] != 0.f ? __ldg(reinterpret_cast<const float4*>(src + (s + 4 * k) * split_stride)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) fma4(acc, wg[k], v[k]);
  }
  for (; s < S; s += 4) {
    const float wg = s_w[s];
    if (wg != 0.f) fma4(acc, wg, __ldg(reinterpret_cast<const float4*>(src + s * split_stride)));
  }
  if (warp > 0) s_acc[warp - 1][lane] = acc;
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const float4 v = s_acc[k][lane];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const float inv = 1.f / sum;
    const uint32_t lo = pack2<F16>(acc.x * inv, acc.y * inv), hi = pack2<F16>(acc.z * inv, acc.w * inv);
    if (p.out_vec) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
    } else {
      dst[0] = uint16_t(lo & 0xFFFFu);
      dst[1] = uint16_t(lo >> 16);
      dst[2] = uint16_t(hi & 0xFFFFu);
      dst[3] = uint16_t(hi >> 16);
    }
    if (t == 0 && chunk == 0 && p.lse != nullptr) p.lse[int64_t(b) * H + h] = mx + logf(sum);
  }
}

}  // namespace graphsafe::mla_sm90

// The sm90 MLA combine kernel: adds the splits' partial O by their LSE (splits > 1).
#pragma once

#include "graphsafe_kernels/mla.h"
#include "mla/sm90/schedule.cuh"
#include "mla/sm90/split.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// Combine: out[b, r] = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s), for every query
// row r (a head of one of the request's s_q tokens; "head" below).
//
// The kernel is latency-bound (an LSE load, then the partial O loads, then the store, per head), so
// what matters is how many of those chains run at once and how many loads each keeps in flight.
// One warp owns a head's whole 512-dim row (lane = dims 4 lane + 128 k, k = 0..3): four 16-byte
// loads a split, two splits at a time. With few splits (<= kCombineFewSplits) and many heads in all
// (batch x heads >= kCombineWarpHeads) a block is four heads, a warp each; otherwise a block is one
// head and its 16 warps take splits s = w, w + 16, ..., added in a fixed order at the end. Both are
// deterministic for a given (batch x heads, splits); the two add in different orders, so a
// request's last bits may differ between a batch below and above the threshold. Splits with
// LSE = -inf (empty) never enter the sums: a warp's first two partials are loaded before the
// weights are known (their bytes, never written for an empty split, are then dropped); later ones
// only with their LSE beside them.
// (The first version, a block per 128-dim chunk of a head, ran four times as many chains of the
// same length: 34 us for 128 heads x 64 requests x 2 splits, 30 us at 16 x 16,384 x 4 splits, on
// the H200.)
// =================================================================================================
// Not tuned: a warp a head was measured faster at 2 and 4 splits; 16 warps a head at 64 and 128
// splits (and at 8 with few heads); the bound 8 between them is a guess.
constexpr int kCombineFewSplits = 8;
constexpr int kCombineWarpHeads = 1024;  // 16 x 64 x 2 splits took 93.0 -> 90.9 us with a warp a head, 16 x 16 x 8 89.4 -> 93.0

template <int kWarpsPerHead>
constexpr int combine_threads() {
  return kWarpsPerHead == 1 ? 128 : 32 * kWarpsPerHead;
}

// The 16-warp block is held to two blocks per SM (at most 64 registers a thread): it runs at 64-128
// splits, where 512 blocks (4 x 16,384 at 128 heads) need two per SM, and a change that wants more
// registers then spills (ptxas reports it) instead of silently halving the occupancy. Four
// partials ahead instead of two needed 76 registers and made 4 x 16,384 9 % slower (H200);
// with this bound the combine measured the same as without (H200:
// 128 heads 1 x 65,536 39.9 against 39.7-40.2 us, 16 heads 1 x 65,536 29.0-29.3 against 29.1-29.2).
template <bool F16, int kWarpsPerHead>
__global__ void __launch_bounds__(combine_threads<kWarpsPerHead>(), kWarpsPerHead > 1 ? 2 : 1)
    mla_sm90_combine_kernel(const Params p) {
  static_assert(kWarpsPerHead == 1 || kWarpsPerHead == 16, "four heads a block, or one head on 16 warps");
  constexpr int kHeadsPerBlock = kWarpsPerHead == 1 ? 4 : 1;
  // 16 warps a head: each warp's sum over its splits, then one dim per thread (512 threads = 512 dims).
  __shared__ float s_red[kWarpsPerHead > 1 ? kWarpsPerHead : 1][kWarpsPerHead > 1 ? kNope : 1];
  // After the N kernel it is launched programmatically dependent (decode.cu): wait for the
  // partials (a no-op after the other kernels, launched plainly). The next grid (the next decode's
  // N kernel) may be scheduled at once: it waits for this whole grid before it touches memory.
  grid_dependency_wait();
  grid_launch_dependents();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int hl = warp / kWarpsPerHead, wi = warp % kWarpsPerHead;
  const int h = blockIdx.x * kHeadsPerBlock + hl, b = blockIdx.y;
  const int H = p.rows;  // partials are laid out by query row, [batch, num_splits, rows]
  // A whole block shares h when kWarpsPerHead = 16, so this return (and the ones below) are
  // block-uniform there; with one warp a head nothing below synchronises more than the warp.
  if (h >= H) return;
  // The partials to merge: every split of one request (empty ones wrote LSE -inf); in a batch, the
  // request's own chunks (schedule.cuh), from the lengths its split kernels used. A request of one
  // chunk (or none) was written by its split kernel: nothing to do.
  int S = p.num_splits;
  if (p.sched_lens != nullptr) {
    S = sched_chunks(p.sched_lens[b], p.chunk);
    if (S <= 1) return;
  }
  const float* lse = p.ws_lse + int64_t(b) * p.num_splits * H + h;
  const float* src = p.ws_o + (int64_t(b) * p.num_splits * H + h) * kNope + lane * 4;  // fp32 partials
  const int64_t split_stride = int64_t(H) * kNope;
  auto load_raw = [&](int s, int k) { return __ldcg(reinterpret_cast<const float4*>(src + s * split_stride + 128 * k)); };
  constexpr int kStep = kWarpsPerHead;  // a warp takes splits wi, wi + kStep, ...
  // The first kAhead of a warp's splits are loaded at entry, beside the LSEs, before their weights
  // are known: the LSE round trip and theirs overlap. An empty split's partial (never written) is
  // loaded too, from inside the workspace, and dropped: a weight of 0 skips its product. Two, not
  // more: four (of the bf16 partials once stored) made the 16-warp block 76 registers and halved its
  // blocks per SM, slower wherever a grid needs more than one wave; with fp32 partials two made it
  // spill at its 64 registers, so the 16-warp block loads one ahead.
  constexpr int kAhead = kWarpsPerHead > 1 ? 1 : 2;
  float4 ahead[kAhead][4];
  float ahead_lse[kAhead];
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    const int s = wi + j * kStep;
    ahead_lse[j] = -INFINITY;
    if (s < S) {
      ahead_lse[j] = lse[int64_t(s) * H];
#pragma unroll
      for (int k = 0; k < 4; ++k) ahead[j][k] = load_raw(s, k);
    }
  }
  // num_splits <= GS_MLA_SM90_MAX_SPLITS (decode.cu validates): every split's LSE has a register.
  static_assert(GS_MLA_SM90_MAX_SPLITS % 32 == 0, "the split LSEs are spread evenly over a warp");
  constexpr int kLsePerLane = GS_MLA_SM90_MAX_SPLITS / 32;
  float lv[kLsePerLane];
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) lv[i] = lane + 32 * i < S ? lse[int64_t(lane + 32 * i) * H] : -INFINITY;
  float mx = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) {
    mx = fmaxf(mx, lv[i]);
    nan |= lv[i] != lv[i];
  }
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  uint16_t* const orow = out_row(p, b, h);
  const int64_t lse_at = lse_index(p, b, h);
  uint16_t* dst = orow + lane * 4;
  auto store4 = [&](int k, uint32_t lo, uint32_t hi) {
    uint16_t* d = dst + 128 * k;
    if (p.out_vec) {
      *reinterpret_cast<uint2*>(d) = make_uint2(lo, hi);
    } else {
      d[0] = uint16_t(lo & 0xFFFFu);
      d[1] = uint16_t(lo >> 16);
      d[2] = uint16_t(hi & 0xFFFFu);
      d[3] = uint16_t(hi >> 16);
    }
  };
  // A NaN partial (NaN in the cache, or an fp8 scale that is NaN) makes the head NaN. fmaxf drops
  // NaN, so without this a head whose every split is NaN would look empty and come out as zeros.
  if (__any_sync(0xffffffffu, nan)) {
    if (wi == 0) {
      const uint32_t q = pack2<F16>(NAN, NAN);
#pragma unroll
      for (int k = 0; k < 4; ++k) store4(k, q, q);
      if (lane == 0 && p.lse != nullptr) p.lse[lse_at] = NAN;
    }
    return;
  }
  if (mx == -INFINITY) {  // every split empty: seq_len 0, or a causal row with no key
    if (wi == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) store4(k, 0u, 0u);
      if (lane == 0 && p.lse != nullptr) p.lse[lse_at] = final_lse(-INFINITY);
    }
    return;
  }
  auto weight = [&](float v) { return v == -INFINITY ? 0.f : expf(v - mx); };
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kLsePerLane; ++i) sum += weight(lv[i]);
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);

  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  auto fma4 = [](float4& a, float w, const float4& v) {
    a.x = fmaf(w, v.x, a.x);
    a.y = fmaf(w, v.y, a.y);
    a.z = fmaf(w, v.z, a.z);
    a.w = fmaf(w, v.w, a.w);
  };
  // Splits in increasing order within a warp; a split of weight 0 adds nothing (as before, when
  // it added 0 * 0): deterministic, and bit-identical to the layout before the loads moved.
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    const float w = weight(ahead_lse[j]);  // 0 past S too (ahead_lse = -inf)
    if (w != 0.f) {
#pragma unroll
      for (int k = 0; k < 4; ++k) fma4(acc[k], w, ahead[j][k]);
    }
  }
  int s = wi + kAhead * kStep;
  if constexpr (kWarpsPerHead == 1) {
    for (; s + kStep < S; s += 2 * kStep) {  // two splits, eight loads in flight, their LSEs beside them
      const float v0 = lse[int64_t(s) * H], v1 = lse[int64_t(s + kStep) * H];
      float4 u0[4], u1[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        u0[k] = load_raw(s, k);
        u1[k] = load_raw(s + kStep, k);
      }
      const float w0 = weight(v0), w1 = weight(v1);
      if (w0 != 0.f) {
#pragma unroll
        for (int k = 0; k < 4; ++k) fma4(acc[k], w0, u0[k]);
      }
      if (w1 != 0.f) {
#pragma unroll
        for (int k = 0; k < 4; ++k) fma4(acc[k], w1, u1[k]);
      }
    }
  }
  // One split at a time: the last one above, or every one of the 16-warp block (two fp32 partials
  // in flight spilled at its 64 registers).
  for (; s < S; s += kStep) {
    const float w0 = weight(lse[int64_t(s) * H]);
    if (w0 != 0.f) {
#pragma unroll
      for (int k = 0; k < 4; ++k) fma4(acc[k], w0, load_raw(s, k));
    }
  }
  const float inv = 1.f / sum;
  if constexpr (kWarpsPerHead > 1) {
    // Every thread adds one dim over the 16 warps, in warp order (the same additions, in the same
    // order, as warp 0 adding the others' float4s one after another, which it did before: that
    // serial tail took 0.66 us of a 4.6 us block at 64 splits, H200 globaltimer probes).
#pragma unroll
    for (int k = 0; k < 4; ++k) *reinterpret_cast<float4*>(&s_red[wi][128 * k + 4 * lane]) = acc[k];
    __syncthreads();
    float v = s_red[0][t];
#pragma unroll
    for (int j = 1; j < kWarpsPerHead; ++j) v += s_red[j][t];
    orow[t] = to_bits<F16>(v * inv);
    if (t == 0 && p.lse != nullptr) p.lse[lse_at] = mx + logf(sum);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) store4(k, pack2<F16>(acc[k].x * inv, acc[k].y * inv), pack2<F16>(acc[k].z * inv, acc[k].w * inv));
    if (lane == 0 && p.lse != nullptr) p.lse[lse_at] = mx + logf(sum);
  }
}

}  // namespace graphsafe::mla_sm90

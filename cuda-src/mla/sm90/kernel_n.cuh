// The sm90 MLA split kernel "N" (16 or 32 heads); see kernels.cuh and decode.cu.
#pragma once

#include "mla/sm90/n_softmax.cuh"
#include "mla/sm90/split.cuh"
#include "mla/sm90/wgmma_ops.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// Kernel "N": query rows as the MMA's N, for up to 16 or 32 rows (memory-bound; fewer rows are
// padded with zero queries, never stored). One CTA = (split, request).
// Tokens are the M dimension: S^T = K.Q^T (m64nNk16 x 36), O^T = V^T.P^T (m64nNk16 x 8 x 4, V read
// MN-major from the same tile bytes). The two warpgroups take alternate tiles, each with its own
// stage, running max/sum and full O^T; the CTA merges the two at the end. Warpgroup 2 produces:
// TMA of the bf16/fp16 cache straight into the stages. Both fp8 caches run the N8 kernel instead
// (kernel_n_fp8.cuh).
// =================================================================================================
template <int N>
struct NLayout {
  static constexpr int kQBytes = N * 128 * kBlocks;  // a multiple of 1 KiB
  static constexpr int kOStride = 516;                // floats per head row of the O staging
  static constexpr int kSmem = kQBytes + 2 * kStageBytes + (8 * N + 2 * N + 2 * N + N) * 4 + 5 * 8 + 1024;
};

template <int N, bool F16>
__global__ void __launch_bounds__(kThreads, 1) mla_sm90_n_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  static_assert(N == 16 || N == 32, "N kernel: 16 or 32 heads");
  constexpr int R = N / 2;  // accumulator registers per m64nN tile
  constexpr int J = N / 8;  // 8-column groups
  using L = NLayout<N>;
  static_assert(L::kSmem <= 232448, "N kernel: shared memory");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  // Launched programmatically dependent (decode.cu, launch_n): nothing an earlier kernel may write
  // (seq_lens, the page table, q, the cache, the scale, out) is touched before this.
  grid_dependency_wait();
  const SplitRange sr = split_range(p);  // every thread, before the roles split
  if (!sr.active) return;
  const int b = sr.b;
  if (sr.n == 0) {
    write_empty<F16>(p, sr, 0, p.rows, tid, kThreads);
    return;
  }

  uint8_t* sq = smem;
  uint8_t* skv = smem + L::kQBytes;
  float* s_red = reinterpret_cast<float*>(skv + 2 * kStageBytes);  // [2 wg][4 warps][N]
  float* s_m = s_red + 8 * N;                                      // [2][N]
  float* s_l = s_m + 2 * N;                                        // [2][N]
  float* s_lse = s_l + 2 * N;                                      // [N]
  const uint32_t bars = smem_u32(s_lse + N);
  const uint32_t full0 = bars, empty0 = bars + 16, math_bar = bars + 32;
  const uint32_t sq_a = smem_u32(sq), skv_a = smem_u32(skv);

  if (!enter_roles(&kv_map, p, b, sr, tid, bars, {1u, 128u}, skv_a)) return;

  uint32_t math_phase = 0;
  load_q<N, kMathThreads>(sq, p, b, 0, p.rows, tid);  // rows past p.rows: zeros, never stored
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int w = tid >> 7;  // warpgroup: takes tiles i with i % 2 == w, always in stage w
  const int lt = tid & 127, warp = lt >> 5, lane = lt & 31, q = lane & 3, g = lane >> 2;
  const int ta = warp * 16 + g, tb = ta + 8;  // S^T rows (tokens) of this thread
  const float sl2 = p.scale_log2;  // what the softmax below multiplies the scores by
  float o[8][R];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int k = 0; k < R; ++k) o[mb][k] = 0.f;
  float mrun[2 * J], lp[2 * J];  // per owned head 8j + 2q + e, index 2j + e
#pragma unroll
  for (int k = 0; k < 2 * J; ++k) {
    mrun[k] = -INFINITY;
    lp[k] = 0.f;
  }
  const uint32_t deltas = NSoftmax<N>::row_deltas(p, q);  // the owned columns' causal limits
  const uint64_t dq = sw128_desc(sq_a, 16, 1024);
  uint8_t* stage = skv + w * kStageBytes;
  const uint32_t st = skv_a + w * kStageBytes;

  for (int i = w; i < sr.n; i += 2) {
    mbar_wait(full0 + 8 * w, (i >> 1) & 1);
    float sc[R];
    const uint64_t dk = sw128_desc(st, 16, 1024);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 36; ++k) {
      const uint32_t offa = uint32_t((k >> 2) * kBlockBytes + (k & 3) * 32) >> 4;
      const uint32_t offb = uint32_t((k >> 2) * (N * 128) + (k & 3) * 32) >> 4;
      Wgmma<N, F16>::template ss<0, 0>(sc, dk + offa, dq + offb, k > 0 ? 1u : 0u);
    }
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);

    const int valid = sr.seq - (sr.tile0 + i) * kTileS;  // V rows past the length are zeroed below
    NSoftmax<N>::tile_max(sc, valid, deltas, ta, tb, g, q, w, warp, s_red);

    float alpha[2 * J];
    uint8_t* pb = stage + 8 * kBlockBytes;  // P^T: K-major [N heads x 64 tokens]
    NSoftmax<N>::update(sc, sl2, mrun, lp, alpha, s_red, w, q, [&](int h, float pa, float pv) {
      *reinterpret_cast<uint16_t*>(pb + h * 128 + (((ta >> 3) ^ (h & 7)) << 4) + (ta & 7) * 2) = to_bits<F16>(pa);
      *reinterpret_cast<uint16_t*>(pb + h * 128 + (((tb >> 3) ^ (h & 7)) << 4) + (tb & 7) * 2) = to_bits<F16>(pv);
    });
    if (valid < kTileS) zero_tail_rows(stage, valid, lt, 128);
    fence_proxy_async();
    named_bar_sync(2 + w, 128);

    NSoftmax<N>::rescale(o, alpha);
    const uint64_t dv = sw128_desc(st, kBlockBytes, 1024);
    const uint64_t dp = sw128_desc(st + 8 * kBlockBytes, 16, 1024);
    wg_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        Wgmma<N, F16>::template ss<1, 0>(o[mb], dv + ((mb * kBlockBytes + k * 2048) >> 4), dp + ((k * 32) >> 4), 1u);
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) reg_fence(o[mb]);
    mbar_arrive(empty0 + 8 * w);
  }

  // No griddepcontrol.launch_dependents here: the kernel after this one (the combine, or the next
  // decode's N kernel) is scheduled as this grid's CTAs exit. Triggering after the loop instead put
  // waiting combine CTAs on the SMs early and measured slower with many splits (H200, graphs of 10
  // calls: 16 heads 1 x 65536 at 128 splits 36.0 against 34.8 us without PDL, 32 heads 45.5
  // against 43.2 without the trigger; docs/notes/2026-12-performance-log.md).
  // Merge the two warpgroups: per-head sums, then O = (O0 e0 + O1 e1) / (l0 e0 + l1 e1).
  NSoftmax<N>::publish(lp, mrun, s_red, s_m, s_l, g, q, w, warp);
  mbar_sync(math_bar, math_phase);
  float coef[2 * J];
  NSoftmax<N>::coefficients(coef, s_m, s_l, s_lse, 1.f, g, q, w, warp);
  float* so = reinterpret_cast<float*>(skv);  // [N heads][kOStride]
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == w) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int h = 8 * j + 2 * q + e, d = mb * 64 + ta;
            float* x = so + h * L::kOStride + d;
            const float va = o[mb][4 * j + e] * coef[2 * j + e], vb = o[mb][4 * j + 2 + e] * coef[2 * j + e];
            if (w == 0) {
              x[0] = va;
              x[8] = vb;
            } else {
              x[0] += va;
              x[8] += vb;
            }
          }
    }
    mbar_sync(math_bar, math_phase);
  }
  store_rows<F16>(so, L::kOStride, p.rows, 0, s_lse, p, sr, tid, kMathThreads);
}

}  // namespace graphsafe::mla_sm90

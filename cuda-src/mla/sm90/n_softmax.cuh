// The online softmax and the warpgroup merge of the two "N"-shaped sm90 split kernels (kernel_n.cuh,
// kernel_n_fp8.cuh): tokens are the accumulator's rows, query rows ("heads" below: a head of one
// of the request's s_q tokens) its columns. A thread of math
// warpgroup w (warp `warp`, lane = 4 g + q) holds S^T rows ta = 16 warp + g and tb = ta + 8 for the
// heads 8 j + 2 q + e (accumulator registers 4 j + e and 4 j + 2 + e); the per-head running state
// (max mrun, sum lp, rescale alpha) is indexed 2 j + e. Each warpgroup owns a tile at a time; the
// two merge at the end.
#pragma once

#include "mla/sm90/primitives.cuh"

namespace graphsafe::mla_sm90 {

template <int N>
struct NSoftmax {
  static constexpr int R = N / 2;  // accumulator registers per m64nN tile
  static constexpr int J = N / 8;  // 8-column groups

  // Publishes one per-head value a warp (lane q of row group 0 holds heads 8 j + 2 q + e) in
  // s_red[(4 w + warp) N + h] and waits for the warpgroup (named barrier 2 + w).
  static __device__ __forceinline__ void stash(const float (&v)[2 * J], float* s_red, int g, int q, int w, int warp) {
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) s_red[(w * 4 + warp) * N + 8 * j + 2 * q + e] = v[2 * j + e];
    }
    named_bar_sync(2 + w, 128);
  }

  // The causal limits of the owned columns (query rows 8 j + 2 q + e, index k = 2 j + e) as one
  // register: column k attends the request's keys but its last (deltas >> 4k) & 15 (s_q - 1 - t
  // with causal masks, < GS_MLA_MAX_S_Q = 16; 0 otherwise and for padding columns). An int per
  // column made the 32-row N8 kernel spill (152 bytes of loads a thread).
  static __device__ __forceinline__ uint32_t row_deltas(const Params& p, int q) {
    static_assert(2 * J * 4 <= 32, "eight 4-bit deltas per register");
    uint32_t deltas = 0;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int delta = -row_keys(p, 0, 8 * j + 2 * q + e);  // row_keys(seq) = seq - delta
        deltas |= uint32_t(delta) << (4 * (2 * j + e));
      }
    return deltas;
  }
  // Masks the scores of rows (tokens) ta, tb at or past their column's limit to -inf: a tile
  // whose first key is `base` of a request of `seq` keys leaves column k seq - base - delta_k keys.
  // The fields are unpacked here, each tile: `d` is laundered through an empty asm so the compiler
  // cannot hoist the unpacked limits out of the tile loop (held there, they took eight registers).
  static __device__ __forceinline__ void mask(float (&sc)[R], int seq_left, uint32_t deltas, int ta, int tb) {
    uint32_t d = deltas;
    asm volatile("" : "+r"(d));
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = seq_left - int((d >> (4 * (2 * j + e))) & 15u);
        if (ta >= v) sc[4 * j + e] = -INFINITY;
        if (tb >= v) sc[4 * j + 2 + e] = -INFINITY;
      }
  }

  // Masks the scores past each column's limit (mask), then publishes this warp's per-head maxima
  // of the tile in s_red[(4 w + warp) N + h] and waits for the warpgroup (named barrier 2 + w).
  static __device__ __forceinline__ void tile_max(float (&sc)[R], int seq_left, uint32_t deltas, int ta, int tb, int g,
                                                  int q, int w, int warp, float* s_red) {
    mask(sc, seq_left, deltas, ta, tb);
    float cm[2 * J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float m = fmaxf(sc[4 * j + e], sc[4 * j + 2 + e]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        cm[2 * j + e] = m;
      }
    }
    stash(cm, s_red, g, q, w, warp);
  }

  // The tile's step of the online softmax (scores times sl2 in the exp2 domain): the new running
  // maxima from the four warps' tile maxima, alpha = the old state's rescale, lp updated, and each
  // head's two probabilities handed to store(h, p_ta, p_tb).
  template <class Store>
  static __device__ __forceinline__ void update(const float (&sc)[R], float sl2, float (&mrun)[2 * J], float (&lp)[2 * J],
                                                float (&alpha)[2 * J], const float* s_red, int w, int q, Store&& store) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * q + e, k = 2 * j + e;
        const float* red = s_red + w * 4 * N + h;
        const float tm = fmaxf(fmaxf(red[0], red[N]), fmaxf(red[2 * N], red[3 * N]));
        const float mn = fmaxf(mrun[k], tm * sl2);
        alpha[k] = softmax_alpha(mrun[k], mn);
        mrun[k] = mn;
        const float base = softmax_base(mn);
        const float pa = ex2(fmaf(sc[4 * j + e], sl2, -base));
        const float pv = ex2(fmaf(sc[4 * j + 2 + e], sl2, -base));
        lp[k] = lp[k] * alpha[k] + pa + pv;
        store(h, pa, pv);
      }
    }
  }

  // O^T (eight m64 blocks) times each head's alpha.
  static __device__ __forceinline__ void rescale(float (&o)[8][R], const float (&alpha)[2 * J]) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          o[mb][4 * j + e] *= alpha[2 * j + e];
          o[mb][4 * j + 2 + e] *= alpha[2 * j + e];
        }
  }

  // The merge, first half: each warpgroup's per-head sums over its 64 rows and maxima into
  // s_m[w N + h] and s_l[w N + h]. The caller then syncs all math threads.
  static __device__ __forceinline__ void publish(float (&lp)[2 * J], const float (&mrun)[2 * J], float* s_red, float* s_m,
                                                 float* s_l, int g, int q, int w, int warp) {
#pragma unroll
    for (int k = 0; k < 2 * J; ++k) {
      lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 4);
      lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 8);
      lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 16);
    }
    stash(lp, s_red, g, q, w, warp);
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int h = 8 * j + 2 * q + e;
          const float* red = s_red + w * 4 * N + h;
          s_m[w * N + h] = mrun[2 * j + e];
          s_l[w * N + h] = ((red[0] + red[N]) + red[2 * N]) + red[3 * N];
        }
    }
  }

  // The merge, second half (after the sync): O = (O0 e0 + O1 e1) / (l0 e0 + l1 e1) times `scale`,
  // so this warpgroup's coefficient per owned head is e_w / l * scale (0 for a row that saw no
  // key: l = 0); warpgroup 0's first lanes write the heads' LSE (-inf for such a row).
  static __device__ __forceinline__ void coefficients(float (&coef)[2 * J], const float* s_m, const float* s_l, float* s_lse,
                                                      float scale, int g, int q, int w, int warp) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * q + e;
        const float ma = s_m[h], mb = s_m[N + h];
        const float mm = fmaxf(ma, mb);  // -inf when the row saw no key in either warpgroup's tiles
        const float base = softmax_base(mm);
        const float ea = ex2(ma - base), eb = ex2(mb - base);
        const float l = s_l[h] * ea + s_l[N + h] * eb;
        coef[2 * j + e] = l == 0.f ? 0.f : (w == 0 ? ea : eb) / l * scale;
        if (w == 0 && warp == 0 && g == 0) s_lse[h] = (mm + __log2f(l)) * kLn2;
      }
  }
};

}  // namespace graphsafe::mla_sm90

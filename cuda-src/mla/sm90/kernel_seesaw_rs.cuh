// The sm90 MLA split kernel "seesaw RS": more than 32 query rows over the per-tensor fp8 cache,
// the math warps converting the raw codes into the A registers of their wgmmas
// (docs/design/mla-sm90-compute-bound.md 7.3.3).
#pragma once

#include <type_traits>
#include "mla/sm90/kernel_n_fp8.cuh"
#include "mla/sm90/kernel_seesaw.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// One CTA = (64-row group, split, request), as the seesaw kernel; the N8 kernel's operands with
// rows (a head of one of the s_q tokens) as the MMA's N and tokens / dims as its M:
//   S^T = K.Q^T    A = K (the thread's two token rows, one 16-byte piece a 64-dim block), B = Q
//                  staged as fp16 x 2^k_r in the N8 kernel's permuted dim order;
//   O^T = V^T.P^T  A = V^T (the thread's 8 dims of four tokens a k16 step, paired by byte_perm),
//                  B = P^T in shared memory (fp16, the N8 kernel's permuted token order).
// Nothing converted is stored: the raw tiles land by TMA in a ring of three slots, and a slot is
// refilled once both warpgroups read it (256 arrivals), a pair of tiles before it is needed.
// The tiles go in pairs (A = tile 2k, B = 2k + 1) and O^T by rows (dims), as the seesaw kernel
// splits O by columns: warpgroup 0 owns O^T_L = dims 0..255, warpgroup 1 O^T_R = dims 256..511.
//   WG0: S^T_A; softmax A against the running max; P^T_A; O^T_L += V^T_A,L.P^T_A; once WG1
//        published B: O^T_L += V^T_B,L.P^T_B.
//   WG1: S^T_B (under WG0's softmax A); O^T_R += V^T_A,R.P^T_A; softmax B against A's max;
//        P^T_B; O^T_R += V^T_B,R.P^T_B.
// The running maximum of each row lives in shared memory (s_run): a softmax reads it and, when a
// score passes it by more than kLazyTau, moves it; the alphas of a tile that moved it go to the
// other warpgroup with a flag (A_READY / B_READY order them). The row sums stay per thread and
// warpgroup (16 rows a thread) and are added at the end.
// Per-tensor format only: every e4m3 value is an exact fp16, so a conversion is one cvt a pair.
// e4m3's NaN codes come out as fp16 NaNs; a split whose output came out NaN runs again with them
// read as 448 (the finite-value contract), as in the N8 kernel.
// =================================================================================================
struct SeesawRsLayout {
  // The raw tile of the N8 kernel's per-tensor ring (produce_raw_ring fills it): nine 64-byte
  // column blocks of 64 rows, 36 KiB.
  static constexpr int kRawBlock = N8Layout<16, kKvFp8PerTensor>::kRawBlock;
  static constexpr int kRawTile = N8Layout<16, kKvFp8PerTensor>::kRawTile;
  static constexpr int kSlots = 3;
  static constexpr int kQBytes = 64 * 128 * kBlocks;  // Q: nine K-major blocks of 64 rows x 128 B
  static constexpr int kPBytes = 64 * 128;            // P^T of one tile: [64 rows x 64 tokens] fp16
  static constexpr int kOStride = 516;                // floats per row of the O staging
  static constexpr int kQ = kSlots * kRawTile, kP = kQ + kQBytes, kF = kP + 2 * kPBytes;
  // s_red [2 wg][4 warps][64], s_qf [64], s_run [64], s_alpha [2 tiles][64], s_lse [64], s_mnew [2 wg][64]
  static constexpr int kFloats = 512 + 64 + 64 + 128 + 64 + 128;
  // The row sums: each math thread's 16 in shared memory ([4 chunks][256 threads] float4, each
  // thread reads and writes only its own): held in registers they made the math warps spill.
  static constexpr int kLp = kF + kFloats * 4;
  static constexpr int kFlags = kLp + 4 * 256 * 16;     // [2 tiles] the tile moved the maximum
  static constexpr int kBars = kFlags + 16;  // full[3], empty[3], A_READY, B_READY, PA_FREE, math, verdict
  static constexpr int kSmem = 1024 + kBars + (2 * kSlots + 5) * 8;
  static_assert(kSmem <= 227 * 1024, "the sm90 opt-in shared memory per block");
  static_assert(64 * kOStride * 4 <= kP, "the O staging reuses the ring and Q");
  static constexpr int kMathRegs = 240, kProducerRegs = 24;
};

__global__ void __launch_bounds__(kThreads, 1) mla_sm90_seesaw_rs_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  using L = SeesawRsLayout;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * 64;
  const int rows = min(64, p.rows - row0);
  const SplitRange sr = split_range(p);
  if (!sr.active) return;
  const int b = sr.b;
  if (sr.n == 0) {
    write_empty<false>(p, sr, row0, rows, tid, kThreads);
    return;
  }
  uint8_t* ring = smem;
  uint8_t* sq = smem + L::kQ;
  uint8_t* sp = smem + L::kP;  // P^T of tile A, then of tile B
  float* s_red = reinterpret_cast<float*>(smem + L::kF);
  float* s_qf = s_red + 512;
  float* s_run = s_qf + 64;
  float* s_alpha = s_run + 64;
  float* s_lse = s_alpha + 128;
  float* s_mnew = s_lse + 64;  // [2 wg][64] an exact step's new maxima, until they replace s_run
  int* s_flag = reinterpret_cast<int*>(smem + L::kFlags);
  float4* const s_lp = reinterpret_cast<float4*>(smem + L::kLp) + tid;  // chunk c at s_lp[c * kMathThreads]
  const uint32_t bars = smem_u32(smem + L::kBars);
  // PA_FREE: warpgroup 1 has read P^T_A (and alpha_A) of the pair: warpgroup 0 may write the next.
  const uint32_t full0 = bars, empty0 = bars + 8 * L::kSlots, a_ready = bars + 16 * L::kSlots, b_ready = a_ready + 8,
                 pa_free = b_ready + 8, math_bar = pa_free + 8, verdict_bar = math_bar + 8;
  __shared__ int s_rerun;

  if (!enter_roles_init<L::kMathRegs, L::kProducerRegs>(
          tid,
          [&] {
#pragma unroll 1
            for (int s = 0; s < L::kSlots; ++s) {
              mbar_init(full0 + 8 * s, 1);
              mbar_init(empty0 + 8 * s, kMathThreads);
            }
            mbar_init(a_ready, 128);
            mbar_init(b_ready, 128);
            mbar_init(pa_free, 128);
            mbar_init(math_bar, kMathThreads);
            mbar_init(verdict_bar, 1);
          },
          [&](int pt) {
            if (pt != 0) return;
            produce_raw_ring<kKvFp8PerTensor, L::kSlots>(&kv_map, nullptr, p, b, sr, 0, smem_u32(ring), full0, empty0);
            mbar_wait(verdict_bar, 0);
            if (s_rerun) produce_raw_ring<kKvFp8PerTensor, L::kSlots>(&kv_map, nullptr, p, b, sr, sr.n, smem_u32(ring), full0, empty0);
          }))
    return;

  uint32_t math_phase = 0;
  load_q_f16_scaled<64, false>(sq, s_qf, p, b, row0, tid);
  if (tid < 64) s_run[tid] = -INFINITY;
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int w = tid >> 7;
  const int lt = tid & 127, warp = lt >> 5, lane = lt & 31, q = lane & 3, g = lane >> 2;
  const int ta = warp * 16 + g, tb = ta + 8;  // S^T rows (tokens) of this thread
  // The per-tensor scale multiplies every K and V: applied to the scores (after Q's 2^-k_r, each
  // product in f32 on its own) before they are masked and their maximum taken (device data of any
  // sign), and to the output's normalisation.
  const float kv_scale = __ldcg(p.kv_scale);
  const float sl2 = p.scale_log2 * kv_scale;
  // The causal limits of the owned rows (8 j + 2 q + e, index k = 2 j + e): row k attends the
  // request's keys but its last delta_k (< 16), four bits each in two registers.
  uint32_t deltas[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int r = row0 + 8 * (k >> 1) + 2 * q + (k & 1);
    deltas[k >> 3] |= uint32_t(-row_keys(p, 0, r)) << (4 * (k & 7));
  }
  const uint64_t dq = sw128_desc(smem_u32(sq), 16, 1024);
  // K: rows ta and tb, chunk q of each 64-byte row (64-byte swizzle: chunk c of row r at c ^ ((r >> 1) & 3)).
  const uint32_t k_off0 = uint32_t(ta * 64 + ((q ^ ((ta >> 1) & 3)) << 4));
  const uint32_t k_off1 = uint32_t(tb * 64 + ((q ^ ((tb >> 1) & 3)) << 4));
  // V: the thread's 8 dims 256 w + 64 warp + 8 g .. + 7 (raw block 4 w + warp, bytes 8 g of a row);
  // O^T row g of m64 block mb is dim 64 warp + 8 g + 2 mb of the warpgroup's 256, row g + 8 the next.
  // A quarter warp (one q) reads one token's whole 64-byte row: conflict-free.
  uint32_t v_off[4];  // token 4 jt + q of a k16 step (step ks adds 16 rows = 1 KiB: the swizzle repeats)
#pragma unroll
  for (int jt = 0; jt < 4; ++jt) {
    const int t = 4 * jt + q;
    v_off[jt] = uint32_t((4 * w + warp) * L::kRawBlock + t * 64 + (((g >> 1) ^ ((t >> 1) & 3)) << 4) + (g & 1) * 8);
  }
  const int kla = n8_p_col(ta), klb = n8_p_col(tb);  // P^T columns of tokens ta and tb

  float o[128];  // O^T: four m64n64 blocks, o[32 mb + 4 j + ...] (zeroed by each pass)
  // This thread's share of the row sums (its two tokens of every tile it softmaxed): row k = 2 j + e
  // is component k % 4 of chunk k / 4 (s_lp).
  auto lp_load = [&](int c) { return s_lp[c * kMathThreads]; };
  auto lp_store = [&](int c, float4 v) { s_lp[c * kMathThreads] = v; };

  // Tile t of the pass is ring sequence number seq0 + t (the rerun continues the sequence).
  int seq0 = 0;
  auto wait_tile = [&](int t) { mbar_wait(full0 + 8 * ((seq0 + t) % L::kSlots), ((seq0 + t) / L::kSlots) & 1); };
  auto raw_of = [&](int t) { return ring + ((seq0 + t) % L::kSlots) * L::kRawTile; };
  auto release_tile = [&](int t) { mbar_arrive(empty0 + 8 * ((seq0 + t) % L::kSlots)); };

  // S^T of tile t into sc: per 64-dim block, the thread's two 16-byte pieces -> four k16 steps of A.
  auto issue_s = [&](auto clamp, float (&sc)[32], int t) {
    constexpr bool kClamp = decltype(clamp)::value;
    const uint8_t* raw = raw_of(t);
    uint32_t ka[2][2][4];  // two k16 steps a commit group, two groups in flight
#pragma unroll
    for (int c = 0; c < kBlocks; ++c) {
      const uint4 x0 = *reinterpret_cast<const uint4*>(raw + c * L::kRawBlock + k_off0);
      const uint4 x1 = *reinterpret_cast<const uint4*>(raw + c * L::kRawBlock + k_off1);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int grp = 2 * c + hf;
        if (grp >= 2) wg_wait<1>();  // group grp - 2's wgmmas (the last readers of ka[grp & 1]) are done
        uint32_t(&a)[2][4] = ka[grp & 1];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * hf + jj;
          e4m3x4_to_f16x2x2<kClamp>(u4_word(x0, j), a[jj][0], a[jj][2]);
          e4m3x4_to_f16x2x2<kClamp>(u4_word(x1, j), a[jj][1], a[jj][3]);
        }
        wg_fence();
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * hf + jj;
          WgmmaRSN<64, true>::rs(sc, a[jj], dq + (uint32_t(c * (64 * 128) + j * 32) >> 4), (c | j) != 0 ? 1u : 0u);
        }
        wg_commit();
      }
    }
    wg_wait<0>();  // also retires every product before it (this warpgroup's O is free)
    reg_fence(sc);
    reg_fence(o);
  };

  // The softmax of tile t's scores (sc) against s_run: P^T into pb, this warpgroup's row sums, and
  // (when a score passed the running max by more than kLazyTau) the new maxima into s_run and the
  // alphas into s_alpha[tile parity] (flag set). Returns whether the maximum moved; the alphas are
  // then applied to lp here and to O by the caller (rescale_o).
  auto softmax = [&](float (&sc)[32], int t, uint8_t* pb) -> bool {
    const int valid = sr.seq - (sr.tile0 + t) * kTileS;
    // The running maxima are read from s_run where they are used (held in registers they spilled).
    auto mrun = [&](int j) { return *reinterpret_cast<const float2*>(s_run + 8 * j + 2 * q); };
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 qf = *reinterpret_cast<const float2*>(s_qf + 8 * j + 2 * q);
      sc[4 * j] = (sc[4 * j] * qf.x) * sl2;
      sc[4 * j + 1] = (sc[4 * j + 1] * qf.y) * sl2;
      sc[4 * j + 2] = (sc[4 * j + 2] * qf.x) * sl2;
      sc[4 * j + 3] = (sc[4 * j + 3] * qf.y) * sl2;
    }
    // Keys at or past a row's limit: the request's length, and with causal masks the row's own.
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      uint32_t d = deltas[k >> 3];
      asm volatile("" : "+r"(d));
      const int v = valid - int((d >> (4 * (k & 7))) & 15u);
      if (ta >= v) sc[4 * (k >> 1) + (k & 1)] = -INFINITY;
      if (tb >= v) sc[4 * (k >> 1) + 2 + (k & 1)] = -INFINITY;
    }
    auto store_p = [&](int h, float pa, float pv) {
      *reinterpret_cast<uint16_t*>(pb + h * 128 + (((kla >> 3) ^ (h & 7)) << 4) + (kla & 7) * 2) = to_bits<true>(pa);
      *reinterpret_cast<uint16_t*>(pb + h * 128 + (((klb >> 3) ^ (h & 7)) << 4) + (klb & 7) * 2) = to_bits<true>(pv);
    };
    bool over = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 m = mrun(j);
      over |= sc[4 * j] > m.x + kLazyTau || sc[4 * j + 2] > m.x + kLazyTau;
      over |= sc[4 * j + 1] > m.y + kLazyTau || sc[4 * j + 3] > m.y + kLazyTau;
    }
    float ts[16];
    if (!__any_sync(0xffffffffu, over)) {  // a warp that will take the exact step anyway stores nothing
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 m = mrun(j);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float base = softmax_base(e == 0 ? m.x : m.y);  // a row that has seen no key and has none here stays 0
          const float pa = ex2(sc[4 * j + e] - base), pv = ex2(sc[4 * j + 2 + e] - base);
          ts[2 * j + e] = pa + pv;
          store_p(8 * j + 2 * q + e, pa, pv);
        }
      }
    }
    fence_proxy_async();
    const bool moved = named_bar_or(2 + w, 128, over);
    if (!moved) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float4 v = lp_load(c);
        lp_store(c, make_float4(v.x + ts[4 * c], v.y + ts[4 * c + 1], v.z + ts[4 * c + 2], v.w + ts[4 * c + 3]));
      }
    } else {
      // The exact step: each row's maximum over the tile's 64 tokens (the 8 g lanes, then the 4 warps).
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int j = k >> 1, e = k & 1;
        float m = fmaxf(sc[4 * j + e], sc[4 * j + 2 + e]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (g == 0) s_red[(w * 4 + warp) * 64 + 8 * j + 2 * q + e] = m;
      }
      named_bar_sync(2 + w, 128);
      auto new_max = [&](int h, float mp) {
        const float* red = s_red + w * 4 * 64 + h;
        return fmaxf(mp, fmaxf(fmaxf(red[0], red[64]), fmaxf(red[128], red[192])));
      };
      float* alpha_out = s_alpha + (t & 1) * 64;
      float4 cur = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 m = mrun(j);
        if ((j & 1) == 0) cur = lp_load(j >> 1);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int k = 2 * j + e, h = 8 * j + 2 * q + e;
          const float mp = e == 0 ? m.x : m.y, mn = new_max(h, mp);
          const float alpha = softmax_alpha(mp, mn);
          const float base = softmax_base(mn);
          const float pa = ex2(sc[4 * j + e] - base), pv = ex2(sc[4 * j + 2 + e] - base);
          float& l = (k & 3) == 0 ? cur.x : (k & 3) == 1 ? cur.y : (k & 3) == 2 ? cur.z : cur.w;
          l = l * alpha + pa + pv;
          store_p(h, pa, pv);
          if (warp == 0 && g == 0) {
            alpha_out[h] = alpha;
            s_mnew[w * 64 + h] = mn;
          }
        }
        if ((j & 1) == 1) lp_store(j >> 1, cur);
      }
      fence_proxy_async();
      named_bar_sync(2 + w, 128);
      // Every thread of the warpgroup has read s_run (above): the new maxima replace it (the lanes
      // that wrote them; s_red may be reused by then).
      if (warp == 0 && g == 0) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int h = 8 * j + 2 * q;
          *reinterpret_cast<float2*>(s_run + h) = *reinterpret_cast<const float2*>(s_mnew + w * 64 + h);
        }
      }
    }
    if (lt == 0) s_flag[t & 1] = moved ? 1 : 0;
    return moved;
  };
  // O^T times the alphas of tile t (s_alpha[t & 1]); nothing may be in flight on O.
  auto rescale_o = [&](int t) {
    const float* al = s_alpha + (t & 1) * 64;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 a = *reinterpret_cast<const float2*>(al + 8 * j + 2 * q);
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) {
        o[32 * mb + 4 * j] *= a.x;
        o[32 * mb + 4 * j + 1] *= a.y;
        o[32 * mb + 4 * j + 2] *= a.x;
        o[32 * mb + 4 * j + 3] *= a.y;
      }
    }
  };
  auto rescale_lp = [&](int t) {
    const float* al = s_alpha + (t & 1) * 64;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float2 a0 = *reinterpret_cast<const float2*>(al + 8 * (2 * c) + 2 * q);
      const float2 a1 = *reinterpret_cast<const float2*>(al + 8 * (2 * c + 1) + 2 * q);
      const float4 v = lp_load(c);
      lp_store(c, make_float4(v.x * a0.x, v.y * a0.y, v.z * a1.x, v.w * a1.y));
    }
  };
  // O^T += V^T.P^T over tile t's V half of this warpgroup (P^T in pb): per k16 step, four tokens'
  // 8 dims -> four m64 blocks' A registers (two commit groups of two blocks); then the slot is
  // handed back. The products are retired before it returns (no register an unfinished wgmma
  // reads may be reused).
  auto pv = [&](auto clamp, int t, const uint8_t* pb) {
    constexpr bool kClamp = decltype(clamp)::value;
    uint32_t va[2][2][4];
    const uint8_t* raw = raw_of(t);
    const int valid = sr.seq - (sr.tile0 + t) * kTileS;
    const uint64_t dp = sw128_desc(smem_u32(pb), 16, 1024);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint2 tv[4];
#pragma unroll
      for (int jt = 0; jt < 4; ++jt) tv[jt] = *reinterpret_cast<const uint2*>(raw + v_off[jt] + ks * 1024);
      if (ks == 3) release_tile(t);  // this thread's last reads of the slot
      // Tokens past seq_len hold whatever the cache holds (maybe NaN codes): P = 0 would not clear them.
      if (valid < kTileS) {
#pragma unroll
        for (int jt = 0; jt < 4; ++jt)
          if (16 * ks + 4 * jt + q >= valid) tv[jt] = make_uint2(0u, 0u);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // word 0 of each token: blocks 0, 1; word 1: blocks 2, 3
        const int grp = 2 * ks + half;
        if (grp >= 2) wg_wait<1>();  // the last readers of va[half] are done
        uint32_t(&a)[2][4] = va[half];
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {  // tokens (0, 1) -> registers 0, 1; tokens (2, 3) -> 2, 3
          const uint32_t x = half == 0 ? tv[2 * pr].x : tv[2 * pr].y, y = half == 0 ? tv[2 * pr + 1].x : tv[2 * pr + 1].y;
          // [x.b0, y.b0, x.b1, y.b1]: dims 2 mb and 2 mb + 1 of the token pair; then the next two dims.
          e4m3x4_to_f16x2x2<kClamp>(__byte_perm(x, y, 0x5140u), a[0][2 * pr], a[0][2 * pr + 1]);
          e4m3x4_to_f16x2x2<kClamp>(__byte_perm(x, y, 0x7362u), a[1][2 * pr], a[1][2 * pr + 1]);
        }
        wg_fence();
#pragma unroll
        for (int i = 0; i < 2; ++i)
          WgmmaRSN<64, true>::rs(o + 32 * (2 * half + i), a[i], dp + (uint32_t(ks * 32) >> 4), 1u);
        wg_commit();
      }
    }
    wg_wait<0>();
    reg_fence(o);
  };

  const int pairs = (sr.n + 1) >> 1, full_pairs = sr.n >> 1;
  uint8_t* const pa_buf = sp;
  uint8_t* const pb_buf = sp + L::kPBytes;
  // One pass over the split's tiles. A_READY completes once a pair, B_READY and PA_FREE once a
  // whole pair: a rerun's phases continue from those of the pass before it (a_base, f_base).
  auto pass = [&](auto clamp, int a_base, int f_base) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) lp_store(c, make_float4(0.f, 0.f, 0.f, 0.f));
    if (w == 0) {
      for (int k = 0; k < pairs; ++k) {
        const int ta_ = 2 * k, tb_ = ta_ + 1;
        const bool has_b = tb_ < sr.n;
        float sc[32];
        wait_tile(ta_);
        issue_s(clamp, sc, ta_);  // S^T_A
        if (k > 0) mbar_wait(pa_free, (f_base + k - 1) & 1);  // P^T_A and alpha_A of the pair before are read
        if (softmax(sc, ta_, pa_buf)) rescale_o(ta_);
        mbar_arrive(a_ready);
        pv(clamp, ta_, pa_buf);  // O^T_L += V^T_A,L.P^T_A
        if (has_b) {
          mbar_wait(b_ready, (f_base + k) & 1);
          wait_tile(tb_);
          if (s_flag[1] != 0) {
            rescale_o(tb_);
            rescale_lp(tb_);
          }
          pv(clamp, tb_, pb_buf);  // O^T_L += V^T_B,L.P^T_B
        }
      }
    } else {
      // Whole pairs in the loop, the odd last tile after it (as the seesaw kernel).
      for (int k = 0; k < full_pairs; ++k) {
        const int ta_ = 2 * k, tb_ = ta_ + 1;
        float sc[32];
        wait_tile(tb_);
        issue_s(clamp, sc, tb_);  // S^T_B; retires O^T_R += V^T_B,R.P^T_B of the pair before
        mbar_wait(a_ready, (a_base + k) & 1);
        wait_tile(ta_);
        // Softmax B first (it needs only A's maxima), so warpgroup 0's next products wait for no
        // product of this one; then A's and B's products, each after its alphas.
        const bool moved_a = s_flag[0] != 0;
        if (moved_a) rescale_lp(ta_);
        const bool moved_b = softmax(sc, tb_, pb_buf);
        mbar_arrive(b_ready);
        if (moved_a) rescale_o(ta_);
        pv(clamp, ta_, pa_buf);  // O^T_R += V^T_A,R.P^T_A
        mbar_arrive(pa_free);
        if (moved_b) rescale_o(tb_);
        pv(clamp, tb_, pb_buf);  // O^T_R += V^T_B,R.P^T_B
      }
      if (sr.n & 1) {  // the last pair has only A
        const int k = full_pairs, ta_ = 2 * k;
        mbar_wait(a_ready, (a_base + k) & 1);
        wait_tile(ta_);
        if (s_flag[0] != 0) {
          rescale_o(ta_);
          rescale_lp(ta_);
        }
        pv(clamp, ta_, pa_buf);
      }
    }
  };
  pass(std::false_type{}, 0, 0);
  // NaN anywhere in this thread's output or sums: an e4m3 NaN code (read as NaN without the clamp),
  // or NaN from the data itself (q, the scale, infinite scores). Then the split runs again with
  // NaN codes read as 448 (the header's contract); real NaNs come out NaN again. As the N8 kernel:
  // the clamp, one min a pair of values, measured 0.75-0.82x -> 0.66-0.74x the bf16 speed here.
  float probe = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float4 v = lp_load(c);
    probe += (v.x + v.y) + (v.z + v.w);
  }
#pragma unroll
  for (int i = 0; i < 128; ++i) probe += o[i] * 0.f;  // 0 for finite o, NaN for NaN or inf
  const bool rerun = named_bar_or(1, kMathThreads, isnan(probe));
  if (tid == 0) {
    s_rerun = rerun;
    mbar_arrive(verdict_bar);  // the producer streams the tiles again, or exits
  }
  if (rerun) {
    seq0 = sr.n;
    if (tid < 64) s_run[tid] = -INFINITY;  // every math thread is past its last read (the barrier above)
    mbar_sync(math_bar, math_phase);
    pass(std::true_type{}, pairs, full_pairs);
  }

  // Epilogue: l = the two warpgroups' sums (both relative to s_run, the final maximum), O = O^T / l
  // times the scale, LSE; O^T staged as fp32 rows over the ring and Q (both idle), then stored.
  float lp[16];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float4 v = lp_load(c);
    lp[4 * c] = v.x, lp[4 * c + 1] = v.y, lp[4 * c + 2] = v.z, lp[4 * c + 3] = v.w;
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 4);
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 8);
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 16);
    if (g == 0) s_red[(w * 4 + warp) * 64 + 8 * (k >> 1) + 2 * q + (k & 1)] = lp[k];
  }
  mbar_sync(math_bar, math_phase);
  float coef[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int h = 8 * (k >> 1) + 2 * q + (k & 1);
    float l = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) l += s_red[i * 64 + h];
    coef[k] = softmax_inv(l) * (l == 0.f ? 1.f : kv_scale);
    if (w == 0 && warp == 0 && g == 0) s_lse[h] = (s_run[h] + __log2f(l)) * kLn2;
  }
  float* so = reinterpret_cast<float*>(ring);  // [64 rows][kOStride]
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int j = k >> 1, e = k & 1, h = 8 * j + 2 * q + e;
      *reinterpret_cast<float2*>(so + h * L::kOStride + 256 * w + 64 * warp + 8 * g + 2 * mb) =
          make_float2(o[32 * mb + 4 * j + e] * coef[k], o[32 * mb + 4 * j + 2 + e] * coef[k]);
    }
  mbar_sync(math_bar, math_phase);
  store_rows<false>(so, L::kOStride, rows, row0, s_lse, p, sr, tid, kMathThreads);
}

}  // namespace graphsafe::mla_sm90

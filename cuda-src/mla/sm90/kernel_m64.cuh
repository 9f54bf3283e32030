// The sm90 MLA split kernel "M64" (more than 32 query rows, fp8 caches); see kernels.cuh and
// decode.cu. A bf16/fp16 cache at these row counts takes the seesaw kernel (kernel_seesaw.cuh),
// which replaced this kernel's native path (0.74x -> 1.0x and more of its time per call).
#pragma once

#include "mla/sm90/fp8.cuh"
#include "mla/sm90/split.cuh"
#include "mla/sm90/wgmma_ops.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// Kernel "M64": query rows as the MMA's M. One CTA = (64-row group, split, request); for 33..2048 rows
// over an fp8 cache (the tile is dequantised to bf16 in shared memory, then read like a bf16 tile).
//
//   warpgroup 0: S = Q.K^T (m64n64k16 x 36, Q and K from shared memory), online softmax in
//                registers, P (bf16/fp16) into the tile's rope block (dead once S is done), then
//                O[:, 0:256] += P.V (m64n256k16 x 4).
//   warpgroup 1: waits for P, O[:, 256:512] += P.V.
//   warpgroup 2: the producer, two stages of 64 tokens, all 128 threads: TMA of the raw tile into
//                its stage and an in-place dequantisation (fp8.cuh, produce_fp8_in_place).
// WG0 issues S(i+1) while both warpgroups' P.V(i) are still running on the tensor cores.
// Shared memory: Q 72 KiB + 2 x 72 KiB KV stages + row scales + barriers and 2 raw-tile barriers.
// =================================================================================================
constexpr int kM64Smem = 3 * kStageBytes + (128 + 64 + 64) * 4 + 9 * 8 + 1024;

template <bool F16, int KV>
__global__ void __launch_bounds__(kThreads, 1)
    mla_sm90_m64_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap scale_map,
                        const __grid_constant__ CUtensorMap rope_map, const Params p) {
  static_assert(KV != kKvNative && !F16, "the M64 kernel reads fp8 caches with bf16 queries");
  static_assert(kM64Smem <= 232448, "M64 kernel: shared memory");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * 64;
  const int rows = min(64, p.rows - row0);
  const SplitRange sr = split_range(p);  // every thread, before the roles split
  if (!sr.active) return;
  const int b = sr.b;
  if (sr.n == 0) {
    write_empty<F16>(p, sr, row0, rows, tid, kThreads);
    return;
  }

  uint8_t* sq = smem;
  uint8_t* skv = smem + kStageBytes;
  float* s_alpha = reinterpret_cast<float*>(smem + 3 * kStageBytes);  // [2][64]
  float* s_inv_l = s_alpha + 128;                                     // [64]
  float* s_lse = s_inv_l + 64;                                        // [64]
  const uint32_t bars = smem_u32(s_lse + 64);
  const uint32_t full0 = bars, empty0 = bars + 16, pready0 = bars + 32, math_bar = bars + 48;
  const uint32_t sq_a = smem_u32(sq), skv_a = smem_u32(skv);

  {
    // Full barriers: one arrival per producer thread. Raw tiles: the TMA's expect_tx.
    const uint32_t rawfull0 = math_bar + 8;
    if (!enter_roles_with<3, kMathRegs, kProducerRegs, 2>(tid, bars, {128u, uint32_t(kMathThreads), 128u}, 1u, [&](int pt) {
          produce_fp8_in_place<KV>(&kv_map, &scale_map, &rope_map, p, b, sr, skv, full0, empty0, rawfull0, pt);
        }))
      return;
  }

  uint32_t math_phase = 0;
  load_q<64, kMathThreads>(sq, p, b, row0, rows, tid);
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int wg = tid >> 7;
  const int lane = tid & 31, q = lane & 3;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2), r1 = r0 + 8;  // accumulator rows (query rows row0 + r)
  const int keys0 = row_keys(p, sr.seq, row0 + r0), keys1 = row_keys(p, sr.seq, row0 + r1);  // causal limits
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  // The per-tensor fp8 scale multiplies every K and V (the stages hold the codes' exact values):
  // applied to the scores before they are masked and their maximum taken, and to the output's
  // normalisation, as in the N kernel (kernel_n.cuh says why in that order).
  const float kv_scale = KV == kKvFp8PerTensor ? __ldg(p.kv_scale) : 1.f;
  if (wg == 0) {
    const float sl2_scores = p.scale_log2 * kv_scale;
    const float sl2 = KV == kKvFp8PerTensor ? 1.f : sl2_scores;  // what the softmax below multiplies by
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const uint64_t dq = sw128_desc(sq_a, 16, 1024);
    for (int i = 0; i < sr.n; ++i) {
      const int s = i & 1;
      const uint32_t st = skv_a + s * kStageBytes;
      mbar_wait(full0 + 8 * s, (i >> 1) & 1);
      float sc[32];
      const uint64_t dk = sw128_desc(st, 16, 1024);
      wg_fence();
#pragma unroll
      for (int k = 0; k < 36; ++k) {
        const uint32_t off = uint32_t((k >> 2) * kBlockBytes + (k & 3) * 32) >> 4;
        Wgmma<64, F16>::template ss<0, 0>(sc, dq + off, dk + off, k > 0 ? 1u : 0u);
      }
      wg_commit();
      wg_wait<0>();  // S(i), and P.V(i-1) issued last iteration
      reg_fence(sc);
      reg_fence(o);
      if (i > 0) mbar_arrive(empty0 + 8 * ((i - 1) & 1));
      if constexpr (KV == kKvFp8PerTensor) {
#pragma unroll
        for (int k = 0; k < 32; ++k) sc[k] *= sl2_scores;
      }

      // Online softmax on rows r0, r1; columns 8j + 2q + {0,1} (j = 0..7). Keys at or past a
      // row's limit (the length; causal: the row's own) are masked; a row with none in this tile
      // keeps its maximum (-inf if it has seen no key yet: softmax_base/alpha keep it harmless).
      const int valid = sr.seq - (sr.tile0 + i) * kTileS;  // >= 1: the V rows past the length
      const int v0 = keys0 - (sr.tile0 + i) * kTileS, v1 = keys1 - (sr.tile0 + i) * kTileS;
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = 8 * j + 2 * q;
        if (c >= v0) sc[4 * j] = -INFINITY;
        if (c + 1 >= v0) sc[4 * j + 1] = -INFINITY;
        if (c >= v1) sc[4 * j + 2] = -INFINITY;
        if (c + 1 >= v1) sc[4 * j + 3] = -INFINITY;
        mx0 = fmaxf(mx0, fmaxf(sc[4 * j], sc[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
      const float a0 = softmax_alpha(m0, mn0), a1 = softmax_alpha(m1, mn1);
      m0 = mn0;
      m1 = mn1;
      const float e0 = softmax_base(mn0), e1 = softmax_base(mn1);
      float sum0 = 0.f, sum1 = 0.f;
      uint32_t pk[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = ex2(fmaf(sc[4 * j], sl2, -e0)), p1 = ex2(fmaf(sc[4 * j + 1], sl2, -e0));
        const float p2 = ex2(fmaf(sc[4 * j + 2], sl2, -e1)), p3 = ex2(fmaf(sc[4 * j + 3], sl2, -e1));
        sum0 += p0 + p1;
        sum1 += p2 + p3;
        pk[2 * j] = pack2<F16>(p0, p1);
        pk[2 * j + 1] = pack2<F16>(p2, p3);
      }
      l0 = l0 * a0 + sum0;
      l1 = l1 * a1 + sum1;

      // P -> the tile's rope block: K-major [64 heads x 64 tokens], the A operand of P.V.
      uint8_t* stage = skv + s * kStageBytes;
      uint8_t* pb = stage + 8 * kBlockBytes;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int off = ((j ^ (r0 & 7)) << 4) + 4 * q;
        *reinterpret_cast<uint32_t*>(pb + r0 * 128 + off) = pk[2 * j];
        *reinterpret_cast<uint32_t*>(pb + r1 * 128 + off) = pk[2 * j + 1];
      }
      if (q == 0) {
        s_alpha[s * 64 + r0] = a0;
        s_alpha[s * 64 + r1] = a1;
      }
      if (valid < kTileS) zero_tail_rows(stage, valid, tid, 128);
      fence_proxy_async();
      mbar_arrive(pready0 + 8 * s);
      named_bar_sync(2, 128);

#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
      }
      const uint64_t dp = sw128_desc(st + 8 * kBlockBytes, 16, 1024);
      const uint64_t dv = sw128_desc(st, kBlockBytes, 1024);  // dims 0..255: blocks 0..3
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) Wgmma<256, F16>::template ss<0, 1>(o, dp + ((k * 32) >> 4), dv + ((k * 2048) >> 4), 1u);
      wg_commit();
    }
    wg_wait<0>();
    reg_fence(o);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (q == 0) {
      // A row that saw no key is zeros, whatever the scale (as an empty request's).
      s_inv_l[r0] = l0 == 0.f ? 0.f : 1.f / l0 * kv_scale;
      s_inv_l[r1] = l1 == 0.f ? 0.f : 1.f / l1 * kv_scale;
      s_lse[r0] = (m0 + __log2f(l0)) * kLn2;
      s_lse[r1] = (m1 + __log2f(l1)) * kLn2;
    }
  } else {
    for (int i = 0; i < sr.n; ++i) {
      const int s = i & 1;
      const uint32_t st = skv_a + s * kStageBytes;
      mbar_wait(pready0 + 8 * s, (i >> 1) & 1);
      const float a0 = s_alpha[s * 64 + r0], a1 = s_alpha[s * 64 + r1];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
      }
      const uint64_t dp = sw128_desc(st + 8 * kBlockBytes, 16, 1024);
      const uint64_t dv = sw128_desc(st + 4 * kBlockBytes, kBlockBytes, 1024);  // dims 256..511
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) Wgmma<256, F16>::template ss<0, 1>(o, dp + ((k * 32) >> 4), dv + ((k * 2048) >> 4), 1u);
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
      mbar_arrive(empty0 + 8 * s);
    }
  }

  // Epilogue: normalise, stage fp32 rows in the (now idle) KV stages, store coalesced.
  mbar_sync(math_bar, math_phase);
  float* so = reinterpret_cast<float*>(skv);
  stage_and_store_o64<F16>(so, o, wg * 256, q, r0, r1, s_inv_l[r0], s_inv_l[r1], math_bar, math_phase, rows, row0, s_lse, p, sr, tid);
}

}  // namespace graphsafe::mla_sm90

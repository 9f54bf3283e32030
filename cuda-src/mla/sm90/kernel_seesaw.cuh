// The sm90 MLA split kernel "seesaw" (more than 32 query rows, every cache format),
// docs/design/mla-sm90-compute-bound.md §5 (bf16/fp16) and §7.3.2 (fp8).
#pragma once

#include "mla/sm90/fp8.cuh"
#include "mla/sm90/split.cuh"
#include "mla/sm90/wgmma_ops.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// One CTA = (64-row group, split, request); a row is a query row (a head of one of the s_q tokens). The split's tiles are taken two at a time, a pair
// (A = tile 2k in buffer 0, B = tile 2k + 1 in buffer 1), and the output by columns: warpgroup 0
// owns O_L = O[:, 0:256], warpgroup 1 owns O_R = O[:, 256:512].
//
//   WG0: S_A = Q.K_A^T box by box; softmax A against the running max -> m_A, alpha_A, P_A (in
//        registers, and into buffer 0's block 8 for WG1); O_L = O_L alpha_A + P_A.V_A,L (RS); then,
//        once WG1 published B: O_L = O_L alpha_B + P_B.V_B,L (P_B from buffer 1's block 8).
//   WG1: S_B = Q.K_B^T (on the tensor cores while WG0 runs softmax A); O_R = O_R alpha_A +
//        P_A.V_A,R (P_A from smem), softmax B against m_A (under that product), then O_R = O_R
//        alpha_B + P_B.V_B,R (RS).
//   WG2: one thread streams the tiles by 64-column box, each box with its own full barrier; each
//        box group is refilled once its last reader released it (the four release groups below).
//        Over an fp8 cache all 128 threads convert the boxes into the same stages instead, in the
//        same order under the same releases (produce_fp8_seesaw, fp8.cuh).
//
// Lazy maximum: the running max moves only when a row max exceeds it by more than kLazyTau (log2
// units), so alpha is exactly 1 in the common case and the O rescales are skipped per warp.
// P <= 2^kLazyTau stays far inside bf16, fp16 and the f32 sums.
//
// Release groups (an mbarrier of 128 arrivals each: the releasing warpgroup's threads, after their
// wgmma.wait_group proved their reads done):
//   E0L: buffer 0 blocks 0..3  (last reader WG0: P_A.V_A,L)
//   E0R: buffer 0 blocks 4..8  (last reader WG1: P_A.V_A,R, which reads P_A in block 8)
//   E1R: buffer 1 blocks 4..7  (last reader WG1: P_B.V_B,R)
//   E1L: buffer 1 blocks 0..3, 8 (last reader WG0: P_B.V_B,L, which reads P_B in block 8)
// A_READY / B_READY (128 arrivals): the publishing warpgroup's P, maxima and alphas are in smem.
// A warpgroup cannot publish pair k + 1 before the other consumed pair k (its next S needs a box
// the other released), so one barrier per direction, parity k & 1, suffices.
// =================================================================================================
constexpr float kLazyTau = 8.f;
// Keeps the packed P registers (an RS wgmma's A operand) where they are until its wait_group.
template <int R>
__device__ __forceinline__ void reg_fence_u32(uint32_t (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// Barriers: full(b, c) = 9 pairs; the release groups E0L/E0R, E1R/E1L as two pairs; A/B_READY; math;
// a CTA pair's forwarded releases (the peer's E0L, E0R, E1R, E1L: fp8.cuh).
constexpr int kSeesawPairs = kBlocks + 3, kSeesawForwards = 4;
constexpr int kSeesawUsed = 3 * kStageBytes + 7 * 64 * 4 + (2 * kSeesawPairs + 1 + kSeesawForwards) * 8;
constexpr int kSeesawSmem = kSeesawUsed + 1024;  // + the alignment of the base to 1 KiB
// Over an fp8 cache: the feed's ring of raw codes after the barriers (fp8.cuh). With the pair's
// forward barriers it takes all of what sm90 lets a block have (227 KiB, static shared memory
// included: split_range_pair's 16 bytes; a new barrier or __shared__ variable must come out of
// this budget or the launch fails).
constexpr int kSeesawRawOff = (kSeesawUsed + 15) / 16 * 16;
constexpr int kSeesawFp8Smem = kSeesawRawOff + kRawSlots * kRawSlotBytes + 1024;
static_assert(kSeesawFp8Smem + 16 <= 227 * 1024, "the sm90 opt-in shared memory per block");
template <int KV>
constexpr int seesaw_smem() { return KV == kKvNative ? kSeesawSmem : kSeesawFp8Smem; }

// The producer for the seesaw: tile t's boxes in the order their groups are released.
// After tile 0 it waits until the math warpgroups have staged Q (the math barrier's first phase):
// Q's loads hit L2 but queue behind the DRAM misses of every CTA's second tile when all are issued
// at once, and the first S product needs Q and tile 0 only. H200, scratch harness, graphs of 10, 128
// heads, outputs bit-identical: 1 x 65,536 44.0 -> 43.2 us (pages drawn from a 1M-token cache 44.3
// -> 43.6), 4 x 16,384 45.3 -> 44.8; 16 x 16,384 and 64 x 4096 unchanged. Waiting before tile 0
// instead was in between (43.7 us).
__device__ __forceinline__ void produce_tiles_seesaw(const CUtensorMap* map, const Params& p, int b, const SplitRange& sr,
                                                     uint32_t stages, uint32_t full0, uint32_t rel0, uint32_t q_ready) {
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  // rel0: E0L, E0R (pair), then E1R, E1L.
  const uint32_t e0l = rel0, e0r = rel0 + 8, e1r = rel0 + 16, e1l = rel0 + 24;
  for (int t = 0; t < sr.n; ++t) {
    const int bf = t & 1;
    const int tok = (sr.tile0 + t) * kTileS;
    const int page = min(max(__ldg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
    const int row = page * p.page_size + tok % p.page_size;
    const uint32_t dst = stages + bf * kStageBytes, parity = ((t >> 1) - 1) & 1;
    auto box = [&](int c) {
      const uint32_t bar = full0 + 16 * c + 8 * bf;
      mbar_arrive_expect_tx(bar, kBlockBytes);
      tma_load_2d_evict_first(dst + c * kBlockBytes, map, c * 64, row, bar);
    };
    if (bf == 0) {
      if (t >= 2) mbar_wait(e0l, parity);
      for (int c = 0; c < 4; ++c) box(c);
      if (t >= 2) mbar_wait(e0r, parity);
      for (int c = 4; c < kBlocks; ++c) box(c);
    } else {
      if (t >= 2) mbar_wait(e1r, parity);
      for (int c = 4; c < 8; ++c) box(c);
      if (t >= 2) mbar_wait(e1l, parity);
      for (int c = 0; c < 4; ++c) box(c);
      box(8);
    }
    // Phase 0 of the math barrier, which the math threads use again later (epilogue): with a
    // second tile still to issue they cannot get past phase 0 yet, so a parity wait here cannot
    // mistake a later phase for it whatever the number of later uses; with one tile there is
    // nothing left to hold back.
    if (t == 0 && sr.n > 1) mbar_wait(q_ready, 0);
  }
}

// KV: the cache's format. The 656-byte fp8 cache (bf16 queries) is fed by produce_fp8_seesaw
// (fp8.cuh) into the same stages, as bf16 values. The per-tensor fp8 cache runs the seesaw RS
// kernel instead (kernel_seesaw_rs.cuh).
// kPair (fp8 only; decode.cu launches it for the 656-byte format): clusters of two along x, the two
// row groups of a split share the conversion of its tiles (fp8.cuh). The math warps release their
// own CTA's boxes; the feeds forward the releases, so a box is refilled once both CTAs read it.
// kv_map: the bf16 cache's boxes, or the 656-byte format's rope boxes.
template <bool F16, int KV, bool kPair>
__global__ void __launch_bounds__(kThreads, 1) mla_sm90_seesaw_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  static_assert(KV == kKvNative || !F16, "fp8 caches take bf16 queries");
  static_assert(KV != kKvFp8PerTensor, "the per-tensor fp8 cache runs the seesaw RS kernel");
  constexpr bool kFp8 = KV != kKvNative;
  static_assert(kFp8 || !kPair, "only the fp8 feed is shared by a pair");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  const int row0 = blockIdx.x * 64;
  const int rows = min(64, p.rows - row0);
  uint8_t* sq = smem;
  uint8_t* skv = smem + kStageBytes;
  float* s_ma = reinterpret_cast<float*>(smem + 3 * kStageBytes);  // [64] m_A
  float* s_aa = s_ma + 64;                                          // [64] alpha_A
  float* s_mb = s_aa + 64;                                          // [64] m_B
  float* s_ab = s_mb + 64;                                          // [64] alpha_B
  float* s_l = s_ab + 64;                                           // [2][64] partial sums
  float* s_lse = s_l + 128;                                         // [64]
  const uint32_t bars = smem_u32(s_lse + 64);
  // full(b, c) = bars + 16 c + 8 b; E0L, E0R, E1R, E1L; A_READY, B_READY; math.
  const uint32_t full0 = bars, rel0 = bars + 16 * kBlocks, ready0 = rel0 + 32, math_bar = ready0 + 16;
  const uint32_t e0l = rel0, e0r = rel0 + 8, e1r = rel0 + 16, e1l = rel0 + 24, a_ready = ready0, b_ready = ready0 + 8;
  const uint32_t sq_a = smem_u32(sq), skv_a = smem_u32(skv);
  // A full barrier: every feed thread's arrival (in a pair also the peer's half, as transactions);
  // box 8 (the rope) in both formats: its TMA's. A release group: the releasing warpgroup's 128
  // threads. A forwarded release (a pair): one arrival, from the peer's feed.
  constexpr uint32_t f = kFp8 ? 128u : 1u;
  constexpr uint32_t kCounts[kSeesawPairs] = {f, f, f, f, f, f, f, f, 1u, 128u, 128u, 128u};
  const uint32_t rank = kPair ? cluster_rank() : 0u;
  // Every thread, before the roles split. A pair initialises its barriers first (the peer arrives
  // on them) and from then on leaves only through the cluster barrier at the end.
  const SplitRange sr =
      kPair ? split_range_pair(p, [&] { init_barriers<kSeesawPairs, kSeesawForwards>(bars, kCounts, 1u); }) : split_range(p);
  if (!sr.active) {
    if constexpr (kPair) cluster_sync();
    return;
  }
  const int b = sr.b;
  if (sr.n == 0) {
    write_empty<F16>(p, sr, row0, rows, tid, kThreads);
    if constexpr (kPair) cluster_sync();
    return;
  }

  if constexpr (kPair) {
    using F = SeesawFp8;
    if (!enter_roles_init<F::kMathRegs, F::kProducerRegs>(tid, [] {}, [&](int pt) {
          produce_fp8_seesaw<true>(&kv_map, p, b, sr, skv, smem + kSeesawRawOff, full0, rel0, math_bar + 8, math_bar, pt, rank);
        }))
      return;
  } else if constexpr (kFp8) {
    using F = SeesawFp8;
    if (!enter_roles_with<kSeesawPairs, F::kMathRegs, F::kProducerRegs>(tid, bars, kCounts, 0u, [&](int pt) {
          produce_fp8_seesaw<false>(&kv_map, p, b, sr, skv, smem + kSeesawRawOff, full0, rel0, 0u, math_bar, pt, 0u);
        }))
      return;
  } else {
    if (!enter_roles_with<kSeesawPairs, kMathRegs, kProducerRegs>(
            tid, bars, kCounts, 0u, [&](int pt) {
              if (pt == 0) produce_tiles_seesaw(&kv_map, p, b, sr, skv_a, full0, rel0, math_bar);  // math_bar phase 0: Q staged
            }))
      return;
  }

  uint32_t math_phase = 0;
  load_q<64, kMathThreads>(sq, p, b, row0, rows, tid);
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int wg = tid >> 7, wt = tid & 127;
  const int lane = tid & 31, q = lane & 3;
  const int r0 = (wt >> 5) * 16 + (lane >> 2), r1 = r0 + 8;  // accumulator rows (query rows row0 + r)
  const int keys0 = row_keys(p, sr.seq, row0 + r0), keys1 = row_keys(p, sr.seq, row0 + r1);  // causal limits
  const float sl2 = p.scale_log2;  // what the softmax multiplies by
  const uint64_t dq = sw128_desc(sq_a, 16, 1024);
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (log2 units, scale folded) of rows r0, r1
  float l0 = 0.f, l1 = 0.f;              // this warpgroup's partial row sums, relative to m0, m1
  const int pairs = (sr.n + 1) >> 1;

  // A release group's arrival (after the wgmma wait that proved this thread's reads done). In a
  // pair the feed forwards it to the peer's feed (fp8.cuh): a remote operation here would be waited
  // for by this thread's next proxy fence (a MEMBAR), on the math's critical path.
  auto release = [&](uint32_t bar) { mbar_arrive(bar); };
  // S of tile t into sc, box by box in `order`: wait, fence, 4 k-steps, commit (9 groups).
  auto issue_s = [&](float (&sc)[32], int t, const int (&order)[kBlocks]) {
    const int bf = t & 1;
    const uint64_t dk = sw128_desc(skv_a + bf * kStageBytes, 16, 1024);
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
      const int c = order[n];
      mbar_wait(full0 + 16 * c + 8 * bf, (t >> 1) & 1);
      // The fp8 feed stores through the generic proxy and fences nothing (a fence there waits for
      // its loads in flight); the reader fences after acquiring the box, before its wgmmas.
      if constexpr (kFp8) fence_proxy_async();
      wg_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t off = uint32_t(c * kBlockBytes + k * 32) >> 4;
        Wgmma<64, F16>::template ss<0, 0>(sc, dq + off, dk + off, (n > 0 || k > 0) ? 1u : 0u);
      }
      wg_commit();
    }
  };
  // Softmax of tile t's scores against the running max (mp0, mp1): the new (lazy) maxima, the
  // alphas, P packed as the RS A fragments of the four k-steps (pk[4s .. 4s + 3]), the row sums.
  // Keys at or past a row's limit are masked: the request's length (only a split's last tile is
  // partial), and with causal masks the row's own, which can leave a row no key in a tile (its
  // maximum stays -inf: softmax_base/alpha keep its P 0 and its sums as they were).
  auto softmax = [&](float (&sc)[32], int t, float mp0, float mp1, float& mn0, float& mn1, float& al0, float& al1,
                     uint32_t (&pk)[16], float& sum0, float& sum1) {
    const int base = (sr.tile0 + t) * kTileS;
    const int v0 = keys0 - base, v1 = keys1 - base;
    float mx0 = -INFINITY, mx1 = -INFINITY;
    if (min(v0, v1) < kTileS) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = 8 * j + 2 * q;
        if (c >= v0) sc[4 * j] = -INFINITY;
        if (c + 1 >= v0) sc[4 * j + 1] = -INFINITY;
        if (c >= v1) sc[4 * j + 2] = -INFINITY;
        if (c + 1 >= v1) sc[4 * j + 3] = -INFINITY;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(sc[4 * j], sc[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float x0 = mx0 * sl2, x1 = mx1 * sl2;
    mn0 = x0 > mp0 + kLazyTau ? x0 : mp0;
    mn1 = x1 > mp1 + kLazyTau ? x1 : mp1;
    al0 = softmax_alpha(mp0, mn0);
    al1 = softmax_alpha(mp1, mn1);
    const float e0 = softmax_base(mn0), e1 = softmax_base(mn1);
    sum0 = 0.f;
    sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = ex2(fmaf(sc[4 * j], sl2, -e0)), p1 = ex2(fmaf(sc[4 * j + 1], sl2, -e0));
      const float p2 = ex2(fmaf(sc[4 * j + 2], sl2, -e1)), p3 = ex2(fmaf(sc[4 * j + 3], sl2, -e1));
      sum0 += p0 + p1;
      sum1 += p2 + p3;
      pk[2 * j] = pack2<F16>(p0, p1);
      pk[2 * j + 1] = pack2<F16>(p2, p3);
    }
  };
  // P of tile t into its buffer's block 8 (K-major [64 rows x 64 tokens], the A operand of the
  // other warpgroup's P.V), this warpgroup's maxima and alphas, and (last tile) V rows past the
  // length zeroed; then fence for the async proxy. The caller arrives on its READY barrier.
  auto publish = [&](int t, const uint32_t (&pk)[16], float mn0, float mn1, float al0, float al1, float* s_m, float* s_a) {
    uint8_t* stage = skv + (t & 1) * kStageBytes;
    uint8_t* pb = stage + 8 * kBlockBytes;
    {
      // stmatrix x4: matrices (rows 0-7, chunk j), (rows 8-15, j), (rows 0-7, j + 1), (rows 8-15, j + 1)
      // of this warp's 16 rows; lane l gives the address of row l & 7 of matrix l >> 3.
      const int mi = lane >> 3, rr = (wt >> 5) * 16 + (mi & 1) * 8 + (lane & 7);
      const uint32_t rowa = smem_u32(pb) + rr * 128;
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        const uint32_t addr = rowa + (((j + (mi >> 1)) ^ (rr & 7)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(pk[2 * j]),
                     "r"(pk[2 * j + 1]), "r"(pk[2 * j + 2]), "r"(pk[2 * j + 3])
                     : "memory");
      }
    }
    if (q == 0) {
      s_m[r0] = mn0;
      s_m[r1] = mn1;
      s_a[r0] = al0;
      s_a[r1] = al1;
    }
    const int valid = sr.seq - (sr.tile0 + t) * kTileS;
    if (valid < kTileS) zero_tail_rows(stage, valid, wt, 128);
    fence_proxy_async();
    // This warpgroup's own P.V reads rows other warps zeroed: all zeros first (the other
    // warpgroup is ordered by the READY barrier).
    if (valid < kTileS) named_bar_sync(2 + wg, 128);
  };
  auto rescale = [&](float a0, float a1) {
    if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j] *= a0;
        o[4 * j + 1] *= a0;
        o[4 * j + 2] *= a1;
        o[4 * j + 3] *= a1;
      }
    }
  };
  // P.V for this warpgroup's 256 columns of V: RS from the own P, or SS from the other's P in smem.
  auto pv_rs = [&](const uint32_t (&pk)[16], int t, int col_block) {
    const uint64_t dv = sw128_desc(skv_a + (t & 1) * kStageBytes + col_block * kBlockBytes, kBlockBytes, 1024);
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t a[4] = {pk[4 * s], pk[4 * s + 1], pk[4 * s + 2], pk[4 * s + 3]};
      WgmmaRS256<F16>::template rs<1>(o, a, dv + ((s * 2048) >> 4), 1u);
    }
    wg_commit();
  };
  auto pv_ss = [&](int t, int col_block) {
    const uint32_t st = skv_a + (t & 1) * kStageBytes;
    const uint64_t dp = sw128_desc(st + 8 * kBlockBytes, 16, 1024);
    const uint64_t dv = sw128_desc(st + col_block * kBlockBytes, kBlockBytes, 1024);
    wg_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) Wgmma<256, F16>::template ss<0, 1>(o, dp + ((s * 32) >> 4), dv + ((s * 2048) >> 4), 1u);
    wg_commit();
  };

  uint32_t pk[16];
  if (wg == 0) {
    constexpr int kOrderA[kBlocks] = {0, 1, 2, 3, 4, 5, 6, 7, 8};  // E0L's boxes are refilled first
    for (int k = 0; k < pairs; ++k) {
      const int ta = 2 * k, tb = ta + 1;
      const bool has_b = tb < sr.n;
      float sc[32];
      issue_s(sc, ta, kOrderA);
      wg_wait<0>();  // S_A(k); P_B.V_B,L(k - 1) retired at the end of the last pair
      reg_fence(sc);
      float mn0, mn1, al0, al1, sum0, sum1;
      softmax(sc, ta, m0, m1, mn0, mn1, al0, al1, pk, sum0, sum1);
      publish(ta, pk, mn0, mn1, al0, al1, s_ma, s_aa);
      mbar_arrive(a_ready);
      l0 = l0 * al0 + sum0;
      l1 = l1 * al1 + sum1;
      rescale(al0, al1);
      pv_rs(pk, ta, 0);  // O_L += P_A.V_A,L (V blocks 0..3)
      m0 = mn0;
      m1 = mn1;
      if (has_b) {
        mbar_wait(b_ready, k & 1);
        const float bm0 = s_mb[r0], bm1 = s_mb[r1], ba0 = s_ab[r0], ba1 = s_ab[r1];
        wg_wait<0>();  // P_A.V_A,L done: buffer 0 blocks 0..3 are free, O_L may be rescaled
        reg_fence(o);
        reg_fence_u32(pk);
        release(e0l);
        rescale(ba0, ba1);
        l0 *= ba0;
        l1 *= ba1;
        pv_ss(tb, 0);  // O_L += P_B.V_B,L (P_B from buffer 1's block 8, V blocks 0..3)
        wg_wait<0>();
        reg_fence(o);
        release(e1l);
        m0 = bm0;
        m1 = bm1;
      } else {
        wg_wait<0>();
        reg_fence(o);
        reg_fence_u32(pk);
        release(e0l);
      }
    }
  } else {
    constexpr int kOrderB[kBlocks] = {4, 5, 6, 7, 0, 1, 2, 3, 8};  // E1R's boxes are refilled first
    // Whole pairs in the loop, the odd last tile after it: a branch on "has B" inside the loop
    // makes ptxas serialise the wgmmas (C7515).
    const int full_pairs = sr.n >> 1;
    for (int k = 0; k < full_pairs; ++k) {
      const int ta = 2 * k, tb = ta + 1;
      float sc[32];
      issue_s(sc, tb, kOrderB);
      mbar_wait(a_ready, k & 1);
      const float am0 = s_ma[r0], am1 = s_ma[r1], aa0 = s_aa[r0], aa1 = s_aa[r1];
      // S_B first: O_R is rescaled and P_A.V_A,R issued with nothing in flight (a rescale while
      // S_B runs made ptxas inject a wait on a per-warp path, C7517, outside wgmma's warpgroup
      // contract). The tensor pipe stays busy meanwhile with WG0's P_A.V_A,L.
      wg_wait<0>();
      reg_fence(sc);
      reg_fence(o);
      rescale(aa0, aa1);
      l0 *= aa0;
      l1 *= aa1;
      pv_ss(ta, 4);  // O_R += P_A.V_A,R (P_A from buffer 0's block 8, V blocks 4..7); softmax B runs under it
      float mn0, mn1, al0, al1, sum0, sum1;
      softmax(sc, tb, am0, am1, mn0, mn1, al0, al1, pk, sum0, sum1);
      publish(tb, pk, mn0, mn1, al0, al1, s_mb, s_ab);
      mbar_arrive(b_ready);
      l0 = l0 * al0 + sum0;
      l1 = l1 * al1 + sum1;
      wg_wait<0>();  // P_A.V_A,R done: buffer 0 blocks 4..8 are free, O_R may be rescaled
      reg_fence(o);
      release(e0r);
      rescale(al0, al1);
      pv_rs(pk, tb, 4);  // O_R += P_B.V_B,R
      wg_wait<0>();
      reg_fence(o);
      reg_fence_u32(pk);
      release(e1r);
      m0 = mn0;
      m1 = mn1;
    }
    if (sr.n & 1) {  // the last pair has only A
      const int k = full_pairs, ta = 2 * k;
      mbar_wait(a_ready, k & 1);
      const float am0 = s_ma[r0], am1 = s_ma[r1], aa0 = s_aa[r0], aa1 = s_aa[r1];
      rescale(aa0, aa1);
      l0 *= aa0;
      l1 *= aa1;
      pv_ss(ta, 4);
      wg_wait<0>();
      reg_fence(o);
      release(e0r);
      m0 = am0;
      m1 = am1;
    }
  }

  // Epilogue: l = l_L + l_R, O = [O_L, O_R] / l, LSE; stage fp32 rows in the (idle) buffers, store.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (q == 0) {
    s_l[wg * 64 + r0] = l0;
    s_l[wg * 64 + r1] = l1;
  }
  mbar_sync(math_bar, math_phase);
  const float lt0 = s_l[r0] + s_l[64 + r0], lt1 = s_l[r1] + s_l[64 + r1];
  // A row that saw no key is zeros (as an empty request's).
  const float i0 = softmax_inv(lt0), i1 = softmax_inv(lt1);
  if (wg == 0 && q == 0) {
    s_lse[r0] = (m0 + __log2f(lt0)) * kLn2;
    s_lse[r1] = (m1 + __log2f(lt1)) * kLn2;
  }
  stage_and_store_o64<F16>(reinterpret_cast<float*>(skv), o, wg * 256, q, r0, r1, i0, i1, math_bar, math_phase, rows, row0, s_lse, p, sr, tid);
  // A pair leaves together: the peer may still read this CTA's copy of the request length
  // (split_range_pair); every other access of the peer to this CTA's shared memory (its bulk-copied
  // bytes, its forwarded releases) was waited for before here.
  if constexpr (kPair) cluster_sync();
}

}  // namespace graphsafe::mla_sm90

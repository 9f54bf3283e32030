// The W4A16 GEMM kernel (tile grid with cluster split-K, or stream-K) and the stream-K fixup kernel;
// see w4a16.cu's design notes, w4a16_plan.cuh for the schedules. Included by w4a16.cu only.
#pragma once

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_bf16.h>
#include <cstdint>
#include "common/sm90.cuh"
#include "nvfp4/sm90/w4a16_dequant.cuh"
#include "nvfp4/sm90/w4a16_plan.cuh"
#include "nvfp4/sm90/wgmma_rs.cuh"

namespace graphsafe::nvfp4_sm90 {
namespace {  // this file is part of w4a16.cu's translation unit only

using namespace graphsafe::sm90;

constexpr int kConsumers = 256;  // two consumer warpgroups
// + a producer: one warp (288 threads), or a whole warpgroup where setmaxnreg moves registers to
// the consumers (the BM = 256 configuration: 384 threads).
constexpr int threads_for(int bm) { return bm == 256 ? 384 : 288; }
constexpr int kRegsConsumer = 232;  // setmaxnreg for the BM = 256 configuration
constexpr int kRegsProducer = 40;
// Rows of one activation TMA box (the tensor map's box height, see the producer): 64 from BM = 128.
template <int BM>
constexpr int kActBoxRows = BM < 128 ? BM : 64;

struct Params {
  const uint8_t* chunks;  // prepared + kHeaderBytes
  const float* factor;    // prepared header: 2^19 / global_scale
  const float* alpha;
  uint16_t* d;
  int64_t ld_d;
  int m, n;
  int kblocks, kb_per_split, splits;
  int64_t units, ctas;  // stream-K: CTA c takes chunks [floor(c units / ctas), floor((c + 1) units / ctas))
  float4* slots;        // stream-K: the workspace's partial tiles
  uint32_t k16, k2_29;  // always 16 and 2^29 (see mad_lo)
};

template <int BM, int STAGES>
struct Smem {
  static constexpr int kA = BM * 128;  // one activation stage (BM rows x 64 bf16)
  static constexpr int kAOff = 0;
  static constexpr int kWOff = STAGES * kA;
  static constexpr int kBarOff = kWOff + STAGES * kChunkBytes;
  static constexpr int kBytes = 1024 /* alignment slack */ + kBarOff + 2 * STAGES * 8;
  // The split-K reduction stages each consumer thread's accumulators here once the pipeline is
  // drained: [BM / 8][256 threads] float4, over the (then idle) stage buffers.
  static constexpr int kReduceBytes = BM * 512;
  static_assert(kReduceBytes <= kBarOff, "the split-K staging must fit in the stage buffers");
};

// One output quad of a consumer thread ct (0..255): acc[4g .. 4g+3] -> D rows m0, m0 + 1 and columns
// n0, n0 + 8 (the wgmma D fragment of the swapped product), scaled by f.
template <int BM>
__device__ __forceinline__ void store_quad(const Params& p, int n_tile, int m_tile, int ct, int g, float a0, float a1,
                                           float a2, float a3, float f) {
  const int wg = ct >> 7, t = ct & 127, warp = t >> 5, lane = t & 31;
  const int n0 = n_tile * kTileN + wg * 64 + warp * 16 + (lane >> 2);
  const int m0 = m_tile * BM + 2 * (lane & 3) + 8 * g;
  const bool n0_ok = n0 < p.n, n1_ok = n0 + 8 < p.n;
  if (m0 < p.m) {
    uint16_t* row = p.d + int64_t(m0) * p.ld_d;
    if (n0_ok) row[n0] = to_bf16(a0 * f);
    if (n1_ok) row[n0 + 8] = to_bf16(a2 * f);
  }
  if (m0 + 1 < p.m) {
    uint16_t* row = p.d + int64_t(m0 + 1) * p.ld_d;
    if (n0_ok) row[n0] = to_bf16(a1 * f);
    if (n1_ok) row[n0 + 8] = to_bf16(a3 * f);
  }
}

// The stream-K work of this CTA as segments f(n_tile, kb0, nk, slot): chunks kb0 .. kb0 + nk - 1
// of weight tile n_tile, in the order the producer loads them and the consumers take them (the
// CTA's range cut at tile boundaries). slot: -1 for a segment that covers its whole tile (written
// to D), else which of the CTA's two workspace slots takes its fp32 sums: 0 for its first segment,
// 1 for its last (a range holds at most two partial segments, so these never collide).
// MAX_SEGS = 2: the plan guarantees no CTA's range touches more than two tiles (make_plan's
// streamk_two_segments), and the walk is two straight-line steps instead of a loop: around the
// BM = 64 main loop, a loop made ptxas serialize its wgmmas at 2 CTAs per SM (C7512).
template <int MAX_SEGS, class F>
__device__ __forceinline__ void for_each_streamk_segment(const Params& p, F&& f) {
  const int64_t c = blockIdx.x;
  const int64_t u0 = streamk_start(c, p.units, p.ctas), u1 = streamk_start(c + 1, p.units, p.ctas);
  int64_t seg = u0;
  auto step = [&]() {
    const int64_t t = seg / p.kblocks, t_end = (t + 1) * p.kblocks;
    const int64_t end = min(u1, t_end);
    const int kb0 = int(seg - t * p.kblocks);
    const int slot = kb0 == 0 && end == t_end ? -1 : (seg == u0 ? 0 : 1);
    f(t, kb0, int(end - seg), slot);
    seg = end;
  };
  if constexpr (MAX_SEGS == 2) {
    if (seg < u1) step();
    if (seg < u1) step();
  } else {
#pragma unroll 1
    while (seg < u1) step();
  }
}
// Segments per stream-K CTA the kernel of this BM is built for (0: any number).
template <int BM>
constexpr int kStreamKMaxSegs = BM == 64 ? 2 : 0;
// SPLIT: the tile grid's cluster split-K reduction is compiled in (taken when p.splits > 1). BM = 256
// has a second instantiation without it for unsplit grids: with the reduction its 232-register
// consumers were scheduled differently and ran 2-5 % slower at m = 4096 on an H200 (8192 x 28672
// 2,521 -> 2,624-2,647 us, 8192 x 8192 748 -> 767) with the same plan.
template <int BM, int STAGES, int MINB, bool STREAMK, bool SPLIT>
__global__ void __launch_bounds__(threads_for(BM), MINB) w4a16_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                                                    const Params p) {
  using L = Smem<BM, STAGES>;
  constexpr bool kRealloc = BM == 256;
  constexpr bool kImad = BM <= 64;
  constexpr int kAcc = BM / 2;
  extern __shared__ uint8_t smem_raw[];
  // smem_base_1k's rounding, written out: through the helper the compiler schedules this kernel's
  // prologue differently (the SASS was compared), and these kernels' timings were measured as is.
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sa = smem_u32(smem + L::kAOff);
  uint8_t* sw = smem + L::kWOff;
  const uint32_t full0 = smem_u32(smem + L::kBarOff);
  const uint32_t empty0 = full0 + STAGES * 8;

  // The first chunks this CTA streams, for the L2 hint below: chunk index and count.
  int64_t first_chunk, first_count;
  int m_tile = 0;
  int kb_first = 0, nk_grid = 0;  // tile grid: this CTA's k-blocks
  if constexpr (STREAMK) {
    const int64_t c = blockIdx.x;
    first_chunk = streamk_start(c, p.units, p.ctas);  // the units are the weight's chunks, in order
    first_count = streamk_start(c + 1, p.units, p.ctas) - first_chunk;
  } else {
    m_tile = blockIdx.y;
    kb_first = blockIdx.z * p.kb_per_split;
    nk_grid = min(p.kblocks - kb_first, p.kb_per_split);  // >= 1 chunk (balanced splits)
    first_chunk = int64_t(blockIdx.x) * p.kblocks + kb_first;
    first_count = nk_grid;
  }
  const uint8_t* wsrc = p.chunks + size_t(first_chunk) * kChunkBytes;

  // Before the wait on the previous grid: only a hint to L2 (never data in this CTA's hands, so
  // a weight written by that grid is still read after it finished), so the first stages come
  // from L2 while the previous kernel drains. Not for BM <= 16: there the hint cost more than it
  // saved (H200, back-to-back calls, m = 1: 8192^2 17.8 -> 16.6 us and 8192 x 28672 48.0 -> 46.8
  // without it; m = 16 20.2 -> 18.9 and 57.8 -> 55.9; 28672 x 8192 unchanged). The many small
  // CTAs' prefetches compete with the previous call's last loads; a pure stream of the same
  // chunks measured the same way was 1-2 us slower with it too (docs/notes/2026-12-nvfp4-log.md).
  if (BM > 16 && threadIdx.x == kConsumers) prefetch_l2(wsrc, uint32_t(min(first_count, int64_t(STAGES))) * kChunkBytes);
  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, kConsumers);
    }
    fence_barrier_init();
  }
  __syncthreads();
  // Everything below reads what earlier grids wrote (activations, alpha, the weight) or writes D.
  grid_dependency_wait();

  const int wg = threadIdx.x >> 7;
  if (wg == 2) {
    // ---- producer -----------------------------------------------------------------------------
    if constexpr (kRealloc) regs_decrease<kRegsProducer>();
    if (threadIdx.x == kConsumers) {
      int s = 0;
      uint32_t ph = 0;
      int64_t issued = 0;
      // Chunks kb0 .. kb0 + nk - 1 of weight tile n_tile with the activations of tile m_tile.
      auto load = [&](int64_t n_tile, int kb0, int nk) {
        // BM >= 128 loads the activations in boxes of kActBoxRows rows, only those holding rows < m:
        // boxes mostly past m ran slow (m = 136 of a 256-row tile: 57.5 us against 46.5 at m = 200
        // on an H200, long-scoreboard stalls 45 % against 14 %). The rows of a partial tile left
        // unloaded hold stale shared memory; they only feed output columns >= m, never stored.
        const int act_rows = BM < 128 ? BM : min(BM, p.m - m_tile * BM);
        const int act_boxes = (act_rows + kActBoxRows<BM> - 1) / kActBoxRows<BM>;
        const uint32_t act_bytes = uint32_t(act_boxes) * uint32_t(kActBoxRows<BM> * kBlockK * 2);
        const uint8_t* src = p.chunks + size_t(n_tile * p.kblocks + kb0) * kChunkBytes;
#pragma unroll 1
        for (int i = 0; i < nk; ++i, ++issued) {
          if (issued >= STAGES) mbar_wait(empty0 + 8 * s, ph ^ 1u);
          const uint32_t bar = full0 + 8 * s;
          mbar_arrive_expect_tx(bar, act_bytes + kChunkBytes);
          bulk_g2s(smem_u32(sw + s * kChunkBytes), src + size_t(i) * kChunkBytes, kChunkBytes, bar);
#pragma unroll 1
          for (int b = 0; b < act_boxes; ++b)
            tma_load_2d(sa + s * L::kA + b * (kActBoxRows<BM> * kBlockK * 2), &tmap_a, (kb0 + i) * kBlockK,
                        m_tile * BM + b * kActBoxRows<BM>, bar);
          if (++s == STAGES) {
            s = 0;
            ph ^= 1u;
          }
        }
      };
      if constexpr (STREAMK) {
        for_each_streamk_segment<kStreamKMaxSegs<BM>>(p, [&](int64_t n_tile, int kb0, int nk, int) { load(n_tile, kb0, nk); });
      } else {
        load(blockIdx.x, kb_first, nk_grid);
      }
    }
    // Exited threads do not hold up the cluster barriers below.
    return;
  }

  // ---- consumers ----------------------------------------------------------------------------------
  if constexpr (kRealloc) regs_increase<kRegsConsumer>();
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int ct = threadIdx.x;  // 0..255
  float acc[kAcc];
  uint32_t fa[4][4], fb[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) fa[i][j] = fb[i][j] = 0u;
  const uint8_t* codes_p = sw + wg * 2048 + t * 16;
  const uint8_t* scales_p = sw + kCodeBytes + wg * 256 + warp * 64 + (lane >> 2) * 8;
  const uint32_t codes_w = opaque(smem_u32(codes_p)), scales_w = opaque(smem_u32(scales_p));

  // Stage index and phase of the next stage to consume, tracked incrementally across segments.
  uint32_t stage = 0, phase = 0, prev = 0;
  const uint32_t desc_hi = uint32_t(1024 >> 4) | (1u << 30);  // SBO = 1 KiB, 128-byte swizzle
  const uint32_t desc_lo0 = ((sa >> 4) & 0x3FFFu) | (1u << 16);  // start address, LBO = 16 B (unused)
  auto issue = [&](uint32_t(&f)[4][4]) {
    mbar_wait(full0 + 8 * stage, phase);
    uint4 c;
    uint2 sc;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "r"(codes_w + stage * kChunkBytes) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sc.x), "=r"(sc.y) : "r"(scales_w + stage * kChunkBytes) : "memory");
    dequant_step<kImad>(c.x, scale_pair<0, kImad>(sc.x, p.k16), p.k2_29, f[0]);
    dequant_step<kImad>(c.y, scale_pair<2, kImad>(sc.x, p.k16), p.k2_29, f[1]);
    dequant_step<kImad>(c.z, scale_pair<0, kImad>(sc.y, p.k16), p.k2_29, f[2]);
    dequant_step<kImad>(c.w, scale_pair<2, kImad>(sc.y, p.k16), p.k2_29, f[3]);
    wg_fence();
    const uint32_t lo = desc_lo0 + stage * uint32_t(L::kA >> 4);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // +32 bytes per k16 step inside the 128-byte swizzled rows
      WgmmaRS<BM>::mma(acc, f[kk], (uint64_t(desc_hi) << 32) | uint64_t(lo + 2u * kk));
    wg_commit();
    prev = stage;
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  };
  // Every consumer thread hands a stage back with its own arrive (the empty barriers count all
  // kConsumers threads): an arrive releases only the arriving thread's earlier reads, so one
  // arrive per warp after __syncwarp left the other lanes' shared loads of the stage unordered
  // with the producer's next bulk copy into it (racecheck: write-after-read hazards).
  auto release = [&](uint32_t s) { mbar_arrive(empty0 + 8 * s); };
  const float f = __ldg(p.alpha) * __ldg(p.factor);

  // BM <= 16: mma.sync per warp (B fragments by ldmatrix from the 128-byte-swizzled activation
  // rows: 16-byte chunk c of row r sits at chunk c ^ (r & 7)); each warp hands its stage back as
  // soon as its operands are in registers. Larger BM: wgmma, double-buffered (below).
  // The A fragment of m16n8k16 is one warp's slice of the wgmma m64 A fragment, so the dequantized
  // registers feed it unchanged, and its D fragment is the wgmma m64n8 D fragment's slice (same
  // epilogue).
  constexpr bool kMma = BM <= 16;
  // Thread-invariant shared addresses, computed once (else the compiler rematerialises them
  // every chunk); the stage offsets advance incrementally.
  const uint32_t codes_a = codes_w, scales_a = scales_w;
  const uint32_t ldsm_a0 = opaque(sa + uint32_t(lane & 7) * 128u + uint32_t(((lane >> 3) ^ (lane & 7)) << 4));  // chunks 0..3
  const uint32_t ldsm_a1 = opaque(sa + uint32_t(lane & 7) * 128u + uint32_t((((lane >> 3) + 4) ^ (lane & 7)) << 4));  // 4..7
  uint32_t off_w = 0, off_a = 0;  // stage * kChunkBytes, stage * kA
  auto step_mma = [&]() {
    mbar_wait(full0 + 8 * stage, phase);
    uint4 c;
    uint2 sc;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "r"(codes_a + off_w) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sc.x), "=r"(sc.y) : "r"(scales_a + off_w) : "memory");
    uint32_t b[4][BM / 8][2];
#pragma unroll
    for (int nb = 0; nb < BM / 8; ++nb) {
      ldsm_x4(ldsm_a0 + off_a + nb * 1024u, b[0][nb][0], b[0][nb][1], b[1][nb][0], b[1][nb][1]);
      ldsm_x4(ldsm_a1 + off_a + nb * 1024u, b[2][nb][0], b[2][nb][1], b[3][nb][0], b[3][nb][1]);
    }
    dequant_step<kImad>(c.x, scale_pair<0, kImad>(sc.x, p.k16), p.k2_29, fa[0]);
    dequant_step<kImad>(c.y, scale_pair<2, kImad>(sc.x, p.k16), p.k2_29, fa[1]);
    dequant_step<kImad>(c.z, scale_pair<0, kImad>(sc.y, p.k16), p.k2_29, fa[2]);
    dequant_step<kImad>(c.w, scale_pair<2, kImad>(sc.y, p.k16), p.k2_29, fa[3]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int nb = 0; nb < BM / 8; ++nb) mma16816(acc + 4 * nb, fa[kk], b[kk][nb][0], b[kk][nb][1]);
    release(stage);
    off_w += kChunkBytes;
    off_a += uint32_t(L::kA);
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
      off_w = 0;
      off_a = 0;
    }
  };

  // The chunks kb0 .. kb0 + nk - 1 of one tile into acc (a segment: the producer loaded them in
  // this order).
  auto mainloop = [&](int nk) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    if constexpr (kMma) {
      // Two chunks per trip: the loop's own instructions are shared (H200, m = 16: 2-3 % faster).
#pragma unroll 2
      for (int it = 0; it < nk; ++it) step_mma();
    } else {
      reg_fence(acc);
      int it = 0;
#pragma unroll 1
      for (; it + 1 < nk; it += 2) {
        const uint32_t before = prev;
        issue(fa);
        wg_wait<1>();
        reg_fence(fb);
        if (it > 0) release(before);
        const uint32_t mid = prev;
        issue(fb);
        wg_wait<1>();
        reg_fence(fa);
        release(mid);
      }
      if (it < nk) {
        const uint32_t before = prev;
        issue(fa);
        wg_wait<1>();
        reg_fence(fb);
        if (it > 0) release(before);
      }
      wg_wait<0>();
      reg_fence(acc);
      reg_fence(fa);
      reg_fence(fb);
      release(prev);  // every stage of the segment is handed back
    }
  };

  if constexpr (STREAMK) {
    for_each_streamk_segment<kStreamKMaxSegs<BM>>(p, [&](int64_t n_tile, int, int nk, int slot) {
      mainloop(nk);
      if (slot < 0) {
        // The whole tile is this CTA's: write D.
#pragma unroll
        for (int g = 0; g < BM / 8; ++g)
          store_quad<BM>(p, int(n_tile), 0, ct, g, acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3], f);
      } else {
        // Shared with other CTAs: the fp32 sums go to this CTA's slot for its first or last segment.
        float4* dst = p.slots + (size_t(blockIdx.x) * 2 + slot) * (BM / 8) * kConsumers + ct;
#pragma unroll
        for (int g = 0; g < BM / 8; ++g) dst[g * kConsumers] = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
      }
    });
  } else {
    // ---- tile grid: one segment; split-K within the cluster through distributed shared memory ----
    const int n_tile = blockIdx.x;
    mainloop(nk_grid);
    if constexpr (SPLIT) {
      if (p.splits > 1) {
        // Both consumer warpgroups must be done with the stage buffers (the other one may still
        // be reading the activations of its last stages) before they are overwritten.
        named_bar_sync(1, kConsumers);
        float4* red = reinterpret_cast<float4*>(smem);
#pragma unroll
        for (int g = 0; g < BM / 8; ++g) red[g * kConsumers + ct] = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
        grid_launch_dependents();
        cluster_sync();
        // CTA r of the cluster reduces quads [r * Q / S, (r + 1) * Q / S), Q = BM / 8 * 256, adding
        // the splits in split order 0..S-1 (deterministic, the same on every run and replay).
        const uint32_t r = cluster_rank(), splits = uint32_t(p.splits);
        constexpr uint32_t kQuads = uint32_t(BM / 8) * kConsumers;
        const uint32_t lo = r * kQuads / splits, hi = (r + 1) * kQuads / splits;
        const uint32_t red_u32 = smem_u32(red);
#pragma unroll 1
        for (uint32_t q = lo + uint32_t(ct); q < hi; q += kConsumers) {
          float4 sum = ld_peer(red_u32 + q * 16u, 0);
#pragma unroll 1
          for (uint32_t s = 1; s < splits; ++s) {
            const float4 v = ld_peer(red_u32 + q * 16u, s);
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
          }
          store_quad<BM>(p, n_tile, m_tile, int(q % kConsumers), int(q / kConsumers), sum.x, sum.y, sum.z, sum.w, f);
        }
        cluster_sync();  // the peers' shared memory stays alive until every read of it is done
        return;
      }
    }
#pragma unroll
    for (int g = 0; g < BM / 8; ++g)
      store_quad<BM>(p, n_tile, m_tile, ct, g, acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3], f);
  }
  grid_launch_dependents();
}

// Stream-K fixup: one CTA per weight tile; a tile shared by CTAs c_first..c_last of the GEMM gets
// their slots added in CTA order and written to D. Launched right after the GEMM, programmatically
// dependent on it: it waits for the GEMM to finish (and its writes to be visible) before reading.
template <int BM>
__global__ void __launch_bounds__(kConsumers) w4a16_fixup_kernel(const Params p) {
  grid_launch_dependents();  // the next kernel may start its prologue: this one only reads slots
  // Every CTA waits for the GEMM, also one whose tile is not shared: a chain of programmatically
  // dependent grids is ordered only if each grid completes after its predecessor, and a return
  // before the wait would let this grid complete while GEMM CTAs still write D (the next kernel
  // waits on this grid only, and would read D too early). This mattered when the plan still
  // launched this kernel with no tile shared (k <= 64). make_plan now launches it only when some
  // tile is shared, whose CTA's wait alone would order the grid; every CTA waiting keeps that
  // order independent of the plan.
  grid_dependency_wait();
  const int64_t n_tile = blockIdx.x;
  const int64_t c_first = streamk_owner(n_tile * p.kblocks, p.units, p.ctas);
  const int64_t c_last = streamk_owner((n_tile + 1) * p.kblocks - 1, p.units, p.ctas);
  if (c_first == c_last) return;  // the GEMM wrote this tile directly
  const int ct = threadIdx.x;
  const float f = __ldg(p.alpha) * __ldg(p.factor);
  constexpr int kQ = BM / 8;
  // Slot 1 (a CTA's last segment) only for c_first when its range began in an earlier tile; every
  // later CTA's range begins inside this tile, so this tile is its first segment.
  const int first_which = streamk_start(c_first, p.units, p.ctas) < n_tile * p.kblocks ? 1 : 0;
#pragma unroll
  for (int g = 0; g < kQ; ++g) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (int64_t c = c_first; c <= c_last; ++c) {
      const int which = c == c_first ? first_which : 0;
      const float4 v = __ldcg(p.slots + (size_t(c) * 2 + which) * kQ * kConsumers + g * kConsumers + ct);
      if (c == c_first) {
        sum = v;
      } else {
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
    }
    store_quad<BM>(p, int(n_tile), 0, ct, g, sum.x, sum.y, sum.z, sum.w, f);
  }
}

}  // namespace
}  // namespace graphsafe::nvfp4_sm90

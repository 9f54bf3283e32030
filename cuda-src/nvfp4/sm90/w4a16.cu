// graphsafe-build: archs=sm_90a kind=object mem_mib=500
// graphsafe's Hopper (sm_90a) weight-only NVFP4 GEMM: gs_nvfp4_w4a16_prepare, gs_nvfp4_w4a16_gemm.
//
//   D[m, n] (bf16) = alpha[0] * A[m, k] (bf16) x W[n, k]^T,  W NVFP4 (e2m1 codes, fp8 scales per 16
//   along k, one fp32 global scale), dequantized in registers, multiplied on the tensor cores.
//
// Design
//   * Swapped product: the CTA computes D^T tiles, weights as the wgmma A operand (from registers,
//     where they are dequantized) and activations as the B operand (shared memory, K-major,
//     128-byte swizzle, loaded by TMA; rows past m and columns past k are zero-filled by TMA).
//     CTA tile = 128 weight rows (two consumer warpgroups x m64) x BM activation rows (wgmma N,
//     8..256 chosen by m, see w4a16_plan.cuh) x 64 along k per stage.
//   * One producer thread (a whole producer warpgroup only for BM = 256, where setmaxnreg moves
//     its registers to the consumers; else one warp: 288 threads, up to 3 CTAs per SM) streams
//     stages: one 1-D bulk copy of the prepared weight chunk (4,608 B: codes + scales of 128 rows x
//     64 k, laid out by prepare exactly as the consumer threads read them) plus one 2-D TMA box of
//     activations, both completing on the stage's mbarrier; consumers hand a stage back through a
//     second mbarrier once their wgmma on it retired.
//   * Dequantization (per consumer thread per stage: one 16-byte and one 8-byte shared load, then
//     about 3.5 integer/bf16 instructions per weight pair): prepare stores each code's sign and
//     magnitude bits where one or two shifts and a mask move them to bf16 bit 15 and bits 8..6,
//     which makes a bf16 equal to the code's value times 2^-126 (0.5 becomes a bf16 subnormal);
//     mul.rn.bf16x2 (subnormals kept) by the block's scale as a bf16 equal to sf * 2^107 (built
//     from a re-encoded scale byte with one byte_perm and one integer multiply-add, broadcast by
//     an operand swizzle) gives exactly e2m1 * sf * 2^-19 (at most 6 significant bits: no
//     rounding). The 2^19 / global_scale factor and alpha scale the fp32 accumulators in the
//     epilogue.
//   * The register operand is double-buffered: while the wgmma of stage i runs, the warpgroup
//     waits for stage i+1, dequantizes it into the other buffer and issues it; wgmma.wait_group 1
//     then retires stage i, whose slot is handed back to the producer.
//   * Split-K when the tiles alone cannot fill the GPU (make_plan's cost model): each split stores
//     its fp32 accumulators to the workspace; the last CTA of a tile (a per-tile counter, reset to
//     0 by that CTA, so the workspace stays valid across graph replays) adds the splits in split
//     order: deterministic, bit-identical run to run.
// Nothing here allocates or touches the legacy stream; the tensor map is a kernel parameter.
#include <cuda.h>  // CUtensorMap (type only; the encoder comes through the runtime's entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>
#include "common/status.cuh"
#include "common/sm90.cuh"
#include "graphsafe_kernels/nvfp4.h"
#include "nvfp4/sm90/w4a16_plan.cuh"
#include "nvfp4/sm90/wgmma_rs.cuh"

namespace graphsafe::nvfp4_sm90 {
namespace {

using namespace graphsafe::sm90;

constexpr int kConsumers = 256;  // two consumer warpgroups
// + a producer: one warp (288 threads), or a whole warpgroup where setmaxnreg moves registers to
// the consumers (the BM = 256 configuration: 384 threads).
constexpr int threads_for(int bm) { return bm == 256 ? 384 : 288; }
constexpr int kRegsConsumer = 232;  // setmaxnreg for the BM = 256 configuration
constexpr int kRegsProducer = 40;

struct Params {
  const uint8_t* chunks;  // prepared + kHeaderBytes
  const float* factor;    // prepared header: 2^19 / global_scale
  const float* alpha;
  uint16_t* d;
  int64_t ld_d;
  int m, n;
  int kblocks, kb_per_split, splits;
  int tiles_n, tiles;
  float* partials;       // split-K only
  uint32_t* counters;    // split-K only
};

// ---- primitives (sm_90a PTX) ------------------------------------------------------------------
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void fence_regs(uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
template <int R>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }


// ---- dequantization ---------------------------------------------------------------------------
// The two scales of a k16 step as one bf16x2 {row g, row g + 8}: bytes B and B + 1 of `word` are
// re-encoded scales u = (E << 3) | m standing for 2^(E - 10) * (1 + m / 8); (u << 4) | 0x7000 is the
// bf16 with exponent field 224 + E and mantissa m, i.e. that value times 2^107.
template <int B>
__device__ __forceinline__ uint32_t scale_pair(uint32_t word) {
  const uint32_t x = __byte_perm(word, 0u, 0x4040u | B | ((B + 1) << 8));  // [byte B, 0, byte B+1, 0]
  return x * 16u + 0x70007000u;
}
// bf16x2 a * {s.lo, s.lo} and a * {s.hi, s.hi} (the broadcast is an operand swizzle of HMUL2).
__device__ __forceinline__ uint32_t mul_lo(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {l, l};\nmul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
__device__ __forceinline__ uint32_t mul_hi(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {h, h};\nmul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
// A word holds the 8 codes of one k16 step of a thread's wgmma A fragment, 4 bits per code but not
// contiguous: each 16-bit half holds one code of each of the 4 registers (low half: even k, high half:
// odd k), register j's sign bit at S_j and magnitude bits at C_j..C_j+2 of the half, with
//   j = 0: S 15, C 6  ->  w & M                                   (already in place)
//   j = 1: S 12, C 3  ->  (w << 3) & M
//   j = 2: S 14, C 0  ->  ((w & 0x40074007) * (2 + 64)) & M       (two shifted copies, no carries)
//   j = 3: S 13, C 9  ->  ((w << 2) & 0x80008000) | ((w >> 3) & 0x01C001C0)
// with M = 0x81C081C0: sign -> bit 15, magnitude -> bits 8..6 of each bf16, i.e. the code's value
// times 2^-126 (0.5 becomes a bf16 subnormal). prepare writes this layout (kRegSign / kRegMag).
__device__ constexpr int kRegSign[4] = {15, 12, 14, 13};
__device__ constexpr int kRegMag[4] = {6, 3, 0, 9};
// One k16 step of the wgmma A fragment: a[0] = (row g, k 2q..2q+1), a[1] = (row g+8, same k),
// a[2] = (row g, k + 8), a[3] = (row g+8, k + 8); s = scales {row g, row g+8} (scale_pair).
__device__ __forceinline__ void dequant_step(uint32_t w, uint32_t s, uint32_t (&a)[4]) {
  constexpr uint32_t M = 0x81C081C0u;
  a[0] = mul_lo(w & M, s);
  a[1] = mul_hi((w << 3) & M, s);
  a[2] = mul_lo(((w & 0x40074007u) * 66u) & M, s);
  a[3] = mul_hi(((w << 2) & 0x80008000u) | ((w >> 3) & 0x01C001C0u), s);
}

__device__ __forceinline__ uint16_t to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <int BM, int STAGES>
struct Smem {
  static constexpr int kA = BM * 128;  // one activation stage (BM rows x 64 bf16)
  static constexpr int kAOff = 0;
  static constexpr int kWOff = STAGES * kA;
  static constexpr int kBarOff = kWOff + STAGES * kChunkBytes;
  static constexpr int kFlagOff = kBarOff + 2 * STAGES * 8;
  static constexpr int kBytes = 1024 /* alignment slack */ + kFlagOff + 16;
};

template <int BM, int STAGES, int MINB>
__global__ void __launch_bounds__(threads_for(BM), MINB) w4a16_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                                                    const Params p) {
  using L = Smem<BM, STAGES>;
  constexpr bool kRealloc = BM == 256;
  constexpr int kAcc = BM / 2;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sa = smem_u32(smem + L::kAOff);
  uint8_t* sw = smem + L::kWOff;
  const uint32_t full0 = smem_u32(smem + L::kBarOff);
  const uint32_t empty0 = full0 + STAGES * 8;
  int* flag = reinterpret_cast<int*>(smem + L::kFlagOff);

  const int n_tile = blockIdx.x, m_tile = blockIdx.y, split = blockIdx.z;
  const int kb0 = split * p.kb_per_split;
  const int nk = min(p.kblocks - kb0, p.kb_per_split);  // >= 1 (balanced splits)

  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int wg = threadIdx.x >> 7;
  if (wg == 2) {
    // ---- producer -----------------------------------------------------------------------------
    if constexpr (kRealloc) regs_dec<kRegsProducer>();
    if (threadIdx.x == kConsumers) {
      const uint8_t* src = p.chunks + (size_t(n_tile) * p.kblocks + kb0) * kChunkBytes;
#pragma unroll 1
      for (int it = 0; it < nk; ++it) {
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(empty0 + 8 * s, ((it / STAGES) - 1) & 1);
        const uint32_t bar = full0 + 8 * s;
        mbar_arrive_expect_tx(bar, L::kA + kChunkBytes);
        bulk_g2s(smem_u32(sw + s * kChunkBytes), src + size_t(it) * kChunkBytes, kChunkBytes, bar);
        tma_2d(sa + s * L::kA, &tmap_a, (kb0 + it) * kBlockK, m_tile * BM, bar);
      }
    }
    return;
  }

  // ---- consumers ----------------------------------------------------------------------------------
  if constexpr (kRealloc) regs_inc<kRegsConsumer>();
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  uint32_t fa[4][4], fb[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) fa[i][j] = fb[i][j] = 0u;
  const uint8_t* codes_p = sw + wg * 2048 + t * 16;
  const uint8_t* scales_p = sw + kCodeBytes + wg * 256 + warp * 64 + (lane >> 2) * 8;

  // Stage index and phase of the next stage to consume, tracked incrementally.
  uint32_t stage = 0, phase = 0, prev = 0;
  const uint32_t desc_hi = uint32_t(1024 >> 4) | (1u << 30);  // SBO = 1 KiB, 128-byte swizzle
  const uint32_t desc_lo0 = ((sa >> 4) & 0x3FFFu) | (1u << 16);  // start address, LBO = 16 B (unused)
  auto issue = [&](uint32_t(&f)[4][4]) {
    mbar_wait(full0 + 8 * stage, phase);
    const uint4 c = *reinterpret_cast<const uint4*>(codes_p + stage * kChunkBytes);
    const uint2 sc = *reinterpret_cast<const uint2*>(scales_p + stage * kChunkBytes);
    dequant_step(c.x, scale_pair<0>(sc.x), f[0]);
    dequant_step(c.y, scale_pair<2>(sc.x), f[1]);
    dequant_step(c.z, scale_pair<0>(sc.y), f[2]);
    dequant_step(c.w, scale_pair<2>(sc.y), f[3]);
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
  auto release = [&](uint32_t s) {
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
  };

  fence_regs(acc);
  int it = 0;
#pragma unroll 1
  for (; it + 1 < nk; it += 2) {
    const uint32_t before = prev;
    issue(fa);
    wg_wait<1>();
    fence_regs(fb);
    if (it > 0) release(before);
    const uint32_t mid = prev;
    issue(fb);
    wg_wait<1>();
    fence_regs(fa);
    release(mid);
  }
  if (it < nk) {
    const uint32_t before = prev;
    issue(fa);
    wg_wait<1>();
    fence_regs(fb);
    if (it > 0) release(before);
  }
  wg_wait<0>();
  fence_regs(acc);
  fence_regs(fa);
  fence_regs(fb);

  // ---- split-K: partials to the workspace, the last CTA of the tile reduces in split order -------
  // (BM = 256 is only chosen when the tiles fill the GPU: never split, see make_plan.)
  if (BM < 256 && p.splits > 1) {
    const int ct = threadIdx.x;  // 0..255
    const int tile = m_tile * p.tiles_n + n_tile;
    const size_t tile_stride = size_t(kAcc) * kConsumers;
    float* mine = p.partials + (size_t(split) * p.tiles + tile) * tile_stride + ct;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) __stcg(mine + i * kConsumers, acc[i]);
    __threadfence();
    named_sync(1, kConsumers);
    if (ct == 0) {
      const uint32_t prev = atomicAdd(p.counters + tile, 1u);
      const int last = prev == uint32_t(p.splits - 1);
      if (last) atomicExch(p.counters + tile, 0u);  // self-reset for the next launch / replay
      *flag = last;
    }
    named_sync(1, kConsumers);
    if (*flag == 0) return;
    __threadfence();
    const float* base = p.partials + size_t(tile) * tile_stride + ct;
    const size_t split_stride = size_t(p.tiles) * tile_stride;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      float sum = 0.0f;
#pragma unroll 1
      for (int s = 0; s < p.splits; ++s) sum += (s == split) ? acc[i] : __ldcg(base + s * split_stride + i * kConsumers);
      acc[i] = sum;
    }
  }

  // ---- epilogue: D[m][n] = acc * alpha * 2^19 / global_scale ------------------------------------------
  const float f = __ldg(p.alpha) * __ldg(p.factor);
  const int n0 = n_tile * kTileN + wg * 64 + warp * 16 + (lane >> 2);
  const int mb = m_tile * BM + 2 * (lane & 3);
  const bool n0_ok = n0 < p.n, n1_ok = n0 + 8 < p.n;
#pragma unroll
  for (int i = 0; i < BM / 8; ++i) {
    const int m0 = mb + 8 * i;
    if (m0 < p.m) {
      uint16_t* row = p.d + int64_t(m0) * p.ld_d;
      if (n0_ok) row[n0] = to_bf16(acc[4 * i + 0] * f);
      if (n1_ok) row[n0 + 8] = to_bf16(acc[4 * i + 2] * f);
    }
    if (m0 + 1 < p.m) {
      uint16_t* row = p.d + int64_t(m0 + 1) * p.ld_d;
      if (n0_ok) row[n0] = to_bf16(acc[4 * i + 1] * f);
      if (n1_ok) row[n0 + 8] = to_bf16(acc[4 * i + 3] * f);
    }
  }
}

// ---- prepare ----------------------------------------------------------------------------------------
// Scale byte (fp8 e4m3) -> the kernel's encoding u = (E << 3) | m, value 2^(E - 10) * (1 + m / 8):
// every positive e4m3 (subnormals included) is exact with E in 1..18. Zero and NaN scales give u = 0
// and zero the block's codes; a negative scale flips the block's code signs.
// Returned packed: bits 0..7 = u, bit 8 = zero the codes, bit 9 = flip the code signs.
__device__ __forceinline__ uint32_t encode_scale(uint32_t f) {
  const uint32_t neg = (f & 0x80u) ? 0x200u : 0u;
  const uint32_t a = f & 0x7Fu;
  if (a == 0u || a == 0x7Fu) return 0x100u;
  const uint32_t e = a >> 3, m = a & 7u;
  uint32_t u;
  if (e > 0) {
    u = ((e + 3u) << 3) | m;
  } else if (m == 1u) {
    u = 1u << 3;
  } else if (m < 4u) {
    u = (2u << 3) | ((m - 2u) << 2);
  } else {
    u = (3u << 3) | ((m - 4u) << 1);
  }
  return u | neg;
}

__device__ __forceinline__ int64_t scale_offset(int64_t row, int block, int kb4) {
  return (row >> 7) * (int64_t(kb4) * 512) + int64_t(block >> 2) * 512 + (row & 31) * 16 + ((row & 127) >> 5) * 4 +
         (block & 3);
}

// One thread per (chunk, warpgroup, thread): its 16 bytes of codes; lanes with lane % 4 == 0 also
// write the 8 scale bytes of their row pair.
__global__ void __launch_bounds__(256) w4a16_prepare_kernel(const uint8_t* __restrict__ packed,
                                                            const uint8_t* __restrict__ scales,
                                                            const float* __restrict__ global_scale, int n, int k,
                                                            int kblocks, uint8_t* __restrict__ out) {
  const int64_t chunk = blockIdx.x;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int g = lane >> 2, q = lane & 3;
  const int tile = int(chunk / kblocks), kb = int(chunk % kblocks);
  const int64_t r0 = int64_t(tile) * kTileN + wg * 64 + warp * 16 + g;
  const int kblk16 = k / 16, kb4 = (kblk16 + 3) / 4;
  uint32_t sc[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = r0 + 8 * h;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int b = kb * 4 + kk;
      const uint32_t byte = (r < n && b < kblk16) ? scales[scale_offset(r, b, kb4)] : 0u;
      sc[h][kk] = encode_scale(byte);
    }
  }
  uint32_t words[4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = j & 1;
      const int64_t r = r0 + 8 * h;
      const int col = kb * kBlockK + 16 * kk + 2 * q + (j >= 2 ? 8 : 0);
      uint32_t byte = (r < n && col < k) ? packed[r * (k / 2) + col / 2] : 0u;  // low nibble: col, high: col + 1
      if (sc[h][kk] & 0x100u) byte = 0u;
      if (sc[h][kk] & 0x200u) byte ^= 0x88u;
      const uint32_t lo = byte & 0xFu, hi = byte >> 4;
      w |= ((lo >> 3) << kRegSign[j]) | ((lo & 7u) << kRegMag[j]);
      w |= ((hi >> 3) << (16 + kRegSign[j])) | ((hi & 7u) << (16 + kRegMag[j]));
    }
    words[kk] = w;
  }
  uint8_t* c = out + kHeaderBytes + chunk * kChunkBytes;
  *reinterpret_cast<uint4*>(c + wg * 2048 + t * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  if (q == 0) {
    uint32_t s[2];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      s[half] = (sc[0][2 * half] & 0xFFu) | ((sc[1][2 * half] & 0xFFu) << 8) | ((sc[0][2 * half + 1] & 0xFFu) << 16) |
                ((sc[1][2 * half + 1] & 0xFFu) << 24);
    *reinterpret_cast<uint2*>(c + kCodeBytes + wg * 256 + warp * 64 + g * 8) = make_uint2(s[0], s[1]);
  }
  if (chunk == 0 && threadIdx.x < kHeaderBytes / 4) {
    uint32_t v = 0;
    if (threadIdx.x == 0) v = __float_as_uint(524288.0f / __ldg(global_scale));  // 2^19 / global_scale
    if (threadIdx.x == 1) v = uint32_t(n);
    if (threadIdx.x == 2) v = uint32_t(k);
    reinterpret_cast<uint32_t*>(out)[threadIdx.x] = v;
  }
}

// ---- host ---------------------------------------------------------------------------------------------

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

template <int C>
int launch(const void* a, int64_t ld_a, const Params& p, const Plan& plan, int m, int k, cudaStream_t stream) {
  constexpr Config cfg = kConfigs[C];
  constexpr auto kernel = w4a16_gemm_kernel<cfg.bm, cfg.stages, cfg.ctas_per_sm>;
  constexpr int smem = Smem<cfg.bm, cfg.stages>::kBytes;
  EncodeTiled encode = nullptr;
  if (int st = encode_fn(&encode); st != GS_OK) return st;
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(m)};
  const cuuint64_t strides[1] = {cuuint64_t(ld_a) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(cfg.bm)};
  const cuuint32_t elem_strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return GS_ERR_INVALID_ARGUMENT;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return graphsafe::cuda_failed(e);
  if (int st = ensure_smem<kernel>(device, smem); st != GS_OK) return st;
  kernel<<<dim3(plan.tiles_n, plan.tiles_m, plan.splits), threads_for(cfg.bm), smem, stream>>>(map, p);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

}  // namespace
}  // namespace graphsafe::nvfp4_sm90

using namespace graphsafe::nvfp4_sm90;

extern "C" int gs_nvfp4_w4a16_prepare(const uint8_t* packed, const uint8_t* scales, const float* global_scale, int32_t n,
                                      int32_t k, void* prepared, uint64_t prepared_size, void* stream) {
  if (packed == nullptr || scales == nullptr || global_scale == nullptr || prepared == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!shape_ok(1, n, k) || prepared_size < prepared_bytes(n, k) || !aligned(prepared, 16)) return GS_ERR_INVALID_ARGUMENT;
  const int tiles_n = int(cdiv(n, kTileN)), kblocks = int(cdiv(k, kBlockK));
  const int64_t chunks = int64_t(tiles_n) * kblocks;
  if (chunks > INT32_MAX) return GS_ERR_INVALID_ARGUMENT;
  w4a16_prepare_kernel<<<unsigned(chunks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      packed, scales, global_scale, n, k, kblocks, static_cast<uint8_t*>(prepared));
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

extern "C" int gs_nvfp4_w4a16_gemm(const void* a, int64_t ld_a, const void* prepared, const float* alpha, void* d,
                                   int64_t ld_d, int32_t m, int32_t n, int32_t k, int32_t sm_count, void* workspace,
                                   uint64_t workspace_bytes, void* stream) {
  if (a == nullptr || prepared == nullptr || alpha == nullptr || d == nullptr || sm_count <= 0) return GS_ERR_INVALID_ARGUMENT;
  if (!shape_ok(m, n, k)) return GS_ERR_INVALID_ARGUMENT;
  // TMA: 16-byte aligned base and row stride; bulk copies: 16-byte aligned prepared weight.
  if (ld_a < k || ld_a % 8 != 0 || !aligned(a, 16) || !aligned(prepared, 16)) return GS_ERR_INVALID_ARGUMENT;
  if (ld_d < n || !aligned(d, 2)) return GS_ERR_INVALID_ARGUMENT;
  const Plan plan = make_plan(m, n, k, sm_count);
  Params p{};
  p.chunks = static_cast<const uint8_t*>(prepared) + kHeaderBytes;
  p.factor = static_cast<const float*>(prepared);
  p.alpha = alpha;
  p.d = static_cast<uint16_t*>(d);
  p.ld_d = ld_d;
  p.m = m;
  p.n = n;
  p.kblocks = plan.kblocks;
  p.kb_per_split = plan.kb_per_split;
  p.splits = plan.splits;
  p.tiles_n = plan.tiles_n;
  p.tiles = plan.tiles;
  if (plan.workspace_bytes > 0) {
    if (workspace == nullptr || workspace_bytes < plan.workspace_bytes) return GS_ERR_WORKSPACE_TOO_SMALL;
    if (!aligned(workspace, 16)) return GS_ERR_INVALID_ARGUMENT;
    p.partials = static_cast<float*>(workspace);
    p.counters = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(workspace) + plan.partial_bytes);
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (plan.workspace_bytes > 0) {
    // The workspace is shared: other kernels (MLA partials, this GEMM at another shape, whose
    // partials may cover these counters) leave it dirty, so the counters are zeroed on the
    // caller's stream before every launch (a memset node in a captured graph). The kernel's own
    // reset keeps them zero for a second launch of the same shape, but cannot be relied on alone.
    cudaError_t e = cudaMemsetAsync(p.counters, 0, uint64_t(plan.tiles) * 4u, s);
    if (e != cudaSuccess) return graphsafe::cuda_failed(e);
  }
  switch (plan.config) {
    case 0: return launch<0>(a, ld_a, p, plan, m, k, s);
    case 1: return launch<1>(a, ld_a, p, plan, m, k, s);
    case 2: return launch<2>(a, ld_a, p, plan, m, k, s);
    case 3: return launch<3>(a, ld_a, p, plan, m, k, s);
    case 4: return launch<4>(a, ld_a, p, plan, m, k, s);
    default: return launch<5>(a, ld_a, p, plan, m, k, s);
  }
}

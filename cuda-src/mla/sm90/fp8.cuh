// The fp8 KV caches of the sm90 M64 kernel (48..128 query rows): its producer warpgroup lands a
// tile's raw bytes in the front of its own bf16 stage and dequantises them there, back to front
// (produce_fp8_in_place, below): Q and the two stages take 216 of the 227 KiB, so there is no room
// for a raw ring. Up to 32 rows both fp8 formats run the N8 kernel (kernel_n_fp8.cuh), which
// converts in its math warps instead.
#pragma once

#include <cuda_fp8.h>
#include "mla/sm90/split.cuh"

namespace graphsafe::mla_sm90 {

enum KvFormat : int { kKvNative = 0, kKvFp8PerTensor = 1, kKvFp8DsMla = 2 };

// The raw tile of each fp8 format as the M64 producer's TMA boxes write it, in halves of 32 rows:
// the latent (and for the per-tensor format the rope) as 64-byte column blocks (block c = dims
// 64c..64c+63, row-major, unswizzled), then for the 656-byte format the rows' 16-byte scales.
template <int KV>
struct Fp8Raw {
  static_assert(KV == kKvFp8PerTensor || KV == kKvFp8DsMla, "fp8 formats only");
  static constexpr int kHalf = kTileS / 2;                          // rows per TMA box
  static constexpr int kLatBlocks = KV == kKvFp8PerTensor ? 9 : 8;  // blocks converted by the producer
  static constexpr int kRopeOff = 528;  // 656-byte format: 64 bf16 rope values after latent + scales
};

// bf16 bits of x * 2^-112 for each e4m3 code of `pair` (low byte -> low half). Exact: every e4m3
// value is a normal f16 (or zero), and moving the f16 exponent and mantissa down into the bf16
// fields divides by 2^(127 - 15) without rounding. The e4m3 NaN codes give a finite value.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2_scaled(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  const uint32_t w = uint32_t(h.x) | (uint32_t(h.y) << 16);
  return ((w >> 3) & 0x0FFF0FFFu) | (w & 0x80008000u);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
constexpr uint32_t kBf16x2Pow112 = 0x77807780u;  // bf16(2^112) in both halves
constexpr float kPow112 = 5.192296858534828e33f;  // 2^112

// Four e4m3 codes -> two bf16x2 words, exact (the per-tensor format's scale is applied elsewhere).
__device__ __forceinline__ void convert4_exact(uint32_t v, uint32_t& lo, uint32_t& hi) {
  lo = bf16x2_mul(e4m3x2_to_bf16x2_scaled(uint16_t(v & 0xFFFFu)), kBf16x2Pow112);
  hi = bf16x2_mul(e4m3x2_to_bf16x2_scaled(uint16_t(v >> 16)), kBf16x2Pow112);
}
// Four e4m3 codes times `s` -> two bf16x2 words: the product in f32 (exact up to one rounding),
// rounded once to bf16. (x * 2^-112) * 2^112 first, so a tiny scale cannot push it subnormal.
__device__ __forceinline__ uint32_t scale_pair(uint32_t y, float s) {
  const float lo = __uint_as_float(y << 16) * kPow112 * s;
  const float hi = __uint_as_float(y & 0xFFFF0000u) * kPow112 * s;
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ void convert4_scaled(uint32_t v, float s, uint32_t& lo, uint32_t& hi) {
  lo = scale_pair(e4m3x2_to_bf16x2_scaled(uint16_t(v & 0xFFFFu)), s);
  hi = scale_pair(e4m3x2_to_bf16x2_scaled(uint16_t(v >> 16)), s);
}

// The fp8 producer of the M64 kernel, on all 128 threads of the producer warpgroup: tile i's raw
// bytes land (TMA) in the front of its own stage s = i % 2, as 64-column blocks of the whole tile
// (block c = dims 64c..64c+63, 64 rows x 64 B, row-major, unswizzled: 4 KiB at 4 KiB c; the
// 656-byte format's scales after its 8 latent blocks, its bf16 rope by TMA straight into block 8),
// and are dequantised in place into the stage's bf16 layout, block c = 8 (7) down to 0.
//
// Why back to front, with a barrier between each block's loads and its stores: bf16 block c
// (8 KiB at 8 KiB c) covers raw blocks 2c and 2c + 1 (and, for c = 4, the scales): raw data of
// blocks >= c only. Every thread loads its codes of block c (and read its scales at the start)
// before the barrier of block c, and stores block c after it, so no store can overwrite raw bytes
// that some thread has yet to read. Blocks 5..8 overwrite no raw bytes at all.
// Thread pt takes rows pt / 4 and 32 + pt / 4, quarter pt % 4 of each raw row (16 codes -> two
// 16-byte chunks of the bf16 row at their swizzled places). A stage is refilled
// only after the math warpgroups released it (empty), and is full once all 128 threads arrived
// (and, for the 656-byte format, the rope's TMA landed: thread 0 adds it to the phase's bytes
// before its own arrival).
template <int KV>
__device__ __forceinline__ void produce_fp8_in_place(const CUtensorMap* lat_map, const CUtensorMap* scale_map,
                                                     const CUtensorMap* rope_map, const Params& p, int b,
                                                     const SplitRange& sr, uint8_t* stages, uint32_t full0,
                                                     uint32_t empty0, uint32_t rawfull0, int pt) {
  using R = Fp8Raw<KV>;
  constexpr int kRawBlock = kTileS * 64;                  // one raw column block of a tile: 4 KiB
  constexpr int kScaleOff = R::kLatBlocks * kRawBlock;    // the 656-byte format's scales: 64 x 16 B
  constexpr int kRawBytes = kScaleOff + (KV == kKvFp8DsMla ? kTileS * 16 : 0);
  // Clear of block 8, where the 656-byte format's rope lands by TMA while the raw bytes wait.
  static_assert(kRawBytes <= 8 * kBlockBytes, "the raw tile must stay clear of block 8");
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  const uint32_t stages_a = smem_u32(stages);
  const int r = pt >> 2, q = pt & 3;
  for (int i = 0; i < sr.n; ++i) {
    const int s = i & 1;
    uint8_t* stage = stages + s * kStageBytes;
    const uint32_t st = stages_a + s * kStageBytes, raw_bar = rawfull0 + 8 * s, full = full0 + 8 * s;
    int row = 0;
    if (pt == 0) {  // the page-table read's latency passes while the stage drains
      const int tok = (sr.tile0 + i) * kTileS;
      const int page = min(max(__ldg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
      row = page * p.page_size + tok % p.page_size;
    }
    if (i >= 2) mbar_wait(empty0 + 8 * s, ((i >> 1) - 1) & 1);
    if (pt == 0) {
      mbar_arrive_expect_tx(raw_bar, kRawBytes);
#pragma unroll
      for (int c = 0; c < R::kLatBlocks; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) tma_load_2d(st + c * kRawBlock + h * (kRawBlock / 2), lat_map, c * 64, row + h * R::kHalf, raw_bar);
      if constexpr (KV == kKvFp8DsMla) {
#pragma unroll
        for (int h = 0; h < 2; ++h) tma_load_2d(st + kScaleOff + h * R::kHalf * 16, scale_map, kNope, row + h * R::kHalf, raw_bar);
        mbar_expect_tx(full, kTileS * 128);
#pragma unroll
        for (int h = 0; h < 2; ++h) tma_load_2d(st + 8 * kBlockBytes + h * R::kHalf * 128, rope_map, R::kRopeOff, row + h * R::kHalf, full);
      }
    }
    mbar_wait(raw_bar, (i >> 1) & 1);
    float4 sa = make_float4(1.f, 1.f, 1.f, 1.f), sb = sa;
    if constexpr (KV == kKvFp8DsMla) {
      sa = *reinterpret_cast<const float4*>(stage + kScaleOff + r * 16);
      sb = *reinterpret_cast<const float4*>(stage + kScaleOff + (r + R::kHalf) * 16);
    }
#pragma unroll 1
    for (int c = R::kLatBlocks - 1; c >= 0; --c) {
      const uint4 va = *reinterpret_cast<const uint4*>(stage + c * kRawBlock + r * 64 + q * 16);
      const uint4 vb = *reinterpret_cast<const uint4*>(stage + c * kRawBlock + (r + R::kHalf) * 64 + q * 16);
      named_bar_sync(1, 128);  // every thread holds its codes of blocks >= c: their raw bytes are dead
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const uint4 v = t == 0 ? va : vb;
        const int rr = r + t * R::kHalf, sw = rr & 7;
        uint4 lo, hi;
        if constexpr (KV == kKvFp8PerTensor) {
          convert4_exact(v.x, lo.x, lo.y);
          convert4_exact(v.y, lo.z, lo.w);
          convert4_exact(v.z, hi.x, hi.y);
          convert4_exact(v.w, hi.z, hi.w);
        } else {
          const float4 sc = t == 0 ? sa : sb;
          const int k = c >> 1;
          const float f = k == 0 ? sc.x : k == 1 ? sc.y : k == 2 ? sc.z : sc.w;
          convert4_scaled(v.x, f, lo.x, lo.y);
          convert4_scaled(v.y, f, lo.z, lo.w);
          convert4_scaled(v.z, f, hi.x, hi.y);
          convert4_scaled(v.w, f, hi.z, hi.w);
        }
        uint8_t* dst = stage + c * kBlockBytes + rr * 128;
        *reinterpret_cast<uint4*>(dst + (((2 * q) ^ sw) << 4)) = lo;
        *reinterpret_cast<uint4*>(dst + (((2 * q + 1) ^ sw) << 4)) = hi;
      }
    }
    fence_proxy_async();  // the math warpgroups read the stage through the async proxy (wgmma)
    mbar_arrive(full);
  }
}

}  // namespace graphsafe::mla_sm90

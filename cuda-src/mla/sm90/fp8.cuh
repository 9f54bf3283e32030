// The fp8 KV caches of the sm90 N and M64 kernels. The N kernel (16/32 heads, the 656-byte format
// GS_MLA_KV_FP8_DS_MLA; the per-tensor format there runs the N8 kernel, kernel_n_fp8.cuh, which
// converts in its math warps and is faster): a producer warpgroup that streams raw fp8 half-tiles
// with TMA into a small ring of raw slots and dequantises them into the same bf16 stages, in the
// same 128-byte-swizzled layout, that the TMA producer of a bf16 cache writes. The math warpgroups are unchanged: they cannot tell the two
// producers apart except by the full barrier's arrival count (128 here, one per producer thread).
//
// Why a raw ring in shared memory and not loads into registers: the TMA keeps a whole tile of
// bytes in flight per SM without registers (the producer has 152 or 104 per thread), and it does the
// page-table addressing and the 656-byte token stride for us. The cost is one more shared-memory
// write and read of the raw bytes (36 KiB per tile), which the N kernel (16/32 heads, memory-bound)
// has room for. The M64 kernel (48..128 heads) has no room for a ring (Q and its two stages take
// 216 of the 227 KiB): produce_fp8_in_place lands a tile's raw bytes in the front of its own stage
// and dequantises them there, back to front (below).
#pragma once

#include <cuda_fp8.h>
#include "mla/sm90/split.cuh"

namespace graphsafe::mla_sm90 {

enum KvFormat : int { kKvNative = 0, kKvFp8PerTensor = 1, kKvFp8DsMla = 2 };

// Raw half-tile (32 tokens) of each fp8 format, as the TMA writes it into a raw slot: the latent
// (and for the per-tensor format the rope) as 64-byte column blocks of 32 rows (block c = dims
// 64c..64c+63, row-major, unswizzled), then for the 656-byte format the 32 rows' 16-byte scales.
template <int KV>
struct Fp8Raw {
  static_assert(KV == kKvFp8PerTensor || KV == kKvFp8DsMla, "fp8 formats only");
  static constexpr int kHalf = kTileS / 2;                       // tokens per raw slot
  static constexpr int kBoxBytes = kHalf * 64;                   // one 64-column block of a half: 2 KiB
  static constexpr int kLatBlocks = KV == kKvFp8PerTensor ? 9 : 8;  // blocks converted by the producer
  static constexpr int kScaleOff = kLatBlocks * kBoxBytes;
  static constexpr int kBytes = kScaleOff + (KV == kKvFp8DsMla ? kHalf * 16 : 0);  // a multiple of 128
  static constexpr int kTokenBytes = KV == kKvFp8PerTensor ? kDim : 656;
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

// Dequantises raw slot `raw` (half `half` of a tile) into rows [32 half, 32 half + 32) of `stage`.
// Thread pt (0..127) takes row pt / 4 and the 16-byte quarter pt % 4 of every 64-byte block: its
// 16 codes become two 16-byte chunks (2q, 2q + 1) of the bf16 row, at their swizzled places.
template <int KV>
__device__ __forceinline__ void dequant_half(const uint8_t* raw, uint8_t* stage, int half, int pt) {
  static_assert(KV == kKvFp8DsMla, "the N kernel's raw ring serves the 656-byte format only (per-tensor: kernel_n_fp8.cuh)");
  using R = Fp8Raw<KV>;
  const int r = pt >> 2, q = pt & 3, row = half * R::kHalf + r, sw = row & 7;
  const uint8_t* src = raw + r * 64 + q * 16;
  uint8_t* dst = stage + row * 128;
  float4 sc = make_float4(1.f, 1.f, 1.f, 1.f);
  if constexpr (KV == kKvFp8DsMla) sc = *reinterpret_cast<const float4*>(raw + R::kScaleOff + r * 16);
  // Every load first: the conversions of nine independent chunks then overlap each other's
  // latencies (one chunk at a time, a producer warp issues about one instruction in six).
  uint4 in[R::kLatBlocks];
#pragma unroll
  for (int c = 0; c < R::kLatBlocks; ++c) in[c] = *reinterpret_cast<const uint4*>(src + c * R::kBoxBytes);
#pragma unroll
  for (int c = 0; c < R::kLatBlocks; ++c) {
    const uint4 v = in[c];
    uint4 a, b;
    const float s = (c >> 1) == 0 ? sc.x : (c >> 1) == 1 ? sc.y : (c >> 1) == 2 ? sc.z : sc.w;
    convert4_scaled(v.x, s, a.x, a.y);
    convert4_scaled(v.y, s, a.z, a.w);
    convert4_scaled(v.z, s, b.x, b.y);
    convert4_scaled(v.w, s, b.z, b.w);
    *reinterpret_cast<uint4*>(dst + c * kBlockBytes + (((2 * q) ^ sw) << 4)) = a;
    *reinterpret_cast<uint4*>(dst + c * kBlockBytes + (((2 * q + 1) ^ sw) << 4)) = b;
  }
}

// The fp8 producer, on all 128 threads of the producer warpgroup. Half-tile h (tile h / 2) goes
// through raw slot h % kSlots: thread 0 issues its TMA kSlots halves ahead; every thread waits for
// it, dequantises its share into the tile's stage, and the warpgroup syncs (named barrier 1) before
// thread 0 refills the slot. A stage is refilled only after the math warpgroup released it
// (empty), and is full once all 128 threads arrived after their second half (and, for the 656-byte
// format, the rope's TMA straight into the stage's block 8 landed).
template <int KV, int kSlots>
__device__ __forceinline__ void produce_fp8_tiles(const CUtensorMap* lat_map, const CUtensorMap* scale_map,
                                                  const CUtensorMap* rope_map, const Params& p, int b, const SplitRange& sr,
                                                  uint8_t* stages, uint8_t* raw, uint32_t full0, uint32_t empty0,
                                                  uint32_t rawfull0, int pt) {
  using R = Fp8Raw<KV>;
  const int halves = 2 * sr.n;
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  // Cache row of the first token of half-tile h (a half never crosses a page: pages are 64 or 128).
  // Through the read-only path, unlike the N kernel's other reads of caller data (load_q): the
  // kernel is launched programmatically dependent, but this runs after its griddepcontrol.wait, when
  // the grid before it has completed and flushed, and no CTA of this grid read the table before; an
  // L2-only load here measured 3-9 % slower for every fp8 shape (H200, 16 heads 64 x 4096 per-tensor
  // 96.4 against 104.3 us; loading it an iteration earlier did not help).
  auto cache_row = [&](int h) {
    const int tok = (sr.tile0 + (h >> 1)) * kTileS + (h & 1) * R::kHalf;
    const int page = min(max(__ldg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
    return page * p.page_size + tok % p.page_size;
  };
  const uint32_t raw_a = smem_u32(raw), stages_a = smem_u32(stages);
  auto issue = [&](int h, int row) {
    const int slot = h % kSlots;
    const uint32_t bar = rawfull0 + 8 * slot, dst = raw_a + slot * R::kBytes;
    mbar_arrive_expect_tx(bar, R::kBytes);
#pragma unroll
    for (int c = 0; c < R::kLatBlocks; ++c) tma_load_2d(dst + c * R::kBoxBytes, lat_map, c * 64, row, bar);
    if constexpr (KV == kKvFp8DsMla) tma_load_2d(dst + R::kScaleOff, scale_map, kNope, row, bar);
  };
  if (pt == 0)
    for (int h = 0; h < min(kSlots, halves); ++h) issue(h, cache_row(h));
  for (int h = 0; h < halves; ++h) {
    const int i = h >> 1, s = i & 1, half = h & 1, slot = h % kSlots;
    uint8_t* stage = stages + s * kStageBytes;
    // Thread 0's page-table reads for this iteration's TMAs, issued first: their latency (a global
    // load) passes while the warpgroup dequantises, instead of stalling everyone at the barrier.
    int next_row = 0, rope_row = 0;
    if (pt == 0) {
      if (h + kSlots < halves) next_row = cache_row(h + kSlots);
      if (KV == kKvFp8DsMla && half == 0) rope_row = cache_row(h);  // both halves: one page
    }
    if (half == 0 && i >= 2) mbar_wait(empty0 + 8 * s, ((i >> 1) - 1) & 1);
    mbar_wait(rawfull0 + 8 * slot, (h / kSlots) & 1);
    dequant_half<KV>(raw + slot * R::kBytes, stage, half, pt);
    named_bar_sync(1, 128);  // every thread is done reading the slot
    if (pt == 0) {
      if (h + kSlots < halves) issue(h + kSlots, next_row);
      if constexpr (KV == kKvFp8DsMla) {
        // The rope lands in the stage's block 8 (free: the stage was released above). Expected
        // before the 128 arrivals of half 1 can complete the phase.
        if (half == 0) {
          const uint32_t bar = full0 + 8 * s, dst = stages_a + s * kStageBytes + 8 * kBlockBytes;
          mbar_expect_tx(bar, R::kHalf * 128 * 2);
          tma_load_2d(dst, rope_map, R::kRopeOff, rope_row, bar);
          tma_load_2d(dst + R::kHalf * 128, rope_map, R::kRopeOff, rope_row + R::kHalf, bar);
        }
      }
    }
    if (half == 1) {
      fence_proxy_async();  // the math warpgroups read the stage through the async proxy (wgmma)
      mbar_arrive(full0 + 8 * s);
    }
  }
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
// 16-byte chunks of the bf16 row at their swizzled places), like dequant_half. A stage is refilled
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
        // dequant_half's conversion, written again: a shared helper (tried) gives the same
        // instruction counts but another schedule in all five fp8 kernels' sm_90a SASS, which
        // needs a run on the H200 before it can replace measured code.
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

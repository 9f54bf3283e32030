// The fp8 KV caches of the sm90 64-row kernel (more than 32 query rows): the conversions, and the
// seesaw kernel's fp8 feed (produce_fp8_seesaw, below), which converts each box of a tile into the
// bf16 stage the math warpgroups read. Up to 32 rows both fp8 formats run the N8 kernel
// (kernel_n_fp8.cuh), which converts in its math warps instead.
#pragma once

#include <cuda_fp8.h>
#include "mla/sm90/split.cuh"

namespace graphsafe::mla_sm90 {

enum KvFormat : int { kKvNative = 0, kKvFp8PerTensor = 1, kKvFp8DsMla = 2 };
// The 656-byte token (GS_MLA_DS_MLA_TOKEN_BYTES): 512 e4m3 codes, four f32 group scales, 64 bf16 rope values.
constexpr int kDsTokenBytes = 656, kDsScaleOff = 512, kDsRopeOff = 528;

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

// Four e4m3 codes -> two bf16x2 words, exact (the per-tensor format's scale is applied elsewhere).
__device__ __forceinline__ void convert4_exact(uint32_t v, uint32_t& lo, uint32_t& hi) {
  lo = bf16x2_mul(e4m3x2_to_bf16x2_scaled(uint16_t(v & 0xFFFFu)), kBf16x2Pow112);
  hi = bf16x2_mul(e4m3x2_to_bf16x2_scaled(uint16_t(v >> 16)), kBf16x2Pow112);
}
// Four e4m3 codes times `s` -> two bf16x2 words: each code exactly to f16 and f32, the product
// in f32 (one rounding), rounded once to bf16. The NaN codes come out as 448 (min.f16x2 returns
// its non-NaN operand; every finite code is at most 448).
__device__ __forceinline__ uint32_t scale_pair(uint16_t pair, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  const __half2 c = __hmin2(*reinterpret_cast<const __half2*>(&h), __half2(__half_raw{0x5F00}, __half_raw{0x5F00}));
  const float2 f = __half22float2(c);
  const __nv_bfloat162 r = __floats2bfloat162_rn(f.x * s, f.y * s);
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ void convert4_scaled(uint32_t v, float s, uint32_t& lo, uint32_t& hi) {
  lo = scale_pair(uint16_t(v & 0xFFFFu), s);
  hi = scale_pair(uint16_t(v >> 16), s);
}

// ---- the seesaw kernel's fp8 feed -----------------------------------------------------------------
// Over an fp8 cache the seesaw kernel (kernel_seesaw.cuh) keeps its bf16 stages, its box order and
// its four release groups; only the producer changes: instead of one thread issuing TMA boxes, all
// 128 threads of the producer warpgroup load the raw codes into registers (16-byte loads that skip
// L1) and store them converted into the stage's swizzled bf16 layout, box by box, each box's full
// barrier completed by the 128 arrivals. Why registers and not a raw ring in shared memory: Q and
// the two stages take 216 of the 227 KiB. What this buys over a raw TMA landing in the stage and
// converted in place there (the kernel it replaced, docs/design/mla-sm90-compute-bound.md 7.3.1):
// a box's loads are issued kAhead boxes before its stores, so before the wait for the release of
// the stage they go to, and the memory latency no longer sits between a release and the refill.
// The tiles are also asked of L2 four tiles ahead (bulk prefetch: no registers, no shared memory).
//
// Two things ptxas does that this code is shaped around (measured, H100, 2026-12-06):
//  * a fence.proxy.async compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC, and the MEMBAR waits for
//    the thread's loads in flight; so the feed fences nothing and the math warpgroups fence after
//    acquiring each box (the proxy fence may sit anywhere on the release-acquire path between the
//    generic stores and the async-proxy reads): 128 heads 64 x 4096 per-tensor 234 -> 214 us;
//  * ptxas tracks the feed's loads on one scoreboard, so converting a box waits for every load in
//    flight (design 7.3.2: what bounds this feed); with the loads behind a branch it also issued
//    them one box at a time. The loads are unconditional (past the split's last tile they read
//    page 0 and are never stored), which lets ptxas issue them in batches: 286 -> 234 us.
template <int KV>
struct SeesawFp8 {
  static_assert(KV == kKvFp8PerTensor || KV == kKvFp8DsMla, "fp8 formats only");
  static constexpr bool kDs = KV == kKvFp8DsMla;
  static constexpr int kRowBytes = kDs ? kDsTokenBytes : kDim;  // bytes per token in the cache
  // Boxes a tile the feed threads convert: the 656-byte format's bf16 rope (box 8, last in both
  // buffers' orders) needs no conversion and goes by TMA (the kernel's tensor map: 128-byte x
  // 64-row boxes of the [tokens, 656] bytes, swizzled as a bf16 block), holding no registers.
  static constexpr int kUnits = kDs ? 8 : kBlocks;
  // Boxes whose loads are in flight ahead of the one converted: the ring of kAhead + 1 register
  // sets must divide the loop body's boxes (36 or 32). Per-tensor 3 -> 5: 128 heads 128 x 8192
  // 778 -> 754 us; the 656-byte format's next divisor (7) spills (ptxas: 284 bytes).
  static constexpr int kAhead = kDs ? 3 : 5;
  // Registers: the math warpgroups run without spills at 200 (ptxas; the bf16 path keeps 232), the
  // feed takes the rest for its loads in flight.
  static constexpr int kMathRegs = 200, kProducerRegs = 104;
};

// One box of one feed thread: 16 codes of rows r and r + 32 and their group scales (656-byte format).
struct Fp8Box {
  uint4 v[2];
  float s[2];
};

__device__ __forceinline__ uint4 ldg_stream16(const uint8_t* src) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
  return v;
}
// Volatile like ldg_stream16: kept where the feed's pipeline puts it (a scale hoisted to the top of
// the unrolled pair would hold a register for the whole pair).
__device__ __forceinline__ float ldg_f32(const uint8_t* src) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(src));
  return v;
}

// `row` points at byte 16 q of the thread's row r of the tile.
template <int KV>
__device__ __forceinline__ void load_fp8_box(Fp8Box& x, const uint8_t* row, int c, int q) {
  using F = SeesawFp8<KV>;
  const uint8_t* row_b = row + 32 * F::kRowBytes;
  x.v[0] = ldg_stream16(row + 64 * c);
  x.v[1] = ldg_stream16(row_b + 64 * c);
  if constexpr (F::kDs) {
    const int off = kDsScaleOff + 4 * (c >> 1) - 16 * q;
    x.s[0] = ldg_f32(row + off);
    x.s[1] = ldg_f32(row_b + off);
  }
}

// Box c of rows r and r + 32 into block c of `stage` (bf16, 128-byte swizzle): 16 codes become the
// bf16 chunks 2q and 2q + 1 of the row.
template <int KV>
__device__ __forceinline__ void store_fp8_box(uint8_t* stage, const Fp8Box& x, int c, int r, int q) {
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int rr = r + 32 * t, sw = rr & 7;
    uint8_t* dst = stage + c * kBlockBytes + rr * 128;
    uint4 lo, hi;
    if constexpr (KV == kKvFp8PerTensor) {
      convert4_exact(x.v[t].x, lo.x, lo.y);
      convert4_exact(x.v[t].y, lo.z, lo.w);
      convert4_exact(x.v[t].z, hi.x, hi.y);
      convert4_exact(x.v[t].w, hi.z, hi.w);
    } else {
      convert4_scaled(x.v[t].x, x.s[t], lo.x, lo.y);
      convert4_scaled(x.v[t].y, x.s[t], lo.z, lo.w);
      convert4_scaled(x.v[t].z, x.s[t], hi.x, hi.y);
      convert4_scaled(x.v[t].w, x.s[t], hi.z, hi.w);
    }
    *reinterpret_cast<uint4*>(dst + (((2 * q) ^ sw) << 4)) = lo;
    *reinterpret_cast<uint4*>(dst + (((2 * q + 1) ^ sw) << 4)) = hi;
  }
}

// The box order of the seesaw's two buffers (the order their release groups free them; the math
// warpgroups wait for the boxes in the same order): tile A of a pair 0..8, tile B 4..7, 0..3, 8.
__device__ __forceinline__ constexpr int seesaw_box(int bf, int n) { return bf == 0 ? n : n < 4 ? n + 4 : n < 8 ? n - 4 : 8; }

// The feed, on each of the 128 producer threads (pt): thread pt converts rows pt / 4 and
// pt / 4 + 32, 16 codes (dims 16 (pt % 4) ..) of each box. Two pairs (four tiles) of boxes a loop
// iteration, unrolled, each box with the loads of the box kAhead later issued first into a ring of
// kAhead + 1 register sets indexed at compile time (a ring that moved its registers along would
// wait for each load at the move). The releases are waited for as produce_tiles_seesaw waits for
// them. `rope_map`: the 656-byte format's rope boxes (thread 0 issues them).
template <int KV>
__device__ __forceinline__ void produce_fp8_seesaw(const CUtensorMap* rope_map, const Params& p, int b,
                                                   const SplitRange& sr, uint8_t* stages, uint32_t full0,
                                                   uint32_t rel0, uint32_t q_ready, int pt) {
  using F = SeesawFp8<KV>;
  constexpr int A = F::kAhead, U = F::kUnits, R = A + 1, kBody = 4 * U;
  static_assert(kBody % R == 0 && A < U, "the ring's slots repeat with the loop body");
  const uint32_t e0l = rel0, e0r = rel0 + 8, e1r = rel0 + 16, e1l = rel0 + 24;
  const int r = pt >> 2, q = pt & 3;
  const int32_t* pages = p.page_table + int64_t(b) * p.page_table_stride;
  const int ps_shift = __ffs(p.page_size) - 1;  // page sizes are powers of two
  // Tile t's page (clamped into the cache), read ahead: the page-table latency must not sit in
  // the feed's pipeline (thread 0 needs a page at a tile's start for the L2 prefetch and the rope).
  auto page_of = [&](int t) {
    return t < sr.n ? min(max(__ldg(pages + (((sr.tile0 + t) * kTileS) >> ps_shift)), 0), p.num_pages - 1) : 0;
  };
  // Unsigned: past the split's last tile (t up to sr.n + 3) the token index may pass INT_MAX; it
  // wraps, and only its offset within a page is used.
  auto cache_row = [&](int t, int page) {
    return page * p.page_size + int((uint32_t(sr.tile0 + t) * uint32_t(kTileS)) & uint32_t(p.page_size - 1));
  };
  int page[8];  // tiles 4m .. 4m + 7: this loop iteration's and the next one's
#pragma unroll
  for (int i = 0; i < 8; ++i) page[i] = page_of(i);
  // Byte 16 q of row r of tile t (past the split's last tile, of page 0: loaded, never stored,
  // and no branch around the loads, which lets ptxas issue them in batches; see above).
  auto tile_row = [&](int t, int pg) -> const uint8_t* {
    return p.kv_cache + (int64_t(cache_row(t, pg)) + r) * F::kRowBytes + 16 * q;
  };
  auto prefetch = [&](int t, int pg) {
    if (pt == 0 && t < sr.n) prefetch_l2(p.kv_cache + int64_t(cache_row(t, pg)) * F::kRowBytes, kTileS * F::kRowBytes);
  };
  auto load = [&](Fp8Box& x, const uint8_t* tile, int u) {  // unit u of a body (u < kBody + A)
    load_fp8_box<KV>(x, tile, seesaw_box((u / U) & 1, u % U), q);
  };
  prefetch(2, page[2]);
  prefetch(3, page[3]);
  Fp8Box ring[R];
  {
    const uint8_t* t0 = tile_row(0, page[0]);
#pragma unroll
    for (int u = 0; u < A; ++u) load(ring[u], t0, u);
  }
  for (int m = 0; 4 * m < sr.n; ++m) {
    int ahead[4];  // the pages of tiles 4m + 8 .. 4m + 11, for the next iteration
#pragma unroll
    for (int i = 0; i < 4; ++i) ahead[i] = page_of(4 * m + 8 + i);
    const uint8_t* tiles[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) tiles[i] = tile_row(4 * m + i, page[i]);
#pragma unroll
    for (int j = 0; j < kBody; ++j) {
      const int i = j / U, bf = i & 1, n = j % U, c = seesaw_box(bf, n), t = 4 * m + i;
      const uint32_t parity = (i >> 1) ^ 1;  // the releases of the pair before: (2m + i / 2 - 1) & 1
      load(ring[(j + A) % R], tiles[(j + A) / U], j + A);
      if (n == 0) prefetch(t + 4, page[i + 4]);
      if (t < sr.n) {
        if (t >= 2 && n == 0) mbar_wait(bf == 0 ? e0l : e1r, parity);
        if (t >= 2 && n == 4) mbar_wait(bf == 0 ? e0r : e1l, parity);
        if (F::kDs && n == 4 && pt == 0) {  // block 8 is free with the group just waited for
          const uint32_t bar = full0 + 16 * 8 + 8 * bf;
          mbar_arrive_expect_tx(bar, kBlockBytes);
          tma_load_2d(smem_u32(stages + bf * kStageBytes + 8 * kBlockBytes), rope_map, kDsRopeOff, cache_row(t, page[i]), bar);
        }
        store_fp8_box<KV>(stages + bf * kStageBytes, ring[j % R], c, r, q);
        mbar_arrive(full0 + 16 * c + 8 * bf);
      }
      // As produce_tiles_seesaw: Q's loads first, once tile 0 is on its way.
      if (m == 0 && j == U - 1 && sr.n > 1) mbar_wait(q_ready, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      page[i] = page[i + 4];
      page[i + 4] = ahead[i];
    }
  }
}

}  // namespace graphsafe::mla_sm90

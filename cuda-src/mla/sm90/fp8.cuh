// The fp8 KV caches on sm90: the conversions, and the seesaw kernel's feed of the 656-byte format
// over more than 32 query rows (produce_fp8_seesaw, below), which converts each box of a tile into
// the bf16 stage the math warpgroups read. Up to 32 rows both fp8 formats run the N8 kernel
// (kernel_n_fp8.cuh), and the per-tensor format over more rows the seesaw RS kernel
// (kernel_seesaw_rs.cuh): both convert in their math warps instead.
#pragma once

#include <cuda_fp8.h>
#include "mla/sm90/split.cuh"

namespace graphsafe::mla_sm90 {

enum KvFormat : int { kKvNative = 0, kKvFp8PerTensor = 1, kKvFp8DsMla = 2 };
// The 656-byte token (GS_MLA_DS_MLA_TOKEN_BYTES): 512 e4m3 codes, four f32 group scales, 64 bf16 rope values.
constexpr int kDsTokenBytes = 656, kDsScaleOff = 512, kDsRopeOff = 528;
// The seesaw fp8 feed's ring of raw codes (below): half-boxes of 128 threads x 16 bytes.
constexpr int kRawSlots = 4, kRawSlotBytes = 128 * 16;


// Four e4m3 codes (one 32-bit word) -> two f16x2 words: bytes 0-1 -> lo, bytes 2-3 -> hi. Exact for
// every finite code. kClamp: the NaN codes (0x7F, 0xFF) come out as 448 (min.f16x2 returns the
// non-NaN operand), else as fp16 NaNs. The clamp costs one instruction per register, 16 % of the
// N8 kernel's time at 16 heads (H200, 64 x 4096: 56.0 against 48.2 us), so the kernels that convert
// in their math warps run without it and rerun a split with it only if its output came out NaN
// (kernel_n_fp8.cuh, kernel_seesaw_rs.cuh); the seesaw kernel's feed always clamps.
// The cvt is not the slow conversion pipe: about 50 f16x2 results a clock per SM on an H100, where
// an integer sequence (a sign-replicating prmt, a shift, a mask: exact, NaN codes finite) reaches
// 32 and made the N8 kernel up to 10 % slower (design 7.3.3).
template <bool kClamp>
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (kClamp) {
    asm("{\n.reg .b16 l, h;\n.reg .b32 a, b;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 a, l;\ncvt.rn.f16x2.e4m3x2 b, h;\n"
        "min.f16x2 %0, a, %3;\nmin.f16x2 %1, b, %3;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(w), "r"(0x5F005F00u));  // 448 in both halves
  } else {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
  }
}

// An f16x2 word times `s` -> a bf16x2 word: each value exactly to f32, the product in f32 (one
// rounding), rounded once to bf16.
__device__ __forceinline__ uint32_t scale_f16x2(uint32_t h, float s) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 r = __floats2bfloat162_rn(f.x * s, f.y * s);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The exponent k that stages values of largest magnitude m as fp16 times 2^k: k = 14 - floor(log2 m)
// puts m in [2^14, 2^15) (bf16's 8 significant bits fit fp16's 11), clamped so 2^k and 2^-k are
// normal floats; 0 for m = 0 or an infinity (its scores are infinite or NaN whatever the scale).
// The N8 and seesaw RS kernels' Q rows (load_q_f16_scaled, kernel_n_fp8.cuh).
__device__ __forceinline__ int f16_stage_exponent(float m) {
  const int ex = int((__float_as_uint(m) >> 23) & 0xFFu) - 127;
  return (m == 0.f || ex == 128) ? 0 : min(max(14 - ex, -113), 120);
}
// 2^e, |e| <= 126 (a normal float).
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(127 + e) << 23); }

// ---- the seesaw kernel's fp8 feed -----------------------------------------------------------------
// Over an fp8 cache the seesaw kernel (kernel_seesaw.cuh) keeps its stages, its box order and
// its four release groups; only the producer changes: instead of one thread issuing TMA boxes, all
// 128 threads of the producer warpgroup copy the raw codes into a small ring in shared memory
// (cp.async, 16 bytes a thread and row half) and store them converted into the stage's swizzled
// layout (bf16(code x scale)), box by box, each box's full barrier completed by the 128 arrivals.
// The 656-byte format only: the per-tensor one runs the seesaw RS kernel (kernel_seesaw_rs.cuh).
//
// The ring: kRawSlots half-boxes (32 rows x 64 codes, a thread's 16 bytes at 16 pt), the 8 KiB the
// stages and Q leave. Each thread reads back only what it copied, so the ring needs no barrier:
// the thread's own cp.async groups (one a half-box) count what has landed, and a half-box's copies
// are issued three half-boxes before its conversion, so before the wait for the release of the
// stage they go to. Why not registers: the loads of a register ring all went on one scoreboard, so
// converting a box waited for every load in flight (design 7.3.2); the groups of cp.async are
// counted (wait_group N), so a conversion waits for its own half-box only.
// The tiles are also asked of L2 four tiles ahead (bulk prefetch: no registers, no shared memory).
//
// fence.proxy.async compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC, and the MEMBAR waits for the
// thread's memory operations in flight; so the feed fences nothing and the math warpgroups fence
// after acquiring each box (the proxy fence may sit anywhere on the release-acquire path between
// the generic stores and the async-proxy reads).
struct SeesawFp8 {
  static constexpr int kRowBytes = kDsTokenBytes;  // bytes per token in the cache
  // Boxes a tile the feed threads convert: the bf16 rope (box 8, last in both buffers' orders)
  // needs no conversion and goes by TMA (the kernel's tensor map: 128-byte x 64-row boxes of the
  // [tokens, 656] bytes, swizzled as a bf16 block).
  static constexpr int kUnits = 8;
  // Half-boxes in flight while one is converted (the ring holds one more).
  static constexpr int kAhead = kRawSlots - 1;
  // Registers (ptxas, no spills): the feed needs more than 88 (8 bytes spilled there).
  static constexpr int kMathRegs = 200, kProducerRegs = 104;
};

__device__ __forceinline__ float4 ldg_f32x4(const uint8_t* src) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(src));
  return v;
}

// 16 codes -> two 16-byte chunks of a stage row: bf16(code x s).
__device__ __forceinline__ void convert16(uint4 v, float s, uint4& lo, uint4& hi) {
  auto four = [&](uint32_t w, uint32_t& a, uint32_t& b) {
    e4m3x4_to_f16x2x2<true>(w, a, b);
    a = scale_f16x2(a, s);
    b = scale_f16x2(b, s);
  };
  four(v.x, lo.x, lo.y);
  four(v.y, lo.z, lo.w);
  four(v.z, hi.x, hi.y);
  four(v.w, hi.z, hi.w);
}

// The box order of the seesaw's two buffers (the order their release groups free them; the math
// warpgroups wait for the boxes in the same order): tile A of a pair 0..8, tile B 4..7, 0..3, 8.
__device__ __forceinline__ constexpr int seesaw_box(int bf, int n) { return bf == 0 ? n : n < 4 ? n + 4 : n < 8 ? n - 4 : 8; }
__device__ __forceinline__ float4 opaque_copy(float4 v, uint32_t zero) {
  return make_float4(__uint_as_float(__float_as_uint(v.x) ^ zero), __uint_as_float(__float_as_uint(v.y) ^ zero),
                     __uint_as_float(__float_as_uint(v.z) ^ zero), __uint_as_float(__float_as_uint(v.w) ^ zero));
}
__device__ __forceinline__ constexpr float pick(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The feed, on each of the 128 producer threads (pt): thread pt converts 16 codes (dims 16 (pt % 4)
// ..) of row r = pt / 4 and r + 32 of each box, or in a CTA pair (kPair) of row r + 32 rank only:
// the pair's two CTAs (two row groups of one split, the same tiles) convert a half of each box
// each and store it into their own stage; each warp's 8 rows (1 KiB) then go to the same place in
// the peer's stage by one bulk copy, whose bytes complete the peer's full barrier as transactions
// (thread 0's arrival expects them). Lane 0 fences the warp's generic stores for the copy's async
// proxy after __syncwarp; the fence waits for its own cp.asyncs in flight (see above), the price
// of one copy a warp and box. (16-byte st.async's, 256 a box, took about 15 % longer at 128 heads.)
// The copy's source is free again once the peer released the box: its full barrier, which the
// copy completes, came before.
// A box of either CTA is refilled only once both released it: each feed forwards its own CTA's
// releases to the peer's feed (wait_release). Halving each CTA's conversions and loads is the
// point: the feed, not the tensor cores, set the pace at 128 heads (design 7.3.2).
// A loop iteration is a pair of tiles, unrolled load by load (one half-box a load, 2 H kUnits of
// them). The releases are waited for as produce_tiles_seesaw waits for them. `rope_map`: the
// 656-byte format's rope boxes (thread 0 issues them into its own CTA's stage).
template <bool kPair>
__device__ __forceinline__ void produce_fp8_seesaw(const CUtensorMap* rope_map, const Params& p, int b,
                                                   const SplitRange& sr, uint8_t* stages, uint8_t* raw, uint32_t full0,
                                                   uint32_t rel0, uint32_t fwd0, uint32_t q_ready, int pt, uint32_t rank) {
  using F = SeesawFp8;
  constexpr int U = F::kUnits, A = F::kAhead;
  constexpr int H = kPair ? 1 : 2;  // the row halves of a box this CTA converts
  constexpr int kLoads = 2 * U * H;  // a loop body's loads
  // Bytes of a box a peer stores into this CTA's stage (its row half, 32 rows x 128 bytes).
  constexpr uint32_t kPeerBoxBytes = 32 * 128;
  const uint32_t e0l = rel0, e0r = rel0 + 8, e1r = rel0 + 16, e1l = rel0 + 24;
  const int h0 = kPair ? int(rank) : 0;  // this CTA's first row half
  const int r = pt >> 2, q = pt & 3;
  const int32_t* pages = p.page_table + int64_t(b) * p.page_table_stride;
  const int ps_shift = __ffs(p.page_size) - 1;  // page sizes are powers of two
  // Tile t's page (clamped into the cache), read ahead: the page-table latency must not sit in the
  // feed's pipeline (thread 0 needs a page at a tile's start for the L2 prefetch and the rope).
  auto page_of = [&](int t) {
    return t < sr.n ? min(max(__ldg(pages + (((sr.tile0 + t) * kTileS) >> ps_shift)), 0), p.num_pages - 1) : 0;
  };
  // Unsigned: a tile index past the split's last (issue() reaches n + 1) must not overflow either.
  auto cache_row = [&](int t, int page) {
    return page * p.page_size + int((uint32_t(sr.tile0 + t) * uint32_t(kTileS)) & uint32_t(p.page_size - 1));
  };
  // Byte 16 q of row r + 32 h0 of tile t (the unpaired feed's second half adds 32 rows).
  auto tile_row = [&](int t, int pg) -> const uint8_t* {
    return p.kv_cache + (int64_t(cache_row(t, pg)) + r + 32 * h0) * F::kRowBytes + 16 * q;
  };
  // This CTA's row halves of tile t, asked of L2.
  auto prefetch = [&](int t, int pg) {
    if (pt == 0 && t < sr.n)
      prefetch_l2(p.kv_cache + (int64_t(cache_row(t, pg)) + 32 * h0) * F::kRowBytes, 32 * H * F::kRowBytes);
  };
  uint8_t* const mine = raw + 16 * pt;
  // The ring slot of load k of a body: a constant when the body's loads fill the ring a whole
  // number of times, else taken from the four addresses rotated to the body's first slot.
  uint8_t* sa[kRawSlots];
  auto rotate = [&](int first) {
#pragma unroll
    for (int j = 0; j < kRawSlots; ++j) sa[j] = mine + ((first + j) % kRawSlots) * kRawSlotBytes;
  };
  rotate(0);
  auto slot = [&](int k) { return sa[k % kRawSlots]; };
  // Load k of a body (k may reach into the next body: tile index k / (H U) of `tiles`); past the
  // split's last tile only the (empty) group is committed, which keeps the count.
  auto issue = [&](const uint8_t* const (&tiles)[3], int t0, int k) {
    const int kb = k / H, i = kb / U, n = kb % U, h = k % H;
    if (t0 + i < sr.n) cp_async_16_cg(slot(k), tiles[i] + h * 32 * F::kRowBytes + 64 * seesaw_box(i & 1, n));
    cp_async_commit();
  };
  // The peer's stages, full barriers and forwarded releases (kPair).
  const uint32_t peer_stages = kPair ? peer_addr(smem_u32(stages), rank ^ 1u) : 0u;
  const uint32_t peer_full0 = kPair ? peer_addr(full0, rank ^ 1u) : 0u;
  const uint32_t peer_fwd0 = kPair ? peer_addr(fwd0, rank ^ 1u) : 0u;
  // Release group `bar` (of pair m - 1) of this CTA's readers; in a pair also of the peer's: thread
  // 0 forwards this CTA's release to the peer's feed (one remote arrival on its forward barrier of
  // the group), and the feed waits for the peer's forward (its phases follow the releases').
  auto wait_release = [&](uint32_t bar, uint32_t parity) {
    mbar_wait(bar, parity);
    if constexpr (kPair) {
      if (pt == 0) mbar_arrive_peer(peer_fwd0 + (bar - rel0));
      mbar_wait(fwd0 + (bar - rel0), parity);
    }
  };
  int page[6];  // tiles 2m .. 2m + 5
#pragma unroll
  for (int i = 0; i < 6; ++i) page[i] = page_of(i);
  prefetch(2, page[2]);
  prefetch(3, page[3]);
  const uint32_t zero = uint32_t(p.num_pages) >> 31;  // validated positive
  float4 scale_next[H];  // the group scales of this thread's rows of the next tile
  {
    const uint8_t* const tiles[3] = {tile_row(0, page[0]), tile_row(1, page[1]), tile_row(2, page[2])};
#pragma unroll
    for (int k = 0; k < A; ++k) issue(tiles, 0, k);
#pragma unroll
    for (int a = 0; a < H; ++a) scale_next[a] = ldg_f32x4(tiles[0] - 16 * q + a * 32 * F::kRowBytes + kDsScaleOff);
  }
  for (int m = 0; 2 * m < sr.n; ++m) {
    const int t0 = 2 * m;
    const uint8_t* const tiles[3] = {tile_row(t0, page[0]), tile_row(t0 + 1, page[1]), tile_row(t0 + 2, page[2])};
    int ahead[2];  // the pages of tiles 2m + 6, 2m + 7, for the next iteration
    float4 sc[H];
    uint4 codes[H];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int kb = k / H, i = kb / U, n = kb % U, h = k % H, bf = i, c = seesaw_box(bf, n), t = t0 + i;
      const uint32_t parity = (m & 1) ^ 1;  // the releases of the pair before: (m - 1) & 1
      // The feed's register loads (pages, scales) share one scoreboard, and a register's first use
      // waits for every load on it: so they are issued after a tile's uses of what came before
      // (its scales at box 0, its pages at boxes 0 and 4) and used a tile later.
      // The scales are copied through an operation ptxas cannot see through (xor with a zero it
      // cannot know), so their loads are waited for here and not at a use after the next loads.
      if (n == 0 && h == 0) {
#pragma unroll
        for (int a = 0; a < H; ++a) sc[a] = opaque_copy(scale_next[a], zero);
      }
      if (n == 5 && h == H - 1) {
        if (i == 0) {
#pragma unroll
          for (int a = 0; a < 2; ++a) ahead[a] = page_of(t0 + 6 + a);
        }
#pragma unroll
        for (int a = 0; a < H; ++a) scale_next[a] = ldg_f32x4(tiles[i + 1] - 16 * q + a * 32 * F::kRowBytes + kDsScaleOff);
      }
      if (n == 0 && h == 0) prefetch(t + 4, page[i + 4]);
      cp_async_wait<A - 1>();  // load k has landed (this thread's copies)
      codes[h] = *reinterpret_cast<const uint4*>(slot(k));
      issue(tiles, t0, k + A);  // into the slot of load k - 1, read back before
      if (h == H - 1 && t < sr.n) {
        uint4 lo[H], hi[H];
#pragma unroll
        for (int rh = 0; rh < H; ++rh) convert16(codes[rh], pick(sc[rh], c >> 1), lo[rh], hi[rh]);
        if (t >= 2 && n == 0) wait_release(bf == 0 ? e0l : e1r, parity);
        if (t >= 2 && n == 4) wait_release(bf == 0 ? e0r : e1l, parity);
        if (n == 4 && pt == 0) {  // block 8 is free with the group just waited for
          const uint32_t bar = full0 + 16 * 8 + 8 * bf;
          mbar_arrive_expect_tx(bar, kBlockBytes);
          tma_load_2d(smem_u32(stages + bf * kStageBytes + 8 * kBlockBytes), rope_map, kDsRopeOff, cache_row(t, page[i]), bar);
        }
        const uint32_t full = full0 + 16 * c + 8 * bf;
#pragma unroll
        for (int rh = 0; rh < H; ++rh) {
          const int rr = r + 32 * (h0 + rh), sw = rr & 7;
          const int off = bf * kStageBytes + c * kBlockBytes + rr * 128;
          const int o0 = off + (((2 * q) ^ sw) << 4), o1 = off + (((2 * q + 1) ^ sw) << 4);
          *reinterpret_cast<uint4*>(stages + o0) = lo[rh];
          *reinterpret_cast<uint4*>(stages + o1) = hi[rh];
        }
        if constexpr (kPair) {
          const int warp_rows = bf * kStageBytes + c * kBlockBytes + (32 * h0 + 8 * (pt >> 5)) * 128;
          __syncwarp();
          if ((pt & 31) == 0) {
            fence_proxy_async();
            bulk_s2peer(peer_stages + warp_rows, smem_u32(stages) + warp_rows, 1024, peer_full0 + (full - full0));
          }
        }
        // The peer's half of this box comes as transactions: thread 0 expects them (in the phase
        // they complete: the peer writes only after this CTA released the box's last use).
        if (kPair && pt == 0) {
          mbar_arrive_expect_tx(full, kPeerBoxBytes);
        } else {
          mbar_arrive(full);
        }
      }
      // As produce_tiles_seesaw: Q's loads first, once tile 0 is on its way.
      if (m == 0 && k == U * H - 1 && sr.n > 1) mbar_wait(q_ready, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) page[i] = page[i + 2];
    page[4] = ahead[0];
    page[5] = ahead[1];
    if constexpr (kLoads % kRawSlots != 0) rotate((m + 1) * kLoads % kRawSlots);
  }
  cp_async_wait<0>();
}

}  // namespace graphsafe::mla_sm90

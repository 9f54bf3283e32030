// The sm90 MLA split kernel "N8": 16 or 32 heads over an fp8 e4m3 cache, either format: one
// per-tensor scale (GS_MLA_KV_FP8_PER_TENSOR) or DeepSeek's 656-byte token with four in-line group
// scales and a bf16 rope (GS_MLA_KV_FP8_DS_MLA). See kernels.cuh and decode.cu.
#pragma once

#include <type_traits>
#include "graphsafe_kernels/mla.h"
#include "mla/sm90/fp8.cuh"
#include "mla/sm90/n_softmax.cuh"
#include "mla/sm90/split.cuh"
#include "mla/sm90/wgmma_ops.cuh"

namespace graphsafe::mla_sm90 {

// =================================================================================================
// Kernel "N8": the N kernel's shape (tokens as the MMA's M, heads as its N; one CTA per split and
// request; two math warpgroups on alternate tiles, merged at the end) with no bf16 copy of a tile.
// The producer (one thread) streams raw tiles by TMA into a ring (per-tensor: 36 KiB tiles, five
// slots; 656-byte format: below); each math thread
// loads its operand bytes from the raw tile and converts them (cvt.rn.f16x2.e4m3x2: exact, one
// instruction per two values) straight into the A registers of register-sourced wgmmas:
//   S^T = K.Q^T   A = K, the thread's two token rows, 16 bytes per 64-dim block and row;
//   O^T = V^T.P^T A = V^T, the thread's 16 dims of four tokens a k16 step, paired by byte_perm.
// Why: the producer-dequantising design it replaced (a producer warpgroup converting into the
// bf16 stages the math read; removed, docs/design/mla-sm90-compute-bound.md 7.4) was slower than
// bf16 (0.87x at 16 heads 64 x 4096): a stage could be refilled only after its warpgroup released
// it, so conversion and math added, and the bf16 stages left room for 1.5 raw tiles in flight.
// Here the conversion runs on the math warps beside their own wgmmas, and the ring holds four or
// five raw tiles (164-184 KiB).
// The math is fp16 x fp16 -> f32: every e4m3 value is an exact fp16, and Q (bf16) is staged as fp16
// times 2^k_h per head (k_h puts the head's largest |q| in [2^14, 2^15), so bf16's 8 significant
// bits fit; only values below 2^-28 of the head's largest lose bits), and the scores are scaled
// back by 2^-k_h in f32. P is fp16 (more bits than bf16's 8 in [0, 1]).
// The operands' k orders are permuted so each thread reads whole 16-byte pieces: for the QK^T step
// 4c + j, fragment position 2q + e holds dim 64c + 16q + 4j + e and position 2q + 8 + e dim
// 64c + 16q + 4j + 2 + e (Q is staged in that order); for the PV step ks, position 2q + e holds
// token 16ks + 4e + q and 2q + 8 + e token 16ks + 4(e + 2) + q (P^T is stored in that order), and
// the m64 rows of the eight O^T blocks are the dims 16u + 2mb (row g) and 16u + 2mb + 1 (row g + 8)
// of the thread's dim group u (the epilogue stores them back in order).
// The raw tile: nine 4 KiB column blocks (dims 64c..64c+63) of 64 rows x 64 B, 64-byte swizzled by
// the TMA (16-byte chunk k of row r at chunk k ^ ((r >> 1) & 3)), so both loads are conflict-free.
//
// The 656-byte format (KV = kKvFp8DsMla) in the same skeleton: its K = V = s_g . e (four scales a
// token, one per 128 dims) cannot factor its scales out of the sums, so the math warps multiply them
// in, one mul.f16x2 per two values beside the conversion, in fp16 with a power-of-two offset that
// keeps every product in range:
//   K (S^T rows = tokens): a token's four scales times 2^-E_t, E_t putting the largest in [64, 128),
//     rounded to fp16; the token's scores are scaled back by 2^E_t in f32. The rope (bf16 as
//     stored, raw blocks 8 and 9) goes through bf16 register-sourced wgmmas, times 2^-E_t (exact),
//     against Q's rope staged as bf16 times 2^k_h.
//   V (O^T rows = dims): a thread's sixteen dims lie in one 128-dim group (its warp's), so its O rows
//     share one exponent E_w (a running maximum over the tiles, like the softmax's: when a tile's
//     largest scale of the group needs a larger one, O is rescaled by a power of two, exactly) and V
//     is s_g(t) . 2^-E_w (fp16) times e; O is scaled back by 2^E_w at the end.
// So the values enter the math rounded to 11 significant bits (scale, then product) instead of
// once to bf16's 8: within a bf16 step of bf16(s . e) (docs/design/mla-sm90-compute-bound.md 7.4),
// except where the scaled scale or product is an fp16 subnormal (a group scale below 2^-20 of the
// token's, or for V the group's, largest, or a tiny product): an absolute error below 2^-22 of that
// largest scale (reference.rs, dequantize_ds_mla_fp16_rounded, states the rule the tests hold K
// to). E_t has a floor of -30 (ds_exponent, below), which keeps a zero-scale token's rope in f32's
// range.
// Its raw tile: the eight latent blocks, the rope as two 64-byte blocks (dims 0..31, 32..63), both
// 64-byte swizzled, then the 64 tokens' 16-byte scale records unswizzled: 41 KiB, four slots.
// =================================================================================================
template <int N, int KV>
struct N8Layout {
  static_assert(KV == kKvFp8PerTensor || KV == kKvFp8DsMla, "fp8 formats only");
  static constexpr bool kDs = KV == kKvFp8DsMla;
  static constexpr int kRawBlock = kTileS * 64;                  // one 64-byte column block of a raw tile
  static constexpr int kRawBlocks = kDs ? 10 : kBlocks;          // 656 B: 8 latent + 2 rope blocks
  static constexpr int kScaleOff = kRawBlocks * kRawBlock;       // 656 B: [64 tokens][4] f32 scales
  static constexpr int kRawTile = kScaleOff + (kDs ? kTileS * 16 : 0);  // 36 KiB, 656 B: 41 KiB
  static constexpr int kQBytes = N * 128 * kBlocks;     // Q, K-major swizzled blocks (1 KiB multiple)
  static constexpr int kPBytes = N * 128;               // one warpgroup's P^T: [N heads x 64 tokens] fp16
  static constexpr int kOStride = 516;                  // floats per head row of the O staging
  static constexpr int kFloats = 8 * N + N + 2 * N + 2 * N + N;  // s_red, s_qf, s_m, s_l, s_lse
  static constexpr int kFixed = 1024 + kQBytes + 2 * kPBytes + kFloats * 4;
  static constexpr int kSlots = kDs ? 4 : 5;
  static_assert(kRawTile % 1024 == 0, "slots stay 1 KiB aligned (Q's swizzled blocks follow the ring)");
  static_assert(kDsRopeOff == kNope + 16 && kDsRopeOff + 128 == GS_MLA_DS_MLA_TOKEN_BYTES,
                "656-byte token: latent, four f32 scales, then the 64 bf16 rope values to its end");
  static constexpr int kBarBytes = (2 * kSlots + 2) * 8;  // full, empty, math, verdict
  static constexpr int kSmem = kFixed + kSlots * kRawTile + kBarBytes;
  static_assert(kSmem + 32 <= 232448, "N8 kernel: shared memory (the static ints included)");
  static_assert(N * kOStride * 4 <= kSlots * kRawTile, "the O staging reuses the ring");
};

// The lazy maximum's threshold (log2 units): P = 2^(s - mrun) up to 2^8 before the running maximum moves.
constexpr float kLazyMax = 8.f;

// True on every participating thread if `x` is true on any of the `threads` threads of named barrier `id`.
__device__ __forceinline__ bool named_bar_or(uint32_t id, uint32_t threads, bool x) {
  uint32_t r;
  asm volatile("{\n.reg .pred i, o;\nsetp.ne.u32 i, %1, 0;\nbarrier.red.or.pred o, %2, %3, i;\nselp.u32 %0, 1, 0, o;\n}"
               : "=r"(r)
               : "r"(uint32_t(x)), "r"(id), "r"(threads)
               : "memory");
  return r != 0;
}
__device__ __forceinline__ uint32_t u4_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The QK^T fragment position (0..15) that holds physical offset `off` (0..63) of a 64-dim block,
// and its k16 step j within the block: the inverse of the dim order above.
__device__ __forceinline__ int n8_q_pos(int off, int& j) {
  const int q = off >> 4, r = off & 3;
  j = (off >> 2) & 3;
  return r < 2 ? 2 * q + r : 8 + 2 * q + (r - 2);
}

// The P^T column (the PV step's fragment position) that holds token t (0..63) of a tile: the
// inverse of the token order above. The N8 and seesaw RS kernels store P^T in this order.
__device__ __forceinline__ int n8_p_col(int t) {
  const int r = t & 15, e = r >> 2, qq = r & 3;
  return (t & ~15) + (e < 2 ? 2 * qq + e : 8 + 2 * qq + (e - 2));
}

// Q rows of request b as fp16 times 2^k_h into `sq` (K-major, 128-byte swizzled blocks of N x 128 B,
// in the permuted k order) and 2^-k_h into s_qf[h]; kRopeBf16: the rope block (8) as bf16 times
// 2^k_h (exact), for the 656-byte format's bf16 rope. Warp wq (of 8) takes heads wq, wq + 8, ...; a
// lane takes 16-byte pieces lane, lane + 32, lane + 64 (< 72) of each: all loads first, then the
// per-head maximum by shuffles, then the converted stores.
// row0: the first query row (the 64-row kernel's group; 0 here).
template <int N, bool kRopeBf16>
__device__ __forceinline__ void load_q_f16_scaled(uint8_t* sq, float* s_qf, const Params& p, int b, int row0, int t) {
  constexpr int kHeads = N / 8;
  const int wq = t >> 5, lane = t & 31;
  uint4 v[kHeads][3];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    const int h = wq + 8 * hh;
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const int c = lane + 32 * k;
      v[hh][k] = make_uint4(0u, 0u, 0u, 0u);
      if (c < 72 && row0 + h < p.rows) {  // padding rows past p.rows: zeros (scale 1), never stored
        const uint16_t* src = q_piece(p, b, row0 + h, c);
        if (p.q_vec) {
          v[hh][k] = __ldcg(reinterpret_cast<const uint4*>(src));
        } else {
          uint16_t e[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) e[i] = __ldcg(src + i);
          v[hh][k] = make_uint4(e[0] | (uint32_t(e[1]) << 16), e[2] | (uint32_t(e[3]) << 16),
                                e[4] | (uint32_t(e[5]) << 16), e[6] | (uint32_t(e[7]) << 16));
        }
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    const int h = wq + 8 * hh;
    float m = 0.f;  // fmaxf drops NaNs: a NaN stays NaN through the conversion below anyway
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const float4 a = unpack4<false>(make_uint2(v[hh][k].x, v[hh][k].y));
      const float4 c = unpack4<false>(make_uint2(v[hh][k].z, v[hh][k].w));
      m = fmaxf(m, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w))));
      m = fmaxf(m, fmaxf(fmaxf(fabsf(c.x), fabsf(c.y)), fmaxf(fabsf(c.z), fabsf(c.w))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int kh = f16_stage_exponent(m);  // 0 for a head of zeros
    const float f = pow2f(kh);
    if (lane == 0) s_qf[h] = pow2f(-kh);
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const int c = lane + 32 * k;
      if (c >= 72) continue;
      const float4 a = unpack4<false>(make_uint2(v[hh][k].x, v[hh][k].y));
      const float4 d = unpack4<false>(make_uint2(v[hh][k].z, v[hh][k].w));
      const int blk = c >> 3, off = (c & 7) * 8;  // dims 64 blk + off .. + 7
      uint32_t w[4];
      if (kRopeBf16 && blk == kBlocks - 1) {
        w[0] = pack2<false>(a.x * f, a.y * f), w[1] = pack2<false>(a.z * f, a.w * f);
        w[2] = pack2<false>(d.x * f, d.y * f), w[3] = pack2<false>(d.z * f, d.w * f);
      } else {
        w[0] = pack2<true>(a.x * f, a.y * f), w[1] = pack2<true>(a.z * f, a.w * f);
        w[2] = pack2<true>(d.x * f, d.y * f), w[3] = pack2<true>(d.z * f, d.w * f);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int j;
        const int pos = n8_q_pos(off + 2 * i, j);
        const int kl = 16 * j + pos;
        *reinterpret_cast<uint32_t*>(sq + blk * (N * 128) + h * 128 + (((kl >> 3) ^ (h & 7)) << 4) + (kl & 7) * 2) = w[i];
      }
    }
  }
}

// The producer of the N8 kernel (one thread): the split's tiles into the ring of raw slots, as ring
// sequence numbers seq0 + i (a rerun continues the sequence). full[s]: the tile landed
// (expect_tx); empty[s]: the 128 threads of the warpgroup that used it are done reading it. The
// page table through the read-only path, unlike the kernel's other reads of caller data (load_q):
// the kernel is launched programmatically dependent, but this runs after its griddepcontrol.wait,
// when the grid before it has completed and flushed, and no CTA of this grid read the table
// before; an L2-only load measured 3-9 % slower for every fp8 shape of the producer-dequantising
// kernel this replaced (H200, 16 heads 64 x 4096 per-tensor 96.4 against 104.3 us). The 656-byte format: the
// latent blocks at byte columns 0..448, the rope's at 528 and 592, the scales (their own map, 16 x
// 64 unswizzled) at 512.
// kSlots: the ring's length (the 64-row kernel's ring is shorter, kernel_seesaw_rs.cuh).
template <int KV, int kSlots = N8Layout<16, KV>::kSlots>
__device__ __forceinline__ void produce_raw_ring(const CUtensorMap* map, const CUtensorMap* scale_map, const Params& p, int b,
                                                 const SplitRange& sr, int seq0, uint32_t ring, uint32_t full0, uint32_t empty0) {
  using L = N8Layout<16, KV>;  // the slot geometry does not depend on N
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  for (int i = 0; i < sr.n; ++i) {
    const int seq = seq0 + i, s = seq % kSlots;
    const int tok = (sr.tile0 + i) * kTileS;
    const int page = min(max(__ldg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
    const int row = page * p.page_size + tok % p.page_size;
    if (seq >= kSlots) mbar_wait(empty0 + 8 * s, ((seq / kSlots) - 1) & 1);
    mbar_arrive_expect_tx(full0 + 8 * s, L::kRawTile);
    const uint32_t dst = ring + s * L::kRawTile;
#pragma unroll
    for (int c = 0; c < L::kRawBlocks; ++c) {
      const int x = !L::kDs || c < 8 ? c * 64 : kDsRopeOff + (c - 8) * 64;
      tma_load_2d_evict_first(dst + c * L::kRawBlock, map, x, row, full0 + 8 * s);
    }
    if constexpr (L::kDs) tma_load_2d_evict_first(dst + L::kScaleOff, scale_map, kNope, row, full0 + 8 * s);
  }
}

// 656-byte format: the exponent offset of a set of scales whose largest magnitude is m: E with
// m . 2^-E in [64, 128) (so 448 . m . 2^-E < 65504, fp16's largest), clamped to [lo, 100] so 2^E
// and 2^-E are normal floats (a zero, subnormal, infinite or NaN m lands on a bound: the products
// stay 0, inf or NaN as they are). K's lower bound is higher (kDsKMinExponent): its 2^-E also
// multiplies the token's bf16 rope, and a token whose scales are all zero or tiny must not push
// its rope's products (Q's rope is below 2^15) out of f32's range; with 2^30 they stay finite for
// any rope below 2^70, and such a token's latent (scales below 2^-24) keeps an absolute error
// below 2^-46 (fp16 subnormals).
constexpr int kDsKMinExponent = -30, kDsVMinExponent = -100, kDsMaxExponent = 100;
template <int kLo>
__device__ __forceinline__ int ds_exponent(float m) {
  return min(max(int((__float_as_uint(m) >> 23) & 0xFFu) - 127 - 6, kLo), kDsMaxExponent);
}
// 1 / x for x = pow2f(e), |e| <= 126: the exponent field reflected about 127.
__device__ __forceinline__ float pow2f_inverse(float x) { return __uint_as_float((254u << 23) - __float_as_uint(x)); }
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// The e_run of a warpgroup that has seen no tile (its O is zero).
constexpr int kNoExponent = -1000;

template <int N, int KV>
__global__ void __launch_bounds__(kThreads, 1)
    mla_sm90_n8_kernel(const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap scale_map, const Params p) {
  static_assert(N == 16 || N == 32, "N8 kernel: 16 or 32 heads");
  constexpr int R = N / 2;  // accumulator registers per m64nN tile
  constexpr int J = N / 8;  // 8-column groups
  // The PV step's A registers: two buffers, each a k16 step's eight m64 blocks (32 registers) at 16
  // heads, half of them at 32 (which have no room for 64): a part's conversion then runs while the
  // other part's wgmmas do (measured in docs/notes/2026-12-performance-log.md).
  constexpr int kVParts = N == 16 ? 1 : 2;  // parts of a k16 step
  constexpr int kVBlocks = 8 / kVParts;     // m64 blocks a part
  using L = N8Layout<N, KV>;
  constexpr bool kDs = L::kDs;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  // Launched programmatically dependent (decode.cu, launch_n8): nothing an earlier kernel may write
  // is touched before this.
  grid_dependency_wait();
  const SplitRange sr = split_range(p);  // every thread, before the roles split
  if (!sr.active) return;
  const int b = sr.b;
  if (sr.n == 0) {
    write_empty<false>(p, sr, 0, p.rows, tid, kThreads);
    return;
  }

  uint8_t* ring = smem;                                   // kSlots raw tiles (1 KiB aligned)
  uint8_t* sq = ring + L::kSlots * L::kRawTile;           // fp16 Q (656 B: its rope bf16)
  uint8_t* sp = sq + L::kQBytes;                          // [2 warpgroups] P^T
  float* s_red = reinterpret_cast<float*>(sp + 2 * L::kPBytes);  // [2 wg][4 warps][N]
  float* s_qf = s_red + 8 * N;                            // [N] 2^-k_h
  float* s_m = s_qf + N;                                  // [2][N]
  float* s_l = s_m + 2 * N;                               // [2][N]
  float* s_lse = s_l + 2 * N;                             // [N]
  const uint32_t bars = smem_u32(s_lse + N);
  const uint32_t full0 = bars, empty0 = bars + 8 * L::kSlots, math_bar = bars + 16 * L::kSlots, verdict_bar = math_bar + 8;
  const uint32_t ring_a = smem_u32(ring);
  __shared__ int s_rerun;

  if (!enter_roles_init<kMathRegs, kProducerRegs>(
          tid,
          [&] {
#pragma unroll 1
            for (int s = 0; s < L::kSlots; ++s) {
              mbar_init(full0 + 8 * s, 1);
              mbar_init(empty0 + 8 * s, 128);
            }
            mbar_init(math_bar, kMathThreads);
            mbar_init(verdict_bar, 1);
          },
          [&](int pt) {
            if (pt != 0) return;
            produce_raw_ring<KV>(&kv_map, &scale_map, p, b, sr, 0, ring_a, full0, empty0);
            mbar_wait(verdict_bar, 0);
            if (s_rerun) produce_raw_ring<KV>(&kv_map, &scale_map, p, b, sr, sr.n, ring_a, full0, empty0);
          }))
    return;

  uint32_t math_phase = 0;
  load_q_f16_scaled<N, kDs>(sq, s_qf, p, b, 0, tid);
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int w = tid >> 7;  // warpgroup: takes tiles i with i % 2 == w
  const int lt = tid & 127, warp = lt >> 5, lane = lt & 31, q = lane & 3, g = lane >> 2;
  const int ta = warp * 16 + g, tb = ta + 8;  // S^T rows (tokens) of this thread
  // The per-tensor scale multiplies every K and V: applied to the scores here (after 2^-k_h, each
  // product in f32 on its own) and to the output's normalisation at the end. It is device data of
  // any sign (or zero, or NaN), so the scores are scaled before they are masked and their maximum
  // taken. The 656-byte format has none (its scales are in the tiles).
  const float kv_scale = kDs ? 1.f : __ldcg(p.kv_scale);
  const float sl2 = p.scale_log2 * kv_scale;
  float qf[2 * J];  // per owned head 8j + 2q + e, index 2j + e
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) qf[2 * j + e] = s_qf[8 * j + 2 * q + e];
  float o[8][R], mrun[2 * J], lp[2 * J];  // lp, mrun: per owned head 8j + 2q + e, index 2j + e
  int e_run = kNoExponent;                 // 656 B: O is in units of 2^e_run (this warp's group)
  auto reset = [&] {
    e_run = kNoExponent;
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int k = 0; k < R; ++k) o[mb][k] = 0.f;
#pragma unroll
    for (int k = 0; k < 2 * J; ++k) {
      mrun[k] = -INFINITY;
      lp[k] = 0.f;
    }
  };
  const uint32_t deltas = NSoftmax<N>::row_deltas(p, q);  // the owned columns' causal limits
  const uint64_t dq = sw128_desc(smem_u32(sq), 16, 1024);
  uint8_t* pb = sp + w * L::kPBytes;
  const uint64_t dp = sw128_desc(smem_u32(pb), 16, 1024);
  // K: rows ta and tb, chunk q of each 64-byte row (swizzled).
  const uint32_t k_off0 = uint32_t(ta * 64 + ((q ^ ((ta >> 1) & 3)) << 4));
  const uint32_t k_off1 = uint32_t(tb * 64 + ((q ^ ((tb >> 1) & 3)) << 4));
  // V: the thread's dim group u (dims 16u..16u+15, chunk u & 3 of block u >> 2), chosen so that the
  // two g of a quarter warp (which read the same four token rows) take chunks that differ in bit 1:
  // with the swizzle their eight 16-byte loads then hit eight distinct bank groups.
  const int u = warp * 8 + (((g & 1) << 1) | ((g >> 1) & 1) | (g & 4));
  uint32_t v_off[4];  // token 4jt + q of a k16 step (step ks adds 16 rows = 1 KiB: the swizzle repeats)
#pragma unroll
  for (int jt = 0; jt < 4; ++jt) {
    const int t = 4 * jt + q;
    v_off[jt] = uint32_t((u >> 2) * L::kRawBlock + t * 64 + (((u & 3) ^ ((t >> 1) & 3)) << 4));
  }
  const int kla = n8_p_col(ta), klb = n8_p_col(tb);  // P^T columns of tokens ta and tb

  // One pass over the split's tiles (ring sequence numbers seq0 + i), tile i in warpgroup i % 2.
  auto pass = [&](auto clamp, int seq0) {
    constexpr bool kClamp = decltype(clamp)::value;
    reset();
    for (int i = w; i < sr.n; i += 2) {
      const int seq = seq0 + i, slot = seq % L::kSlots;
      const uint8_t* raw = ring + slot * L::kRawTile;
      // The slot's previous tile (seq - kSlots) may have gone to the other warpgroup (always for
      // an odd kSlots; for an even one after a rerun's odd start), so this warpgroup may never have
      // waited on that phase of full[slot]: if its copy were still in flight (bulk copies may
      // complete out of order), the parity wait below would see the phase before it as ours and
      // pass at once. So first wait for that tile's release (empty[slot], as the producer
      // does before refilling the slot): then full[slot] is at this tile's phase. Free in practice:
      // this tile cannot land before that release anyway. (No GPU run has shown this race.)
      if (seq >= L::kSlots) mbar_wait(empty0 + 8 * slot, ((seq / L::kSlots) - 1) & 1);
      mbar_wait(full0 + 8 * slot, (seq / L::kSlots) & 1);
      const int valid = sr.seq - (sr.tile0 + i) * kTileS;  // V rows past the length are zeroed below

      // ---- S^T = K.Q^T: block c's two 16-byte pieces -> four k16 steps of A registers -------------
      // 656 B: 2^-E_t of rows ta and tb (few registers: 32 heads have none to spare; a group's
      // scales are read again where they are used).
      [[maybe_unused]] float row_down[2];
      auto k_scales = [&](int r) { return reinterpret_cast<const float*>(raw + L::kScaleOff + (r == 0 ? ta : tb) * 16); };
      if constexpr (kDs) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float4 s4 = *reinterpret_cast<const float4*>(k_scales(r));
          // From 0, as the reference folds (fmaxf drops NaNs: all-NaN scales land on the lower bound).
          const float m = fmaxf(fmaxf(fmaxf(fmaxf(0.f, fabsf(s4.x)), fabsf(s4.y)), fabsf(s4.z)), fabsf(s4.w));
          row_down[r] = pow2f(-ds_exponent<kDsKMinExponent>(m));
        }
      }
      float sc[R];
      uint32_t ka[2][4][4];
#pragma unroll
      for (int c = 0; c < kBlocks; ++c) {
        const bool rope_bf16 = kDs && c == kBlocks - 1;
        uint4 x0, x1, y0, y1;
        if (rope_bf16) {
          // The thread's 16 rope dims 16q..16q+15 of each row: chunks 2(q & 1), +1 of rope block q >> 1.
          const uint8_t* rb = raw + (8 + (q >> 1)) * L::kRawBlock;
          const int c0 = 2 * (q & 1);
          x0 = *reinterpret_cast<const uint4*>(rb + ta * 64 + ((c0 ^ ((ta >> 1) & 3)) << 4));
          y0 = *reinterpret_cast<const uint4*>(rb + ta * 64 + (((c0 + 1) ^ ((ta >> 1) & 3)) << 4));
          x1 = *reinterpret_cast<const uint4*>(rb + tb * 64 + ((c0 ^ ((tb >> 1) & 3)) << 4));
          y1 = *reinterpret_cast<const uint4*>(rb + tb * 64 + (((c0 + 1) ^ ((tb >> 1) & 3)) << 4));
        } else {
          x0 = *reinterpret_cast<const uint4*>(raw + c * L::kRawBlock + k_off0);
          x1 = *reinterpret_cast<const uint4*>(raw + c * L::kRawBlock + k_off1);
        }
        if (c >= 2) wg_wait<1>();  // block c - 2's wgmmas (the last readers of ka[c & 1]) are done
        uint32_t(&a)[4][4] = ka[c & 1];
        if (rope_bf16) {
          // Step j's positions 2q, 2q + 1 hold dims 16q + 4j, + 1 (bf16 word 2j of the 16), 2q + 8,
          // 2q + 9 dims 16q + 4j + 2, + 3 (word 2j + 1); times 2^-E_t, exactly.
          [[maybe_unused]] uint32_t rope_down[2] = {0u, 0u};
          if constexpr (kDs) rope_down[0] = pack2<false>(row_down[0], row_down[0]), rope_down[1] = pack2<false>(row_down[1], row_down[1]);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            a[j][0] = bf16x2_mul(u4_word(j < 2 ? x0 : y0, (2 * j) & 3), rope_down[0]);
            a[j][2] = bf16x2_mul(u4_word(j < 2 ? x0 : y0, (2 * j + 1) & 3), rope_down[0]);
            a[j][1] = bf16x2_mul(u4_word(j < 2 ? x1 : y1, (2 * j) & 3), rope_down[1]);
            a[j][3] = bf16x2_mul(u4_word(j < 2 ? x1 : y1, (2 * j + 1) & 3), rope_down[1]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            e4m3x4_to_f16x2x2<kClamp>(u4_word(x0, j), a[j][0], a[j][2]);
            e4m3x4_to_f16x2x2<kClamp>(u4_word(x1, j), a[j][1], a[j][3]);
            if constexpr (kDs) {  // group c / 2's scale of each row, times 2^-E_t, in fp16
              const float sa = k_scales(0)[c >> 1] * row_down[0], sb = k_scales(1)[c >> 1] * row_down[1];
              const uint32_t ha = pack2<true>(sa, sa), hb = pack2<true>(sb, sb);
              a[j][0] = f16x2_mul(a[j][0], ha), a[j][2] = f16x2_mul(a[j][2], ha);
              a[j][1] = f16x2_mul(a[j][1], hb), a[j][3] = f16x2_mul(a[j][3], hb);
            }
          }
        }
        wg_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint64_t db = dq + (uint32_t(c * (N * 128) + j * 32) >> 4);
          const uint32_t acc = (c | j) != 0 ? 1u : 0u;
          if (rope_bf16) {
            WgmmaRSN<N, false>::rs(sc, a[j], db, acc);
          } else {
            WgmmaRSN<N, true>::rs(sc, a[j], db, acc);
          }
        }
        wg_commit();
      }
      wg_wait<0>();
      reg_fence(sc);
      float up0 = 1.f, up1 = 1.f;  // 656 B: the rows' 2^E_t (exact reciprocals of powers of two)
      if constexpr (kDs) up0 = pow2f_inverse(row_down[0]), up1 = pow2f_inverse(row_down[1]);
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[4 * j + e] = ((sc[4 * j + e] * up0) * qf[2 * j + e]) * sl2;
          sc[4 * j + 2 + e] = ((sc[4 * j + 2 + e] * up1) * qf[2 * j + e]) * sl2;
        }

      // ---- online softmax (n_softmax.cuh; sl2 = 1: the scores are scaled above), P^T in the PV step's token order
      auto store_p = [&](int h, float pa, float pv) {
        *reinterpret_cast<uint16_t*>(pb + h * 128 + (((kla >> 3) ^ (h & 7)) << 4) + (kla & 7) * 2) = to_bits<true>(pa);
        *reinterpret_cast<uint16_t*>(pb + h * 128 + (((klb >> 3) ^ (h & 7)) << 4) + (klb & 7) * 2) = to_bits<true>(pv);
      };
      // Lazy maximum (the seesaw kernel's): while no score of the tile exceeds the head's running
      // maximum by more than kLazyMax (log2 units), P = 2^(s - mrun) as it stands (at most
      // 2^kLazyMax, as exact in fp16 as below 1; lp and O are f32), so the tile needs one barrier
      // (P stored, and whether any thread saw a larger score) instead of two (the warps' maxima,
      // then P), and no rescale of O. A tile with a larger score (every first tile: mrun is -inf)
      // takes the exact step below after that barrier. A NaN score compares false and comes out
      // NaN in P either way; a +inf one takes the exact step.
      bool over = false;
      float ts[2 * J];
      NSoftmax<N>::mask(sc, valid, deltas, ta, tb);
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int k = 2 * j + e;
          over |= sc[4 * j + e] > mrun[k] + kLazyMax || sc[4 * j + 2 + e] > mrun[k] + kLazyMax;
        }
      if (!__any_sync(0xffffffffu, over)) {  // a warp that will take the exact step anyway stores nothing
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int k = 2 * j + e;
            // softmax_base: a column that has seen no key (mrun -inf) and has none here stays 0.
            const float base = softmax_base(mrun[k]);
            const float pa = ex2(sc[4 * j + e] - base), pv = ex2(sc[4 * j + 2 + e] - base);
            ts[k] = pa + pv;
            store_p(8 * j + 2 * q + e, pa, pv);
          }
      }
      fence_proxy_async();
      if (!named_bar_or(2 + w, 128, over)) {
#pragma unroll
        for (int k = 0; k < 2 * J; ++k) lp[k] += ts[k];
      } else {
        NSoftmax<N>::tile_max(sc, valid, deltas, ta, tb, g, q, w, warp, s_red);
        float alpha[2 * J];
        NSoftmax<N>::update(sc, 1.f, mrun, lp, alpha, s_red, w, q, store_p);
        fence_proxy_async();
        named_bar_sync(2 + w, 128);
        NSoftmax<N>::rescale(o, alpha);
      }

      // ---- 656 B: O's exponent for this warp's group over the tile's tokens ------------------------
      // (Here rather than before the QK^T step: there it measured slower at 32 heads, 88.6 against
      // 85.7 us at 64 x 4096 on an H100, its registers live across that step, and no faster at 16.)
      // The scale of token t of this warp's group; tokens past seq_len count as scale 0 (their
      // cache bytes may be anything). The maximum over the four q lanes covers all 64 tokens, the
      // same on every lane of the warp.
      auto v_scale = [&](int t) {
        return t < valid ? *reinterpret_cast<const float*>(raw + L::kScaleOff + t * 16 + 4 * warp) : 0.f;
      };
      [[maybe_unused]] float v_down = 1.f;  // 2^-e_run
      if constexpr (kDs) {
        float m = 0.f;
#pragma unroll
        for (int k = 0; k < 16; ++k) m = fmaxf(m, fabsf(v_scale(4 * k + q)));  // token 16 ks + 4 jt + q, k = 4 ks + jt
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const int et = ds_exponent<kDsVMinExponent>(m);
        if (et > e_run) {  // warp-uniform; O holds no wgmma result in flight (the last tile's waited)
          if (e_run != kNoExponent) {
            const float r = et - e_run > 126 ? 0.f : pow2f(e_run - et);
#pragma unroll
            for (int mb = 0; mb < 8; ++mb)
#pragma unroll
              for (int k = 0; k < R; ++k) o[mb][k] *= r;
          }
          e_run = et;
        }
        v_down = pow2f(-e_run);
      }

      // ---- O^T += V^T.P^T: per k16 step, four tokens' 16 dims -> eight m64 blocks' A registers ----
      uint32_t va[2][kVBlocks][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint4 tv[4];
#pragma unroll
        for (int jt = 0; jt < 4; ++jt) tv[jt] = *reinterpret_cast<const uint4*>(raw + v_off[jt] + ks * 1024);
        // 656 B: vs[pr] = fp16 s(t) . 2^-e_run of tokens 16ks + 8pr + q (low half) and + 4 (high half),
        // read before the slot is handed back below.
        [[maybe_unused]] uint32_t vs[2];
        if constexpr (kDs) {
#pragma unroll
          for (int pr = 0; pr < 2; ++pr) {
            const int t = 16 * ks + 8 * pr + q;
            vs[pr] = pack2<true>(v_scale(t) * v_down, v_scale(t + 4) * v_down);
          }
        }
        // The last reads of this slot: hand it back (every thread arrives after its own loads,
        // the scales' included: the arrive releases them).
        if (ks == 3) mbar_arrive(empty0 + 8 * slot);
        // Tokens past seq_len hold whatever the cache holds (maybe NaN codes): P = 0 would not clear them.
        if (valid < kTileS) {
#pragma unroll
          for (int jt = 0; jt < 4; ++jt)
            if (16 * ks + 4 * jt + q >= valid) tv[jt] = make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int part = 0; part < kVParts; ++part) {
          const int step = ks * kVParts + part;
          if (step >= 2) wg_wait<1>();  // the last readers of va[step & 1] are done
          uint32_t(&a)[kVBlocks][4] = va[step & 1];
#pragma unroll
          for (int vv = 0; vv < 4 / kVParts; ++vv)
#pragma unroll
            for (int pr = 0; pr < 2; ++pr) {
              const int v = part * (4 / kVParts) + vv;  // dims 4v..4v+3 of the thread's 16: blocks 2v, 2v + 1
              const uint32_t x = u4_word(tv[2 * pr], v), y = u4_word(tv[2 * pr + 1], v);
              // [x.b0, y.b0, x.b1, y.b1]: dims 4v and 4v + 1 of the pair of tokens; then dims 4v + 2, + 3.
              e4m3x4_to_f16x2x2<kClamp>(__byte_perm(x, y, 0x5140u), a[2 * vv][2 * pr], a[2 * vv][2 * pr + 1]);
              e4m3x4_to_f16x2x2<kClamp>(__byte_perm(x, y, 0x7362u), a[2 * vv + 1][2 * pr], a[2 * vv + 1][2 * pr + 1]);
              if constexpr (kDs) {  // each half is one token's value: times that token's scale
#pragma unroll
                for (int hv = 0; hv < 2; ++hv) {
                  a[2 * vv + hv][2 * pr] = f16x2_mul(a[2 * vv + hv][2 * pr], vs[pr]);
                  a[2 * vv + hv][2 * pr + 1] = f16x2_mul(a[2 * vv + hv][2 * pr + 1], vs[pr]);
                }
              }
            }
          wg_fence();
#pragma unroll
          for (int lb = 0; lb < kVBlocks; ++lb)
            WgmmaRSN<N, true>::rs(o[part * kVBlocks + lb], a[lb], dp + (uint32_t(ks * 32) >> 4), 1u);
          wg_commit();
        }
      }
      wg_wait<0>();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) reg_fence(o[mb]);
    }
  };
  pass(std::false_type{}, 0);
  // An NaN anywhere in this thread's output or sums: an e4m3 NaN code (read as NaN without the
  // clamp), or NaN from the data itself (q, the scale, infinite scores). Then the whole split runs
  // again with NaN codes read as 448, the header's contract; real NaNs come out NaN again.
  float probe = 0.f;
#pragma unroll
  for (int k = 0; k < 2 * J; ++k) probe += lp[k];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int k = 0; k < R; ++k) probe += o[mb][k] * 0.f;  // 0 for finite o, NaN for NaN or inf
  const bool rerun = named_bar_or(1, kMathThreads, isnan(probe));
  if (tid == 0) {
    s_rerun = rerun;
    mbar_arrive(verdict_bar);  // the producer streams the tiles again, or exits
  }
  if (rerun) pass(std::true_type{}, sr.n);

  // Merge the two warpgroups (as the N kernel), the per-tensor scale in the coefficients.
  NSoftmax<N>::publish(lp, mrun, s_red, s_m, s_l, g, q, w, warp);
  mbar_sync(math_bar, math_phase);  // both warpgroups are past their last tile: the ring is free
  float coef[2 * J];
  NSoftmax<N>::coefficients(coef, s_m, s_l, s_lse, kv_scale, g, q, w, warp);
  if constexpr (kDs) {  // O back from units of 2^e_run (exact: a power of two)
    if (e_run != kNoExponent)
#pragma unroll
      for (int k = 0; k < 2 * J; ++k) coef[k] *= pow2f(e_run);
  }
  float* so = reinterpret_cast<float*>(ring);  // [N heads][kOStride]
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == w) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int h = 8 * j + 2 * q + e;
            float2* x = reinterpret_cast<float2*>(so + h * L::kOStride + 16 * u + 2 * mb);  // dims (row g, row g + 8)
            const float2 v = make_float2(o[mb][4 * j + e] * coef[2 * j + e], o[mb][4 * j + 2 + e] * coef[2 * j + e]);
            if (w == 0) {
              *x = v;
            } else {
              const float2 y = *x;
              *x = make_float2(y.x + v.x, y.y + v.y);
            }
          }
    }
    mbar_sync(math_bar, math_phase);
  }
  store_rows<false>(so, L::kOStride, p.rows, 0, s_lse, p, sr, tid, kMathThreads);
}

}  // namespace graphsafe::mla_sm90

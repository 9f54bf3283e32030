// graphsafe's Hopper (sm_90a) MLA decode: the split kernels (one per head-count regime) and the
// combine kernel. Written for this crate; see decode.cu for the launcher and the design notes.
//
// Shared memory layout of a KV tile (and of Q): nine 64-column blocks, each block `rows` x 128 B,
// 128-byte swizzled (16-byte chunk c of row r stored at chunk c ^ (r % 8)). This is exactly what a
// TMA box of 64 x 64 elements with SWIZZLE_128B writes, and what wgmma reads through a 128-byte
// swizzle descriptor, K-major (rows = tokens or heads, K = the 576 dims) or MN-major (V as the
// [dims x tokens] operand of P.V: the same bytes read the other way round).
#pragma once

#include "mla/sm90/primitives.cuh"
#include "mla/sm90/wgmma_ops.cuh"

namespace graphsafe::mla_sm90 {

// Tiles [tile0, tile0 + n) of request b for this split (n may be 0: the split is empty).
struct SplitRange {
  int seq;
  int tile0;
  int n;
};
__device__ __forceinline__ SplitRange split_range(const Params& p, int b, int split) {
  int seq = p.seq_lens[b];
  seq = max(0, min(seq, p.max_seq_len));
  const int tiles = (seq + kTileS - 1) / kTileS;
  const int per = (tiles + p.num_splits - 1) / p.num_splits;
  const int t0 = split * per;
  return SplitRange{seq, t0, max(0, min(tiles, t0 + per) - t0)};
}

// Q rows [head0, head0 + valid) of request b into `sq` (ROWS rows, swizzled K-major blocks of
// ROWS x 128 B); rows past `valid` are zero.
template <int ROWS>
__device__ __forceinline__ void load_q(uint8_t* sq, const Params& p, int b, int head0, int valid, int t, int nt) {
  for (int idx = t; idx < ROWS * 72; idx += nt) {
    const int r = idx / 72, c = idx - r * 72;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < valid) {
      const int h = head0 + r;
      const uint16_t* src = c < 64 ? p.q_nope + b * p.q_nope_sb + h * p.q_nope_sh + c * 8
                                   : p.q_pe + b * p.q_pe_sb + h * p.q_pe_sh + (c - 64) * 8;
      if (p.q_vec) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        uint16_t e[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) e[k] = __ldg(src + k);
        v = make_uint4(e[0] | (uint32_t(e[1]) << 16), e[2] | (uint32_t(e[3]) << 16), e[4] | (uint32_t(e[5]) << 16),
                       e[6] | (uint32_t(e[7]) << 16));
      }
    }
    *reinterpret_cast<uint4*>(sq + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)) = v;
  }
}

// Zeroes V rows [valid, 64) of a tile (blocks 0..7): those tokens lie past seq_len, their bytes
// are whatever the cache holds (maybe NaN), and P = 0 times NaN would still be NaN.
__device__ __forceinline__ void zero_tail_rows(uint8_t* stage, int valid, int t, int nt) {
  const int count = (kTileS - valid) * 64;  // rows x 8 blocks x 8 chunks
  for (int idx = t; idx < count; idx += nt) {
    const int r = valid + (idx >> 6), blk = (idx >> 3) & 7, ch = idx & 7;
    *reinterpret_cast<uint4*>(stage + blk * kBlockBytes + r * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The producer: one thread streams the split's tiles into two stages with TMA.
// full[s] completes when a tile has landed; empty[s] when the consumers are done with it.
__device__ __forceinline__ void produce_tiles(const CUtensorMap* map, const Params& p, int b, const SplitRange& sr,
                                              uint32_t stages, uint32_t full0, uint32_t empty0) {
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  for (int i = 0; i < sr.n; ++i) {
    const int s = i & 1;
    const int tok = (sr.tile0 + i) * kTileS;
    // Issued before the wait below. A page index out of range is clamped into the cache, the rule
    // the sm100 path's sanitize pre-pass applies too (graphsafe_kernels/mla.h, "Device data").
    const int page = min(max(__ldg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
    const int row = page * p.page_size + tok % p.page_size;
    if (i >= 2) mbar_wait(empty0 + 8 * s, ((i >> 1) - 1) & 1);
    mbar_arrive_expect_tx(full0 + 8 * s, kStageBytes);
    const uint32_t dst = stages + s * kStageBytes;
#pragma unroll
    for (int c = 0; c < kBlocks; ++c) tma_load_2d(dst + c * kBlockBytes, map, c * 64, row, full0 + 8 * s);
  }
}

// The warp-specialised prologue both split kernels share. Thread 0 initialises the barriers, 8
// bytes each from `bars`: kPairs two-stage pairs with the given arrival counts (full[2] first,
// one arrival: the producer's expect_tx; empty[2] next), then the math barrier (kMathThreads).
// Then the producer warpgroup gives its registers to the math warpgroups, one of its threads
// streams the split's tiles, and it returns false (the kernel returns: exited threads do not hold
// up the math barrier). The math threads take the registers and return true.
template <int kPairs>
__device__ __forceinline__ bool enter_roles(const CUtensorMap* map, const Params& p, int b, const SplitRange& sr, int tid,
                                            uint32_t bars, const uint32_t (&pair_counts)[kPairs], uint32_t skv_a) {
  const uint32_t full0 = bars, empty0 = bars + 16, math_bar = bars + 16 * kPairs;
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      mbar_init(bars + 16 * i, pair_counts[i]);
      mbar_init(bars + 16 * i + 8, pair_counts[i]);
    }
    mbar_init(math_bar, kMathThreads);
    fence_barrier_init();
  }
  __syncthreads();

  if (tid >= kMathThreads) {
    regs_decrease<kProducerRegs>();
    if (tid == kMathThreads) produce_tiles(map, p, b, sr, skv_a, full0, empty0);
    return false;
  }
  regs_increase<kMathRegs>();
  return true;
}

// Writes `rows` finished rows (fp32 in shared memory, row stride `stride` floats) to out (splits == 1,
// normalised, in the output dtype) or to the fp32 partial-O workspace; and their LSE.
template <bool F16>
__device__ __forceinline__ void store_rows(const float* so, int stride, int rows, int head0, const float* slse,
                                           const Params& p, int b, int split, int t, int nt) {
  const int H = p.num_heads;
  for (int idx = t; idx < rows * 64; idx += nt) {
    const int r = idx >> 6, c8 = idx & 63;
    const float4 x = *reinterpret_cast<const float4*>(so + r * stride + c8 * 8);
    const float4 y = *reinterpret_cast<const float4*>(so + r * stride + c8 * 8 + 4);
    const int h = head0 + r;
    if (p.num_splits == 1) {
      uint16_t* dst = p.out + b * p.out_sb + h * p.out_sh + c8 * 8;
      const uint4 v = make_uint4(pack2<F16>(x.x, x.y), pack2<F16>(x.z, x.w), pack2<F16>(y.x, y.y), pack2<F16>(y.z, y.w));
      if (p.out_vec) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          dst[2 * k] = uint16_t(w[k] & 0xFFFFu);
          dst[2 * k + 1] = uint16_t(w[k] >> 16);
        }
      }
    } else {
      float* dst = p.ws_o + ((int64_t(b) * p.num_splits + split) * H + h) * kNope + c8 * 8;
      reinterpret_cast<float4*>(dst)[0] = x;
      reinterpret_cast<float4*>(dst)[1] = y;
    }
  }
  for (int r = t; r < rows; r += nt) {
    const int h = head0 + r;
    if (p.num_splits == 1) {
      if (p.lse != nullptr) p.lse[int64_t(b) * H + h] = slse[r];
    } else {
      p.ws_lse[(int64_t(b) * p.num_splits + split) * H + h] = slse[r];
    }
  }
}

// An empty split (or seq_len 0): one split writes zeros and LSE = -inf; a partial writes only
// LSE = -inf, which tells the combine kernel to skip (never read) its partial O.
template <bool F16>
__device__ __forceinline__ void write_empty(const Params& p, int b, int split, int head0, int rows, int t, int nt) {
  const int H = p.num_heads;
  if (p.num_splits == 1) {
    for (int idx = t; idx < rows * kNope; idx += nt) {
      const int r = idx / kNope, d = idx - r * kNope;
      p.out[b * p.out_sb + (head0 + r) * p.out_sh + d] = 0;
    }
    if (p.lse != nullptr)
      for (int r = t; r < rows; r += nt) p.lse[int64_t(b) * H + head0 + r] = -INFINITY;
  } else {
    for (int r = t; r < rows; r += nt) p.ws_lse[(int64_t(b) * p.num_splits + split) * H + head0 + r] = -INFINITY;
  }
}

// =================================================================================================
// Kernel "M64": heads as the MMA's M. One CTA = (64-head group, split, request); for 48..128 heads.
//
//   warpgroup 0: S = Q.K^T (m64n64k16 x 36, Q and K from shared memory), online softmax in
//                registers, P (bf16/fp16) into the tile's rope block (dead once S is done), then
//                O[:, 0:256] += P.V (m64n256k16 x 4).
//   warpgroup 1: waits for P, O[:, 256:512] += P.V.
//   warpgroup 2: TMA producer (one thread), two stages of 64 tokens.
// WG0 issues S(i+1) while both warpgroups' P.V(i) are still running on the tensor cores.
// Shared memory: Q 72 KiB + 2 x 72 KiB KV stages + row scales + barriers.
// =================================================================================================
constexpr int kM64OStride = 520;  // floats per row of the fp32 O staging (conflict-free float2 stores)
constexpr int kM64Smem = 3 * kStageBytes + (128 + 64 + 64) * 4 + 7 * 8 + 1024;

template <bool F16>
__global__ void __launch_bounds__(kThreads, 1) mla_sm90_m64_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  const int split = blockIdx.y, b = blockIdx.z;
  const int head0 = blockIdx.x * 64;
  const int rows = min(64, p.num_heads - head0);
  const SplitRange sr = split_range(p, b, split);
  if (sr.n == 0) {
    write_empty<F16>(p, b, split, head0, rows, tid, kThreads);
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

  if (!enter_roles(&kv_map, p, b, sr, tid, bars, {1u, uint32_t(kMathThreads), 128u}, skv_a)) return;

  uint32_t math_phase = 0;
  load_q<64>(sq, p, b, head0, rows, tid, kMathThreads);
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int wg = tid >> 7;
  const int lane = tid & 31, q = lane & 3;
  const int r0 = ((tid & 127) >> 5) * 16 + (lane >> 2), r1 = r0 + 8;  // accumulator rows (heads)
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  if (wg == 0) {
    const float sl2 = p.scale_log2;
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

      // Online softmax on rows r0, r1; columns 8j + 2q + {0,1} (j = 0..7).
      const int valid = sr.seq - (sr.tile0 + i) * kTileS;  // >= 1
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int c = 8 * j + 2 * q;
        if (c >= valid) sc[4 * j] = sc[4 * j + 2] = -INFINITY;
        if (c + 1 >= valid) sc[4 * j + 1] = sc[4 * j + 3] = -INFINITY;
        mx0 = fmaxf(mx0, fmaxf(sc[4 * j], sc[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
      const float a0 = ex2(m0 - mn0), a1 = ex2(m1 - mn1);
      m0 = mn0;
      m1 = mn1;
      float sum0 = 0.f, sum1 = 0.f;
      uint32_t pk[16];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = ex2(fmaf(sc[4 * j], sl2, -mn0)), p1 = ex2(fmaf(sc[4 * j + 1], sl2, -mn0));
        const float p2 = ex2(fmaf(sc[4 * j + 2], sl2, -mn1)), p3 = ex2(fmaf(sc[4 * j + 3], sl2, -mn1));
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
      s_inv_l[r0] = 1.f / l0;
      s_inv_l[r1] = 1.f / l1;
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
  const float i0 = s_inv_l[r0], i1 = s_inv_l[r1];
  const int cbase = wg * 256 + 2 * q;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<float2*>(so + r0 * kM64OStride + cbase + 8 * j) = make_float2(o[4 * j] * i0, o[4 * j + 1] * i0);
    *reinterpret_cast<float2*>(so + r1 * kM64OStride + cbase + 8 * j) = make_float2(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
  }
  mbar_sync(math_bar, math_phase);
  store_rows<F16>(so, kM64OStride, rows, head0, s_lse, p, b, split, tid, kMathThreads);
}

// =================================================================================================
// Kernel "N": heads as the MMA's N, for 16 or 32 heads (memory-bound). One CTA = (split, request).
// Tokens are the M dimension: S^T = K.Q^T (m64nNk16 x 36), O^T = V^T.P^T (m64nNk16 x 8 x 4, V read
// MN-major from the same tile bytes). The two warpgroups take alternate tiles, each with its own
// stage, running max/sum and full O^T; the CTA merges the two at the end. Warpgroup 2 produces.
// =================================================================================================
template <int N>
struct NLayout {
  static constexpr int kQBytes = N * 128 * kBlocks;  // a multiple of 1 KiB
  static constexpr int kOStride = 516;                // floats per head row of the O staging
  static constexpr int kSmem = kQBytes + 2 * kStageBytes + (8 * N + 2 * N + 2 * N + N) * 4 + 5 * 8 + 1024;
};

template <int N, bool F16>
__global__ void __launch_bounds__(kThreads, 1) mla_sm90_n_kernel(const __grid_constant__ CUtensorMap kv_map, const Params p) {
  static_assert(N == 16 || N == 32, "N kernel: 16 or 32 heads");
  constexpr int R = N / 2;  // accumulator registers per m64nN tile
  constexpr int J = N / 8;  // 8-column groups
  using L = NLayout<N>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_base_1k(smem_raw);
  const int tid = threadIdx.x;
  const int split = blockIdx.y, b = blockIdx.z;
  const SplitRange sr = split_range(p, b, split);
  if (sr.n == 0) {
    write_empty<F16>(p, b, split, 0, N, tid, kThreads);
    return;
  }

  uint8_t* sq = smem;
  uint8_t* skv = smem + L::kQBytes;
  float* s_red = reinterpret_cast<float*>(skv + 2 * kStageBytes);  // [2 wg][4 warps][N]
  float* s_m = s_red + 8 * N;                                      // [2][N]
  float* s_l = s_m + 2 * N;                                        // [2][N]
  float* s_lse = s_l + 2 * N;                                      // [N]
  const uint32_t bars = smem_u32(s_lse + N);
  const uint32_t full0 = bars, empty0 = bars + 16, math_bar = bars + 32;
  const uint32_t sq_a = smem_u32(sq), skv_a = smem_u32(skv);

  if (!enter_roles(&kv_map, p, b, sr, tid, bars, {1u, 128u}, skv_a)) return;

  uint32_t math_phase = 0;
  load_q<N>(sq, p, b, 0, N, tid, kMathThreads);
  fence_proxy_async();
  mbar_sync(math_bar, math_phase);

  const int w = tid >> 7;  // warpgroup: takes tiles i with i % 2 == w, always in stage w
  const int lt = tid & 127, warp = lt >> 5, lane = lt & 31, q = lane & 3, g = lane >> 2;
  const int ta = warp * 16 + g, tb = ta + 8;  // S^T rows (tokens) of this thread
  const float sl2 = p.scale_log2;
  float o[8][R];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int k = 0; k < R; ++k) o[mb][k] = 0.f;
  float mrun[2 * J], lp[2 * J];  // per owned head 8j + 2q + e, index 2j + e
#pragma unroll
  for (int k = 0; k < 2 * J; ++k) {
    mrun[k] = -INFINITY;
    lp[k] = 0.f;
  }
  const uint64_t dq = sw128_desc(sq_a, 16, 1024);
  uint8_t* stage = skv + w * kStageBytes;
  const uint32_t st = skv_a + w * kStageBytes;

  for (int i = w; i < sr.n; i += 2) {
    mbar_wait(full0 + 8 * w, (i >> 1) & 1);
    float sc[R];
    const uint64_t dk = sw128_desc(st, 16, 1024);
    wg_fence();
#pragma unroll
    for (int k = 0; k < 36; ++k) {
      const uint32_t offa = uint32_t((k >> 2) * kBlockBytes + (k & 3) * 32) >> 4;
      const uint32_t offb = uint32_t((k >> 2) * (N * 128) + (k & 3) * 32) >> 4;
      Wgmma<N, F16>::template ss<0, 0>(sc, dk + offa, dq + offb, k > 0 ? 1u : 0u);
    }
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);

    const int valid = sr.seq - (sr.tile0 + i) * kTileS;
    float cm[2 * J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (ta >= valid) sc[4 * j + e] = -INFINITY;
        if (tb >= valid) sc[4 * j + 2 + e] = -INFINITY;
        float m = fmaxf(sc[4 * j + e], sc[4 * j + 2 + e]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        cm[2 * j + e] = m;
      }
    }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) s_red[(w * 4 + warp) * N + 8 * j + 2 * q + e] = cm[2 * j + e];
    }
    named_bar_sync(2 + w, 128);

    float alpha[2 * J];
    uint8_t* pb = stage + 8 * kBlockBytes;  // P^T: K-major [N heads x 64 tokens]
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * q + e, k = 2 * j + e;
        const float* red = s_red + w * 4 * N + h;
        const float tm = fmaxf(fmaxf(red[0], red[N]), fmaxf(red[2 * N], red[3 * N]));
        const float mn = fmaxf(mrun[k], tm * sl2);
        alpha[k] = ex2(mrun[k] - mn);
        mrun[k] = mn;
        const float pa = ex2(fmaf(sc[4 * j + e], sl2, -mn));
        const float pv = ex2(fmaf(sc[4 * j + 2 + e], sl2, -mn));
        lp[k] = lp[k] * alpha[k] + pa + pv;
        *reinterpret_cast<uint16_t*>(pb + h * 128 + (((ta >> 3) ^ (h & 7)) << 4) + (ta & 7) * 2) = to_bits<F16>(pa);
        *reinterpret_cast<uint16_t*>(pb + h * 128 + (((tb >> 3) ^ (h & 7)) << 4) + (tb & 7) * 2) = to_bits<F16>(pv);
      }
    }
    if (valid < kTileS) zero_tail_rows(stage, valid, lt, 128);
    fence_proxy_async();
    named_bar_sync(2 + w, 128);

#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          o[mb][4 * j + e] *= alpha[2 * j + e];
          o[mb][4 * j + 2 + e] *= alpha[2 * j + e];
        }
    const uint64_t dv = sw128_desc(st, kBlockBytes, 1024);
    const uint64_t dp = sw128_desc(st + 8 * kBlockBytes, 16, 1024);
    wg_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        Wgmma<N, F16>::template ss<1, 0>(o[mb], dv + ((mb * kBlockBytes + k * 2048) >> 4), dp + ((k * 32) >> 4), 1u);
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) reg_fence(o[mb]);
    mbar_arrive(empty0 + 8 * w);
  }

  // Merge the two warpgroups: per-head sums, then O = (O0 e0 + O1 e1) / (l0 e0 + l1 e1).
#pragma unroll
  for (int k = 0; k < 2 * J; ++k) {
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 4);
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 8);
    lp[k] += __shfl_xor_sync(0xffffffffu, lp[k], 16);
  }
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) s_red[(w * 4 + warp) * N + 8 * j + 2 * q + e] = lp[2 * j + e];
  }
  named_bar_sync(2 + w, 128);
  if (warp == 0 && g == 0) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * q + e;
        const float* red = s_red + w * 4 * N + h;
        s_m[w * N + h] = mrun[2 * j + e];
        s_l[w * N + h] = ((red[0] + red[N]) + red[2 * N]) + red[3 * N];
      }
  }
  mbar_sync(math_bar, math_phase);
  float coef[2 * J];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + 2 * q + e;
      const float ma = s_m[h], mb = s_m[N + h];
      const float mm = fmaxf(ma, mb);  // finite: warpgroup 0 always has a tile
      const float ea = ex2(ma - mm), eb = ex2(mb - mm);
      const float l = s_l[h] * ea + s_l[N + h] * eb;
      coef[2 * j + e] = (w == 0 ? ea : eb) / l;
      if (w == 0 && warp == 0 && g == 0) s_lse[h] = (mm + __log2f(l)) * kLn2;
    }
  float* so = reinterpret_cast<float*>(skv);  // [N heads][kOStride]
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == w) {
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int h = 8 * j + 2 * q + e, d = mb * 64 + ta;
            float* x = so + h * L::kOStride + d;
            const float va = o[mb][4 * j + e] * coef[2 * j + e], vb = o[mb][4 * j + 2 + e] * coef[2 * j + e];
            if (w == 0) {
              x[0] = va;
              x[8] = vb;
            } else {
              x[0] += va;
              x[8] += vb;
            }
          }
    }
    mbar_sync(math_bar, math_phase);
  }
  store_rows<F16>(so, L::kOStride, N, 0, s_lse, p, b, split, tid, kMathThreads);
}

// =================================================================================================
// Combine: out[b, h] = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s). One block per
// (h, b, 128-dim chunk); warp w sums splits s = w, w + 4, ... (lane = 4 dims), the four warps are
// added in a fixed order: deterministic. Splits with LSE = -inf (empty) are skipped, never read.
// =================================================================================================
constexpr int kCombineChunks = 4;  // 512 dims = 4 blocks of 128

template <bool F16>
__global__ void __launch_bounds__(128) mla_sm90_combine_kernel(const Params p) {
  __shared__ float s_w[256];
  __shared__ float s_red[4];
  __shared__ float4 s_acc[3][32];
  const int h = blockIdx.x, b = blockIdx.y, chunk = blockIdx.z;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int S = p.num_splits, H = p.num_heads;
  const float* lse = p.ws_lse + int64_t(b) * S * H + h;
  float mx = -INFINITY;
  for (int s = t; s < S; s += 128) mx = fmaxf(mx, lse[int64_t(s) * H]);
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(s_red[0], s_red[1]), fmaxf(s_red[2], s_red[3]));
  const int d = chunk * 128 + lane * 4;
  uint16_t* dst = p.out + b * p.out_sb + h * p.out_sh + d;
  if (mx == -INFINITY) {  // every split empty: seq_len 0
    if (warp == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) dst[k] = 0;
    }
    if (t == 0 && chunk == 0 && p.lse != nullptr) p.lse[int64_t(b) * H + h] = -INFINITY;
    return;
  }
  __syncthreads();  // s_red is reused below
  float sum = 0.f;
  for (int s = t; s < S; s += 128) {
    const float v = lse[int64_t(s) * H];
    const float wgt = v == -INFINITY ? 0.f : expf(v - mx);
    s_w[s] = wgt;
    sum += wgt;
  }
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  sum = (s_red[0] + s_red[1]) + (s_red[2] + s_red[3]);

  const float* src = p.ws_o + (int64_t(b) * S * H + h) * kNope + d;
  const int64_t split_stride = int64_t(H) * kNope;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto fma4 = [](float4& a, float w, const float4& v) {
    a.x = fmaf(w, v.x, a.x);
    a.y = fmaf(w, v.y, a.y);
    a.z = fmaf(w, v.z, a.z);
    a.w = fmaf(w, v.w, a.w);
  };
  int s = warp;
  for (; s + 12 < S; s += 16) {  // four loads in flight per thread
    float wg[4];
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wg[k] = s_w[s + 4 * k];
      v[k] = wg[k] != 0.f ? __ldg(reinterpret_cast<const float4*>(src + (s + 4 * k) * split_stride)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) fma4(acc, wg[k], v[k]);
  }
  for (; s < S; s += 4) {
    const float wg = s_w[s];
    if (wg != 0.f) fma4(acc, wg, __ldg(reinterpret_cast<const float4*>(src + s * split_stride)));
  }
  if (warp > 0) s_acc[warp - 1][lane] = acc;
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      const float4 v = s_acc[k][lane];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    const float inv = 1.f / sum;
    const uint32_t lo = pack2<F16>(acc.x * inv, acc.y * inv), hi = pack2<F16>(acc.z * inv, acc.w * inv);
    if (p.out_vec) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
    } else {
      dst[0] = uint16_t(lo & 0xFFFFu);
      dst[1] = uint16_t(lo >> 16);
      dst[2] = uint16_t(hi & 0xFFFFu);
      dst[3] = uint16_t(hi >> 16);
    }
    if (t == 0 && chunk == 0 && p.lse != nullptr) p.lse[int64_t(b) * H + h] = mx + logf(sum);
  }
}

}  // namespace graphsafe::mla_sm90

// Shapes, parameters and device helpers of the sm90 MLA decode: the math-thread barrier, wgmma
// shared-memory descriptors, exp2 and packing. The Hopper PTX wrappers it shares with the W4A16
// GEMM (mbarriers, TMA, wgmma fences, named barriers, setmaxnreg) are in common/sm90.cuh.
// Hand-written PTX; sm_90a only.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the driver is reached through the runtime's entry points)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include "common/sm90.cuh"

namespace graphsafe::mla_sm90 {

using namespace graphsafe::sm90;

// ---- shapes -------------------------------------------------------------------------------------
constexpr int kTileS = 64;                          // KV tokens per tile (GS_MLA_SM90_TILE_S)
constexpr int kNope = 512;                          // latent dims (also V)
constexpr int kDim = 576;                           // latent + rope
constexpr int kBlocks = kDim / 64;                  // 9 column blocks of 64 elements (128 bytes)
constexpr int kBlockBytes = kTileS * 128;           // one column block of a tile: 64 rows x 128 B
constexpr int kStageBytes = kBlocks * kBlockBytes;  // one KV tile in shared memory: 73,728 B
constexpr int kMathThreads = 256;                   // two warpgroups
constexpr int kThreads = kMathThreads + 128;        // + a producer warpgroup (one thread issues TMA)
constexpr int kLaunchRegs = 168;                    // 65536 / kThreads, rounded down to a multiple of 8
constexpr int kMathRegs = 232;                      // setmaxnreg: 2 x 232 + 40 <= 3 x kLaunchRegs
constexpr int kProducerRegs = 40;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;

// Everything a kernel needs besides the tensor map; filled and checked by the host launcher.
// Query rows: a request's s_q tokens of num_heads heads each, row r = t * num_heads + h (FlashMLA's
// fold of [s_q, heads] into the MMA's M), `rows` = s_q * num_heads of them. The kernels take the
// rows as they take heads, a 64-row group (or all rows, for 32 or fewer) per CTA; only loading
// q, the causal limit and storing out/lse map a row back to its (token, head).
struct Params {
  const uint16_t* q_nope;
  int64_t q_nope_sb, q_nope_st, q_nope_sh;  // strides (elements) of request, token, head
  const uint16_t* q_pe;
  int64_t q_pe_sb, q_pe_st, q_pe_sh;
  const int32_t* seq_lens;
  const int32_t* page_table;
  int64_t page_table_stride;
  int32_t page_size;
  int32_t num_pages;
  int32_t max_seq_len;
  int32_t num_heads;
  int32_t s_q;      // query tokens per request
  int32_t rows;     // s_q * num_heads
  int32_t causal;   // token t of s_q sees keys 0 ..= len - s_q + t
  int32_t num_splits;
  int32_t batch;
  int32_t chunk;    // batch > 1: tiles per work item (schedule.cuh)
  int32_t* sched_lens;   // batch > 1: int32 [batch], the lengths read once (workspace)
  int32_t* sched_items;  // batch > 1, up to kSchedMaxSorted requests: int32 [batch, splits], the order of the work items; else null
  int32_t q_vec;    // q pointers and strides allow 16-byte loads
  int32_t out_vec;  // out pointer and strides allow 16-byte stores
  uint16_t* out;
  int64_t out_sb, out_st, out_sh;
  float* lse;     // [batch, heads, s_q] or null
  float* ws_o;     // splits > 1: fp32 [batch, splits, rows, 512] (split.cuh, store_rows)
  float* ws_lse;  // splits > 1: fp32 [batch, splits, rows]
  float scale_log2;  // sm_scale * log2(e)
  const float* kv_scale;  // GS_MLA_KV_FP8_PER_TENSOR: the cache's f32 scale (device data)
  const uint8_t* kv_cache;  // the cache's bytes, for the loads that bypass the tensor map (fp8, > 32 rows)
};

// Query row r of a request as its (token, head).
struct QueryRow {
  int t, h;
};
__device__ __forceinline__ QueryRow query_row(const Params& p, int r) {
  const int t = r / p.num_heads;
  return QueryRow{t, r - t * p.num_heads};
}
// Keys row r attends, of a request of `seq` keys: all of them, or causally seq - (s_q - 1 - t)
// (<= 0: none; such a row comes out as an empty request's). Padding rows (r >= rows, which the
// kernels compute and never store) see every key, so they never make a tile empty.
__device__ __forceinline__ int row_keys(const Params& p, int seq, int r) {
  if (!p.causal || r >= p.rows) return seq;
  return seq - (p.s_q - 1 - r / p.num_heads);
}

// ---- shared memory, barriers ------------------------------------------------------------------

// A barrier among the math threads through an mbarrier of `count` arrivals (phase tracked by the
// caller). Used instead of a named barrier for the CTA-wide math syncs: the producer warpgroup has
// exited by then, and compute-sanitizer's racecheck models mbarriers exactly.
__device__ __forceinline__ void mbar_sync(uint32_t bar, uint32_t& phase) {
  mbar_arrive(bar);
  mbar_wait(bar, phase);
  phase ^= 1u;
}

// ---- wgmma --------------------------------------------------------------------------------------
// Shared-memory matrix descriptor, 128-byte swizzle. Offsets in bytes; the start address field is
// 14 bits of 16-byte units (all of shared memory), so a byte offset >> 4 can be added to the result.
//   K-major operand:  rows of 128 B (64 elements), 8-row groups `sbo` = 1024 B apart (lbo unused: 16).
//   MN-major operand: 64 MN-elements per 128-B row, 8 K-rows per 1 KiB atom; `lbo` = distance between
//                     64-element MN blocks, `sbo` = distance between 8-row K groups (1024 B here).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3FFFu) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// ---- math -----------------------------------------------------------------------------------------
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The exponent base of a softmax row whose running maximum is `m`: m itself, or 0 while the row
// has seen no key (m = -inf), so that exp2(score - base) is 0 for its masked scores instead of
// exp2(-inf + inf) = NaN. (A row with no key in a tile or a split is new with causal masks.)
__device__ __forceinline__ float softmax_base(float m) { return m == -INFINITY ? 0.f : m; }
// The factor that moves a row's sums from running maximum m_old to m_new (m_new >= m_old): 1
// when the maximum stayed (also when both are -inf, where exp2(m_old - m_new) would be NaN).
__device__ __forceinline__ float softmax_alpha(float m_old, float m_new) { return m_old == m_new ? 1.f : ex2(m_old - m_new); }
// 1 / l, a row's normalisation; 0 for a row that saw no key (l = 0), whose output is zeros. (A
// NaN sum stays NaN.)
__device__ __forceinline__ float softmax_inv(float l) { return l == 0.f ? 0.f : 1.f / l; }

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (F16) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}
template <bool F16>
__device__ __forceinline__ uint16_t to_bits(float a) {
  if constexpr (F16) {
    __half v = __float2half_rn(a);
    return *reinterpret_cast<uint16_t*>(&v);
  } else {
    __nv_bfloat16 v = __float2bfloat16_rn(a);
    return *reinterpret_cast<uint16_t*>(&v);
  }
}
// The inverse of two pack2 calls: four 16-bit values (bf16 or fp16) as floats, exactly.
template <bool F16>
__device__ __forceinline__ float4 unpack4(uint2 u) {
  if constexpr (F16) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
  } else {
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xFFFF0000u));
  }
}

}  // namespace graphsafe::mla_sm90

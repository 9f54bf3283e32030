// graphsafe-build: archs=all kind=object mem_mib=400
// NVFP4 quantize / dequantize / global scale (gs_nvfp4_quantize, gs_nvfp4_dequantize,
// gs_nvfp4_global_scale): bit-exact with the algorithm in include/graphsafe_kernels/nvfp4.h and
// the Rust reference (src/ops/nvfp4/reference.rs). Plain CUDA, no arch-specific instructions
// beyond the fp8 conversion (hardware on sm_89+), so the same source builds for all three archs.
//
// Exactness: every step is the header's fp32 expression evaluated in IEEE round-to-nearest-even:
// amax / 6.0f * global_scale (a true division: nvcc's default -prec-div=true, no fast math; no
// FMA can form, there is no addition), the fp8 e4m3 conversion with saturation and subnormals
// (__nv_cvt_float_to_fp8, __NV_SATFINITE), global_scale / (float)sf (true division), x * inv (its
// own FMUL: a min/max sits between it and the rounding below, so nothing can contract it), then
// e2m1 of that fp32 product by one correctly rounded FFMA / FADD whose single rounding is the
// grid's round-to-nearest-even (e2m1_pack8_fast, e2m1_code).
//
// quantize: one thread per block of 16 (two 16-byte loads, one 8-byte store of 16 codes), or per
// two adjacent blocks on large inputs (nvfp4_quantize_kernel's BPI); the 4 (or 2) lanes that own
// the 4 blocks whose scales are one aligned 4-byte word of the swizzled layout gather it for one
// lane to store. Threads cover round_up(m, 128) rows x round_up(k / 16, 4) blocks, so the padding of the
// scale tensor is written with zeros by the same pass. A grid of at most the CTAs the GPU holds
// at once walks the blocks with a stride, each thread loading its next block before it computes
// the current one, so memory and arithmetic overlap inside every warp (measured on an H200: 1.25x
// a one-shot grid of the same kernel). The arithmetic is close to the issue limit, so the per-element work is
// kept to about 9 instructions (see e2m1_pack8_fast): inv = global_scale / sf comes from a
// 256-entry table each CTA fills once (the same division, so the same bits), signs are gathered
// word-wide from the input's own sign bits, and blocks holding Inf or NaN (or whose inv is not
// finite) take the element-by-element path. It is launched programmatically dependent (PDL): the
// grid may become resident while the previous kernel drains, and waits for it before any read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <atomic>
#include <climits>
#include <cstdint>
#include "common/launch.cuh"
#include "common/status.cuh"
#include "graphsafe_kernels/nvfp4.h"

namespace {

constexpr int kThreads = 256;
// Resident 256-thread quantize CTAs per SM, by blocks per thread and trip (the register budget:
// no spills at these counts).
constexpr int quant_ctas_per_sm(int bpi) { return bpi == 1 ? 4 : 3; }

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }
int launch_status();

template <bool F16>
__device__ __forceinline__ float to_float(uint32_t bits16) {
  if constexpr (F16) {
    __half_raw r;
    r.x = static_cast<unsigned short>(bits16);
    return __half2float(__half(r));
  } else {
    return __uint_as_float(bits16 << 16);  // bf16 -> f32 is exact: the bits are the top half
  }
}

template <bool F16>
__device__ __forceinline__ uint16_t from_float(float v) {
  if constexpr (F16) {
    __half h = __float2half_rn(v);
    return __half_as_ushort(h);
  } else {
    __nv_bfloat16 b = __float2bfloat16_rn(v);
    return __bfloat16_as_ushort(b);
  }
}

template <bool F16>
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = to_float<F16>(w[i] & 0xFFFFu);
    f[2 * i + 1] = to_float<F16>(w[i] >> 16);
  }
}

// e2m1 code of v: nearest of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code; |v| > 6 -> 6;
// NaN -> +0; a result of magnitude 0 is +0 whatever v's sign.
// The rounding is one IEEE addition: on [0, 2) the grid step is 0.5, on [2, 4) 1, on [4, 6] 2, and
// a + 2^22 * step rounds a to a multiple of step, to nearest, ties to even (an even multiple is an
// even code); the multiple is read off the sum's bits. |v| is clamped to 6 first (saturation).
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  const float a = fminf(fabsf(v), 6.0f);  // NaN -> 6 here; fixed below
  const bool p2 = a >= 2.0f, p4 = a >= 4.0f;
  const float magic = p4 ? 16777216.0f : (p2 ? 8388608.0f : 4194304.0f);
  const uint32_t base = p4 ? (0x4B800000u - 4u) : (p2 ? (0x4B000000u - 2u) : 0x4A800000u);
  const uint32_t mag = __float_as_uint(a + magic) - base;
  const uint32_t sign = (__float_as_uint(v) >> 28) & 8u;
  return isnan(v) ? 0u : (mag != 0u ? (mag | sign) : 0u);
}

// Codes of 8 finite values x_j * inv (x and inv finite; the words w0..w3 hold the 8 inputs as 16-bit
// pairs, element 2i in the low half of w_i), nibble j = element j, bit-identical to e2m1_code.
// Magnitude of a = min(|v|, 6): with E' = max(exponent(a), 0), FFMA(a, 2^(1 - E'), 2^23) is
// 2^23 + RNE(a * 2^(1 - E')) (a * 2^(1 - E') is exact and below 2^23, so the sum rounds once, at
// integer granularity, ties to even), and the code is that integer + 2E': steps 0.5, 1 and 2 on
// [0, 2), [2, 4) and [4, 6], ties to the even code. Each element adds
// (bits(t) + (bits(2^E') >> 22)) << 4j = (0x4B0000FE + code) << 4j; the constants sum to kPackBias
// (mod 2^32), subtracted once. Signs: sign(v) = sign(x) ^ sign(inv), gathered with byte permutes
// from the inputs' bit 15 / 31, kept only where the code is not zero (code + 7 carries into bit 3).
__device__ constexpr uint32_t pack_bias() {
  uint32_t b = 0;
  for (int j = 0; j < 8; ++j) b += 0x4B0000FEu << (4 * j);
  return b;
}
// The integer pipe issues logic, shifts and min/max at half the rate of the FMA pipe, and most of
// this loop is such ops; products by multipliers the compiler cannot see (kernel parameters:
// PackConsts, always {0xFFFFFFFF, 16}) stay IMADs on the FMA pipe instead of becoming shifts or
// subtractions. Measured on an H200: +3 % (the loop is bound by instructions issued more than by
// one pipe; docs/notes/2026-12-nvfp4-log.md). Not t + (e >> 22) as mad.hi(e, 1024, t), though: SASS's
// IMAD.HI adds a 64-bit addend, so each one came with a move zeroing the addend's low word (two
// FMA-pipe instructions where one LEA.HI does it): written plainly, 16 fewer instructions a block
// and 4096 x 8192 27.6 -> 25.5 us (H200).
__device__ __forceinline__ uint32_t mad_lo(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
struct PackConsts {
  uint32_t minus1, k16;  // 0xFFFFFFFF, 16 (kernel parameters, see above)
};
__device__ __forceinline__ uint32_t e2m1_pack8_fast(const float* f, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3,
                                                    float inv, const PackConsts& k) {
  uint32_t acc = 0;
#pragma unroll
  for (int j = 7; j >= 0; --j) {  // Horner: acc = acc * 16 + X_j, X_j = bits(t) + (bits(2^E') >> 22)
    const uint32_t ab = __float_as_uint(fminf(fabsf(f[j] * inv), 6.0f));
    const uint32_t e = max(ab & 0x7F800000u, 0x3F800000u);  // bits of 2^E'
    const float s = __uint_as_float(mad_lo(e, k.minus1, 0x7F800000u));  // 2^(1 - E')
    const uint32_t t = __float_as_uint(fmaf(__uint_as_float(ab), s, 8388608.0f));
    const uint32_t x = t + (e >> 22);  // one LEA.HI
    acc = j == 7 ? x : mad_lo(acc, k.k16, x);
  }
  const uint32_t mags = acc - pack_bias();
  const uint32_t a = __byte_perm(w0, w1, 0x7351);  // [w0.b1, w1.b1, w0.b3, w1.b3]
  const uint32_t b = __byte_perm(w2, w3, 0x7351);
  const uint32_t even = __byte_perm(a, b, 0x5410);  // byte i bit 7: sign of element 2i
  const uint32_t odd = __byte_perm(a, b, 0x7632);   // byte i bit 7: sign of element 2i + 1
  const uint32_t signs = (odd & 0x80808080u) | ((even >> 4) & 0x7F7F7F7Fu);  // bits 8i + 7, 8i + 3
  const uint32_t flip = uint32_t(int32_t(__float_as_uint(inv)) >> 31);
  return mags | ((signs ^ flip) & (mags + 0x77777777u) & 0x88888888u);
}

// max(|x|) over the 16 inputs of a block (8 words of 16-bit pairs), NaN if any is NaN: packed
// bf16x2 / half2 max on the FMA pipe (exact: max never rounds). Returned as an fp32.
template <bool F16>
__device__ __forceinline__ float amax16(const uint4& a, const uint4& b) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  if constexpr (F16) {
    __half2 m = __habs2(*reinterpret_cast<const __half2*>(&w[0]));
#pragma unroll
    for (int i = 1; i < 8; ++i) m = __hmax2_nan(m, __habs2(*reinterpret_cast<const __half2*>(&w[i])));
    return __half2float(__hmax_nan(__low2half(m), __high2half(m)));
  } else {
    __nv_bfloat162 m = __habs2(*reinterpret_cast<const __nv_bfloat162*>(&w[0]));
#pragma unroll
    for (int i = 1; i < 8; ++i) m = __hmax2_nan(m, __habs2(*reinterpret_cast<const __nv_bfloat162*>(&w[i])));
    return __bfloat162float(__hmax_nan(__low2bfloat16(m), __high2bfloat16(m)));
  }
}

__device__ __forceinline__ float max_nan(float a, float b) {  // NaN if either is NaN
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));  // exact: e4m3 is a subset of fp16
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  // Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: codes >= 2 are 2^(c/2 - 1) * (1 + (c & 1) / 2).
  const uint32_t c = code & 7u;
  const float m = c == 0u ? 0.0f : c == 1u ? 0.5f : __uint_as_float(((126u + (c >> 1)) << 23) | ((c & 1u) << 22));
  return (code & 8u) ? -m : m;
}

// Byte offset of scale (row, block) in the swizzled 128x4-atom layout (see nvfp4.h).
__device__ __forceinline__ int64_t scale_offset(int64_t row, int block, int kb4) {
  return (row >> 7) * (int64_t(kb4) * 512) + int64_t(block >> 2) * 512 + (row & 31) * 16 + ((row & 127) >> 5) * 4 +
         (block & 3);
}

// One block of 16 (two 16-byte words of inputs): its scale byte and its 16 codes (lo: elements
// 0..7, hi: 8..15), bit-identical to the header's algorithm.
template <bool F16>
__device__ __forceinline__ uint32_t quantize_block(const uint4& v0, const uint4& v1, float gs, const float* inv_of,
                                                   const PackConsts& kc, uint32_t& lo, uint32_t& hi) {
  float f[16];
  unpack8<F16>(v0, f);
  unpack8<F16>(v1, f + 8);
  // amax with a NaN-propagating max; a block with Inf or NaN takes the exact slow path.
  float amax = amax16<F16>(v0, v1);
  bool slow = !(amax <= 3.402823466e38f);  // NaN or Inf
  if (slow) {
    amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(f[j]));  // fmaxf ignores NaN
  }
  const __nv_fp8_storage_t sf = __nv_cvt_float_to_fp8(amax / 6.0f * gs, __NV_SATFINITE, __NV_E4M3);
  const float inv = inv_of[sf];
  slow = slow || !(fabsf(inv) <= 3.402823466e38f);
  lo = 0;
  hi = 0;
  if (!slow) {
    lo = e2m1_pack8_fast(f, v0.x, v0.y, v0.z, v0.w, inv, kc);
    hi = e2m1_pack8_fast(f + 8, v1.x, v1.y, v1.z, v1.w, inv, kc);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo |= e2m1_code(f[j] * inv) << (4 * j);
      hi |= e2m1_code(f[8 + j] * inv) << (4 * j);
    }
  }
  return uint32_t(sf);
}

// BPI blocks of 16 per thread and trip (1 or 2, adjacent in the row): 2 shares the per-trip work
// (item indices, addresses, the loop, the scale word's shuffles) between two blocks, which pays
// where every thread runs many trips (H200, 16384 x 8192: 115 -> 101 us); 1 keeps more threads
// on small inputs, where each thread runs about one trip (16 x 8192: 2.6 us against 3.0).
template <bool F16, int BPI>
__global__ void __launch_bounds__(kThreads, quant_ctas_per_sm(BPI)) nvfp4_quantize_kernel(
    const uint16_t* __restrict__ x, int64_t ld_x, int m, int k, int kb4, uint32_t div_magic, int div_shift,
    uint32_t items, const float* __restrict__ gsp, uint8_t* __restrict__ packed, uint8_t* __restrict__ scales, int vec,
    const PackConsts kc) {
  static_assert(kThreads == 256, "one table entry per thread");
  static_assert(BPI == 1 || BPI == 2, "1 or 2 blocks per item");
  constexpr int kLanes = 4 / BPI;  // lanes that share one 4-block scale group (one word of scales)
  __shared__ float inv_of[256];  // inv for each scale byte: (sf == 0) ? 0 : gs / sf, as the header says
  // Launched programmatically dependent (launch_quantize): wait for the previous grid on the stream
  // (it may have written x or the global scale) before reading anything, and let the next grid
  // launch at once, since it in turn waits for this whole grid before it reads what this writes.
  // The next grid's CTAs so get resident and through their prologue while this grid still runs.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const float gs = __ldg(gsp);
  const uint32_t stride = gridDim.x * kThreads;  // a multiple of 32: a warp's lanes stay in step
  const int sub = threadIdx.x & (kLanes - 1);  // this lane's part of the group
  // item = row * (4 * kb4 / BPI) + kLanes * g4 + sub: blocks 4 g4 + BPI sub + b (b < BPI) of the row
  // (k is a multiple of 32, so a pair of blocks is inside k or outside). The division by
  // 4 * kb4 / BPI is a multiply-high (host magic). items is a multiple of 256 and < 2^31 (host
  // check), so every lane of a warp runs the same trips.
  struct Item {
    uint4 v[2 * BPI];
    int64_t row;
    int g4, col;
    bool valid;
  };
  auto load = [&](uint32_t item, Item& it) {
    const uint32_t r = (__umulhi(item, div_magic) + item) >> div_shift;
    it.row = r;
    it.g4 = int((item - r * uint32_t(4 * kb4 / BPI)) / kLanes);
    it.col = it.g4 * 64 + sub * 16 * BPI;
    it.valid = it.row < m && it.col < k;
#pragma unroll
    for (int i = 0; i < 2 * BPI; ++i) it.v[i] = make_uint4(0, 0, 0, 0);
    if (it.valid) {
      const uint4* src = reinterpret_cast<const uint4*>(x + it.row * ld_x + it.col);
#pragma unroll
      for (int i = 0; i < 2 * BPI; ++i) it.v[i] = __ldg(src + i);
    }
  };
  uint32_t item = blockIdx.x * kThreads + threadIdx.x;
  Item cur;
  load(item, cur);
  {
    const float sf_f = e4m3_to_float(threadIdx.x);
    inv_of[threadIdx.x] = (sf_f == 0.0f) ? 0.0f : gs / sf_f;
  }
  __syncthreads();
#pragma unroll 1
  while (item < items) {
    Item next;
    const uint32_t nitem = item + stride;  // < 2^32: items + stride < 2^31 + 2^31
    if (nitem < items) load(nitem, next);
    uint32_t c[2 * BPI];
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < BPI; ++b)
      word |= quantize_block<F16>(cur.v[2 * b], cur.v[2 * b + 1], gs, inv_of, kc, c[2 * b], c[2 * b + 1]) << (8 * b);
    if (cur.valid) {
      uint8_t* dst = packed + cur.row * (k >> 1) + (cur.col >> 1);
      if (vec) {  // 8 * BPI-byte aligned
        if constexpr (BPI == 2) {
          *reinterpret_cast<uint4*>(dst) = make_uint4(c[0], c[1], c[2], c[3]);
        } else {
          *reinterpret_cast<uint2*>(dst) = make_uint2(c[0], c[1]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 2 * BPI; ++i) reinterpret_cast<uint32_t*>(dst)[i] = c[i];
      }
    }
    // The group's 4 scale bytes as one word of the swizzled layout, stored by its first lane.
    word = cur.valid ? word << (8 * BPI * sub) : 0u;
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) word |= __shfl_xor_sync(0xFFFFFFFFu, word, o);
    if (sub == 0) *reinterpret_cast<uint32_t*>(scales + scale_offset(cur.row, cur.g4 * 4, kb4)) = word;
    cur = next;
    item = nitem;
  }
}

// The launch of one blocks-per-item choice (see nvfp4_quantize_kernel).
template <int BPI>
int launch_quantize(const uint16_t* xs, int32_t dtype, int m, int k, int64_t ld_x, int kb4, int64_t rows_pad, int sm,
                    const float* global_scale, uint8_t* packed, uint8_t* scales, cudaStream_t s) {
  const int64_t items = rows_pad * kb4 * (4 / BPI);  // a multiple of 256 (rows_pad is of 128)
  if (items > INT32_MAX) return GS_ERR_INVALID_ARGUMENT;  // 32-bit item indices
  // Division by d = 4 * kb4 / BPI for item < 2^31: q = (umulhi(item, magic) + item) >> l,
  // l = ceil(log2 d), magic = floor(2^32 (2^l - d) / d) + 1 (Granlund-Montgomery; the sum cannot
  // overflow 32 bits).
  const uint32_t d = uint32_t(4 * kb4 / BPI);
  int l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint32_t magic = uint32_t(((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1);
  // At most the CTAs the GPU holds at once.
  int64_t blocks = items / kThreads;
  const int64_t resident = int64_t(sm) * quant_ctas_per_sm(BPI);
  if (blocks > resident) blocks = resident;
  const int vec = aligned(packed, 8 * BPI);  // rows of codes are k / 2 bytes, a multiple of 16
  const PackConsts kc{0xFFFFFFFFu, 16u};
  // Programmatic stream serialization: this grid may start while the previous kernel drains (the
  // kernel waits for it before reading). H200, back-to-back calls: 16 x 8192 2.56 -> 2.31 us,
  // 4096 x 8192 27.8 -> 27.4 us, the same bits.
  const uint32_t n_items = uint32_t(items);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  cudaError_t e = dtype == GS_DTYPE_FP16
                      ? graphsafe::launch_pdl(nvfp4_quantize_kernel<true, BPI>, grid, block, 0, s, xs, ld_x, m, k, kb4,
                                              magic, l, n_items, global_scale, packed, scales, vec, kc)
                      : graphsafe::launch_pdl(nvfp4_quantize_kernel<false, BPI>, grid, block, 0, s, xs, ld_x, m, k, kb4,
                                              magic, l, n_items, global_scale, packed, scales, vec, kc);
  if (e != cudaSuccess) return graphsafe::cuda_failed(e);
  return launch_status();
}

template <bool F16>
__global__ void __launch_bounds__(kThreads) nvfp4_dequantize_kernel(const uint32_t* __restrict__ packed,
                                                                     const uint8_t* __restrict__ scales,
                                                                     const float* __restrict__ gsp, int m, int k,
                                                                     int kb4, uint16_t* __restrict__ out,
                                                                     int64_t ld_out, int vec) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t per_row = k >> 3;
  if (idx >= int64_t(m) * per_row) return;
  const int64_t row = idx / per_row;
  const int col = int(idx - row * per_row) * 8;
  const float gs = __ldg(gsp);
  const uint32_t codes = __ldg(packed + idx);
  const float sf = e4m3_to_float(__ldg(scales + scale_offset(row, col >> 4, kb4)));
  // (e2m1 * sf) / gs with two divisions per thread instead of eight: e2m1 magnitudes are p or 1.5 p
  // with p a power of two, and p * RN(y) == RN(p * y) while nothing is subnormal or overflows, so
  // (p * sf) / gs == p * (sf / gs) and (1.5 p * sf) / gs == p * ((1.5 * sf) / gs) (1.5 * sf is exact).
  // Outside that range (and for NaN, zero or negative quotients) every element divides.
  const float q1 = sf / gs, q15 = (1.5f * sf) / gs;
  const bool fast = q1 >= 0x1p-125f && q1 <= 0x1p124f;
  uint16_t o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t c = (codes >> (4 * j)) & 15u, mag = c & 7u;
    float v;
    if (fast) {
      const float b = ((mag & 1u) && mag > 1u) ? q15 : q1;
      const float p = mag == 0u ? 0.0f : __uint_as_float((126u + (mag >> 1)) << 23);  // 0, .5, 1, 1, 2, 2, 4, 4
      v = b * p;
      if (c & 8u) v = -v;
    } else {
      v = e2m1_value(c) * sf / gs;
    }
    o[j] = from_float<F16>(v);
  }
  uint16_t* dst = out + row * ld_out + col;
  if (vec) {
    uint4 w;
    w.x = o[0] | (uint32_t(o[1]) << 16);
    w.y = o[2] | (uint32_t(o[3]) << 16);
    w.z = o[4] | (uint32_t(o[5]) << 16);
    w.w = o[6] | (uint32_t(o[7]) << 16);
    *reinterpret_cast<uint4*>(dst) = w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) dst[j] = o[j];
  }
}

// amax(|x|) into *gs's bits (the caller zeroed them): non-negative floats order like their bits.
template <bool F16>
__global__ void __launch_bounds__(kThreads) nvfp4_amax_kernel(const uint16_t* __restrict__ x, int64_t n,
                                                               unsigned int* __restrict__ out_bits) {
  float amax = 0.0f;
  const int64_t vecs = n >> 3;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + stride < vecs; i += 2 * stride) {  // two loads in flight
    const uint4 a = __ldg(xv + i), b = __ldg(xv + i + stride);
    float f[8], g[8];
    unpack8<F16>(a, f);
    unpack8<F16>(b, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fmaxf(fabsf(f[j]), fabsf(g[j])));
  }
  if (i < vecs) {
    float f[8];
    unpack8<F16>(__ldg(xv + i), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
  }
  if (blockIdx.x == 0 && threadIdx.x < 8 && (vecs << 3) + threadIdx.x < n)
    amax = fmaxf(amax, fabsf(to_float<F16>(x[(vecs << 3) + threadIdx.x])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  __shared__ float warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = warp_max[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) b = fmaxf(b, warp_max[w]);
    if (b > 0.0f) atomicMax(out_bits, __float_as_uint(b));
  }
}

__global__ void nvfp4_global_scale_finish_kernel(float* gs) {
  const float a = __uint_as_float(*reinterpret_cast<unsigned int*>(gs));
  *gs = (a == 0.0f || !isfinite(a)) ? 1.0f : 2688.0f / a;  // 448 * 6 / amax
}

int launch_status() {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

}  // namespace

extern "C" int gs_nvfp4_global_scale(const void* x, int32_t dtype, int64_t n, float* global_scale, void* stream) {
  if (x == nullptr || global_scale == nullptr || n <= 0 || !aligned(x, 16) || !aligned(global_scale, 4))
    return GS_ERR_INVALID_ARGUMENT;
  if (dtype != GS_DTYPE_BF16 && dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(global_scale, 0, sizeof(float), s);
  if (e != cudaSuccess) return graphsafe::cuda_failed(e);
  const int64_t vecs = n >> 3;
  int64_t blocks = (vecs + kThreads - 1) / kThreads;
  if (blocks > 2048) blocks = 2048;
  if (blocks < 1) blocks = 1;
  auto* bits = reinterpret_cast<unsigned int*>(global_scale);
  const auto* xs = static_cast<const uint16_t*>(x);
  if (dtype == GS_DTYPE_FP16)
    nvfp4_amax_kernel<true><<<unsigned(blocks), kThreads, 0, s>>>(xs, n, bits);
  else
    nvfp4_amax_kernel<false><<<unsigned(blocks), kThreads, 0, s>>>(xs, n, bits);
  if (int st = launch_status(); st != GS_OK) return st;
  nvfp4_global_scale_finish_kernel<<<1, 1, 0, s>>>(global_scale);
  return launch_status();
}

extern "C" int gs_nvfp4_quantize(const void* x, int32_t dtype, int32_t m, int32_t k, int64_t ld_x,
                                 const float* global_scale, uint8_t* packed, uint8_t* scales, void* stream) {
  if (x == nullptr || global_scale == nullptr || packed == nullptr || scales == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (dtype != GS_DTYPE_BF16 && dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;
  if (m <= 0 || k <= 0 || k % 32 != 0 || ld_x < k || ld_x % 8 != 0) return GS_ERR_INVALID_ARGUMENT;
  // 16-byte rows (the header's rule); codes and scale words are stored 4 bytes at a time.
  if (!aligned(x, 16) || !aligned(packed, 4) || !aligned(scales, 4)) return GS_ERR_INVALID_ARGUMENT;
  const int kb4 = (k / 16 + 3) / 4;
  const int64_t rows_pad = (int64_t(m) + 127) / 128 * 128;
  if (rows_pad * kb4 * 4 > INT32_MAX) return GS_ERR_INVALID_ARGUMENT;  // 32-bit item indices (a 64 GiB tensor)
  // The SM count, read once per device.
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return graphsafe::cuda_failed(e);
  static std::atomic<int> sms[64];
  int sm = (device >= 0 && device < 64) ? sms[device].load(std::memory_order_relaxed) : 0;
  if (sm == 0) {
    if (cudaError_t e = cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
      return graphsafe::cuda_failed(e);
    if (device >= 0 && device < 64) sms[device].store(sm, std::memory_order_relaxed);
  }
  auto s = static_cast<cudaStream_t>(stream);
  const auto* xs = static_cast<const uint16_t*>(x);
  // Two blocks per trip once the one-block grid would give every resident thread more than two
  // trips; one below that. Either way the same bits (the blocks are independent).
  const int64_t one_block_items = rows_pad * kb4 * 4;
  if (one_block_items > int64_t(2) * sm * quant_ctas_per_sm(1) * kThreads)
    return launch_quantize<2>(xs, dtype, m, k, ld_x, kb4, rows_pad, sm, global_scale, packed, scales, s);
  return launch_quantize<1>(xs, dtype, m, k, ld_x, kb4, rows_pad, sm, global_scale, packed, scales, s);
}

extern "C" int gs_nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, const float* global_scale, int32_t m,
                                   int32_t k, int32_t out_dtype, void* out, int64_t ld_out, void* stream) {
  if (packed == nullptr || scales == nullptr || global_scale == nullptr || out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (out_dtype != GS_DTYPE_BF16 && out_dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;
  if (m <= 0 || k <= 0 || k % 32 != 0 || ld_out < k) return GS_ERR_INVALID_ARGUMENT;
  if (!aligned(packed, 4) || !aligned(out, 2)) return GS_ERR_INVALID_ARGUMENT;
  const int kb4 = (k / 16 + 3) / 4;
  const int64_t threads = int64_t(m) * (k / 8);
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return GS_ERR_INVALID_ARGUMENT;
  const int vec = aligned(out, 16) && ld_out % 8 == 0;
  auto s = static_cast<cudaStream_t>(stream);
  const auto* pk = reinterpret_cast<const uint32_t*>(packed);
  auto* o = static_cast<uint16_t*>(out);
  if (out_dtype == GS_DTYPE_FP16)
    nvfp4_dequantize_kernel<true><<<unsigned(blocks), kThreads, 0, s>>>(pk, scales, global_scale, m, k, kb4, o, ld_out, vec);
  else
    nvfp4_dequantize_kernel<false><<<unsigned(blocks), kThreads, 0, s>>>(pk, scales, global_scale, m, k, kb4, o, ld_out, vec);
  return launch_status();
}

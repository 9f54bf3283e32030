// gs_nvfp4_w4a16_prepare's kernel: an NVFP4 weight (packed e2m1 codes, swizzled fp8 block scales,
// global scale) rewritten into the chunks the W4A16 GEMM streams (layout: w4a16_plan.cuh; code bit
// positions: w4a16_dequant.cuh). Included by w4a16.cu only.
#pragma once

#include <cstdint>
#include "nvfp4/sm90/w4a16_dequant.cuh"
#include "nvfp4/sm90/w4a16_plan.cuh"

namespace graphsafe::nvfp4_sm90 {
namespace {  // this file is part of w4a16.cu's translation unit only

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

}  // namespace
}  // namespace graphsafe::nvfp4_sm90

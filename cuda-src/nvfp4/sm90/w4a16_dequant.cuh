// The W4A16 GEMM's dequantization (see w4a16.cu's design notes): the register layout prepare writes
// the codes in, and the integer/bf16x2 steps that turn one prepared word and its scales into a k16
// step of the wgmma A fragment. Included by w4a16.cu only (internal linkage).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

namespace graphsafe::nvfp4_sm90 {
namespace {  // this file is part of w4a16.cu's translation unit only

// ---- dequantization ---------------------------------------------------------------------------
// The two scales of a k16 step as one bf16x2 {row g, row g + 8}: bytes B and B + 1 of `word` are
// re-encoded scales u = (E << 3) | m standing for 2^(E - 10) * (1 + m / 8); (u << 4) | 0x7000 is the
// bf16 with exponent field 224 + E and mantissa m, i.e. that value times 2^107.
// Logic ops and shifts issue on the SM's integer pipe at half the FMA pipe's rate, and the
// dequant is mostly logic ops, so its shifts and shift-adds are written as products by
// multipliers the compiler cannot see (Params::k16 = 16, Params::k2_29 = 2^29, kernel parameters):
// they stay IMADs on the FMA pipe instead of becoming SHF / LEA. Measured on an H200: no change
// (the consumers are bound by instructions issued, not by one pipe; docs/notes/2026-12-nvfp4-log.md).
__device__ __forceinline__ uint32_t mad_lo(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.hi.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// (BM <= 64 only: the tensor-bound BM >= 128 kernels keep the plain forms, with which the
// register allocation of BM = 256 does not spill.)
template <int B, bool kImad>
__device__ __forceinline__ uint32_t scale_pair(uint32_t word, uint32_t k16) {
  const uint32_t x = __byte_perm(word, 0u, 0x4040u | B | ((B + 1) << 8));  // [byte B, 0, byte B+1, 0]
  if constexpr (kImad) return mad_lo(x, k16, 0x70007000u);  // x * 16 + 0x70007000
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
template <bool kImad>
__device__ __forceinline__ void dequant_step(uint32_t w, uint32_t s, uint32_t k2_29, uint32_t (&a)[4]) {
  constexpr uint32_t M = 0x81C081C0u;
  a[0] = mul_lo(w & M, s);
  a[1] = mul_hi((w << 3) & M, s);
  a[2] = mul_lo(((w & 0x40074007u) * 66u) & M, s);
  if constexpr (kImad) {
    a[3] = mul_hi(((w << 2) & 0x80008000u) | (mul_hi_u32(w, k2_29) & 0x01C001C0u), s);  // w >> 3
  } else {
    (void)k2_29;
    a[3] = mul_hi(((w << 2) & 0x80008000u) | ((w >> 3) & 0x01C001C0u), s);
  }
}

__device__ __forceinline__ uint16_t to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

}  // namespace
}  // namespace graphsafe::nvfp4_sm90

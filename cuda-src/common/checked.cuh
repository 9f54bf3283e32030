// Overflow-checked size arithmetic for the host-side planners and validators of the glue. Sizes
// computed from caller input go through these: a wrapped size would under-report a workspace or
// an allocation, the very failure the planners exist to prevent. Host code only.
#pragma once
#include <cstdint>

namespace graphsafe::checked {

// a / b rounded up, for b > 0. Never overflows (unlike (a + b - 1) / b).
constexpr uint64_t div_up(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// *out = a * b; false when that does not fit in 64 bits.
inline bool mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// *out = a + b; false when that does not fit in 64 bits.
inline bool add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// *out = a rounded up to a multiple of m (m > 0); false on overflow.
inline bool round_up(uint64_t a, uint64_t m, uint64_t* out) { return mul(div_up(a, m), m, out); }

}  // namespace graphsafe::checked

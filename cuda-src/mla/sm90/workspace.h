// The split-KV workspace of graphsafe's sm90 MLA decode, in one place: plan.cu sizes it
// (gs_mla_sm90_workspace_bytes, which every caller sizes its buffer by) and decode.cu points the
// kernels into it (Params::ws_o, Params::ws_lse), so the two cannot disagree. Host code only.
//
//   O region   [batch, splits, heads, 512] partials in the output dtype, at byte 0
//   LSE region fp32 [batch, splits, heads], at byte round_up(O bytes, 256)
//   total = round_up(O bytes, 256) + round_up(LSE bytes, 256)
//
// A partial row is a convex combination of V rows, so the output dtype holds it; the combine adds
// the partials in fp32 (combine.cuh).
#pragma once
#include <cstdint>
#include "common/checked.cuh"
#include "graphsafe_kernels/mla.h"

namespace graphsafe::mla_sm90_workspace {

constexpr uint64_t kPartialElemBytes = 2;  // bf16 / fp16
constexpr uint64_t kRegionAlign = 256;

struct Layout {
  uint64_t lse_offset;  // byte offset of the LSE region
  uint64_t total;       // bytes of the whole workspace
};

// The layout for rows = batch * splits * heads partial rows; false when a size overflows 64 bits.
inline bool layout(uint64_t rows, Layout* out) {
  namespace ck = graphsafe::checked;
  uint64_t o = 0, lse = 0;
  if (!(ck::mul(rows, GS_MLA_LATENT_DIM * kPartialElemBytes, &o) && ck::round_up(o, kRegionAlign, &o) &&
        ck::mul(rows, sizeof(float), &lse) && ck::round_up(lse, kRegionAlign, &lse) && ck::add(o, lse, &out->total)))
    return false;
  out->lse_offset = o;
  return true;
}

}  // namespace graphsafe::mla_sm90_workspace

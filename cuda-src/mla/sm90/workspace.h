// The workspace of graphsafe's sm90 MLA decode, in one place: plan.cu sizes it
// (gs_mla_sm90_workspace_bytes, which every caller sizes its buffer by) and decode.cu points the
// kernels into it (Params::ws_o, ws_lse, sched_lens, sched_items), so the two cannot disagree.
// Host code only. R = s_q * heads query rows a request, S = splits.
//
//   O region      fp32 [batch, S, R, 512] partials                           (S > 1)
//   LSE region    fp32 [batch, S, R]                                         (S > 1)
//   lens region   int32 [batch]: the lengths the kernels use, read once      (batch > 1)
//   items region  int32 [batch, S]: the order the work items run in          (batch > 1)
//   each region at a 256-byte aligned offset, in this order; total = the end of the last
//
// Partials are fp32, as FlashMLA's: in bf16 (which halves their traffic: 1 x 65,536 at 128 heads,
// 64 splits, 43.7 against 52.5 us on an H200) FlashMLA's own test failed on its cosine tolerance
// (5.3e-6 against 5e-6) for one request of one head over 4096 tokens in 64 splits, each partial's
// rounding adding to the output's. The two schedule regions (schedule.cuh) are written by the
// schedule kernel before the split kernels of a batched decode read them.
#pragma once
#include <cstdint>
#include "common/checked.cuh"
#include "graphsafe_kernels/mla.h"

namespace graphsafe::mla_sm90_workspace {

constexpr uint64_t kPartialElemBytes = 4;  // fp32
constexpr uint64_t kRegionAlign = 256;

struct Layout {
  uint64_t lse_offset;    // byte offset of the LSE region
  uint64_t lens_offset;   // byte offset of the lens region
  uint64_t items_offset;  // byte offset of the items region
  uint64_t total;         // bytes of the whole workspace (0: none needed)
};

// The layout for `batch` requests of `rows` query rows in `splits` splits; false when a size
// overflows 64 bits.
inline bool layout(uint64_t batch, uint64_t rows, uint64_t splits, Layout* out) {
  namespace ck = graphsafe::checked;
  uint64_t partial_rows = 0, o = 0, lse = 0, lens = 0, items = 0;
  if (!ck::mul(batch, splits, &partial_rows) || !ck::mul(partial_rows, rows, &partial_rows)) return false;
  if (splits > 1) {
    if (!(ck::mul(partial_rows, GS_MLA_LATENT_DIM * kPartialElemBytes, &o) && ck::round_up(o, kRegionAlign, &o) &&
          ck::mul(partial_rows, sizeof(float), &lse) && ck::round_up(lse, kRegionAlign, &lse)))
      return false;
  }
  if (batch > 1) {
    if (!(ck::mul(batch, sizeof(int32_t), &lens) && ck::round_up(lens, kRegionAlign, &lens) &&
          ck::mul(batch * splits, sizeof(int32_t), &items) && ck::round_up(items, kRegionAlign, &items)))
      return false;
  }
  out->lse_offset = o;
  if (!ck::add(o, lse, &out->lens_offset) || !ck::add(out->lens_offset, lens, &out->items_offset) ||
      !ck::add(out->items_offset, items, &out->total))
    return false;
  return true;
}

}  // namespace graphsafe::mla_sm90_workspace

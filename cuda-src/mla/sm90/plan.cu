// graphsafe-build: archs=host kind=object mem_mib=600
// Host-only planning for graphsafe's own Hopper (sm_90a) MLA decode: the split-KV count and the
// workspace size. Built on every build (no GPU code), so planners and the CLI work without a GPU.
//
// The split rule (closed form; tests/mla_plan.rs checks it):
//
//   T    = ceil(max_seq_len / 64)              KV tiles of GS_MLA_SM90_TILE_S tokens
//   R    = s_q * num_heads                     query rows of a request (FlashMLA's fold)
//   C    = batch * ceil(R / 64)                CTAs per split (up to 64 rows: one CTA per request)
//   cap  = max(1, min(256, T, ceil(2 * sm_count / C)))      at most about two waves (256: GS_MLA_SM90_MAX_SPLITS)
//   cost(s) = ceil(C * s / sm_count) * ceil(T / s)          waves x tiles per CTA (one CTA per SM)
//   default = the smallest s in 1..=cap with the least cost(s)
//
// The smallest minimiser is automatically balanced, ceil(T / ceil(T / s)) == s: no split is empty
// at max_seq_len (a shorter request may still have empty splits: the kernels handle those).
// Why not always ~2 waves: a split CTA runs a whole wave of tiles either way, and splits cost
// partial-O traffic and a combine launch. Measured on an H200 (132 SMs, bf16, page 64, seq 4096):
// 128 heads x batch 64 took 179 us with 1 split (this rule) against 238 us with 3 (two waves);
// 16 heads x batch 64 took 95 us with 2 splits (this rule) against 115 us with 5.
//
//   requested > 0 is accepted unchanged when 1 <= requested <= min(GS_MLA_SM90_MAX_SPLITS, T).
//
// The worst case over lengths needs only lengths of at most cap tiles (src/ops/mla/sm90.rs uses
// this): if the default picks s for T tiles, it picks s for exactly s tiles. For s' < s,
// ceil(T / s') <= ceil(s / s') * ceil(T / s), so an s' no worse than s at s tiles
// (ceil(C * s' / sm) * ceil(s / s') <= ceil(C * s / sm)) would be no worse at T tiles either, and
// the smallest minimiser at T would not be s. (s <= cap, so the cap at s tiles is s itself.)
//
// Workspace: the layout of mla/sm90/workspace.h, which the decode points its kernels into: the
// partials of splits > 1, and for batch > 1 the work schedule (the lengths read once and the order
// the work items run in; schedule.cuh). 0 for one request in one split.
#include <algorithm>
#include <climits>
#include <cstdint>
#include "common/checked.cuh"
#include "mla/rules.h"
#include "mla/sm90/workspace.h"
#include "graphsafe_kernels/mla.h"

namespace ck = graphsafe::checked;
using graphsafe::mla_rules::batch_ok;
using graphsafe::mla_rules::limits_ok;
using graphsafe::mla_rules::rows_ok;
using graphsafe::mla_rules::sm90_splits_ok;

namespace {
int64_t div_up(int64_t a, int64_t b) { return static_cast<int64_t>(ck::div_up(uint64_t(a), uint64_t(b))); }
}  // namespace

extern "C" int gs_mla_sm90_num_splits(int32_t batch, int32_t num_heads, int32_t s_q, int32_t max_seq_len, int32_t sm_count,
                                      int32_t requested, int32_t* out_splits) {
  if (out_splits == nullptr || !limits_ok(batch, max_seq_len, sm_count) || !rows_ok(num_heads, s_q) || requested < 0)
    return GS_ERR_INVALID_ARGUMENT;
  const int64_t tiles = div_up(max_seq_len, GS_MLA_SM90_TILE_S);
  const int64_t limit = std::min(int64_t{GS_MLA_SM90_MAX_SPLITS}, tiles);
  if (requested > 0) {
    if (requested > limit) return GS_ERR_INVALID_ARGUMENT;
    *out_splits = requested;
    return GS_OK;
  }
  // Within the limits: ctas <= GS_MLA_MAX_BATCH * 32, s <= GS_MLA_SM90_MAX_SPLITS, tiles <= 2^25;
  // every product fits int64.
  const int64_t ctas = int64_t{batch} * div_up(int64_t{s_q} * num_heads, 64);
  const int64_t cap = std::max<int64_t>(1, std::min(limit, div_up(2 * int64_t{sm_count}, ctas)));
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t cost = div_up(ctas * s, sm_count) * div_up(tiles, s);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  *out_splits = static_cast<int32_t>(best);
  return GS_OK;
}

extern "C" int gs_mla_sm90_workspace_bytes(int32_t batch, int32_t num_heads, int32_t s_q, int32_t num_splits, uint64_t* out_bytes) {
  if (out_bytes == nullptr || !batch_ok(batch) || !rows_ok(num_heads, s_q) || !sm90_splits_ok(num_splits))
    return GS_ERR_INVALID_ARGUMENT;
  graphsafe::mla_sm90_workspace::Layout ws{};
  if (!graphsafe::mla_sm90_workspace::layout(uint64_t(batch), uint64_t(s_q) * uint64_t(num_heads), uint64_t(num_splits), &ws))
    return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = ws.total;
  return GS_OK;
}

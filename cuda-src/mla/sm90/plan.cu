// graphsafe-build: archs=host kind=object mem_mib=600
// Host-only planning for graphsafe's own Hopper (sm_90a) MLA decode: the split-KV count and the
// workspace size. Built on every build (no GPU code), so planners and the CLI work without a GPU.
//
// The split rule (closed form; tests/mla_plan.rs checks it):
//
//   T    = ceil(max_seq_len / 64)              KV tiles of GS_MLA_SM90_TILE_S tokens
//   C    = batch * ceil(num_heads / 64)        CTAs per split (16 and 32 heads: one CTA per request)
//   cap  = max(1, min(256, T, ceil(2 * sm_count / C)))      at most about two waves
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
//   requested > 0 is accepted unchanged when 1 <= requested <= min(256, T).
//
// Workspace (splits > 1 only; 0 for one split), laid out as the decode writes it:
//
//   O region   fp32 [batch, splits, heads, 512]   at byte 0
//   LSE region fp32 [batch, splits, heads]        at byte round_up(O bytes, 256)
//   total = round_up(O bytes, 256) + round_up(LSE bytes, 256)
#include <algorithm>
#include <climits>
#include <cstdint>
#include "graphsafe_kernels/mla.h"

namespace {
constexpr int64_t kMaxSplits = 256;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
uint64_t round_up_256(uint64_t x) { return (x + 255) & ~uint64_t{255}; }
bool heads_ok(int32_t h) { return h >= 16 && h <= 128 && h % 16 == 0; }
}  // namespace

extern "C" int gs_mla_sm90_num_splits(int32_t batch, int32_t num_heads, int32_t max_seq_len, int32_t sm_count,
                                      int32_t requested, int32_t* out_splits) {
  if (out_splits == nullptr || batch <= 0 || !heads_ok(num_heads) || max_seq_len <= 0 || sm_count <= 0 || requested < 0)
    return GS_ERR_INVALID_ARGUMENT;
  const int64_t tiles = ceil_div(max_seq_len, GS_MLA_SM90_TILE_S);
  const int64_t limit = std::min(kMaxSplits, tiles);
  if (requested > 0) {
    if (requested > limit) return GS_ERR_INVALID_ARGUMENT;
    *out_splits = requested;
    return GS_OK;
  }
  const int64_t ctas = int64_t{batch} * ceil_div(num_heads, 64);
  const int64_t cap = std::max<int64_t>(1, std::min(limit, ceil_div(2 * int64_t{sm_count}, ctas)));
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t cost = ceil_div(ctas * s, sm_count) * ceil_div(tiles, s);
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  *out_splits = static_cast<int32_t>(best);
  return GS_OK;
}

extern "C" int gs_mla_sm90_workspace_bytes(int32_t batch, int32_t num_heads, int32_t num_splits, uint64_t* out_bytes) {
  if (out_bytes == nullptr || batch <= 0 || !heads_ok(num_heads) || num_splits <= 0 || num_splits > kMaxSplits)
    return GS_ERR_INVALID_ARGUMENT;
  if (num_splits == 1) {
    *out_bytes = 0;
    return GS_OK;
  }
  const uint64_t rows = uint64_t(batch) * uint64_t(num_splits) * uint64_t(num_heads);
  *out_bytes = round_up_256(rows * GS_MLA_LATENT_DIM * sizeof(float)) + round_up_256(rows * sizeof(float));
  return GS_OK;
}

// The MLA decode's limits as the glue checks them, one function per rule, over the constants of
// graphsafe_kernels/mla.h. Rust checks the same constants, through the generated bindings, in
// src/ops/mla/plan.rs before it calls the glue; the glue checks again because it is the C surface's
// memory-safety backstop (any caller of gs_mla_* may pass anything), so every rule here guards an
// index or a size the kernels compute. Host code only (the planners, the decodes' validation).
#pragma once

#include <cstdint>
#include "graphsafe_kernels/mla.h"

// A 64-token tile of the sm90 kernels reads one page (the loaders look its page up once, the fp8
// ones once per 32-token half): every page size they take is a multiple of the tile.
static_assert(GS_MLA_SM90_MIN_PAGE_SIZE % GS_MLA_SM90_TILE_S == 0, "an sm90 KV tile must never cross a page");
// CUTLASS's KV tile holds whole pages: the compact page table has TILE_S / page_size columns a tile.
static_assert(GS_MLA_SM100_TILE_S % GS_MLA_SM100_MAX_PAGE_SIZE == 0, "an sm100 KV tile must hold whole pages");

namespace graphsafe::mla_rules {

constexpr bool power_of_two(int32_t v) { return v >= 1 && (v & (v - 1)) == 0; }

// Requests of a decode: a grid dimension of every MLA kernel and pass.
constexpr bool batch_ok(int32_t batch) { return batch >= 1 && batch <= GS_MLA_MAX_BATCH; }

// Query heads and tokens per request (the staging and the kernels' row counts are sized by them).
constexpr bool rows_ok(int32_t num_heads, int32_t s_q) {
  return num_heads >= 1 && num_heads <= GS_MLA_NUM_HEADS && s_q >= 1 && s_q <= GS_MLA_MAX_S_Q;
}

// The limits every planner checks first.
constexpr bool limits_ok(int32_t batch, int32_t max_seq_len, int32_t sm_count) {
  return batch_ok(batch) && max_seq_len >= 1 && max_seq_len <= GS_MLA_MAX_SEQ_LEN && sm_count >= 1 &&
         sm_count <= GS_MLA_MAX_SM_COUNT;
}

// The requests CUTLASS's sm100 kernel runs for `batch` requests of `s_q` tokens (B' = batch * s_q,
// also a grid dimension), or 0 when any of them is outside its limits or B' is above
// GS_MLA_MAX_BATCH.
constexpr int32_t sm100_kernel_batch(int32_t batch, int32_t num_heads, int32_t s_q) {
  if (!batch_ok(batch) || !rows_ok(num_heads, s_q)) return 0;
  const int64_t b = int64_t(batch) * s_q;
  return b <= GS_MLA_MAX_BATCH ? static_cast<int32_t>(b) : 0;
}

// Page sizes each back-end's loaders take (see the constants in graphsafe_kernels/mla.h).
constexpr bool sm90_page_size_ok(int32_t p) {
  return power_of_two(p) && p >= GS_MLA_SM90_MIN_PAGE_SIZE && p <= GS_MLA_SM90_MAX_PAGE_SIZE;
}
constexpr bool sm100_page_size_ok(int32_t p) { return power_of_two(p) && p <= GS_MLA_SM100_MAX_PAGE_SIZE; }

// KV splits the sm90 decode takes: the partials and the combine's registers are sized for at most
// GS_MLA_SM90_MAX_SPLITS.
constexpr bool sm90_splits_ok(int32_t n) { return n >= 1 && n <= GS_MLA_SM90_MAX_SPLITS; }

}  // namespace graphsafe::mla_rules

// graphsafe-build: archs=host kind=object mem_mib=1600 cutlass_example=77_blackwell_fmha
// Host-only planning for the CUTLASS sm100 MLA decode: the split-KV rule, the workspace size
// CUTLASS's own get_workspace_size returns, and the sanitize region the decode adds after it.
// Built on every build (no GPU code), so the planner and the CLI work on machines and builds
// without sm_100a. Every size is computed in checked 64-bit arithmetic from arguments that were
// first checked against the limits in graphsafe_kernels/mla.h.
#include <algorithm>
#include "common/checked.cuh"
#include "mla/sm100/mla_types.cuh"

using namespace graphsafe::mla_sm100;
namespace ck = graphsafe::checked;

namespace {
bool limits_ok(int32_t batch, int32_t max_seq_len, int32_t sm_count) {
  return batch >= 1 && batch <= GS_MLA_MAX_BATCH && max_seq_len >= 1 && max_seq_len <= GS_MLA_MAX_SEQ_LEN &&
         sm_count >= 1 && sm_count <= GS_MLA_MAX_SM_COUNT;
}

int32_t kv_tiles(int32_t max_seq_len) { return static_cast<int32_t>(ck::div_up(uint64_t(max_seq_len), GS_MLA_SM100_TILE_S)); }

// The largest split count the safety rule allows (see graphsafe_kernels/mla.h and docs/ARCHITECTURE.md).
int32_t safe_cap(int32_t batch, int32_t max_seq_len, int32_t sm_count) {
  if (batch > 1) return 1;
  int32_t cluster_slots = std::max(1, sm_count / 2);  // the kernel runs 2-SM clusters
  return std::min({int32_t{GS_MLA_SM100_MAX_SPLITS}, kv_tiles(max_seq_len), cluster_slots});
}

bool page_size_ok(int32_t p) { return p >= 1 && p <= GS_MLA_SM100_TILE_S && (p & (p - 1)) == 0; }
}  // namespace

extern "C" int gs_mla_sm100_num_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count, int32_t requested,
                                       int32_t* out_splits) {
  if (!limits_ok(batch, max_seq_len, sm_count) || requested < 0 || out_splits == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const int32_t cap = safe_cap(batch, max_seq_len, sm_count);
  if (requested > 0) {
    if (requested > cap) return GS_ERR_UNSAFE_SPLIT;
    *out_splits = requested;
    return GS_OK;
  }
  // Same tiles per split as `cap`, but no split left without KV tiles: an empty split takes the
  // early-return path of the kernel's compute warps, the path that hangs in CUTLASS 4.2.
  const uint64_t t = uint64_t(kv_tiles(max_seq_len));
  *out_splits = static_cast<int32_t>(ck::div_up(t, ck::div_up(t, uint64_t(cap))));
  return GS_OK;
}

extern "C" int gs_mla_sm100_max_safe_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count,
                                            int32_t* out_splits) {
  if (!limits_ok(batch, max_seq_len, sm_count) || out_splits == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_splits = safe_cap(batch, max_seq_len, sm_count);
  return GS_OK;
}

extern "C" int gs_mla_sm100_scheduler(int32_t num_splits, int32_t* out_scheduler) {
  if (num_splits <= 0 || out_scheduler == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_scheduler = num_splits == 1 ? GS_MLA_SCHED_PERSISTENT : GS_MLA_SCHED_INDIVIDUAL;
  return GS_OK;
}

extern "C" int gs_mla_sanitize_layout(int32_t batch, int32_t max_seq_len, int32_t page_size, int32_t num_splits,
                                      GsMlaSanitizeLayout* out) {
  if (out == nullptr || !limits_ok(batch, max_seq_len, 1) || !page_size_ok(page_size) || num_splits < 1 ||
      num_splits > GS_MLA_SM100_MAX_SPLITS)
    return GS_ERR_INVALID_ARGUMENT;
  // Whole KV tiles: CUTLASS reads the index of every page of a tile, also past the length.
  uint64_t columns = uint64_t(kv_tiles(max_seq_len)) * uint64_t(GS_MLA_SM100_TILE_S / page_size);
  uint64_t entries = 0;
  if (!ck::mul(columns, uint64_t(batch), &entries) || entries > uint64_t(INT32_MAX)) return GS_ERR_INVALID_ARGUMENT;
  GsMlaSanitizeLayout l{};
  uint64_t at = 0, size = 0;
  auto place = [&](uint64_t* offset, uint64_t bytes) {
    *offset = at;
    return ck::round_up(bytes, 256, &size) && ck::add(at, size, &at);
  };
  bool ok = place(&l.lens_offset, 4 * uint64_t(batch)) && place(&l.kernel_lens_offset, 4 * uint64_t(batch)) &&
            place(&l.page_table_offset, 4 * entries);
  l.lse_offset = at;
  if (ok && num_splits > 1) ok = place(&l.lse_offset, uint64_t(batch) * GS_MLA_NUM_HEADS * sizeof(float));
  if (!ok) return GS_ERR_INVALID_ARGUMENT;
  l.bytes = at;
  l.columns = static_cast<int32_t>(columns);
  *out = l;
  return GS_OK;
}

namespace {
template <class Element>
uint64_t cutlass_workspace_for(int batch, int max_seq_len, int sm_count, int num_splits) {
  using Out = typename OutputOf<Element>::type;
  // The scheduler does not enter the size; ask the instantiation the decode would launch.
  if (num_splits == 1) {
    using Op = typename Config<Element, Out, true>::Op;
    return Op::get_workspace_size(planning_arguments<Op>(batch, max_seq_len, sm_count, num_splits));
  }
  using Op = typename Config<Element, Out, false>::Op;
  return Op::get_workspace_size(planning_arguments<Op>(batch, max_seq_len, sm_count, num_splits));
}
}  // namespace

extern "C" int gs_mla_sm100_workspace_bytes(int32_t dtype, int32_t batch, int32_t max_seq_len, int32_t page_size,
                                            int32_t sm_count, int32_t num_splits, uint64_t* out_bytes) {
  if (!limits_ok(batch, max_seq_len, sm_count) || num_splits <= 0 || out_bytes == nullptr) return GS_ERR_INVALID_ARGUMENT;
  // CUTLASS sizes its part in size_t from ints: within the safety rule (splits > 1 only for
  // batch 1, at most 16) that product is at most 2052 * 128 * 16 bytes, so it cannot wrap.
  if (num_splits > safe_cap(batch, max_seq_len, sm_count)) return GS_ERR_UNSAFE_SPLIT;
  GsMlaSanitizeLayout l{};
  if (int st = gs_mla_sanitize_layout(batch, max_seq_len, page_size, num_splits, &l); st != GS_OK) return st;
  uint64_t c = 0;
  switch (dtype) {
    case GS_DTYPE_BF16: c = cutlass_workspace_for<cutlass::bfloat16_t>(batch, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP16: c = cutlass_workspace_for<cutlass::half_t>(batch, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP8_E4M3: c = cutlass_workspace_for<cutlass::float_e4m3_t>(batch, max_seq_len, sm_count, num_splits); break;
    default: return GS_ERR_INVALID_ARGUMENT;
  }
  uint64_t total = 0;
  if (!ck::round_up(c, 256, &total) || !ck::add(total, l.bytes, &total)) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = total;
  return GS_OK;
}

// graphsafe-build: archs=host kind=object mem_mib=1600 cutlass_example=77_blackwell_fmha
// Host-only planning for the CUTLASS sm100 MLA decode: the split-KV rule and the workspace size
// CUTLASS's own get_workspace_size returns. Built on every build (no GPU code), so the planner and
// the CLI work on machines and builds without sm_100a.
#include <algorithm>
#include "mla/sm100/mla_types.cuh"

using namespace graphsafe::mla_sm100;

namespace {
int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The largest split count the safety rule allows (see graphsafe_kernels.h and README.md here).
int safe_cap(int batch, int max_seq_len, int sm_count) {
  if (batch > 1) return 1;
  int kv_tiles = ceil_div(max_seq_len, GS_MLA_SM100_TILE_S);
  int cluster_slots = std::max(1, sm_count / 2);  // the kernel runs 2-SM clusters
  return std::min({GS_MLA_SM100_MAX_SPLITS, kv_tiles, cluster_slots});
}
}  // namespace

extern "C" int gs_mla_sm100_num_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count, int32_t requested,
                                       int32_t* out_splits) {
  if (batch <= 0 || max_seq_len <= 0 || sm_count <= 0 || requested < 0 || out_splits == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  int cap = safe_cap(batch, max_seq_len, sm_count);
  if (requested > 0) {
    if (requested > cap) return GS_ERR_UNSAFE_SPLIT;
    *out_splits = requested;
    return GS_OK;
  }
  // Same tiles per split as `cap`, but no split left without KV tiles: an empty split takes the
  // early-return path of the kernel's compute warps, the path that hangs in CUTLASS 4.2.
  int kv_tiles = ceil_div(max_seq_len, GS_MLA_SM100_TILE_S);
  *out_splits = ceil_div(kv_tiles, ceil_div(kv_tiles, cap));
  return GS_OK;
}

extern "C" int gs_mla_sm100_max_safe_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count,
                                            int32_t* out_splits) {
  if (batch <= 0 || max_seq_len <= 0 || sm_count <= 0 || out_splits == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_splits = safe_cap(batch, max_seq_len, sm_count);
  return GS_OK;
}

extern "C" int gs_mla_sm100_scheduler(int32_t num_splits, int32_t* out_scheduler) {
  if (num_splits <= 0 || out_scheduler == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_scheduler = num_splits == 1 ? GS_MLA_SCHED_PERSISTENT : GS_MLA_SCHED_INDIVIDUAL;
  return GS_OK;
}

namespace {
template <class Element>
uint64_t workspace_for(int batch, int max_seq_len, int sm_count, int num_splits) {
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

extern "C" int gs_mla_sm100_workspace_bytes(int32_t dtype, int32_t batch, int32_t max_seq_len, int32_t sm_count,
                                            int32_t num_splits, uint64_t* out_bytes) {
  if (batch <= 0 || max_seq_len <= 0 || sm_count <= 0 || num_splits <= 0 || out_bytes == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  switch (dtype) {
    case GS_DTYPE_BF16: *out_bytes = workspace_for<cutlass::bfloat16_t>(batch, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP16: *out_bytes = workspace_for<cutlass::half_t>(batch, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP8_E4M3: *out_bytes = workspace_for<cutlass::float_e4m3_t>(batch, max_seq_len, sm_count, num_splits); break;
    default: return GS_ERR_INVALID_ARGUMENT;
  }
  return GS_OK;
}

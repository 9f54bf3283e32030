// graphsafe-build: archs=host kind=object mem_mib=300
// Host-only queries of graphsafe's Hopper weight-only NVFP4 GEMM (W4A16): prepared-weight size,
// shape support, workspace size and schedule. Built on every build (no GPU code), so the op layer
// and the planners work without a GPU. The rules live in w4a16_plan.cuh, which the launcher shares.
#include "graphsafe_kernels/nvfp4.h"
#include "nvfp4/sm90/w4a16_plan.cuh"

using namespace graphsafe::nvfp4_sm90;

extern "C" int gs_nvfp4_w4a16_prepared_bytes(int32_t n, int32_t k, uint64_t* out_bytes) {
  if (out_bytes == nullptr || !shape_ok(1, n, k)) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = prepared_bytes(n, k);
  return GS_OK;
}

extern "C" int gs_nvfp4_w4a16_check_shape(int32_t m, int32_t n, int32_t k) {
  return shape_ok(m, n, k) ? GS_OK : GS_ERR_INVALID_ARGUMENT;
}

extern "C" int gs_nvfp4_w4a16_workspace_bytes(int32_t m, int32_t n, int32_t k, int32_t sm_count, uint64_t* out_bytes) {
  if (out_bytes == nullptr || sm_count <= 0 || !shape_ok(m, n, k)) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = make_plan(m, n, k, sm_count).workspace_bytes;
  return GS_OK;
}

extern "C" int gs_nvfp4_w4a16_schedule(int32_t m, int32_t n, int32_t k, int32_t sm_count, GsW4a16Schedule* out) {
  if (out == nullptr || sm_count <= 0 || !shape_ok(m, n, k)) return GS_ERR_INVALID_ARGUMENT;
  const Plan p = make_plan(m, n, k, sm_count);
  out->rows_per_cta = p.bm;
  out->ctas_per_sm = kConfigs[p.config].ctas_per_sm;
  out->stream_k = p.streamk ? 1 : 0;
  out->ctas = p.streamk ? p.ctas : p.tiles * p.splits;
  out->splits = int32_t(p.splits);
  return GS_OK;
}

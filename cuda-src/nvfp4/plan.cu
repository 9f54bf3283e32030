// graphsafe-build: archs=host kind=object mem_mib=4200
// Host-only NVFP4 planning: scale-factor sizes, CUTLASS's own swizzled scale offsets (the Rust
// reference is tested against them), the Blackwell GEMM's tile choice and CUTLASS's
// get_workspace_size for it. Built on every build (no GPU code is instantiated here).
#include "nvfp4/gemm.cuh"

using namespace graphsafe::nvfp4;

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

extern "C" int gs_nvfp4_scale_bytes(int32_t rows, int32_t k, uint64_t* out_bytes) {
  if (rows <= 0 || k <= 0 || k % GS_NVFP4_BLOCK != 0 || out_bytes == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = uint64_t(ceil_div(rows, 128) * 128) * uint64_t(ceil_div(k / GS_NVFP4_BLOCK, 4) * 4);
  return GS_OK;
}

extern "C" int gs_nvfp4_cutlass_scale_offset(int32_t rows, int32_t k, int32_t row, int32_t block, uint64_t* out_offset) {
  if (rows <= 0 || k <= 0 || k % GS_NVFP4_BLOCK != 0 || row < 0 || block < 0 || out_offset == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  if (row >= ceil_div(rows, 128) * 128 || block >= ceil_div(k / GS_NVFP4_BLOCK, 4) * 4) return GS_ERR_INVALID_ARGUMENT;
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<GS_NVFP4_BLOCK>;
  // The layout CUTLASS's mainloop reads scale factors of operand A ([rows, k]) through.
  auto layout = Config::tile_atom_to_shape_SFA(cute::make_shape(rows, 1, k, 1));
  *out_offset = uint64_t(layout(row, block * GS_NVFP4_BLOCK, 0));
  return GS_OK;
}

extern "C" int gs_nvfp4_gemm_tile(int32_t arch, int32_t m, GsNvfp4Tile* out) {
  if (m <= 0 || out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (arch == 100) {
    if (m <= 16) *out = GsNvfp4Tile{128, 128, 256, 1, 1};
    else if (m <= 256) *out = GsNvfp4Tile{256, 128, 256, 2, 1};
    else *out = GsNvfp4Tile{256, 256, 256, 2, 1};
    return GS_OK;
  }
  if (arch == 120) {
    *out = m <= 256 ? GsNvfp4Tile{128, 128, 128, 1, 1} : GsNvfp4Tile{256, 128, 128, 1, 1};
    return GS_OK;
  }
  return GS_ERR_INVALID_ARGUMENT;
}

namespace {
template <template <class> class G>
uint64_t ws_for(int32_t dtype, int m, int n, int k, int sm) {
  return dtype == GS_DTYPE_FP16 ? G<cutlass::half_t>::workspace_bytes(m, n, k, sm)
                                : G<cutlass::bfloat16_t>::workspace_bytes(m, n, k, sm);
}
}  // namespace

extern "C" int gs_nvfp4_gemm_workspace_bytes(int32_t arch, int32_t m, int32_t n, int32_t k, int32_t out_dtype,
                                             int32_t sm_count, uint64_t* out_bytes) {
  if (m <= 0 || n <= 0 || k <= 0 || sm_count <= 0 || out_bytes == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (out_dtype != GS_DTYPE_BF16 && out_dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;
  if (arch == 100) {
    *out_bytes = m <= 16    ? ws_for<sm100::GemmSmall>(out_dtype, m, n, k, sm_count)
                 : m <= 256 ? ws_for<sm100::GemmMedium>(out_dtype, m, n, k, sm_count)
                            : ws_for<sm100::GemmLarge>(out_dtype, m, n, k, sm_count);
    return GS_OK;
  }
  if (arch == 120) {
    *out_bytes = m <= 256 ? ws_for<sm120::GemmSmall>(out_dtype, m, n, k, sm_count)
                          : ws_for<sm120::GemmLarge>(out_dtype, m, n, k, sm_count);
    return GS_OK;
  }
  return GS_ERR_INVALID_ARGUMENT;
}

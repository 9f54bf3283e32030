// graphsafe-build: archs=host kind=object mem_mib=4200
// Host-only NVFP4 planning: scale-factor sizes, CUTLASS's own swizzled scale offsets (the Rust
// reference is tested against them), the Blackwell GEMM's tile choice and CUTLASS's
// get_workspace_size for it. Built on every build (no GPU code is instantiated here).
#include "common/checked.cuh"
#include "nvfp4/gemm.cuh"

using namespace graphsafe::nvfp4;
namespace ck = graphsafe::checked;

namespace {
// 64-bit and named apart from cute::ceil_div, which `using namespace` above makes visible and
// which, being an exact match for two ints, would win overload resolution and compute in int.
uint64_t round_up_u64(uint64_t a, uint64_t m) { return ck::div_up(a, m) * m; }  // a < 2^31: no wrap

// Scale-factor bytes of [rows, k] (rows, k > 0, k % 16 == 0); at most 2^31 * 2^27: fits 64 bits.
uint64_t sf_bytes(int32_t rows, int32_t k) {
  return round_up_u64(uint64_t(rows), 128) * round_up_u64(uint64_t(k) / GS_NVFP4_BLOCK, 4);
}

// CUTLASS's block-scaled layouts (Sm1xxBlockScaledConfig) compute scale offsets with int32
// strides: an operand whose scales exceed INT32_MAX bytes would be indexed with wrapped offsets.
bool sf_fits_int32(int32_t rows, int32_t k) { return sf_bytes(rows, k) <= uint64_t(INT32_MAX); }

// The one place the C ABI's int32_t becomes a GsNvfp4Backend: only a known value is converted (a
// C++ enum holding any other would be undefined behaviour), so the switches below see a valid
// enumerator. A back-end added to the header is refused here until it is handled below.
bool backend_of(int32_t v, GsNvfp4Backend* out) {
  switch (v) {
    case GS_NVFP4_BACKEND_SM100: *out = GS_NVFP4_BACKEND_SM100; return true;
    case GS_NVFP4_BACKEND_SM120: *out = GS_NVFP4_BACKEND_SM120; return true;
    default: return false;
  }
}
}  // namespace

extern "C" int gs_nvfp4_scale_bytes(int32_t rows, int32_t k, uint64_t* out_bytes) {
  if (rows <= 0 || k <= 0 || k % GS_NVFP4_BLOCK != 0 || out_bytes == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = sf_bytes(rows, k);
  return GS_OK;
}

extern "C" int gs_nvfp4_cutlass_scale_offset(int32_t rows, int32_t k, int32_t row, int32_t block, uint64_t* out_offset) {
  if (rows <= 0 || k <= 0 || k % GS_NVFP4_BLOCK != 0 || row < 0 || block < 0 || out_offset == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  if (!sf_fits_int32(rows, k)) return GS_ERR_INVALID_ARGUMENT;  // CUTLASS's int32 layout would wrap
  if (uint64_t(row) >= round_up_u64(uint64_t(rows), 128) || uint64_t(block) >= round_up_u64(uint64_t(k) / GS_NVFP4_BLOCK, 4))
    return GS_ERR_INVALID_ARGUMENT;
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<GS_NVFP4_BLOCK>;
  // The layout CUTLASS's mainloop reads scale factors of operand A ([rows, k]) through. Within
  // sf_fits_int32, block * 16 < k + 64 and every offset is below INT32_MAX.
  auto layout = Config::tile_atom_to_shape_SFA(cute::make_shape(rows, 1, k, 1));
  *out_offset = uint64_t(layout(row, block * GS_NVFP4_BLOCK, 0));
  return GS_OK;
}

extern "C" int gs_nvfp4_gemm_tile(int32_t backend, int32_t m, GsNvfp4Tile* out) {
  GsNvfp4Backend b;
  if (!backend_of(backend, &b) || m <= 0 || out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  switch (b) {
    case GS_NVFP4_BACKEND_SM100:
      if (m <= 16) *out = GsNvfp4Tile{128, 128, 256, 1, 1};
      else if (m <= 256) *out = GsNvfp4Tile{256, 128, 256, 2, 1};
      else *out = GsNvfp4Tile{256, 256, 256, 2, 1};
      return GS_OK;
    case GS_NVFP4_BACKEND_SM120:
      *out = m <= 256 ? GsNvfp4Tile{128, 128, 128, 1, 1} : GsNvfp4Tile{256, 128, 128, 1, 1};
      return GS_OK;
  }
  return GS_ERR_INVALID_ARGUMENT;  // unreachable: backend_of admits only the cases above
}

namespace {
template <template <class> class G>
uint64_t ws_for(int32_t dtype, int m, int n, int k, int sm) {
  return dtype == GS_DTYPE_FP16 ? G<cutlass::half_t>::workspace_bytes(m, n, k, sm)
                                : G<cutlass::bfloat16_t>::workspace_bytes(m, n, k, sm);
}
}  // namespace

extern "C" int gs_nvfp4_gemm_workspace_bytes(int32_t backend, int32_t m, int32_t n, int32_t k, int32_t out_dtype,
                                             int32_t sm_count, uint64_t* out_bytes) {
  GsNvfp4Backend b;
  if (!backend_of(backend, &b)) return GS_ERR_INVALID_ARGUMENT;
  if (m <= 0 || n <= 0 || k <= 0 || k % GS_NVFP4_BLOCK != 0 || sm_count <= 0 || out_bytes == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  if (out_dtype != GS_DTYPE_BF16 && out_dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;
  if (!sf_fits_int32(m, k) || !sf_fits_int32(n, k)) return GS_ERR_INVALID_ARGUMENT;
  switch (b) {
    case GS_NVFP4_BACKEND_SM100:
      *out_bytes = m <= 16    ? ws_for<sm100::GemmSmall>(out_dtype, m, n, k, sm_count)
                   : m <= 256 ? ws_for<sm100::GemmMedium>(out_dtype, m, n, k, sm_count)
                              : ws_for<sm100::GemmLarge>(out_dtype, m, n, k, sm_count);
      return GS_OK;
    case GS_NVFP4_BACKEND_SM120:
      *out_bytes = m <= 256 ? ws_for<sm120::GemmSmall>(out_dtype, m, n, k, sm_count)
                            : ws_for<sm120::GemmLarge>(out_dtype, m, n, k, sm_count);
      return GS_OK;
  }
  return GS_ERR_INVALID_ARGUMENT;  // unreachable: backend_of admits only the cases above
}

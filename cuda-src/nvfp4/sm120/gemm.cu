// graphsafe-build: archs=nvfp4:sm120 kind=object mem_mib=600
// gs_nvfp4_gemm_sm120: host-side checks, then the tile for m (gs_nvfp4_gemm_tile's rule).
#include "graphsafe_kernels/nvfp4.h"

#define GS_NVFP4_GEMM_DECL(name)                                                                             \
  int name(const uint8_t*, const uint8_t*, const uint8_t*, const uint8_t*, const float*, void*, int32_t, int32_t, \
           int32_t, int32_t, int32_t, void*, uint64_t, void*);
extern "C" {
GS_NVFP4_GEMM_DECL(gs_nvfp4_gemm_sm120_small)
GS_NVFP4_GEMM_DECL(gs_nvfp4_gemm_sm120_large)

int gs_nvfp4_gemm_sm120(const uint8_t* a, const uint8_t* sfa, const uint8_t* b, const uint8_t* sfb, const float* alpha,
                        void* d, int32_t out_dtype, int32_t m, int32_t n, int32_t k, int32_t sm_count, void* ws,
                        uint64_t ws_bytes, void* stream) {
  if (!a || !sfa || !b || !sfb || !alpha || !d || m <= 0 || n <= 0 || k <= 0 || k % 32 != 0 || n % 32 != 0 ||
      sm_count <= 0 || (out_dtype != GS_DTYPE_BF16 && out_dtype != GS_DTYPE_FP16))
    return GS_ERR_INVALID_ARGUMENT;
  auto f = m <= 256 ? gs_nvfp4_gemm_sm120_small : gs_nvfp4_gemm_sm120_large;
  return f(a, sfa, b, sfb, alpha, d, out_dtype, m, n, k, sm_count, ws, ws_bytes, stream);
}
}

// graphsafe-build: archs=nvfp4:sm120 kind=object mem_mib=6500
// CUTLASS NVFP4 GEMM on sm120 for m <= 256 (128x128x128, ping-pong), bf16 and fp16 output.
// One file per tile so the ~45 s, ~4 GB instantiations compile in parallel.
#include "nvfp4/gemm.cuh"

using namespace graphsafe::nvfp4;

extern "C" int gs_nvfp4_gemm_sm120_small(const uint8_t* a, const uint8_t* sfa, const uint8_t* b, const uint8_t* sfb,
                                          const float* alpha, void* d, int32_t out_dtype, int32_t m, int32_t n, int32_t k,
                                          int32_t sm_count, void* ws, uint64_t ws_bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (out_dtype == GS_DTYPE_FP16)
    return sm120::GemmSmall<cutlass::half_t>::run(a, sfa, b, sfb, alpha, d, m, n, k, sm_count, ws, ws_bytes, s);
  return sm120::GemmSmall<cutlass::bfloat16_t>::run(a, sfa, b, sfb, alpha, d, m, n, k, sm_count, ws, ws_bytes, s);
}

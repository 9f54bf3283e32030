// graphsafe-build: archs=mla:sm100 kind=object mem_mib=5500 cutlass_example=77_blackwell_fmha
// CUTLASS sm100 MLA decode kernels for fp16 inputs, TMA loads (page size 128), persistent and individual
// schedulers.
// One file per element type so the ~1 min, ~3.6 GB instantiations compile in parallel.
#include "mla/sm100/mla_launch.cuh"

extern "C" int gs_mla_sm100_decode_fp16(GsMlaDecodeArgs const* args, void* workspace, uint64_t workspace_bytes,
                                       void* stream) {
  return graphsafe::mla_sm100::decode<cutlass::half_t, false>(args, workspace, workspace_bytes, stream);
}

// graphsafe-build: archs=mla:sm100 kind=object mem_mib=5500 cutlass_example=77_blackwell_fmha
// CUTLASS sm100 MLA decode kernels for bf16 inputs, cp.async loads (power-of-two pages up to 128),
// persistent and individual schedulers. A file of its own so it compiles in parallel with the others.
#include "mla/sm100/mla_launch.cuh"

extern "C" int gs_mla_sm100_decode_cpasync_bf16(GsMlaDecodeArgs const* args, void* workspace, uint64_t workspace_bytes,
                                               void* stream) {
  return graphsafe::mla_sm100::decode<cutlass::bfloat16_t, true>(args, workspace, workspace_bytes, stream);
}

// graphsafe-build: archs=mla:sm100 kind=object mem_mib=600
// gs_mla_sm100_decode: validates the host-side arguments and dispatches by element type to the
// per-dtype instantiations (mla_{bf16,fp16,fp8}.cu), which sanitize the device data, launch
// CUTLASS and write the rows that attend no key (mla_launch.cuh). Built only with sm_100f.
#include "graphsafe_kernels/mla.h"

extern "C" {
int gs_mla_sm100_decode_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);

int gs_mla_sm100_decode(GsMlaDecodeArgs const* a, void* workspace, uint64_t workspace_bytes, void* stream) {
  // Everything the launch (pre-pass, kernel, post-pass) could refuse is checked here, before the
  // first enqueue: a refusal must leave nothing on the stream (or in a capture). The checks are
  // gs_mla_sm100_kernel_args' (host-only, in every build: plan.cu).
  GsMlaSm100KernelArgs k{};
  if (int st = gs_mla_sm100_kernel_args(a, workspace, workspace_bytes, &k); st != GS_OK) return st;
  bool tma = a->page_size == GS_MLA_SM100_TILE_S;  // TMA needs whole 128-token pages
  switch (a->dtype) {
    case GS_DTYPE_BF16:
      return (tma ? gs_mla_sm100_decode_bf16 : gs_mla_sm100_decode_cpasync_bf16)(a, workspace, workspace_bytes, stream);
    case GS_DTYPE_FP16:
      return (tma ? gs_mla_sm100_decode_fp16 : gs_mla_sm100_decode_cpasync_fp16)(a, workspace, workspace_bytes, stream);
    case GS_DTYPE_FP8_E4M3:
      return (tma ? gs_mla_sm100_decode_fp8 : gs_mla_sm100_decode_cpasync_fp8)(a, workspace, workspace_bytes, stream);
    default: return GS_ERR_INVALID_ARGUMENT;
  }
}
}

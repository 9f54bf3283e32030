// graphsafe-build: archs=sm_100a kind=object mem_mib=600
// gs_mla_sm100_decode: validates the host-side arguments and dispatches by element type to the
// per-dtype instantiations (mla_{bf16,fp16,fp8}.cu). Built only with sm_100a.
#include "graphsafe_kernels/mla.h"

extern "C" {
int gs_mla_sm100_decode_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);

int gs_mla_sm100_decode(GsMlaDecodeArgs const* a, void* workspace, uint64_t workspace_bytes, void* stream) {
  if (a == nullptr || a->batch <= 0 || a->max_seq_len <= 0 || a->num_splits <= 0 || a->sm_count < 2 ||
      a->q_nope == nullptr || a->q_pe == nullptr || a->kv_cache == nullptr || a->seq_lens == nullptr ||
      a->page_table == nullptr || a->out == nullptr || a->num_pages <= 0 || a->num_heads != GS_MLA_NUM_HEADS ||
      a->page_size <= 0 || a->page_size > GS_MLA_SM100_TILE_S || (a->page_size & (a->page_size - 1)) != 0)
    return GS_ERR_INVALID_ARGUMENT;
  if (a->num_splits > 1 && workspace == nullptr) return GS_ERR_WORKSPACE_TOO_SMALL;
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

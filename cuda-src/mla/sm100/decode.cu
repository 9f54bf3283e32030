// graphsafe-build: archs=mla:sm100 kind=object mem_mib=600
// gs_mla_sm100_decode: validates the host-side arguments and dispatches by element type to the
// per-dtype instantiations (mla_{bf16,fp16,fp8}.cu), which sanitize the device data, launch
// CUTLASS and fix up empty requests (mla_launch.cuh). Built only with sm_100a.
#include "graphsafe_kernels/mla.h"

namespace {
bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }
}  // namespace

extern "C" {
int gs_mla_sm100_decode_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_bf16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp16(GsMlaDecodeArgs const*, void*, uint64_t, void*);
int gs_mla_sm100_decode_cpasync_fp8(GsMlaDecodeArgs const*, void*, uint64_t, void*);

int gs_mla_sm100_decode(GsMlaDecodeArgs const* a, void* workspace, uint64_t workspace_bytes, void* stream) {
  // Everything the launch (pre-pass, kernel, post-pass) could refuse is checked here, before the
  // first enqueue: a refusal must leave nothing on the stream (or in a capture).
  if (a == nullptr || a->batch <= 0 || a->batch > GS_MLA_MAX_BATCH || a->max_seq_len <= 0 ||
      a->max_seq_len > GS_MLA_MAX_SEQ_LEN || a->num_splits <= 0 || a->sm_count < 2 ||
      a->sm_count > GS_MLA_MAX_SM_COUNT || a->q_nope == nullptr || a->q_pe == nullptr || a->kv_cache == nullptr ||
      a->seq_lens == nullptr || a->page_table == nullptr || a->out == nullptr || a->num_pages <= 0 ||
      a->num_heads != GS_MLA_NUM_HEADS || a->page_size <= 0 || a->page_size > GS_MLA_SM100_TILE_S ||
      (a->page_size & (a->page_size - 1)) != 0 || int64_t(a->num_pages) * a->page_size > INT32_MAX ||
      a->out_stride_batch < 0 || a->out_stride_head < 0 || !aligned(a->seq_lens, 4) ||
      !aligned(a->page_table, 4) || !aligned(a->out, 2) || !aligned(a->lse, 4) || a->kv_format != GS_MLA_KV_NATIVE)
    return GS_ERR_INVALID_ARGUMENT;
  if (a->batch > 1 && a->page_table_stride < (int64_t(a->max_seq_len) + a->page_size - 1) / a->page_size)
    return GS_ERR_INVALID_ARGUMENT;  // rows would overlap: the pre-pass reads ceil(len / page_size) of each
  // With splits, CUTLASS's reduction kernel writes out densely ([batch, 128, 512]) whatever the
  // strides: refuse any other layout (the Rust op refuses it first, naming out.strides).
  if (a->num_splits > 1 && (a->out_stride_head != GS_MLA_LATENT_DIM ||
                            (a->batch > 1 && a->out_stride_batch != int64_t(GS_MLA_NUM_HEADS) * GS_MLA_LATENT_DIM)))
    return GS_ERR_INVALID_ARGUMENT;
  int32_t cap = 0;
  if (int st = gs_mla_sm100_max_safe_splits(a->batch, a->max_seq_len, a->sm_count, &cap); st != GS_OK) return st;
  if (a->num_splits > cap) return GS_ERR_UNSAFE_SPLIT;
  if (workspace == nullptr) return GS_ERR_WORKSPACE_TOO_SMALL;  // never optional: it holds the sanitize region
  if (!aligned(workspace, 16)) return GS_ERR_INVALID_ARGUMENT;
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

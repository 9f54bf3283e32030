/* graphsafe kernel glue: MLA decode (CUTLASS sm100 planning and launch; graphsafe sm90 kernel). */
#ifndef GRAPHSAFE_KERNELS_MLA_H
#define GRAPHSAFE_KERNELS_MLA_H

#include <stddef.h>
#include <stdint.h>
#include "graphsafe_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Tile schedulers of the CUTLASS sm100 MLA kernel. */
typedef enum GsMlaScheduler {
  /** One CTA pair per SM pair loops over (batch, split) tiles. Used only with one split. */
  GS_MLA_SCHED_PERSISTENT = 0,
  /** One CTA pair per (batch, split) tile. Used whenever there is more than one split. */
  GS_MLA_SCHED_INDIVIDUAL = 1,
} GsMlaScheduler;

/** Fixed shape of the MLA decode kernels: DeepSeek-V2/V3 latent attention. */
#define GS_MLA_NUM_HEADS 128
#define GS_MLA_LATENT_DIM 512
#define GS_MLA_ROPE_DIM 64
/** KV-sequence tile of the sm100 kernel (TileShapeS). */
#define GS_MLA_SM100_TILE_S 128
/** The most KV splits the default rule ever picks. */
#define GS_MLA_SM100_MAX_SPLITS 16

/**
 * Number of KV splits for the CUTLASS 4.2 sm100 MLA kernel.
 *
 * requested == 0 picks the default, safe rule; requested > 0 is validated against the same rule
 * and returned unchanged, or refused with GS_ERR_UNSAFE_SPLIT. The rule (why: cuda-src/mla/sm100/README.md):
 *   batch > 1:  1 split.
 *   batch == 1: cap = min(16, ceil(max_seq_len / 128), max(1, sm_count / 2)); the default is the
 *               balanced count ceil(T / ceil(T / cap)), T = ceil(max_seq_len / 128), which gives
 *               the same per-split work as cap with no empty split.
 */
int gs_mla_sm100_num_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count, int32_t requested,
                            int32_t* out_splits);

/** The largest split count the safety rule allows for these arguments (what `requested` may be). */
int gs_mla_sm100_max_safe_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count, int32_t* out_splits);

/** The scheduler the decode uses for a split count: persistent for 1, individual for more. */
int gs_mla_sm100_scheduler(int32_t num_splits, int32_t* out_scheduler);

/**
 * Workspace bytes of the sm100 MLA decode for these arguments: exactly what CUTLASS's
 * device::MLA<Kernel>::get_workspace_size returns for the kernel instantiated for `dtype`
 * (0 for one split).
 */
int gs_mla_sm100_workspace_bytes(int32_t dtype, int32_t batch, int32_t max_seq_len, int32_t sm_count,
                                 int32_t num_splits, uint64_t* out_bytes);

/** Arguments of one MLA decode step (strides in elements; the innermost stride is 1). */
typedef struct GsMlaDecodeArgs {
  /** GsDtype of q and the KV cache. Output is bf16 for bf16 and fp8, fp16 for fp16. */
  int32_t dtype;
  int32_t batch;
  /** Query heads: 128 for sm100; a multiple of 16 up to 128 for sm90 (q/out are [batch, num_heads, ...]). */
  int32_t num_heads;
  /** Upper bound of seq_lens: sizes the splits and the workspace. */
  int32_t max_seq_len;
  int32_t num_splits;
  int32_t sm_count;
  int32_t device;
  /** [batch, num_heads, 512] */
  const void* q_nope;
  int64_t q_nope_stride_batch;
  int64_t q_nope_stride_head;
  /** [batch, num_heads, 64] */
  const void* q_pe;
  int64_t q_pe_stride_batch;
  int64_t q_pe_stride_head;
  /** [num_pages, page_size, 576], contiguous: latent (512) then rope (64) per token. */
  const void* kv_cache;
  int32_t num_pages;
  int32_t page_size;
  /** [batch] int32. sm100: each in 1..=max_seq_len. sm90: 0 gives zeros and LSE -inf; above max_seq_len is clamped. */
  const int32_t* seq_lens;
  /** [batch, page_table_stride] int32 page indices. */
  const int32_t* page_table;
  int32_t page_table_stride;
  /** [batch, num_heads, 512] */
  void* out;
  int64_t out_stride_batch;
  int64_t out_stride_head;
  /** [batch, 128] fp32 log-sum-exp, or NULL. */
  float* lse;
  float sm_scale;
} GsMlaDecodeArgs;

/**
 * Launches the CUTLASS sm100 MLA decode (and its split-KV reduction) on `stream`.
 * Returns GS_ERR_WORKSPACE_TOO_SMALL, launching nothing, when workspace_bytes is less than
 * gs_mla_sm100_workspace_bytes for these arguments. Only present when sm_100a was built.
 */
int gs_mla_sm100_decode(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes, void* stream);

/* ---- Hopper (sm_90a): graphsafe's own split-KV MLA decode + combine kernel ---------------- */

/** KV tokens per tile of the sm90 kernel: splits are counted in these. */
#define GS_MLA_SM90_TILE_S 64

/**
 * KV splits for the sm90 decode (host-only, every build). requested == 0 picks the default:
 * T = ceil(max_seq_len / 64), C = batch * ceil(num_heads / 64) CTAs per split,
 * cap = max(1, min(256, T, ceil(2 * sm_count / C))), and the smallest s in 1..=cap minimising
 * ceil(C * s / sm_count) * ceil(T / s) (waves x tiles per CTA; never leaves a split empty at
 * max_seq_len). requested > 0 is validated (1..=min(256, T)). Rationale and measurements:
 * cuda-src/mla/sm90/plan.cu.
 */
int gs_mla_sm90_num_splits(int32_t batch, int32_t num_heads, int32_t max_seq_len, int32_t sm_count, int32_t requested,
                           int32_t* out_splits);

/**
 * Workspace bytes of the sm90 decode: fp32 partial O [batch, splits, heads, 512] then fp32 partial
 * LSE [batch, splits, heads], each region 256-byte aligned; 0 for one split.
 */
int gs_mla_sm90_workspace_bytes(int32_t batch, int32_t num_heads, int32_t num_splits, uint64_t* out_bytes);

/**
 * Launches the sm90 decode (splits > 1: the split kernel, then the combine kernel) on `stream`.
 * bf16 or fp16 q/KV; page_size 64 or 128. GS_ERR_WORKSPACE_TOO_SMALL (nothing launched) when
 * workspace_bytes is below gs_mla_sm90_workspace_bytes. Only present when sm_90a was built.
 */
int gs_mla_sm90_decode(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHSAFE_KERNELS_MLA_H */

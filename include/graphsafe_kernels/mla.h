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

/** Fixed shape of the MLA decode kernels: DeepSeek-V2/V3 latent attention. GS_MLA_NUM_HEADS is
 *  the most query heads a decode takes (and the heads CUTLASS's sm100 kernel runs: fewer are
 *  padded up to it in the workspace). */
#define GS_MLA_NUM_HEADS 128
/** The most query tokens per request (s_q: MTP / speculative decode), each with its own heads. */
#define GS_MLA_MAX_S_Q 16
#define GS_MLA_LATENT_DIM 512
#define GS_MLA_ROPE_DIM 64
/** KV-sequence tile of the sm100 kernel (TileShapeS). */
#define GS_MLA_SM100_TILE_S 128
/** The most KV splits the default rule ever picks. */
#define GS_MLA_SM100_MAX_SPLITS 16
/** sm100 page sizes: a power of two up to this (a KV tile, GS_MLA_SM100_TILE_S, holds whole
 *  pages: the compact page table has GS_MLA_SM100_TILE_S / page_size columns a tile). */
#define GS_MLA_SM100_MAX_PAGE_SIZE 128

/*
 * Limits of the MLA decode and its planners (both back-ends). Every planning function below
 * refuses values outside them with GS_ERR_INVALID_ARGUMENT, and so does the decode.
 *   batch        1..=GS_MLA_MAX_BATCH     a grid dimension of both kernels
 *   max_seq_len  1..=GS_MLA_MAX_SEQ_LEN   2^31 - 128: every kernel computes len + tile - 1
 *                                         (tile <= 128) in int32
 *   sm_count     1..=GS_MLA_MAX_SM_COUNT  more than any GPU has; bounds the worst-case scans
 */
#define GS_MLA_MAX_BATCH 65535
#define GS_MLA_MAX_SEQ_LEN 2147483520
#define GS_MLA_MAX_SM_COUNT 1024

/*
 * Device data (seq_lens, page_table) is never trusted; both back-ends give it the same meaning:
 *   seq_lens[b] <= 0           an empty request: out[b] is all zeros and lse[b] is +inf (as
 *                              FlashMLA; so is every query row that attends no key: with causal
 *                              masks, token t of s_q attends keys 0 ..= len - s_q + t).
 *   seq_lens[b] > max_seq_len  clamped to max_seq_len.
 *   page index < 0             read as page 0;
 *   page index >= num_pages    read as page num_pages - 1 (clamped into the cache, never out of
 *                              it: its tokens hold whatever that page holds).
 * Only the columns that hold tokens of the (clamped) length are read from the caller's page table.
 * A NaN value in a bf16/fp16 cache, in a 656-byte cache's scales or rope, or a NaN per-tensor scale
 * makes the sm90 decode's heads it reaches NaN, LSE too: never an empty request's zeros and +inf,
 * never a hang. (e4m3's NaN codes are read as finite values: see gs_mla_sm90_decode.)
 * The sm90 kernel applies this itself. CUTLASS's sm100 kernel does not (a zero length with
 * batch > 1 is an empty persistent split, which hangs CUTLASS 4.2; page indices go straight into
 * addresses), so its decode first runs gs_mla_sanitize on the stream, which writes the clamped
 * lengths and a clamped, compact page table into the workspace for CUTLASS to read, and after it
 * gs_mla_sanitize_finish, which writes the zeros and +inf of every query row that attends no key.
 */

/*
 * ---- sm100 (CUTLASS 4.2, examples/77_blackwell_fmha): the shapes graphsafe adapts -----------
 * CUTLASS's kernel runs exactly one query token of GS_MLA_NUM_HEADS heads per request. graphsafe
 * adapts every other shape inside its workspace; the caller passes the decode as it is:
 *   kernel requests  CUTLASS runs B' = batch * s_q requests (<= GS_MLA_MAX_BATCH, else
 *                    GS_ERR_INVALID_ARGUMENT): kernel request j = b * s_q + t is token t of request
 *                    b, over request b's page-table row, with the length
 *                      len'(j) = causal ? L_b - (s_q - 1 - t) : L_b,  L_b = clamp(seq_lens[b], 0, max_seq_len)
 *                    (<= 0: the row attends no key; it is run as one token and overwritten with
 *                    zeros and +inf). The split rule (gs_mla_sm100_num_splits) is applied to B'.
 *   direct           num_heads == 128 and s_q == 1: CUTLASS reads q and writes out and lse in
 *                    place (B' = batch), so their strides must suit its tensor maps (multiples of
 *                    16 bytes), and with num_splits > 1 out must be dense.
 *   adapted          any other shape: the pre-pass copies q into the region's q staging
 *                    [B', 128, 576] (latent then rope, heads num_heads..127 zero), CUTLASS writes
 *                    the out staging [B', 128, 512] and lse staging [B', 128], and the post-pass
 *                    copies heads 0..num_heads of kernel request j to out[b, t] and lse[b, :, t]
 *                    (any strides). Costs: the copies, and CUTLASS computes 128 heads whatever
 *                    num_heads is, and reads request b's keys s_q times.
 */

/** The shape the sm100 planning functions size for (host-only; see "the shapes graphsafe adapts"). */
typedef struct GsMlaSm100Shape {
  /** GsDtype of q (the q staging holds q's elements: 1 byte for fp8, else 2). */
  int32_t dtype;
  /** Requests of the caller (the kernel runs batch * s_q). */
  int32_t batch;
  /** Query heads, 1..=GS_MLA_NUM_HEADS. */
  int32_t num_heads;
  /** Query tokens per request, 1..=GS_MLA_MAX_S_Q. */
  int32_t s_q;
  int32_t max_seq_len;
  /** A power of two up to GS_MLA_SM100_MAX_PAGE_SIZE. */
  int32_t page_size;
  /** SMs of the GPU (only gs_mla_sm100_workspace_bytes reads it: the split rule). */
  int32_t sm_count;
  /** KV splits, as gs_mla_sm100_num_splits gives them for batch * s_q requests. */
  int32_t num_splits;
} GsMlaSm100Shape;

/**
 * Number of KV splits for the CUTLASS 4.2 sm100 MLA kernel. `batch` is the requests the kernel
 * runs: batch * s_q of the decode (see "the shapes graphsafe adapts").
 *
 * requested == 0 picks the default, safe rule; requested > 0 is validated against the same rule
 * and returned unchanged, or refused with GS_ERR_UNSAFE_SPLIT. The rule (why: docs/ARCHITECTURE.md, "The CUTLASS 4.2 MLA split-KV rule"):
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
 * Where the sm100 decode keeps what it makes for CUTLASS: a region of the workspace after
 * CUTLASS's own part (see gs_mla_sm100_workspace_bytes). Offsets are relative to the region's
 * start, each 256-byte aligned, the parts in this order; a part that is absent has no bytes (its
 * offset is where it would start, so equal to the next part's). B' = kernel_batch.
 */
typedef struct GsMlaSanitizeLayout {
  /** int32 [B']: len' clamped to 0..=max_seq_len; 0 marks a row that attends no key. */
  uint64_t lens_offset;
  /** int32 [B']: max(1, lens): the lengths CUTLASS reads (an empty row runs one token). */
  uint64_t kernel_lens_offset;
  /** int32 [B', columns]: the clamped, compact page table CUTLASS reads (kernel request j: a
   *  copy of request j / s_q's row). */
  uint64_t page_table_offset;
  /**
   * fp32 [B', 128], the LSE CUTLASS writes when it does not write the caller's: adapted decodes
   * (the lse staging, always given to CUTLASS), and direct ones with num_splits > 1 (a scratch
   * used when the caller passes no lse: CUTLASS 4.2 writes the per-split LSE its reduction reads
   * only when it has an lse pointer). Absent otherwise.
   */
  uint64_t lse_offset;
  /** Adapted only: q's elements [B', 128, 576] (latent then rope; heads num_heads.. zero). */
  uint64_t q_offset;
  /** Adapted only: 16-bit output elements [B', 128, 512] (dense: also what CUTLASS's split
   *  reduction writes). */
  uint64_t out_offset;
  /** Bytes of the region. */
  uint64_t bytes;
  /** Columns of the compact page table: ceil(max_seq_len / 128) * (128 / page_size), whole KV
   *  tiles, because CUTLASS reads the page indices of a tile's every page. */
  int32_t columns;
  /** B' = batch * s_q: the requests CUTLASS runs. */
  int32_t kernel_batch;
  /** 1 when the decode is adapted (num_heads < 128 or s_q > 1), 0 when direct. */
  int32_t adapted;
} GsMlaSanitizeLayout;

/**
 * The region's layout for `shape` (host-only, every build; shape->sm_count is not read).
 * GS_ERR_INVALID_ARGUMENT beyond the limits above, for batch * s_q above GS_MLA_MAX_BATCH, or when
 * B' * columns exceeds INT32_MAX (CUTLASS indexes the page table with int32).
 */
int gs_mla_sanitize_layout(const GsMlaSm100Shape* shape, GsMlaSanitizeLayout* out_layout);

/**
 * Workspace bytes of the sm100 MLA decode of `shape`, laid out as the decode uses them:
 *   [0, C)                 CUTLASS's part: device::MLA<Kernel>::get_workspace_size for the kernel
 *                          instantiated for `dtype`, for B' requests (0 for one split, else
 *                          (4 * 512 + 4) * 128 * num_splits * B'; splits > 1 only for B' = 1);
 *   [round_up(C, 256), +)  the region, gs_mla_sanitize_layout's `bytes`.
 * The total is round_up(C, 256) + bytes. Also checks the split count against the safety rule for
 * B' requests (GS_ERR_UNSAFE_SPLIT).
 */
int gs_mla_sm100_workspace_bytes(const GsMlaSm100Shape* shape, uint64_t* out_bytes);

/**
 * How the sm90 decode's kv_cache stores K and V (GsMlaDecodeArgs::kv_format). Queries are bf16
 * (or fp16 for GS_MLA_KV_NATIVE) and the output is bf16 for the fp8 formats.
 */
typedef enum GsMlaKvFormat {
  /** [num_pages, page_size, 576] in q's dtype (the only format of the sm100 back-end). */
  GS_MLA_KV_NATIVE = 0,
  /**
   * [num_pages, page_size, 576] fp8 e4m3, one f32 scale for the whole cache in device memory
   * (kv_scale, read by the kernel when it runs): K = V = scale * e4m3 (vLLM's fp8 KV cache).
   */
  GS_MLA_KV_FP8_PER_TENSOR = 1,
  /**
   * DeepSeek V3.2's 656-byte token, [num_pages, page_size, 656] bytes: 512 e4m3 latent values,
   * 4 f32 scales (one per 128 latent values), 64 bf16 rope values. K = V = bf16(scale_g * e4m3)
   * for the latent (the product in f32, rounded once to bf16), the rope as stored. Up to 32 query
   * rows (s_q * num_heads) the sm90 kernel rounds the scale (times a power of two) and the product
   * to fp16 instead: within one bf16 step of those values and closer to the exact product, except
   * where those fall below fp16's normals (a group scale below 2^-20 of its token's or group's
   * largest, or a tiny product): there the absolute error stays below 2^-22 of that largest scale
   * (graphsafe's reference module states the bounds).
   */
  GS_MLA_KV_FP8_DS_MLA = 2,
} GsMlaKvFormat;

/** Bytes per token of GS_MLA_KV_FP8_DS_MLA. */
#define GS_MLA_DS_MLA_TOKEN_BYTES 656

/**
 * Arguments of one MLA decode step (strides in elements; the innermost stride is 1). q and out
 * are [batch, s_q, num_heads, dim]: s_q query tokens per request (MTP / speculative decode), each
 * with num_heads heads; lse is [batch, num_heads, s_q] (FlashMLA's layout).
 */
typedef struct GsMlaDecodeArgs {
  /** GsDtype of q and the KV cache. Output is bf16 for bf16 and fp8, fp16 for fp16. */
  int32_t dtype;
  int32_t batch;
  /** Query heads, 1..=GS_MLA_NUM_HEADS on both back-ends (sm100 pads them to 128 in its workspace). */
  int32_t num_heads;
  /** Query tokens per request, 1..=GS_MLA_MAX_S_Q. */
  int32_t s_q;
  /** Non-zero: token t of s_q attends keys 0 ..= len - s_q + t (FlashMLA's causal); else every key. */
  int32_t causal;
  /** Upper bound of seq_lens: sizes the splits and the workspace. */
  int32_t max_seq_len;
  int32_t num_splits;
  int32_t sm_count;
  int32_t device;
  /** [batch, s_q, num_heads, 512] */
  const void* q_nope;
  int64_t q_nope_stride_batch;
  int64_t q_nope_stride_token;
  int64_t q_nope_stride_head;
  /** [batch, s_q, num_heads, 64] */
  const void* q_pe;
  int64_t q_pe_stride_batch;
  int64_t q_pe_stride_token;
  int64_t q_pe_stride_head;
  /**
   * [num_pages, page_size, 576] elements, contiguous: latent (512) then rope (64) per token; for
   * GS_MLA_KV_FP8_DS_MLA [num_pages, page_size, 656] bytes. 16-byte aligned.
   */
  const void* kv_cache;
  int32_t num_pages;
  int32_t page_size;
  /** [batch] int32 device data, any value (see "Device data" above). */
  const int32_t* seq_lens;
  /** [batch, page_table_stride] int32 page indices, device data, any value (see "Device data" above). */
  const int32_t* page_table;
  int32_t page_table_stride;
  /** [batch, s_q, num_heads, 512]; a direct sm100 decode (128 heads, one token) with num_splits > 1
   *  (single requests only) takes only out_stride_head 512: CUTLASS's split reduction writes out
   *  densely whatever the strides (an adapted one writes its staging, any strides). */
  void* out;
  int64_t out_stride_batch;
  int64_t out_stride_token;
  int64_t out_stride_head;
  /** [batch, num_heads, s_q] fp32 log-sum-exp, or NULL. */
  float* lse;
  float sm_scale;
  /** GsMlaKvFormat (sm90 only; the sm100 decode refuses any but GS_MLA_KV_NATIVE). */
  int32_t kv_format;
  /**
   * GS_MLA_KV_FP8_PER_TENSOR: the f32 scale, device memory, 4-byte aligned; NULL otherwise. Device
   * data like seq_lens: any value is read as it is (NaN or inf make the output NaN, never a hang or
   * an access outside the cache).
   */
  const float* kv_scale;
} GsMlaDecodeArgs;

/**
 * What CUTLASS's sm100 kernel is given for one decode (gs_mla_sm100_kernel_args), after graphsafe's
 * adaptation: pointers are addresses in the caller's tensors (direct) or in the workspace; strides
 * are in elements, CUTLASS's (head, batch) order; the inner stride is 1.
 */
typedef struct GsMlaSm100KernelArgs {
  /** B': the requests CUTLASS runs (its problem shape's batch). */
  int32_t batch;
  /** 1: q, out and lse are the region's staging; 0: the caller's tensors. */
  int32_t adapted;
  int32_t max_seq_len;
  int32_t num_splits;
  /** hw_info.sm_count: the caller's sm_count rounded down to even (2-SM clusters). */
  int32_t sm_count;
  int32_t page_size;
  int32_t page_count;
  /** Row stride of `page_table`: the layout's columns. */
  int32_t page_table_stride;
  /** [B', 128, 512]. */
  const void* q_latent;
  int64_t q_latent_stride_head;
  int64_t q_latent_stride_batch;
  /** [B', 128, 64]. */
  const void* q_rope;
  int64_t q_rope_stride_head;
  int64_t q_rope_stride_batch;
  /** [B', 128, 512] output elements. */
  void* out;
  int64_t out_stride_head;
  int64_t out_stride_batch;
  /** fp32 [B', 128] (batch stride lse_stride_batch, head stride 1), or NULL: CUTLASS writes no LSE. */
  float* lse;
  int32_t lse_stride_batch;
  /** int32 [B']: the region's kernel_lens. */
  const int32_t* seq_lens;
  /** int32 [B', page_table_stride]: the region's compact page table. */
  const int32_t* page_table;
  /** CUTLASS's part of the workspace: [workspace, workspace + cutlass_bytes). */
  uint64_t cutlass_bytes;
  /** The region: workspace + round_up(cutlass_bytes, 256), laid out as `layout`. */
  void* region;
  GsMlaSanitizeLayout layout;
} GsMlaSm100KernelArgs;

/**
 * Checks a decode's host-side arguments as gs_mla_sm100_decode does and computes what CUTLASS is
 * given (host-only, every build: nothing is dereferenced, so tests run it on any address). The
 * workspace is `workspace_bytes` bytes at `workspace`, 16-byte aligned; GS_ERR_WORKSPACE_TOO_SMALL
 * when it is below gs_mla_sm100_workspace_bytes; GS_ERR_UNSAFE_SPLIT for a split count the rule
 * refuses; GS_ERR_INVALID_ARGUMENT for anything else (a direct decode's strides that CUTLASS's
 * tensor maps cannot take included).
 */
int gs_mla_sm100_kernel_args(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes,
                             GsMlaSm100KernelArgs* out);

/**
 * The sanitize pre-pass, on `stream` (every arch that was built). Reads of `args`: dtype, batch,
 * num_heads, s_q, causal, max_seq_len, num_splits, page_size, num_pages, seq_lens [batch], the
 * caller's page table ([batch, page_table_stride], only the columns a request's clamped length
 * covers) and, when adapted, q_nope and q_pe with their strides (16-byte vector copies when the
 * addresses and strides allow, else element by element); nothing else (other pointers may be
 * NULL). Writes into `region` (gs_mla_sanitize_layout's layout for the args, at least its `bytes`
 * bytes), for every kernel request j = b * s_q + t:
 *   lens[j]         len'(j) clamped to 0..=max_seq_len (see "the shapes graphsafe adapts")
 *   kernel_lens[j]  max(1, lens[j])
 *   page table      column c of row j: clamp(page_table[b][c], 0, num_pages - 1) for
 *                   c < ceil(kernel_lens[j] / page_size), 0 for the other columns
 *   q staging       adapted: [j, h, 0..512] = q_nope[b, t, h], [j, h, 512..576] = q_pe[b, t, h]
 *                   for h < num_heads; zeros for the other heads
 * Nothing else in the region is written. Validates everything before it enqueues anything.
 */
int gs_mla_sanitize(const GsMlaDecodeArgs* args, void* region, uint64_t region_bytes, void* stream);

/**
 * The post-pass, on `stream`, after the kernel. Reads of `args`: batch, num_heads, s_q, out with
 * its strides (16-bit elements), lse (or NULL); `layout` must be gs_mla_sanitize_layout's for a
 * decode of that batch, num_heads and s_q (kernel_batch and adapted are checked, and every part
 * read lies in region_bytes). For every kernel request j = b * s_q + t with e = (lens[j] == 0):
 *   direct   (out and lse hold CUTLASS's result) rows with e: out[b, 0, 0..128, 0..512] = 0 and
 *            lse[b * 128 + 0..128] = +inf; nothing else is touched;
 *   adapted  for h < num_heads: out[b, t, h, 0..512] = e ? 0 : out staging [j, h], and
 *            lse[(b * num_heads + h) * s_q + t] = e ? +inf : lse staging [j, h].
 */
int gs_mla_sanitize_finish(const GsMlaDecodeArgs* args, const GsMlaSanitizeLayout* layout, const void* region,
                           uint64_t region_bytes, void* stream);

/**
 * Launches the CUTLASS sm100 MLA decode on `stream`: gs_mla_sanitize, the kernel (and its split-KV
 * reduction) with gs_mla_sm100_kernel_args' arguments, gs_mla_sanitize_finish. Any num_heads
 * 1..=128 and s_q 1..=16 (causal or not): see "the shapes graphsafe adapts". Returns
 * GS_ERR_WORKSPACE_TOO_SMALL, launching nothing, when workspace_bytes is less than
 * gs_mla_sm100_workspace_bytes for these arguments (the workspace is never optional: it holds the
 * sanitize region); any other refusal also launches nothing. Only present in builds with the
 * sm100 MLA back-end (the sm_100f row).
 */
int gs_mla_sm100_decode(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes, void* stream);

/* ---- Hopper (sm_90a): graphsafe's own split-KV MLA decode + combine kernel ---------------- */

/** KV tokens per tile of the sm90 kernel: splits are counted in these. */
#define GS_MLA_SM90_TILE_S 64
/** The most KV splits the sm90 decode takes (its combine kernel holds a request's split LSEs in
 *  registers sized for this many). */
#define GS_MLA_SM90_MAX_SPLITS 256
/** sm90 page sizes: a power of two from GS_MLA_SM90_MIN_PAGE_SIZE to GS_MLA_SM90_MAX_PAGE_SIZE
 *  (64 or 128). The minimum is the tile: a 64-token tile never crosses a page, so the kernels
 *  look up one page per tile (half-tile for the fp8 loaders). */
#define GS_MLA_SM90_MIN_PAGE_SIZE 64
#define GS_MLA_SM90_MAX_PAGE_SIZE 128

/**
 * KV splits for the sm90 decode (host-only, every build). Its kernels take the s_q * num_heads
 * query rows of a request as one set of rows (FlashMLA's fold), 64 a CTA (all of them in one CTA
 * for 32 or fewer). requested == 0 picks the default:
 * T = ceil(max_seq_len / 64), C = batch * ceil(s_q * num_heads / 64) CTAs per split,
 * cap = max(1, min(GS_MLA_SM90_MAX_SPLITS, T, ceil(2 * sm_count / C))), and the smallest s in 1..=cap minimising
 * ceil(C * s / sm_count) * ceil(T / s) (waves x tiles per CTA; never leaves a split empty at
 * max_seq_len). requested > 0 is validated (1..=min(GS_MLA_SM90_MAX_SPLITS, T)). Rationale and measurements:
 * cuda-src/mla/sm90/plan.cu.
 */
int gs_mla_sm90_num_splits(int32_t batch, int32_t num_heads, int32_t s_q, int32_t max_seq_len, int32_t sm_count,
                           int32_t requested, int32_t* out_splits);

/**
 * Workspace bytes of the sm90 decode: for splits > 1, partial O [batch, splits, s_q * num_heads,
 * 512] fp32 then fp32 partial LSE [batch, splits, s_q * num_heads];
 * for batch > 1 its work schedule, int32 [batch] lengths then int32 [batch, splits] work items;
 * each region 256-byte aligned (cuda-src/mla/sm90/workspace.h); 0 for one request in one split.
 */
int gs_mla_sm90_workspace_bytes(int32_t batch, int32_t num_heads, int32_t s_q, int32_t num_splits, uint64_t* out_bytes);

/**
 * Launches the sm90 decode (splits > 1: the split kernel, then the combine kernel) on `stream`.
 * bf16 or fp16 q/KV (GS_MLA_KV_NATIVE), or bf16 q over an fp8 cache (the other GsMlaKvFormat
 * values, every head count); page_size 64 or 128 (GS_MLA_SM90_MIN/MAX_PAGE_SIZE). An fp8 code 0x7F or 0xFF (e4m3's NaN) is read as a
 * finite value below 2^17 (times its scale), not as NaN: caches written by saturating conversions
 * never hold it. GS_ERR_WORKSPACE_TOO_SMALL (nothing launched) when
 * workspace_bytes is below gs_mla_sm90_workspace_bytes. Only present when sm_90a was built.
 */
int gs_mla_sm90_decode(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHSAFE_KERNELS_MLA_H */

// graphsafe-build: archs=mla:sm90 kind=object mem_mib=250
// graphsafe's own Hopper (sm_90a) split-KV MLA decode: gs_mla_sm90_decode.
//
// Design (kernels in kernels.cuh):
//   * KV tiles of 64 tokens (one tile never crosses a page: pages are 64 or 128 tokens) are
//     streamed by a producer warp with TMA (a 2-D tensor map over the cache viewed as
//     [num_pages * page_size, 576]; nine 64 x 64 boxes per tile, 128-byte swizzle) into two stages.
//   * Query rows: a request's s_q tokens x heads fold into one set of rows (FlashMLA's fold), each
//     with its own causal limit; every KV tile is read once for all of a CTA's rows.
//   * More than 32 rows, bf16/fp16 cache ("seesaw", kernel_seesaw.cuh): a CTA per (64-row group,
//     split, request); the tiles in pairs, each warpgroup computes S = Q.K^T (wgmma m64n64k16, Q
//     resident in shared memory) and the softmax of one tile of the pair and owns half of O's
//     columns, so one's softmax runs under the other's wgmma.
//   * More than 32 rows, 656-byte fp8 cache: the same seesaw kernel over bf16 stages that its
//     producer warpgroup fills by converting the raw codes (cp.async into a ring of half-boxes,
//     fp8.cuh); row groups that come in pairs share the conversion (2-CTA clusters).
//   * More than 32 rows, per-tensor fp8 cache ("seesaw RS", kernel_seesaw_rs.cuh): the seesaw
//     kernel's schedule with the N8 kernel's operands (below): S^T = K.Q^T and O^T = V^T.P^T, the
//     math warps converting the raw tiles of a TMA ring into the A registers of fp16 wgmmas.
//   * Up to 32 rows ("N"): tokens as M, rows as N (wgmma m64n16/m64n32, rows padded to 16 or 32
//     with zero queries); the two warpgroups take alternate tiles and merge at the end.
//   * splits > 1: partial O (in the output dtype) and fp32 LSE to the workspace, then the combine kernel.
//   * fp8 caches (bf16 queries), either format, up to 32 rows ("N8", kernel_n_fp8.cuh): no bf16
//     stages; a ring of raw tiles that the math warps convert straight into the A registers of
//     fp16 wgmmas (the 656-byte format's group scales multiplied in as they convert).
// No allocation, no legacy stream, no atomics: deterministic and capturable.
#include <atomic>
#include <climits>
#include <cmath>
#include "common/launch.cuh"
#include "common/status.cuh"
#include "graphsafe_kernels/mla.h"
#include "mla/rules.h"
#include "mla/sm90/kernels.cuh"
#include "mla/sm90/workspace.h"

using namespace graphsafe::mla_sm90;

namespace {

using graphsafe::sm90::encode_fn;
using graphsafe::sm90::EncodeTiled;
using graphsafe::sm90::ensure_smem;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int validate(const GsMlaDecodeArgs* a) {
  if (a == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (a->dtype != GS_DTYPE_BF16 && a->dtype != GS_DTYPE_FP16) return GS_ERR_INVALID_ARGUMENT;  // fp8 q: sm100 only
  switch (a->kv_format) {
    case GS_MLA_KV_NATIVE: break;
    case GS_MLA_KV_FP8_PER_TENSOR:
      if (a->kv_scale == nullptr || (reinterpret_cast<uintptr_t>(a->kv_scale) & 3u) != 0) return GS_ERR_INVALID_ARGUMENT;
      [[fallthrough]];
    case GS_MLA_KV_FP8_DS_MLA:  // bf16 queries, any head count the kernels take
      if (a->dtype != GS_DTYPE_BF16) return GS_ERR_INVALID_ARGUMENT;
      break;
    default: return GS_ERR_INVALID_ARGUMENT;
  }
  namespace rules = graphsafe::mla_rules;
  if (!rules::batch_ok(a->batch) || !rules::rows_ok(a->num_heads, a->s_q)) return GS_ERR_INVALID_ARGUMENT;  // grid.z
  if (a->causal != 0 && a->causal != 1) return GS_ERR_INVALID_ARGUMENT;
  if (a->max_seq_len <= 0 || a->max_seq_len > GS_MLA_MAX_SEQ_LEN || a->device < 0) return GS_ERR_INVALID_ARGUMENT;
  const int64_t tiles = ceil_div(a->max_seq_len, GS_MLA_SM90_TILE_S);
  if (!rules::sm90_splits_ok(a->num_splits) || a->num_splits > tiles) return GS_ERR_INVALID_ARGUMENT;
  if (!rules::sm90_page_size_ok(a->page_size)) return GS_ERR_INVALID_ARGUMENT;
  if (a->num_pages <= 0 || int64_t(a->num_pages) * a->page_size > INT_MAX) return GS_ERR_INVALID_ARGUMENT;
  if (a->page_table_stride < ceil_div(a->max_seq_len, a->page_size) && a->batch > 1) return GS_ERR_INVALID_ARGUMENT;
  if (a->q_nope == nullptr || a->q_pe == nullptr || a->kv_cache == nullptr || a->seq_lens == nullptr ||
      a->page_table == nullptr || a->out == nullptr)
    return GS_ERR_INVALID_ARGUMENT;
  if (!aligned16(a->kv_cache)) return GS_ERR_INVALID_ARGUMENT;  // TMA
  if (!(std::isfinite(a->sm_scale) && a->sm_scale > 0.f)) return GS_ERR_INVALID_ARGUMENT;
  return GS_OK;
}

// The tensor maps of a launch: the cache's (bf16: 64 x 64 boxes, 128-byte swizzle; fp8 over the
// cache as [tokens, token bytes]: for the N8 kernel 64-byte x 64-row boxes, 64-byte swizzle), for
// the N8 kernel's 656-byte format its scales (16 bytes x 64 rows), and for the seesaw kernel's
// 656-byte format its bf16 rope (128 bytes x 64 rows, swizzled as a bf16 block; the seesaw
// kernel's fp8 feed loads the codes without a map). A map a launch's kernel never reads stays
// zero.
struct Maps {
  CUtensorMap kv, scale;
};

// Launches with programmatic stream serialization (launch_pdl, common/launch.cuh) for the N kernel
// (16/32 heads) and the combine after it, the memory-bound path: each grid's CTAs are then launched
// onto SMs as the previous grid's CTAs exit, instead of after that whole grid has completed (H200,
// graphs of 10 decodes: 16 heads 64 x 4096 86.7 -> 84.6 us, 32 heads 95.1 -> 91.5, 16 heads
// 16 x 16384 87.6 -> 85.3, 1 x 65536 unchanged). The seesaw kernel is launched plainly:
// with PDL they measured slower at 128 heads (1 x 65536: 62.2 against 57.3 us with an L2 prefetch
// before the wait; 16 x 16384 125.0 against 120.1 us waiting at entry with no prefetch;
// docs/notes/2026-12-performance-log.md).
// Both wait (griddepcontrol.wait) before their first access to memory, so the grid before them has
// completed and flushed whenever they read; their loads of data an earlier grid may write still go
// through L2 (ld.global.cg: q, the bf16 producer's page table, kv_scale, the partials; TMA reads L2
// too), except the fp8 producers' page tables, where that measured slower (kernel_n_fp8.cuh,
// produce_raw_ring).

template <int N, bool F16>
int launch_n(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  constexpr auto k = mla_sm90_n_kernel<N, F16>;
  constexpr int smem = NLayout<N>::kSmem;
  if (int st = ensure_smem<k>(a.device, smem); st != GS_OK) return st;
  const cudaError_t e = graphsafe::launch_pdl(k, dim3(1, a.num_splits, a.batch), dim3(kThreads), smem, stream, m.kv, p);
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

// The fp8 caches at 16/32 heads: the N8 kernel (kernel_n_fp8.cuh), launched like the N kernel.
template <int N, int KV>
int launch_n8(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  constexpr auto k = mla_sm90_n8_kernel<N, KV>;
  constexpr int smem = N8Layout<N, KV>::kSmem;
  if (int st = ensure_smem<k>(a.device, smem); st != GS_OK) return st;
  const cudaError_t e = graphsafe::launch_pdl(k, dim3(1, a.num_splits, a.batch), dim3(kThreads), smem, stream, m.kv, m.scale, p);
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

template <int N, bool F16>
int launch_n_format(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  if constexpr (!F16) {
    if (a.kv_format == GS_MLA_KV_FP8_PER_TENSOR) return launch_n8<N, kKvFp8PerTensor>(a, m, p, stream);
    if (a.kv_format == GS_MLA_KV_FP8_DS_MLA) return launch_n8<N, kKvFp8DsMla>(a, m, p, stream);
  }
  return launch_n<N, F16>(a, m, p, stream);
}

template <bool F16, int KV, bool kPair>
int launch_seesaw(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  constexpr auto k = mla_sm90_seesaw_kernel<F16, KV, kPair>;
  constexpr int smem = seesaw_smem<KV>();
  if (int st = ensure_smem<k>(a.device, smem); st != GS_OK) return st;
  const dim3 grid((p.rows + 63) / 64, a.num_splits, a.batch);
  if constexpr (kPair) {
    const cudaError_t e = graphsafe::launch_ex(k, grid, dim3(kThreads), smem, stream, false, dim3(2, 1, 1), m.kv, p);
    return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
  }
  k<<<grid, dim3(kThreads), smem, stream>>>(m.kv, p);
  return GS_OK;
}

// The 656-byte cache's seesaw: one CTA a row group converting all of each tile, except when the
// row groups come in pairs (128 heads, or 64 with two query tokens): clusters of two that share
// the conversion (fp8.cuh). The pair pays the peer copy's latency on the math's path; it gains
// where the conversion costs most. Measured (H100, 128 heads 64 x 4096, design 7.3.2): 211 -> 197
// us paired.
int launch_seesaw_ds(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  if (((p.rows + 63) / 64) % 2 == 0) return launch_seesaw<false, kKvFp8DsMla, true>(a, m, p, stream);
  return launch_seesaw<false, kKvFp8DsMla, false>(a, m, p, stream);
}

// The per-tensor fp8 cache over more than 32 rows: the seesaw RS kernel (kernel_seesaw_rs.cuh).
int launch_seesaw_rs(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  constexpr auto k = mla_sm90_seesaw_rs_kernel;
  constexpr int smem = SeesawRsLayout::kSmem;
  if (int st = ensure_smem<k>(a.device, smem); st != GS_OK) return st;
  k<<<dim3((p.rows + 63) / 64, a.num_splits, a.batch), dim3(kThreads), smem, stream>>>(m.kv, p);
  return GS_OK;
}

// More than 32 query rows: a CTA a 64-row group; the seesaw kernel, or its RS variant over the
// per-tensor fp8 cache.
template <bool F16>
int launch_head_groups(const GsMlaDecodeArgs& a, const Maps& m, const Params& p, cudaStream_t stream) {
  if constexpr (!F16) {
    if (a.kv_format == GS_MLA_KV_FP8_PER_TENSOR) return launch_seesaw_rs(a, m, p, stream);
    if (a.kv_format == GS_MLA_KV_FP8_DS_MLA) return launch_seesaw_ds(a, m, p, stream);
  }
  return launch_seesaw<F16, kKvNative, false>(a, m, p, stream);
}

// Up to 32 query rows (s_q x heads) run the N kernel (rows as the MMA's N, padded to 16 or 32, one
// CTA per split and request); more, the 64-row-group kernels. The combine's launch follows the
// same choice. (Until heads came in any count, 16 and 32 heads were the N kernel's and 48..128
// the groups'; the bound is where it was.)
constexpr bool runs_n_kernel(int64_t rows) { return rows <= 32; }

template <bool F16>
int launch(const GsMlaDecodeArgs& a, const Maps& maps, const Params& p, cudaStream_t stream) {
  cudaError_t e;
  if (p.sched_lens != nullptr) {  // a batch: its work order first (schedule.cuh)
    launch_schedule(p, stream);
    if ((e = cudaGetLastError()) != cudaSuccess) return graphsafe::cuda_failed(e);
  }
  const int st = !runs_n_kernel(p.rows) ? launch_head_groups<F16>(a, maps, p, stream)
                 : p.rows <= 16          ? launch_n_format<16, F16>(a, maps, p, stream)
                                         : launch_n_format<32, F16>(a, maps, p, stream);
  if (st != GS_OK) return st;
  if ((e = cudaGetLastError()) != cudaSuccess) return graphsafe::cuda_failed(e);
  if (a.num_splits > 1) {
    // A warp a head only when there are enough heads to fill the GPU with such chains.
    const bool warp_a_head = a.num_splits <= kCombineFewSplits && int64_t(a.batch) * p.rows >= kCombineWarpHeads;
    const dim3 grid = warp_a_head ? dim3((p.rows + 3) / 4, a.batch) : dim3(p.rows, a.batch);
    const dim3 block = dim3(warp_a_head ? 128 : combine_threads<16>());
    const auto combine = warp_a_head ? mla_sm90_combine_kernel<F16, 1> : mla_sm90_combine_kernel<F16, 16>;
    if (runs_n_kernel(p.rows)) {  // programmatically dependent after the N kernel (see above)
      e = graphsafe::launch_pdl(combine, grid, block, 0, stream, p);
    } else {
      combine<<<grid, block, 0, stream>>>(p);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) return graphsafe::cuda_failed(e);
  }
  return GS_OK;
}

}  // namespace

extern "C" int gs_mla_sm90_decode(const GsMlaDecodeArgs* args, void* workspace, uint64_t workspace_bytes, void* stream) {
  if (int st = validate(args); st != GS_OK) return st;
  const GsMlaDecodeArgs& a = *args;
  uint64_t need = 0;
  if (int st = gs_mla_sm90_workspace_bytes(a.batch, a.num_heads, a.s_q, a.num_splits, &need); st != GS_OK) return st;
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return GS_ERR_WORKSPACE_TOO_SMALL;

  Params p{};
  p.q_nope = static_cast<const uint16_t*>(a.q_nope);
  p.q_nope_sb = a.q_nope_stride_batch;
  p.q_nope_st = a.q_nope_stride_token;
  p.q_nope_sh = a.q_nope_stride_head;
  p.q_pe = static_cast<const uint16_t*>(a.q_pe);
  p.q_pe_sb = a.q_pe_stride_batch;
  p.q_pe_st = a.q_pe_stride_token;
  p.q_pe_sh = a.q_pe_stride_head;
  p.seq_lens = a.seq_lens;
  p.page_table = a.page_table;
  p.page_table_stride = a.page_table_stride;
  p.page_size = a.page_size;
  p.num_pages = a.num_pages;
  p.max_seq_len = a.max_seq_len;
  p.num_heads = a.num_heads;
  p.s_q = a.s_q;
  p.rows = a.s_q * a.num_heads;  // <= 16 x 128 (validated)
  p.causal = a.causal;
  p.num_splits = a.num_splits;
  p.q_vec = aligned16(a.q_nope) && aligned16(a.q_pe) && a.q_nope_stride_batch % 8 == 0 && a.q_nope_stride_token % 8 == 0 &&
            a.q_nope_stride_head % 8 == 0 && a.q_pe_stride_batch % 8 == 0 && a.q_pe_stride_token % 8 == 0 &&
            a.q_pe_stride_head % 8 == 0;
  p.out_vec = aligned16(a.out) && a.out_stride_batch % 8 == 0 && a.out_stride_token % 8 == 0 && a.out_stride_head % 8 == 0;
  p.out = static_cast<uint16_t*>(a.out);
  p.out_sb = a.out_stride_batch;
  p.out_st = a.out_stride_token;
  p.out_sh = a.out_stride_head;
  p.lse = a.lse;
  p.batch = a.batch;
  {
    // The layout gs_mla_sm90_workspace_bytes sized (and checked for overflow) above.
    namespace ws = graphsafe::mla_sm90_workspace;
    static_assert(sizeof(*p.ws_o) == ws::kPartialElemBytes && kNope == GS_MLA_LATENT_DIM, "workspace.h's layout");
    ws::Layout layout{};
    if (!ws::layout(uint64_t(a.batch), uint64_t(p.rows), uint64_t(a.num_splits), &layout)) return GS_ERR_INVALID_ARGUMENT;
    auto* base = static_cast<uint8_t*>(workspace);
    if (a.num_splits > 1) {
      p.ws_o = reinterpret_cast<float*>(base);
      p.ws_lse = reinterpret_cast<float*>(base + layout.lse_offset);
    }
    if (a.batch > 1) {
      // Work items of ceil(T_max / splits) tiles: the longest request splits as before, shorter
      // ones into fewer items (schedule.cuh).
      const int64_t tiles = ceil_div(a.max_seq_len, GS_MLA_SM90_TILE_S);
      p.chunk = int32_t(ceil_div(tiles, a.num_splits));
      p.sched_lens = reinterpret_cast<int32_t*>(base + layout.lens_offset);
      p.sched_items = a.batch <= kSchedMaxSorted ? reinterpret_cast<int32_t*>(base + layout.items_offset) : nullptr;
    }
  }
  p.scale_log2 = a.sm_scale * kLog2e;
  p.kv_scale = a.kv_scale;
  p.kv_cache = static_cast<const uint8_t*>(a.kv_cache);

  EncodeTiled encode = nullptr;
  if (int st = encode_fn(&encode); st != GS_OK) return st;
  const cuuint64_t tokens = cuuint64_t(a.num_pages) * cuuint64_t(a.page_size);
  // A 2-D map over the cache as [tokens, row] elements (u16 for bf16/fp16, bytes for fp8).
  auto encode_map = [&](CUtensorMap* map, bool bytes, cuuint64_t row, cuuint32_t box_x, cuuint32_t box_y,
                        CUtensorMapSwizzle swizzle) {
    const cuuint64_t dims[2] = {row, tokens};
    const cuuint64_t strides[1] = {row * (bytes ? 1 : 2)};
    const cuuint32_t box[2] = {box_x, box_y};
    const cuuint32_t elem_strides[2] = {1, 1};
    return encode(map, bytes ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                  const_cast<void*>(a.kv_cache), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  Maps maps{};
  bool ok = true;
  if (a.kv_format == GS_MLA_KV_NATIVE) {
    ok = encode_map(&maps.kv, false, kDim, 64, kTileS, CU_TENSOR_MAP_SWIZZLE_128B);
  } else {
    const cuuint64_t row = a.kv_format == GS_MLA_KV_FP8_DS_MLA ? GS_MLA_DS_MLA_TOKEN_BYTES : kDim;
    const bool ds = a.kv_format == GS_MLA_KV_FP8_DS_MLA;
    if (runs_n_kernel(int64_t(a.s_q) * a.num_heads) || !ds) {
      // The N8 kernel (and the seesaw RS kernel, the per-tensor format over more rows): whole
      // 64-row tiles of 64-byte column blocks, 64-byte swizzled; the 656-byte format's scale
      // records as 16-byte x 64-row boxes.
      ok = encode_map(&maps.kv, true, row, 64, kTileS, CU_TENSOR_MAP_SWIZZLE_64B);
      if (ds) ok = ok && encode_map(&maps.scale, true, row, 16, kTileS, CU_TENSOR_MAP_SWIZZLE_NONE);
    } else {
      // The seesaw kernel over the 656-byte format: its rope, 128 bytes x 64 rows into a bf16 block.
      ok = encode_map(&maps.kv, true, row, 128, kTileS, CU_TENSOR_MAP_SWIZZLE_128B);
    }
  }
  if (!ok) return GS_ERR_INVALID_ARGUMENT;

  auto s = static_cast<cudaStream_t>(stream);
  return a.dtype == GS_DTYPE_FP16 ? launch<true>(a, maps, p, s) : launch<false>(a, maps, p, s);
}

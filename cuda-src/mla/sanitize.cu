// graphsafe-build: archs=all kind=object mem_mib=300
// The MLA sanitize pre-pass and post-pass (gs_mla_sanitize, gs_mla_sanitize_finish) of the sm100
// decode. They do two jobs around CUTLASS's kernel:
//  * device data made safe for it: it trusts seq_lens and page indices (a zero length with batch
//    > 1 hangs CUTLASS 4.2's persistent scheduler; a page index is used as an address). The rules
//    are in graphsafe_kernels/mla.h ("Device data"); the sm90 kernel applies the same ones itself.
//  * the shapes it does not take (graphsafe_kernels/mla.h, "the shapes graphsafe adapts"): it runs
//    one query token of 128 heads per request, so s_q tokens become s_q kernel requests over the
//    same page-table row (each with its causal length), and fewer heads are padded to 128 in a
//    staging copy of q; the post-pass copies the real heads of its staged output back.
// Plain CUDA, so it builds for every arch: the sm100 decode calls it, and the tests run it on
// Hopper through src/ops/mla/sm100.rs.
//
// Why an empty row runs one token instead of being skipped: CUTLASS decides the split of a
// request from its length alone, so the only way to give it no empty persistent split is a length
// >= 1. Its one token reads column 0 of its (clamped) page-table row, a valid page; the post-pass
// then writes what a row that attends no key must hold (zeros, +inf) over whatever CUTLASS
// computed.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include "common/status.cuh"
#include "graphsafe_kernels/mla.h"
#include "mla/rules.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksX = 64;  // grid-stride over columns beyond this: a row is never that wide in practice
// Blocks per kernel request that copy q into the staging, GS_MLA_NUM_HEADS / kQBlocks heads each:
// one block per request would leave a single request's 147 KB copy to one SM.
constexpr int kQBlocks = 4;
constexpr int kQHeadsPerBlock = GS_MLA_NUM_HEADS / kQBlocks;
constexpr int kRow = GS_MLA_LATENT_DIM + GS_MLA_ROPE_DIM;

struct PrePass {
  const int32_t* seq_lens;
  const int32_t* page_table;
  int64_t page_table_stride;
  int max_seq_len, page_size, num_pages, columns;
  int s_q, causal, num_heads;
  int32_t* lens;
  int32_t* kernel_lens;
  int32_t* table;
  int table_blocks;  // blockIdx.x below it: lengths and page table; from it: q staging
  // Adapted decodes only (q_stage null otherwise). Strides in bytes.
  const uint8_t* q_nope;
  int64_t qn_sb, qn_st, qn_sh;
  const uint8_t* q_pe;
  int64_t qp_sb, qp_st, qp_sh;
  uint8_t* q_stage;  // [B', 128, 576] elements
  int elem;          // bytes per q element (1 or 2)
  int q_vec;         // q's addresses and strides allow 16-byte copies
};

// Kernel request j (blockIdx.y) is token t of request b: the lengths and its copy of b's row.
__device__ void sanitize_row(const PrePass& p, int j, int b, int t) {
  const int full = min(max(p.seq_lens[b], 0), p.max_seq_len);
  // Token t of s_q attends keys 0 ..= full - s_q + t (FlashMLA's causal), i.e. full - (s_q - 1 - t)
  // of them; <= 0 is a row that attends none. Both terms are in int range: |s_q| <= 16.
  const int len = p.causal ? max(full - (p.s_q - 1 - t), 0) : full;
  const int run = max(len, 1);
  // Columns holding a token of the length CUTLASS runs (at least one: an empty row's token). A
  // causal row covers a prefix of its request's columns, so nothing past the request's is read.
  const int used = run / p.page_size + (run % p.page_size != 0);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.lens[j] = len;
    p.kernel_lens[j] = run;
  }
  const int32_t* src = p.page_table + int64_t(b) * p.page_table_stride;
  int32_t* dst = p.table + int64_t(j) * p.columns;
  // 64-bit: columns may be up to 2^31 - 1, and a 32-bit c would wrap negative on its last step
  // (then read and write below both tables).
  for (int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x; c < p.columns; c += int64_t(p.table_blocks) * kThreads) {
    int32_t v = 0;
    if (c < used) v = min(max(src[c], 0), p.num_pages - 1);
    dst[c] = v;
  }
}

// Heads [h0, h0 + kQHeadsPerBlock) of kernel request j's q staging row: the caller's latent then
// rope for heads below num_heads, zeros above (CUTLASS computes all 128; the padding's rows of the
// result are never copied out, and zeros keep them finite and independent of old workspace bytes).
__device__ void stage_q(const PrePass& p, int j, int b, int t, int h0) {
  const int64_t row_bytes = int64_t(kRow) * p.elem, nope_bytes = int64_t(GS_MLA_LATENT_DIM) * p.elem;
  const uint8_t* qn = p.q_nope + b * p.qn_sb + t * p.qn_st;
  const uint8_t* qp = p.q_pe + b * p.qp_sb + t * p.qp_st;
  uint8_t* dst = p.q_stage + (int64_t(j) * GS_MLA_NUM_HEADS + h0) * row_bytes;
  const int unit = p.q_vec ? 16 : p.elem;  // bytes moved per step
  const int per_head = static_cast<int>(row_bytes / unit);
  for (int i = threadIdx.x; i < kQHeadsPerBlock * per_head; i += kThreads) {
    const int hh = i / per_head, h = h0 + hh;
    const int64_t off = int64_t(i - hh * per_head) * unit;
    uint8_t* d = dst + int64_t(hh) * row_bytes + off;
    const uint8_t* s = nullptr;
    if (h < p.num_heads) s = off < nope_bytes ? qn + h * p.qn_sh + off : qp + h * p.qp_sh + (off - nope_bytes);
    if (unit == 16) {
      *reinterpret_cast<uint4*>(d) = s ? *reinterpret_cast<const uint4*>(s) : make_uint4(0, 0, 0, 0);
    } else if (unit == 2) {
      *reinterpret_cast<uint16_t*>(d) = s ? *reinterpret_cast<const uint16_t*>(s) : uint16_t{0};
    } else {
      *d = s ? *s : uint8_t{0};
    }
  }
}

__global__ void __launch_bounds__(kThreads) mla_sanitize_kernel(const PrePass p) {
  const int j = blockIdx.y, b = j / p.s_q, t = j - b * p.s_q;
  if (int(blockIdx.x) < p.table_blocks) {
    sanitize_row(p, j, b, t);
  } else {
    stage_q(p, j, b, t, (blockIdx.x - p.table_blocks) * kQHeadsPerBlock);
  }
}

struct PostPass {
  const int32_t* lens;  // [B']
  int s_q, num_heads;
  uint16_t* out;  // strides in elements
  int64_t out_sb, out_st, out_sh;
  float* lse;                  // [batch, num_heads, s_q] or null
  const uint16_t* out_stage;   // adapted: [B', 128, 512]; null: direct (CUTLASS wrote out in place)
  const float* lse_stage;      // adapted: [B', 128]
  int out_vec;                 // out's address and strides allow 16-byte stores
};

// One block per kernel request j = b * s_q + t.
__global__ void __launch_bounds__(kThreads) mla_sanitize_finish_kernel(const PostPass p) {
  const int j = blockIdx.x, b = j / p.s_q, t = j - b * p.s_q;
  const bool empty = p.lens[j] == 0;
  if (p.out_stage == nullptr && !empty) return;  // direct: CUTLASS's result stands
  uint16_t* row = p.out + int64_t(b) * p.out_sb + int64_t(t) * p.out_st;
  const uint16_t* staged = p.out_stage ? p.out_stage + int64_t(j) * GS_MLA_NUM_HEADS * GS_MLA_LATENT_DIM : nullptr;
  const int unit = p.out_vec ? 8 : 1;  // elements per step
  const int per_head = GS_MLA_LATENT_DIM / unit;
  for (int i = threadIdx.x; i < p.num_heads * per_head; i += kThreads) {
    const int h = i / per_head, d = (i - h * per_head) * unit;
    uint16_t* o = row + h * p.out_sh + d;
    // Zeros are +0.0 in bf16 and fp16; `staged` is read only for a non-empty row (adapted).
    if (unit == 8) {
      *reinterpret_cast<uint4*>(o) = empty ? make_uint4(0, 0, 0, 0) : *reinterpret_cast<const uint4*>(staged + h * GS_MLA_LATENT_DIM + d);
    } else {
      *o = empty ? uint16_t{0} : staged[h * GS_MLA_LATENT_DIM + d];
    }
  }
  if (p.lse != nullptr) {
    // FlashMLA's convention: +inf for a row that attends no key (merged by LSE it weighs nothing),
    // and its [batch, heads, s_q] layout.
    for (int h = threadIdx.x; h < p.num_heads; h += kThreads)
      p.lse[(int64_t(b) * p.num_heads + h) * p.s_q + t] = empty ? INFINITY : p.lse_stage[int64_t(j) * GS_MLA_NUM_HEADS + h];
  }
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

// The requests the kernel runs (B' = batch * s_q), or 0 outside the limits.
int32_t kernel_batch(const GsMlaDecodeArgs& a) { return graphsafe::mla_rules::sm100_kernel_batch(a.batch, a.num_heads, a.s_q); }

bool is_direct(const GsMlaDecodeArgs& a) { return a.num_heads == GS_MLA_NUM_HEADS && a.s_q == 1; }

// Whether a 4-D operand's base and the strides of its dimensions longer than 1 are multiples of
// 16 bytes (`elem` bytes per element): then 16-byte vectors never straddle a row. A dimension of
// size 1 is never stepped, so its stride (whatever the framework left there) does not count.
bool vectorizable(const void* base, const GsMlaDecodeArgs& a, uint64_t elem, std::initializer_list<int64_t> strides) {
  if (!aligned(base, 16)) return false;
  const int32_t extents[3] = {a.batch, a.s_q, a.num_heads};
  int i = 0;
  for (int64_t s : strides) {
    if (extents[i++] > 1 && (uint64_t(s) * elem) % 16 != 0) return false;
  }
  return true;
}

// Region part [offset, offset + bytes) lies in region_bytes.
bool fits(uint64_t offset, uint64_t bytes, uint64_t region_bytes) { return offset <= region_bytes && bytes <= region_bytes - offset; }

}  // namespace

extern "C" int gs_mla_sanitize(const GsMlaDecodeArgs* args, void* region, uint64_t region_bytes, void* stream) {
  if (args == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const GsMlaDecodeArgs& a = *args;
  const int32_t kb = kernel_batch(a);
  if (kb == 0 || (a.causal != 0 && a.causal != 1)) return GS_ERR_INVALID_ARGUMENT;
  const GsMlaSm100Shape shape{a.dtype, a.batch, a.num_heads, a.s_q, a.max_seq_len, a.page_size, a.sm_count, a.num_splits};
  GsMlaSanitizeLayout l{};
  if (int st = gs_mla_sanitize_layout(&shape, &l); st != GS_OK) return st;
  if (a.seq_lens == nullptr || a.page_table == nullptr || region == nullptr || a.num_pages <= 0 ||
      int64_t(a.num_pages) * a.page_size > INT32_MAX)
    return GS_ERR_INVALID_ARGUMENT;
  // Row b is read at b * stride + [0, used): rows of a batch may not overlap the next one (with
  // one request the stride is never used).
  const int64_t row_need = (int64_t(a.max_seq_len) + a.page_size - 1) / a.page_size;
  if (a.batch > 1 && a.page_table_stride < row_need) return GS_ERR_INVALID_ARGUMENT;
  if (region_bytes < l.bytes) return GS_ERR_WORKSPACE_TOO_SMALL;
  // 4-byte aligned int32 arrays at 256-byte aligned offsets; the q staging's 16-byte stores.
  if (!aligned(region, l.adapted ? 16 : 4) || !aligned(a.seq_lens, 4) || !aligned(a.page_table, 4))
    return GS_ERR_INVALID_ARGUMENT;
  auto* base = static_cast<uint8_t*>(region);
  PrePass p{};
  p.seq_lens = a.seq_lens;
  p.page_table = a.page_table;
  p.page_table_stride = a.page_table_stride;
  p.max_seq_len = a.max_seq_len;
  p.page_size = a.page_size;
  p.num_pages = a.num_pages;
  p.columns = l.columns;
  p.s_q = a.s_q;
  p.causal = a.causal;
  p.num_heads = a.num_heads;
  p.lens = reinterpret_cast<int32_t*>(base + l.lens_offset);
  p.kernel_lens = reinterpret_cast<int32_t*>(base + l.kernel_lens_offset);
  p.table = reinterpret_cast<int32_t*>(base + l.page_table_offset);
  p.table_blocks = static_cast<int>(std::min<int64_t>(kMaxBlocksX, (int64_t(l.columns) + kThreads - 1) / kThreads));
  int q_blocks = 0;
  if (l.adapted) {
    const int64_t e = a.dtype == GS_DTYPE_FP8_E4M3 ? 1 : 2;
    if (a.q_nope == nullptr || a.q_pe == nullptr || !aligned(a.q_nope, e) || !aligned(a.q_pe, e)) return GS_ERR_INVALID_ARGUMENT;
    for (int64_t s : {a.q_nope_stride_batch, a.q_nope_stride_token, a.q_nope_stride_head, a.q_pe_stride_batch,
                      a.q_pe_stride_token, a.q_pe_stride_head})
      if (s < 0 || s > (INT64_MAX >> 1)) return GS_ERR_INVALID_ARGUMENT;  // bytes = s * e stay positive
    p.q_nope = static_cast<const uint8_t*>(a.q_nope);
    p.qn_sb = a.q_nope_stride_batch * e;
    p.qn_st = a.q_nope_stride_token * e;
    p.qn_sh = a.q_nope_stride_head * e;
    p.q_pe = static_cast<const uint8_t*>(a.q_pe);
    p.qp_sb = a.q_pe_stride_batch * e;
    p.qp_st = a.q_pe_stride_token * e;
    p.qp_sh = a.q_pe_stride_head * e;
    p.q_stage = base + l.q_offset;
    p.elem = static_cast<int>(e);
    p.q_vec = vectorizable(a.q_nope, a, e, {a.q_nope_stride_batch, a.q_nope_stride_token, a.q_nope_stride_head}) &&
              vectorizable(a.q_pe, a, e, {a.q_pe_stride_batch, a.q_pe_stride_token, a.q_pe_stride_head});
    q_blocks = kQBlocks;
  }
  mla_sanitize_kernel<<<dim3(p.table_blocks + q_blocks, kb), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return graphsafe::cuda_failed(e);
  return GS_OK;
}

extern "C" int gs_mla_sanitize_finish(const GsMlaDecodeArgs* args, const GsMlaSanitizeLayout* layout, const void* region,
                                      uint64_t region_bytes, void* stream) {
  if (args == nullptr || layout == nullptr || region == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const GsMlaDecodeArgs& a = *args;
  const GsMlaSanitizeLayout& l = *layout;
  const int32_t kb = kernel_batch(a);
  // The layout must be one made for this decode's rows; every part read must lie in the region.
  if (kb == 0 || l.kernel_batch != kb || l.adapted != (is_direct(a) ? 0 : 1)) return GS_ERR_INVALID_ARGUMENT;
  const uint64_t rows = uint64_t(kb) * GS_MLA_NUM_HEADS;
  if (!fits(l.lens_offset, 4 * uint64_t(kb), region_bytes) ||
      (l.adapted && (!fits(l.out_offset, rows * GS_MLA_LATENT_DIM * 2, region_bytes) ||
                     !fits(l.lse_offset, rows * sizeof(float), region_bytes))))
    return GS_ERR_INVALID_ARGUMENT;
  const auto* base = static_cast<const uint8_t*>(region);
  if (!aligned(base + l.lens_offset, 4) || (l.adapted && (!aligned(base + l.out_offset, 16) || !aligned(base + l.lse_offset, 4))))
    return GS_ERR_INVALID_ARGUMENT;
  if (a.out == nullptr || a.out_stride_batch < 0 || a.out_stride_token < 0 || a.out_stride_head < 0 ||
      !aligned(a.out, 2) || !aligned(a.lse, 4))
    return GS_ERR_INVALID_ARGUMENT;
  PostPass p{};
  p.lens = reinterpret_cast<const int32_t*>(base + l.lens_offset);
  p.s_q = a.s_q;
  p.num_heads = a.num_heads;
  p.out = static_cast<uint16_t*>(a.out);
  p.out_sb = a.out_stride_batch;
  p.out_st = a.out_stride_token;
  p.out_sh = a.out_stride_head;
  p.lse = a.lse;
  if (l.adapted) {
    p.out_stage = reinterpret_cast<const uint16_t*>(base + l.out_offset);
    p.lse_stage = reinterpret_cast<const float*>(base + l.lse_offset);
  }
  p.out_vec = vectorizable(a.out, a, 2, {a.out_stride_batch, a.out_stride_token, a.out_stride_head});
  mla_sanitize_finish_kernel<<<kb, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return graphsafe::cuda_failed(e);
  return GS_OK;
}

// graphsafe-build: archs=host kind=object mem_mib=1600 cutlass_example=77_blackwell_fmha
// Host-only planning for the CUTLASS sm100 MLA decode: the split-KV rule, the workspace size
// CUTLASS's own get_workspace_size returns, the region the decode adds after it, and the arguments
// CUTLASS is given (gs_mla_sm100_kernel_args: the head padding and the s_q expansion are decided
// here, in one host function the CPU tests call, and the launch only copies them into CUTLASS's
// Arguments). Built on every build (no GPU code), so the planner, the CLI and those tests work on
// machines and builds without sm_100f. Every size is computed in checked 64-bit arithmetic from
// arguments that were first checked against the limits in graphsafe_kernels/mla.h.
#include <algorithm>
#include "common/checked.cuh"
#include "mla/rules.h"
#include "mla/sm100/mla_types.cuh"

using namespace graphsafe::mla_sm100;
namespace ck = graphsafe::checked;
using graphsafe::mla_rules::limits_ok;
using graphsafe::mla_rules::sm100_kernel_batch;
using graphsafe::mla_rules::sm100_page_size_ok;

namespace {

int32_t kv_tiles(int32_t max_seq_len) { return static_cast<int32_t>(ck::div_up(uint64_t(max_seq_len), GS_MLA_SM100_TILE_S)); }

// The largest split count the safety rule allows (see graphsafe_kernels/mla.h and docs/ARCHITECTURE.md).
int32_t safe_cap(int32_t batch, int32_t max_seq_len, int32_t sm_count) {
  if (batch > 1) return 1;
  int32_t cluster_slots = std::max(1, sm_count / 2);  // the kernel runs 2-SM clusters
  return std::min({int32_t{GS_MLA_SM100_MAX_SPLITS}, kv_tiles(max_seq_len), cluster_slots});
}
}  // namespace

extern "C" int gs_mla_sm100_num_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count, int32_t requested,
                                       int32_t* out_splits) {
  if (!limits_ok(batch, max_seq_len, sm_count) || requested < 0 || out_splits == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const int32_t cap = safe_cap(batch, max_seq_len, sm_count);
  if (requested > 0) {
    if (requested > cap) return GS_ERR_UNSAFE_SPLIT;
    *out_splits = requested;
    return GS_OK;
  }
  // Same tiles per split as `cap`, but no split left without KV tiles: an empty split takes the
  // early-return path of the kernel's compute warps, the path that hangs in CUTLASS 4.2.
  const uint64_t t = uint64_t(kv_tiles(max_seq_len));
  *out_splits = static_cast<int32_t>(ck::div_up(t, ck::div_up(t, uint64_t(cap))));
  return GS_OK;
}

extern "C" int gs_mla_sm100_max_safe_splits(int32_t batch, int32_t max_seq_len, int32_t sm_count,
                                            int32_t* out_splits) {
  if (!limits_ok(batch, max_seq_len, sm_count) || out_splits == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_splits = safe_cap(batch, max_seq_len, sm_count);
  return GS_OK;
}

extern "C" int gs_mla_sm100_scheduler(int32_t num_splits, int32_t* out_scheduler) {
  if (num_splits <= 0 || out_scheduler == nullptr) return GS_ERR_INVALID_ARGUMENT;
  *out_scheduler = num_splits == 1 ? GS_MLA_SCHED_PERSISTENT : GS_MLA_SCHED_INDIVIDUAL;
  return GS_OK;
}

namespace {
// Whether CUTLASS runs the decode in place: exactly its one token of 128 heads.
bool direct(int32_t num_heads, int32_t s_q) { return num_heads == GS_MLA_NUM_HEADS && s_q == 1; }

uint64_t elem_bytes(int32_t dtype) { return dtype == GS_DTYPE_FP8_E4M3 ? 1 : 2; }
bool dtype_ok(int32_t dtype) { return dtype == GS_DTYPE_BF16 || dtype == GS_DTYPE_FP16 || dtype == GS_DTYPE_FP8_E4M3; }
}  // namespace

extern "C" int gs_mla_sanitize_layout(const GsMlaSm100Shape* shape, GsMlaSanitizeLayout* out) {
  if (shape == nullptr || out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const GsMlaSm100Shape& s = *shape;
  const int32_t kb = sm100_kernel_batch(s.batch, s.num_heads, s.s_q);
  if (kb == 0 || !dtype_ok(s.dtype) || !limits_ok(kb, s.max_seq_len, 1) || !sm100_page_size_ok(s.page_size) ||
      s.num_splits < 1 || s.num_splits > GS_MLA_SM100_MAX_SPLITS)
    return GS_ERR_INVALID_ARGUMENT;
  // Whole KV tiles: CUTLASS reads the index of every page of a tile, also past the length.
  uint64_t columns = uint64_t(kv_tiles(s.max_seq_len)) * uint64_t(GS_MLA_SM100_TILE_S / s.page_size);
  uint64_t entries = 0;
  if (!ck::mul(columns, uint64_t(kb), &entries) || entries > uint64_t(INT32_MAX)) return GS_ERR_INVALID_ARGUMENT;
  const bool adapted = !direct(s.num_heads, s.s_q);
  const uint64_t rows = uint64_t(kb) * GS_MLA_NUM_HEADS;  // <= 2^23: the products below fit
  GsMlaSanitizeLayout l{};
  uint64_t at = 0, size = 0;
  // Each part starts at the running offset; an absent one takes no bytes there.
  auto place = [&](uint64_t* offset, bool present, uint64_t bytes) {
    *offset = at;
    return !present || (ck::round_up(bytes, 256, &size) && ck::add(at, size, &at));
  };
  bool ok = place(&l.lens_offset, true, 4 * uint64_t(kb)) && place(&l.kernel_lens_offset, true, 4 * uint64_t(kb)) &&
            place(&l.page_table_offset, true, 4 * entries) &&
            place(&l.lse_offset, adapted || s.num_splits > 1, rows * sizeof(float)) &&
            place(&l.q_offset, adapted, rows * (GS_MLA_LATENT_DIM + GS_MLA_ROPE_DIM) * elem_bytes(s.dtype)) &&
            place(&l.out_offset, adapted, rows * GS_MLA_LATENT_DIM * 2);
  if (!ok) return GS_ERR_INVALID_ARGUMENT;
  l.bytes = at;
  l.columns = static_cast<int32_t>(columns);
  l.kernel_batch = kb;
  l.adapted = adapted ? 1 : 0;
  *out = l;
  return GS_OK;
}

namespace {
template <class Element>
uint64_t cutlass_workspace_for(int batch, int max_seq_len, int sm_count, int num_splits) {
  using Out = typename OutputOf<Element>::type;
  // The scheduler does not enter the size; ask the instantiation the decode would launch.
  if (num_splits == 1) {
    using Op = typename Config<Element, Out, true>::Op;
    return Op::get_workspace_size(planning_arguments<Op>(batch, max_seq_len, sm_count, num_splits));
  }
  using Op = typename Config<Element, Out, false>::Op;
  return Op::get_workspace_size(planning_arguments<Op>(batch, max_seq_len, sm_count, num_splits));
}

// CUTLASS's part of the workspace for B' = kernel_batch requests: GS_ERR_* or GS_OK.
int cutlass_part(int32_t dtype, int32_t kb, int32_t max_seq_len, int32_t sm_count, int32_t num_splits, uint64_t* out) {
  // CUTLASS sizes its part in size_t from ints: within the safety rule (splits > 1 only for one
  // kernel request, at most 16) that product is at most 2052 * 128 * 16 bytes, so it cannot wrap.
  if (num_splits > safe_cap(kb, max_seq_len, sm_count)) return GS_ERR_UNSAFE_SPLIT;
  switch (dtype) {
    case GS_DTYPE_BF16: *out = cutlass_workspace_for<cutlass::bfloat16_t>(kb, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP16: *out = cutlass_workspace_for<cutlass::half_t>(kb, max_seq_len, sm_count, num_splits); break;
    case GS_DTYPE_FP8_E4M3: *out = cutlass_workspace_for<cutlass::float_e4m3_t>(kb, max_seq_len, sm_count, num_splits); break;
    default: return GS_ERR_INVALID_ARGUMENT;
  }
  return GS_OK;
}
}  // namespace

extern "C" int gs_mla_sm100_workspace_bytes(const GsMlaSm100Shape* shape, uint64_t* out_bytes) {
  if (shape == nullptr || out_bytes == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const GsMlaSm100Shape& s = *shape;
  const int32_t kb = sm100_kernel_batch(s.batch, s.num_heads, s.s_q);
  if (kb == 0 || !limits_ok(kb, s.max_seq_len, s.sm_count) || s.num_splits <= 0) return GS_ERR_INVALID_ARGUMENT;
  if (s.num_splits > safe_cap(kb, s.max_seq_len, s.sm_count)) return GS_ERR_UNSAFE_SPLIT;
  GsMlaSanitizeLayout l{};
  if (int st = gs_mla_sanitize_layout(&s, &l); st != GS_OK) return st;
  uint64_t c = 0;
  if (int st = cutlass_part(s.dtype, kb, s.max_seq_len, s.sm_count, s.num_splits, &c); st != GS_OK) return st;
  uint64_t total = 0;
  if (!ck::round_up(c, 256, &total) || !ck::add(total, l.bytes, &total)) return GS_ERR_INVALID_ARGUMENT;
  *out_bytes = total;
  return GS_OK;
}

namespace {
bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

// A stride CUTLASS's tensor maps take: a multiple of 16 bytes below 2^40 (cuTensorMapEncodeTiled's
// rule; CUTLASS's own check of the encode compiles out under NDEBUG, so a bad one would run the
// kernel on a zeroed map).
bool tma_stride(int64_t elements, uint64_t elem) {
  if (elements < 0 || elements >= (int64_t{1} << 40)) return false;
  const uint64_t b = uint64_t(elements) * elem;  // < 2^41: no wrap
  return b % 16 == 0 && b < (uint64_t{1} << 40);
}
}  // namespace

extern "C" int gs_mla_sm100_kernel_args(const GsMlaDecodeArgs* a, void* workspace, uint64_t workspace_bytes,
                                        GsMlaSm100KernelArgs* out) {
  if (a == nullptr || out == nullptr) return GS_ERR_INVALID_ARGUMENT;
  const int32_t kb = sm100_kernel_batch(a->batch, a->num_heads, a->s_q);
  if (kb == 0 || (a->causal != 0 && a->causal != 1) || !dtype_ok(a->dtype) || a->kv_format != GS_MLA_KV_NATIVE ||
      a->max_seq_len <= 0 || a->max_seq_len > GS_MLA_MAX_SEQ_LEN || a->num_splits <= 0 || a->sm_count < 2 ||
      a->sm_count > GS_MLA_MAX_SM_COUNT || a->device < 0 || a->q_nope == nullptr || a->q_pe == nullptr ||
      a->kv_cache == nullptr || a->seq_lens == nullptr || a->page_table == nullptr || a->out == nullptr ||
      a->num_pages <= 0 || !sm100_page_size_ok(a->page_size) || int64_t(a->num_pages) * a->page_size > INT32_MAX ||
      !aligned(a->seq_lens, 4) || !aligned(a->page_table, 4) || !aligned(a->lse, 4) || !aligned(a->kv_cache, 16))
    return GS_ERR_INVALID_ARGUMENT;
  const bool is_direct = direct(a->num_heads, a->s_q);
  const uint64_t e = elem_bytes(a->dtype);
  // CUTLASS's tensor maps need 16-byte aligned bases; the passes copy an adapted decode's q and out
  // with 16-byte vectors only where they are aligned, else element by element.
  const uintptr_t q_align = is_direct ? 16 : e, out_align = is_direct ? 16 : 2;
  if (!aligned(a->q_nope, q_align) || !aligned(a->q_pe, q_align) || !aligned(a->out, out_align))
    return GS_ERR_INVALID_ARGUMENT;
  for (int64_t st : {a->q_nope_stride_batch, a->q_nope_stride_token, a->q_nope_stride_head, a->q_pe_stride_batch,
                     a->q_pe_stride_token, a->q_pe_stride_head, a->out_stride_batch, a->out_stride_token,
                     a->out_stride_head})
    if (st < 0) return GS_ERR_INVALID_ARGUMENT;
  // Rows of the caller's page table may not overlap: the pre-pass reads ceil(len / page_size) of
  // each (with one request the stride is never used).
  if (a->batch > 1 && a->page_table_stride < (int64_t(a->max_seq_len) + a->page_size - 1) / a->page_size)
    return GS_ERR_INVALID_ARGUMENT;
  if (is_direct) {
    // CUTLASS builds its Q and O tensor maps from the caller's strides.
    for (int64_t st : {a->q_nope_stride_batch, a->q_nope_stride_head, a->q_pe_stride_batch, a->q_pe_stride_head})
      if (!tma_stride(st, e)) return GS_ERR_INVALID_ARGUMENT;
    for (int64_t st : {a->out_stride_batch, a->out_stride_head})
      if (!tma_stride(st, 2)) return GS_ERR_INVALID_ARGUMENT;
    // With splits, CUTLASS's reduction kernel writes out densely ([batch, 128, 512]) whatever the
    // strides: refuse any other layout (the Rust op refuses it first, naming out.strides). An
    // adapted decode gives CUTLASS its dense staging, so it takes any strides.
    if (a->num_splits > 1 && (a->out_stride_head != GS_MLA_LATENT_DIM ||
                              (a->batch > 1 && a->out_stride_batch != int64_t(GS_MLA_NUM_HEADS) * GS_MLA_LATENT_DIM)))
      return GS_ERR_INVALID_ARGUMENT;
  }
  if (a->num_splits > safe_cap(kb, a->max_seq_len, a->sm_count)) return GS_ERR_UNSAFE_SPLIT;
  const GsMlaSm100Shape shape{a->dtype, a->batch, a->num_heads, a->s_q, a->max_seq_len, a->page_size, a->sm_count,
                              a->num_splits};
  GsMlaSanitizeLayout l{};
  if (int st = gs_mla_sanitize_layout(&shape, &l); st != GS_OK) return st;
  uint64_t c = 0;
  if (int st = cutlass_part(a->dtype, kb, a->max_seq_len, a->sm_count, a->num_splits, &c); st != GS_OK) return st;
  const uint64_t region_at = ck::div_up(c, 256) * 256;  // <= 2052 * 128 * 16 + 255: no wrap
  // The workspace is never optional: it holds the region.
  if (workspace == nullptr || workspace_bytes < region_at || workspace_bytes - region_at < l.bytes)
    return GS_ERR_WORKSPACE_TOO_SMALL;
  if (!aligned(workspace, 16)) return GS_ERR_INVALID_ARGUMENT;
  auto* region = static_cast<uint8_t*>(workspace) + region_at;

  GsMlaSm100KernelArgs k{};
  k.batch = kb;
  k.adapted = is_direct ? 0 : 1;
  k.max_seq_len = a->max_seq_len;
  k.num_splits = a->num_splits;
  k.sm_count = a->sm_count & ~1;
  k.page_size = a->page_size;
  k.page_count = a->num_pages;
  k.page_table_stride = l.columns;
  constexpr int64_t kRow = GS_MLA_LATENT_DIM + GS_MLA_ROPE_DIM, kHeads = GS_MLA_NUM_HEADS;
  if (is_direct) {
    k.q_latent = a->q_nope;
    k.q_latent_stride_head = a->q_nope_stride_head;
    k.q_latent_stride_batch = a->q_nope_stride_batch;
    k.q_rope = a->q_pe;
    k.q_rope_stride_head = a->q_pe_stride_head;
    k.q_rope_stride_batch = a->q_pe_stride_batch;
    k.out = a->out;
    k.out_stride_head = a->out_stride_head;
    k.out_stride_batch = a->out_stride_batch;
    // With splits > 1 CUTLASS 4.2 writes the per-split LSE its reduction reads only when it has an
    // lse pointer; without one the reduction would weigh the splits by stale workspace bytes.
    k.lse = a->lse != nullptr || a->num_splits == 1 ? a->lse : reinterpret_cast<float*>(region + l.lse_offset);
  } else {
    // One q staging row holds latent then rope (the cache's token layout): two tensor maps over one
    // buffer, 576 elements apart per head (1152 or 576 bytes: multiples of 16).
    const uint8_t* q = region + l.q_offset;
    k.q_latent = q;
    k.q_latent_stride_head = kRow;
    k.q_latent_stride_batch = kHeads * kRow;
    k.q_rope = q + GS_MLA_LATENT_DIM * e;
    k.q_rope_stride_head = kRow;
    k.q_rope_stride_batch = kHeads * kRow;
    k.out = region + l.out_offset;
    k.out_stride_head = GS_MLA_LATENT_DIM;
    k.out_stride_batch = kHeads * GS_MLA_LATENT_DIM;
    // Always given: the post-pass reads it when the caller wants lse, and with splits > 1 the
    // reduction needs it (as the direct scratch above).
    k.lse = reinterpret_cast<float*>(region + l.lse_offset);
  }
  k.lse_stride_batch = GS_MLA_NUM_HEADS;
  k.seq_lens = reinterpret_cast<const int32_t*>(region + l.kernel_lens_offset);
  k.page_table = reinterpret_cast<const int32_t*>(region + l.page_table_offset);
  k.cutlass_bytes = c;
  k.region = region;
  k.layout = l;
  *out = k;
  return GS_OK;
}

// The sm100 MLA decode launch, instantiated once per element type by mla_{bf16,fp16,fp8}.cu.
// Everything goes to the caller's stream; the workspace comes from the caller and is never
// allocated here. The fused-reduction path of device::MLA (which memsets on the legacy stream)
// is never used: splits > 1 run the separate reduction kernel on the same stream.
//
// CUTLASS never sees the caller's seq_lens or page table: gs_mla_sanitize first writes clamped
// copies into the workspace's sanitize region (graphsafe_kernels/mla.h, "Device data"), CUTLASS
// reads those, and gs_mla_sanitize_finish then writes the empty requests' output. Every check
// runs before the first launch, so a refusal enqueues nothing (nothing lands in a capture).
#pragma once

#include <atomic>
#include "common/status.cuh"
#include "mla/sm100/mla_types.cuh"

namespace graphsafe::mla_sm100 {

// cudaFuncSetAttribute is per device: a process that drives two GPUs must set it on each, which
// device::MLA's own once-per-process flag would miss.
template <class Kernel>
int ensure_smem_attribute(int device) {
  static std::atomic<uint64_t> done{0};
  uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return GS_OK;
  int smem = Kernel::SharedStorageSize;
  if (smem >= (48 << 10)) {
    cudaError_t e = cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return cuda_failed(e);
  }
  done.fetch_or(bit, std::memory_order_acq_rel);
  return GS_OK;
}

template <class Element, bool Persistent, bool CpAsync>
int launch(GsMlaDecodeArgs const& g, void* workspace, uint64_t workspace_bytes, cudaStream_t stream) {
  using Out = typename OutputOf<Element>::type;
  using Cfg = Config<Element, Out, Persistent, CpAsync>;
  using Op = typename Cfg::Op;
  using Kernel = typename Cfg::Kernel;

  typename Op::Arguments a = planning_arguments<Op>(g.batch, g.max_seq_len, g.sm_count & ~1, g.num_splits);
  a.hw_info.device_id = g.device;
  GsMlaSanitizeLayout san{};
  if (int st = gs_mla_sanitize_layout(g.batch, g.max_seq_len, g.page_size, g.num_splits, &san); st != GS_OK) return st;
  // CUTLASS's part at byte 0, the sanitize region after it (gs_mla_sm100_workspace_bytes).
  const uint64_t cutlass_bytes = Op::get_workspace_size(a);
  const uint64_t region_at = (cutlass_bytes + 255) & ~uint64_t{255};  // <= 2052 * 128 * 16 + 255: no wrap
  if (workspace == nullptr || workspace_bytes < region_at || workspace_bytes - region_at < san.bytes)
    return GS_ERR_WORKSPACE_TOO_SMALL;
  uint8_t* region = static_cast<uint8_t*>(workspace) + region_at;
  auto& m = a.mainloop;
  m.softmax_scale = g.sm_scale;
  m.ptr_q_latent = static_cast<Element*>(const_cast<void*>(g.q_nope));
  m.stride_q_latent = cute::make_tuple(g.q_nope_stride_head, cute::_1{}, g.q_nope_stride_batch);
  m.ptr_q_rope = static_cast<Element*>(const_cast<void*>(g.q_pe));
  m.stride_q_rope = cute::make_tuple(g.q_pe_stride_head, cute::_1{}, g.q_pe_stride_batch);
  constexpr int64_t kRow = GS_MLA_LATENT_DIM + GS_MLA_ROPE_DIM;
  auto* kv = static_cast<Element*>(const_cast<void*>(g.kv_cache));
  m.ptr_c_latent = kv;
  m.stride_c_latent = cute::make_tuple(kRow, cute::_1{}, kRow * g.page_size);
  m.ptr_k_rope = kv + GS_MLA_LATENT_DIM;
  m.stride_k_rope = cute::make_tuple(kRow, cute::_1{}, kRow * g.page_size);
  m.ptr_seq = reinterpret_cast<int*>(region + san.kernel_lens_offset);
  m.ptr_page_table = reinterpret_cast<int*>(region + san.page_table_offset);
  m.stride_page_table = cute::make_tuple(cute::_1{}, san.columns);
  m.page_count = g.num_pages;
  m.page_size = g.page_size;
  a.epilogue.ptr_o = static_cast<Out*>(g.out);
  a.epilogue.stride_o = cute::make_tuple(g.out_stride_head, cute::_1{}, g.out_stride_batch);
  // With splits > 1, CUTLASS 4.2 writes the per-split LSE its reduction reads only when it has an
  // lse pointer; without one the reduction would weigh the splits by stale workspace bytes.
  a.epilogue.ptr_lse = g.lse != nullptr || g.num_splits == 1 ? g.lse : reinterpret_cast<float*>(region + san.lse_offset);
  a.epilogue.stride_lse = cute::make_tuple(cute::_1{}, GS_MLA_NUM_HEADS);

  if (Op::can_implement(a) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_CANNOT_IMPLEMENT;
  if (Op::get_workspace_size(a) != cutlass_bytes) return GS_ERR_CUTLASS_INTERNAL;  // sized above from the same shape
  int st = ensure_smem_attribute<Kernel>(g.device);
  if (st != GS_OK) return st;
  Op op;
  // Host-only for the non-fused path: builds the kernel parameters (TMA descriptors) from the
  // sanitized pointers, enqueues nothing.
  if (op.initialize(a, workspace, stream) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_INTERNAL;

  st = gs_mla_sanitize(g.seq_lens, g.page_table, g.page_table_stride, g.batch, g.max_seq_len, g.page_size, g.num_pages,
                       g.num_splits, region, san.bytes, stream);
  if (st != GS_OK) return st;
  if (op.run(stream) != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? cuda_failed(e) : GS_ERR_CUTLASS_INTERNAL;
  }
  return gs_mla_sanitize_finish(reinterpret_cast<const int32_t*>(region + san.lens_offset), g.batch, g.out,
                                g.out_stride_batch, g.out_stride_head, g.lse, stream);
}

// Entry point per element type and loader: persistent for one split, individual for more (the
// safe rule). TMA loads need page size 128; cp.async loads take power-of-two pages up to 128.
template <class Element, bool CpAsync>
int decode(GsMlaDecodeArgs const* g, void* workspace, uint64_t workspace_bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (g->num_splits == 1) return launch<Element, true, CpAsync>(*g, workspace, workspace_bytes, s);
  return launch<Element, false, CpAsync>(*g, workspace, workspace_bytes, s);
}

}  // namespace graphsafe::mla_sm100

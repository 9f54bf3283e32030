// The sm100 MLA decode launch, instantiated once per element type by mla_{bf16,fp16,fp8}.cu.
// Everything goes to the caller's stream; the workspace comes from the caller and is never
// allocated here. The fused-reduction path of device::MLA (which memsets on the legacy stream)
// is never used: splits > 1 run the separate reduction kernel on the same stream.
//
// CUTLASS never sees the caller's seq_lens or page table: gs_mla_sanitize first writes clamped
// copies into the workspace's region (graphsafe_kernels/mla.h, "Device data"), CUTLASS reads
// those, and gs_mla_sanitize_finish then writes the output of rows that attend no key. A shape
// CUTLASS does not take (fewer than 128 heads, s_q > 1) runs over staging copies in the region
// ("the shapes graphsafe adapts"). Every check runs before the first launch, so a refusal enqueues
// nothing (nothing lands in a capture).
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

  // Every pointer, stride and size CUTLASS gets, the head padding and s_q expansion included, comes
  // from the host function the CPU tests check (plan.cu); this only copies it into CUTLASS's types.
  GsMlaSm100KernelArgs k{};
  if (int st = gs_mla_sm100_kernel_args(&g, workspace, workspace_bytes, &k); st != GS_OK) return st;
  typename Op::Arguments a = planning_arguments<Op>(k.batch, k.max_seq_len, k.sm_count, k.num_splits);
  a.hw_info.device_id = g.device;
  auto& m = a.mainloop;
  m.softmax_scale = g.sm_scale;
  m.ptr_q_latent = static_cast<Element*>(const_cast<void*>(k.q_latent));
  m.stride_q_latent = cute::make_tuple(k.q_latent_stride_head, cute::_1{}, k.q_latent_stride_batch);
  m.ptr_q_rope = static_cast<Element*>(const_cast<void*>(k.q_rope));
  m.stride_q_rope = cute::make_tuple(k.q_rope_stride_head, cute::_1{}, k.q_rope_stride_batch);
  constexpr int64_t kRow = GS_MLA_LATENT_DIM + GS_MLA_ROPE_DIM;
  auto* kv = static_cast<Element*>(const_cast<void*>(g.kv_cache));
  m.ptr_c_latent = kv;
  m.stride_c_latent = cute::make_tuple(kRow, cute::_1{}, kRow * k.page_size);
  m.ptr_k_rope = kv + GS_MLA_LATENT_DIM;
  m.stride_k_rope = cute::make_tuple(kRow, cute::_1{}, kRow * k.page_size);
  m.ptr_seq = const_cast<int*>(k.seq_lens);
  m.ptr_page_table = const_cast<int*>(k.page_table);
  m.stride_page_table = cute::make_tuple(cute::_1{}, k.page_table_stride);
  m.page_count = k.page_count;
  m.page_size = k.page_size;
  a.epilogue.ptr_o = static_cast<Out*>(k.out);
  a.epilogue.stride_o = cute::make_tuple(k.out_stride_head, cute::_1{}, k.out_stride_batch);
  a.epilogue.ptr_lse = k.lse;
  a.epilogue.stride_lse = cute::make_tuple(cute::_1{}, k.lse_stride_batch);

  if (Op::can_implement(a) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_CANNOT_IMPLEMENT;
  if (Op::get_workspace_size(a) != k.cutlass_bytes) return GS_ERR_CUTLASS_INTERNAL;  // sized in plan.cu from the same shape
  int st = ensure_smem_attribute<Kernel>(g.device);
  if (st != GS_OK) return st;
  Op op;
  // Host-only for the non-fused path: builds the kernel parameters (TMA descriptors) from the
  // sanitized pointers, enqueues nothing.
  if (op.initialize(a, workspace, stream) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_INTERNAL;

  st = gs_mla_sanitize(&g, k.region, k.layout.bytes, stream);
  if (st != GS_OK) return st;
  if (op.run(stream) != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? cuda_failed(e) : GS_ERR_CUTLASS_INTERNAL;
  }
  return gs_mla_sanitize_finish(&g, &k.layout, k.region, k.layout.bytes, stream);
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

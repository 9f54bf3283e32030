// Hopper (sm_90a) building blocks shared by graphsafe's own kernels (MLA decode, NVFP4 W4A16):
// mbarrier PTX wrappers on the device side, and on the host side the TMA descriptor encoder
// (reached through the runtime's driver entry point: the crate never links libcuda) and the
// per-device dynamic-shared-memory opt-in.
#pragma once

#include <cuda.h>  // CUtensorMap and friends (types only)
#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>
#include "common/status.cuh"

namespace graphsafe::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled through the runtime's driver entry point, resolved once per process.
inline int encode_fn(EncodeTiled* out) {
  static std::atomic<EncodeTiled> cached{nullptr};
  EncodeTiled f = cached.load(std::memory_order_acquire);
  if (f == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess) return graphsafe::cuda_failed(e);
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) return graphsafe::cuda_failed(cudaErrorNotSupported);
    f = reinterpret_cast<EncodeTiled>(fn);
    cached.store(f, std::memory_order_release);
  }
  *out = f;
  return GS_OK;
}

// cudaFuncSetAttribute is per device: a per-device bitmask per kernel (devices >= 64 set it every
// call). Keyed by the kernel itself (a non-type parameter): kernels may share one pointer type.
template <auto Kernel>
int ensure_smem(int device, int bytes) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return GS_OK;
  cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(Kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return graphsafe::cuda_failed(e);
  done.fetch_or(bit, std::memory_order_acq_rel);
  return GS_OK;
}

}  // namespace graphsafe::sm90

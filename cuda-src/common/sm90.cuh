// Hopper (sm_90a) building blocks shared by graphsafe's own kernels (MLA decode, NVFP4 W4A16),
// each defined once: on the device side the PTX wrappers (mbarriers, TMA and bulk copies, wgmma
// fences, named barriers, register reallocation, clusters, programmatic dependent launch, warp-level
// MMA), and on the host side the TMA descriptor encoder (reached through the runtime's driver entry
// point: the crate never links libcuda) and the per-device dynamic-shared-memory opt-in.
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

// fence.mbarrier_init: the initialised barriers become visible to the async proxy (TMA) and, in a
// cluster, to the peer CTAs, before anyone arrives on them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Generic-proxy shared-memory writes -> later reads by the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The dynamic shared memory base rounded up to 1024 bytes (the 128-byte swizzle repeats every 1 KiB,
// and both TMA and wgmma compute it from the shared-window address).
__device__ __forceinline__ uint8_t* smem_base_1k(uint8_t* raw) {
  const uint32_t a = smem_u32(raw);
  return raw + ((1024u - (a & 1023u)) & 1023u);
}

// A barrier among `threads` threads (a multiple of 32) of the CTA on hardware barrier `id`.
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation between warpgroups (setmaxnreg; the kernel's __launch_bounds__ must cap
// its registers so that the per-warpgroup counts fit the register file).
template <int R>
__device__ __forceinline__ void regs_increase() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void regs_decrease() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }

// ---- bulk copies (TMA) ---------------------------------------------------------------------------
// 2-D TMA tile load (box and swizzle come from the tensor map), completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// The same load with an L2 evict-first policy: for a stream each CTA reads once (or twice, by the
// two head groups of one request, close in time). Measured on the H200 in the seesaw kernel:
// 126.7 -> 119.5 us at 128 heads x 64 x 4096 (random page order), 63 -> 56 us at 1 x 65,536.
__device__ __forceinline__ void tma_load_2d_evict_first(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y,
                                                        uint32_t bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}
// 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared,
// completing on `bar`.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from this CTA's shared
// memory (`src`) into a peer CTA's (`remote`, `remote_bar`: peer_addr results), completing as
// transactions on the peer's mbarrier. The source is read by the async proxy: the generic stores
// that wrote it must be ordered before by a proxy fence (fence_proxy_async) on their path here.
__device__ __forceinline__ void bulk_s2peer(uint32_t remote, uint32_t src, uint32_t bytes, uint32_t remote_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(remote),
               "r"(src), "r"(bytes), "r"(remote_bar)
               : "memory");
}
// Asks L2 to fetch `bytes` from `src` (a hint: nothing reaches this CTA's hands).
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// A 16-byte copy global -> shared through L2 only (cp.async.cg), completed by cp_async_wait_all or
// a counted wait (cp_async_commit, then cp_async_wait<N>) in the same thread; both 16-byte aligned.
__device__ __forceinline__ void cp_async_16_cg(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem_dst)), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// ---- wgmma ordering ------------------------------------------------------------------------------
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed wgmma groups are still pending.
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from touching accumulator (or register-operand) registers across an
// asynchronous wgmma.
template <int R>
__device__ __forceinline__ void reg_fence(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R, int C>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// ---- warp-level MMA --------------------------------------------------------------------------------
// D += A.B, mma.sync m16n8k16, bf16 inputs, fp32 accumulators (d: 4 floats, in place).
__device__ __forceinline__ void mma16816(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ldmatrix .x4: four 8x8 b16 matrices, the row addresses given by lanes 0..31.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
// A value the compiler must keep in a register rather than recompute (it otherwise rebuilds
// thread-invariant addresses inside main loops).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
  uint32_t r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// ---- clusters, programmatic dependent launch -------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {  // release our smem writes, acquire the peers'
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address in the cluster's CTA `rank` of this CTA's shared address `addr` (same offset).
__device__ __forceinline__ uint32_t peer_addr(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}
// 4 bytes at shared address `addr` of the cluster's CTA `rank`.
__device__ __forceinline__ int ld_peer_s32(uint32_t addr, uint32_t rank) {
  int v;
  asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(peer_addr(addr, rank)) : "memory");
  return v;
}
// One arrival on a peer CTA's mbarrier (`remote_bar`: a peer_addr result), with the default
// semantics (release at CTA scope), as CUTLASS's ClusterBarrier::arrive(cta_id). A release at
// cluster scope compiles to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU before the arrive, which waits for this
// thread's loads and remote stores in flight. The waiter uses the plain mbar_wait, as CUTLASS's
// cluster pipelines do: an acquire at cluster scope compiles to an L1 invalidation (CCTL.IVALL) at
// every wait. What these barriers order is shared memory (bulk-copied bytes, which the phase counts,
// and the reads of the stages a release frees), not data cached in L1.
__device__ __forceinline__ void mbar_arrive_peer(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
// 16 bytes at shared address `addr` of the cluster's CTA `rank` (distributed shared memory).
__device__ __forceinline__ float4 ld_peer(uint32_t addr, uint32_t rank) {
  const uint32_t remote = peer_addr(addr, rank);
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}
// Programmatic dependent launch: wait for the grids this one depends on (a no-op when launched
// without the attribute), and let the next grid start its prologue while this one finishes.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

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

// graphsafe-build: archs=nvfp4:sm90 kind=object mem_mib=500
// graphsafe's Hopper (sm_90a) weight-only NVFP4 GEMM: gs_nvfp4_w4a16_prepare, gs_nvfp4_w4a16_gemm.
//
//   D[m, n] (bf16) = alpha[0] * A[m, k] (bf16) x W[n, k]^T,  W NVFP4 (e2m1 codes, fp8 scales per 16
//   along k, one fp32 global scale), dequantized in registers, multiplied on the tensor cores.
//
// Design
//   * Swapped product: the CTA computes D^T tiles, weights as the wgmma A operand (from registers,
//     where they are dequantized) and activations as the B operand (shared memory, K-major,
//     128-byte swizzle, loaded by TMA; rows past m and columns past k are zero-filled by TMA).
//     CTA tile = 128 weight rows (two consumer warpgroups x m64) x BM activation rows (wgmma N,
//     8..256 chosen by m, see w4a16_plan.cuh) x 64 along k per stage.
//   * One producer thread (a whole producer warpgroup only for BM = 256, where setmaxnreg moves
//     its registers to the consumers; else one warp: 288 threads, up to 3 CTAs per SM) streams
//     stages: one 1-D bulk copy of the prepared weight chunk (4,608 B: codes + scales of 128 rows x
//     64 k, laid out by prepare exactly as the consumer threads read them) plus one 2-D TMA box of
//     activations, both completing on the stage's mbarrier; consumers hand a stage back through a
//     second mbarrier once their wgmma on it retired.
//   * Dequantization (per consumer thread per stage: one 16-byte and one 8-byte shared load, then
//     about 3.5 integer/bf16 instructions per weight pair): prepare stores each code's sign and
//     magnitude bits where one or two shifts and a mask move them to bf16 bit 15 and bits 8..6,
//     which makes a bf16 equal to the code's value times 2^-126 (0.5 becomes a bf16 subnormal);
//     mul.rn.bf16x2 (subnormals kept) by the block's scale as a bf16 equal to sf * 2^107 (built
//     from a re-encoded scale byte with one byte_perm and one integer multiply-add, broadcast by
//     an operand swizzle) gives exactly e2m1 * sf * 2^-19 (at most 6 significant bits: no
//     rounding). The 2^19 / global_scale factor and alpha scale the fp32 accumulators in the
//     epilogue.
//   * BM >= 32: the register operand is double-buffered: while the wgmma of stage i runs, the
//     warpgroup waits for stage i+1, dequantizes it into the other buffer and issues it;
//     wgmma.wait_group 1 then retires stage i, whose slot is handed back to the producer.
//   * BM <= 16: mma.sync.m16n8k16 per warp instead (its A fragment is one warp's slice of the wgmma
//     m64 A fragment, so the same dequantized registers feed it; B fragments by ldmatrix from the
//     swizzled activation rows). With N = 8 or 16 the wgmma path spent as long per chunk whatever
//     the schedule (measured: the same per-SM chunk rate for 224, 384 and 396 CTAs), and the
//     synchronous MMA also drops the descriptor, fence and wait instructions.
//   * Schedules (w4a16_plan.cuh): stream-K for m <= 32 with enough chunks, and m <= 64 where the
//     tiles do not fill the SMs and no CTA's range touches more than two tiles (each CTA streams an
//     equal contiguous range of the prepared weight; tiles shared between CTAs go through
//     workspace slots and a fixup kernel, launched programmatically dependent); otherwise a tile
//     grid whose split-K splits form one thread-block cluster (1 x 1 x splits): once drained, each
//     CTA stages its fp32 accumulators in its own shared memory, and after a cluster barrier CTA r
//     adds slice r of the tile over all splits in split order through distributed shared memory.
//     Both are deterministic (fixed summation order: bit-identical run to run and replay to
//     replay) and keep no counters: nothing that a shared, dirty workspace could break, no memset.
//   * Programmatic dependent launch: the kernels are launched with programmatic stream
//     serialization, so their CTAs can start while the previous kernel on the stream drains. Before
//     griddepcontrol.wait a CTA only initialises barriers and (BM > 16) asks L2 to prefetch its
//     first weight stages (a hint: data still reaches the CTA only after the wait, so nothing an earlier grid
//     writes can be read stale); after its main loop it lets the next grid launch.
// Everything that can fail (shape, alignment, the tensor map, the shared-memory opt-in, the
// cluster occupancy query) is checked before the first launch. Nothing here allocates or touches
// the legacy stream; the tensor map is a kernel parameter.
#include <cuda.h>  // CUtensorMap (type only; the encoder comes through the runtime's entry point)
#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>
#include "common/launch.cuh"
#include "common/sm90.cuh"
#include "common/status.cuh"
#include "graphsafe_kernels/nvfp4.h"
#include "nvfp4/sm90/w4a16_plan.cuh"
#include "nvfp4/sm90/w4a16_kernels.cuh"
#include "nvfp4/sm90/w4a16_prepare.cuh"

namespace graphsafe::nvfp4_sm90 {
namespace {

using namespace graphsafe::sm90;  // encode_fn, ensure_smem

// ---- host ---------------------------------------------------------------------------------------------

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

// Whether the device holds `clusters` clusters of `size` CTAs of kernel K at once (cached per
// device: GPCs fragment clusters, so fewer fit than slots / size).
template <auto Kernel>
int clusters_fit(int device, int size, int smem, int threads, int64_t clusters, bool* fits) {
  static std::atomic<int> cache[64][kMaxSplits + 1];  // max active clusters + 1; 0 = not asked yet
  int got = (device >= 0 && device < 64) ? cache[device][size].load(std::memory_order_relaxed) : 0;
  if (got == 0) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = unsigned(size);
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(1, 1, unsigned(size));
    lc.blockDim = dim3(threads);
    lc.dynamicSmemBytes = smem;
    lc.attrs = attr;
    lc.numAttrs = 1;
    int n = 0;
    if (cudaError_t e = cudaOccupancyMaxActiveClusters(&n, Kernel, &lc); e != cudaSuccess) return graphsafe::cuda_failed(e);
    got = n + 1;
    if (device >= 0 && device < 64) cache[device][size].store(got, std::memory_order_relaxed);
  }
  *fits = clusters <= int64_t(got - 1);
  return GS_OK;
}

template <int C, bool kStreamK>
int launch(const void* a, int64_t ld_a, Params p, const Plan& plan, int m, int k, cudaStream_t stream) {
  constexpr Config cfg = kConfigs[C];
  // BM = 256: the kernel without the split-K reduction for an unsplit grid (w4a16_kernels.cuh).
  constexpr bool kSplitApart = cfg.bm == 256 && !kStreamK;
  constexpr auto split_kernel = w4a16_gemm_kernel<cfg.bm, cfg.stages, cfg.ctas_per_sm, kStreamK, true>;
  constexpr auto kernel = w4a16_gemm_kernel<cfg.bm, cfg.stages, cfg.ctas_per_sm, kStreamK, !kSplitApart>;
  constexpr auto fixup = w4a16_fixup_kernel<cfg.bm>;
  constexpr int smem = Smem<cfg.bm, cfg.stages>::kBytes;
  constexpr int threads = threads_for(cfg.bm);
  // Everything that can fail is done before anything is enqueued.
  // The two-segment stream-K walk covers a CTA's range only if make_plan kept it to two tiles.
  if (kStreamK && kStreamKMaxSegs<cfg.bm> == 2 && !streamk_two_segments(plan.units, plan.ctas, plan.kblocks))
    return GS_ERR_INVALID_ARGUMENT;
  EncodeTiled encode = nullptr;
  if (int st = encode_fn(&encode); st != GS_OK) return st;
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(m)};
  const cuuint64_t strides[1] = {cuuint64_t(ld_a) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(kActBoxRows<cfg.bm>)};
  const cuuint32_t elem_strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return GS_ERR_INVALID_ARGUMENT;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return graphsafe::cuda_failed(e);
  if (int st = ensure_smem<kernel>(device, smem); st != GS_OK) return st;
  if (kSplitApart && plan.splits > 1) {
    if (int st = ensure_smem<split_kernel>(device, smem); st != GS_OK) return st;
  }
  dim3 grid(unsigned(plan.tiles_n), unsigned(plan.tiles_m), 1);
  if constexpr (kStreamK) {
    grid = dim3(unsigned(plan.ctas), 1, 1);
  } else {
    // The planner's split count, lowered until the device holds one cluster per tile at once.
    int64_t s = plan.splits;
    while (s > 1) {
      bool fits = false;
      if (int st = clusters_fit<split_kernel>(device, int(s), smem, threads, plan.tiles, &fits); st != GS_OK) return st;
      if (fits) break;
      do {
        --s;
      } while (s > 1 && cdiv(plan.kblocks, cdiv(plan.kblocks, s)) != s);  // balanced counts only
    }
    p.splits = int(s);
    p.kb_per_split = int(cdiv(plan.kblocks, s));
    grid.z = unsigned(s);
  }
  // The splits of a tile (grid.z > 1) form one cluster: they reduce through distributed shared memory.
  cudaError_t e = launch_pdl_cluster(grid.z > 1 ? split_kernel : kernel, grid, dim3(threads), smem, stream, grid.z, map, p);
  if (e == cudaSuccess && kStreamK && plan.fixup)
    e = launch_pdl(fixup, dim3(unsigned(plan.tiles_n), 1, 1), dim3(kConsumers), 0, stream, p);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}
}  // namespace
}  // namespace graphsafe::nvfp4_sm90

using namespace graphsafe::nvfp4_sm90;

extern "C" int gs_nvfp4_w4a16_prepare(const uint8_t* packed, const uint8_t* scales, const float* global_scale, int32_t n,
                                      int32_t k, void* prepared, uint64_t prepared_size, void* stream) {
  if (packed == nullptr || scales == nullptr || global_scale == nullptr || prepared == nullptr) return GS_ERR_INVALID_ARGUMENT;
  if (!shape_ok(1, n, k) || prepared_size < prepared_bytes(n, k) || !aligned(prepared, 16)) return GS_ERR_INVALID_ARGUMENT;
  const int tiles_n = int(cdiv(n, kTileN)), kblocks = int(cdiv(k, kBlockK));
  const int64_t chunks = int64_t(tiles_n) * kblocks;
  if (chunks > INT32_MAX) return GS_ERR_INVALID_ARGUMENT;
  w4a16_prepare_kernel<<<unsigned(chunks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      packed, scales, global_scale, n, k, kblocks, static_cast<uint8_t*>(prepared));
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? GS_OK : graphsafe::cuda_failed(e);
}

extern "C" int gs_nvfp4_w4a16_gemm(const void* a, int64_t ld_a, const void* prepared, const float* alpha, void* d,
                                   int64_t ld_d, int32_t m, int32_t n, int32_t k, int32_t sm_count, void* workspace,
                                   uint64_t workspace_bytes, void* stream) {
  if (a == nullptr || prepared == nullptr || alpha == nullptr || d == nullptr || sm_count <= 0) return GS_ERR_INVALID_ARGUMENT;
  if (!shape_ok(m, n, k)) return GS_ERR_INVALID_ARGUMENT;
  // TMA: 16-byte aligned base and row stride; bulk copies: 16-byte aligned prepared weight.
  if (ld_a < k || ld_a % 8 != 0 || !aligned(a, 16) || !aligned(prepared, 16)) return GS_ERR_INVALID_ARGUMENT;
  if (ld_d < n || !aligned(d, 2)) return GS_ERR_INVALID_ARGUMENT;
  const Plan plan = make_plan(m, n, k, sm_count);
  // Stream-K partial tiles are the only workspace (the cluster split-K reduces in shared memory).
  if (plan.workspace_bytes > 0) {
    if (workspace == nullptr || workspace_bytes < plan.workspace_bytes) return GS_ERR_WORKSPACE_TOO_SMALL;
    if (!aligned(workspace, 16)) return GS_ERR_INVALID_ARGUMENT;
  }
  Params p{};
  p.chunks = static_cast<const uint8_t*>(prepared) + kHeaderBytes;
  p.factor = static_cast<const float*>(prepared);
  p.alpha = alpha;
  p.d = static_cast<uint16_t*>(d);
  p.ld_d = ld_d;
  p.m = m;
  p.n = n;
  p.kblocks = int(plan.kblocks);
  p.kb_per_split = int(plan.kb_per_split);
  p.splits = int(plan.splits);
  p.units = plan.units;
  p.ctas = plan.ctas;
  p.k16 = 16u;
  p.k2_29 = 1u << 29;
  p.slots = plan.workspace_bytes > 0 ? static_cast<float4*>(workspace) : nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  switch (plan.config) {
    case 0: return plan.streamk ? launch<0, true>(a, ld_a, p, plan, m, k, s) : launch<0, false>(a, ld_a, p, plan, m, k, s);
    case 1: return plan.streamk ? launch<1, true>(a, ld_a, p, plan, m, k, s) : launch<1, false>(a, ld_a, p, plan, m, k, s);
    case 2: return plan.streamk ? launch<2, true>(a, ld_a, p, plan, m, k, s) : launch<2, false>(a, ld_a, p, plan, m, k, s);
    case 3: return plan.streamk ? launch<3, true>(a, ld_a, p, plan, m, k, s) : launch<3, false>(a, ld_a, p, plan, m, k, s);
    case 4: return launch<4, false>(a, ld_a, p, plan, m, k, s);
    case 6: return launch<6, false>(a, ld_a, p, plan, m, k, s);
    case 7: return launch<7, false>(a, ld_a, p, plan, m, k, s);
    default: return launch<5, false>(a, ld_a, p, plan, m, k, s);
  }
}

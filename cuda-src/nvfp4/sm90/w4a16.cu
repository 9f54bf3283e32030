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
//   * Schedules (w4a16_plan.cuh): stream-K for m <= 32 with enough chunks (each CTA streams an
//     equal contiguous range of the prepared weight; tiles shared between CTAs go through
//     workspace slots and a fixup kernel, launched programmatically dependent); otherwise a tile
//     grid whose split-K splits form one thread-block cluster (1 x 1 x splits): once drained, each
//     CTA stages its fp32 accumulators in its own shared memory, and after a cluster barrier CTA r
//     adds slice r of the tile over all splits in split order through distributed shared memory.
//     Both are deterministic (fixed summation order: bit-identical run to run and replay to
//     replay) and keep no counters: nothing that a shared, dirty workspace could break, no memset.
//   * Programmatic dependent launch: the kernels are launched with programmatic stream
//     serialization, so their CTAs can start while the previous kernel on the stream drains. Before
//     griddepcontrol.wait a CTA only initialises barriers and asks L2 to prefetch its first weight
//     stages (a hint: data still reaches the CTA only after the wait, so nothing an earlier grid
//     writes can be read stale); after its main loop it lets the next grid launch.
// Everything that can fail (shape, alignment, the tensor map, the shared-memory opt-in, the
// cluster occupancy query) is checked before the first launch. Nothing here allocates or touches
// the legacy stream; the tensor map is a kernel parameter.
#include <cuda.h>  // CUtensorMap (type only; the encoder comes through the runtime's entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>
#include "common/status.cuh"
#include "common/sm90.cuh"
#include "graphsafe_kernels/nvfp4.h"
#include "nvfp4/sm90/w4a16_plan.cuh"
#include "nvfp4/sm90/wgmma_rs.cuh"

namespace graphsafe::nvfp4_sm90 {
namespace {

using namespace graphsafe::sm90;

constexpr int kConsumers = 256;  // two consumer warpgroups
// + a producer: one warp (288 threads), or a whole warpgroup where setmaxnreg moves registers to
// the consumers (the BM = 256 configuration: 384 threads).
constexpr int threads_for(int bm) { return bm == 256 ? 384 : 288; }
constexpr int kRegsConsumer = 232;  // setmaxnreg for the BM = 256 configuration
constexpr int kRegsProducer = 40;

struct Params {
  const uint8_t* chunks;  // prepared + kHeaderBytes
  const float* factor;    // prepared header: 2^19 / global_scale
  const float* alpha;
  uint16_t* d;
  int64_t ld_d;
  int m, n;
  int kblocks, kb_per_split, splits;
  int64_t units, ctas;  // stream-K
  float4* slots;        // stream-K: the workspace's partial tiles
  uint32_t k16, k2_29;  // always 16 and 2^29 (see mad_lo)
};

// ---- primitives (sm_90a PTX) ------------------------------------------------------------------
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int32_t x, int32_t y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
template <int R>
__device__ __forceinline__ void fence_regs(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void fence_regs(uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// Synchronous tensor-core MMA for the smallest activation tiles (BM <= 16): the A fragment of
// m16n8k16 is one warp's slice of the wgmma m64 A fragment, so the dequantized registers feed it
// unchanged, and its D fragment is the wgmma m64n8 D fragment's slice (same epilogue).
__device__ __forceinline__ void mma16816(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
// A value the compiler must keep in a register rather than recompute (it otherwise rebuilds
// thread-invariant addresses inside the main loop).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
  uint32_t r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
template <int R>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }


// ---- dequantization ---------------------------------------------------------------------------
// The two scales of a k16 step as one bf16x2 {row g, row g + 8}: bytes B and B + 1 of `word` are
// re-encoded scales u = (E << 3) | m standing for 2^(E - 10) * (1 + m / 8); (u << 4) | 0x7000 is the
// bf16 with exponent field 224 + E and mantissa m, i.e. that value times 2^107.
// Logic ops and shifts issue on the SM's integer pipe at half the FMA pipe's rate, and the
// dequant is mostly logic ops, so its shifts and shift-adds are written as products by
// multipliers the compiler cannot see (Params::k16 = 16, Params::k2_29 = 2^29, kernel parameters):
// they stay IMADs on the FMA pipe instead of becoming SHF / LEA. Measured on an H200: no change
// (the consumers are bound by instructions issued, not by one pipe; benches/NOTES-nvfp4.md).
__device__ __forceinline__ uint32_t mad_lo(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.hi.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// (BM <= 64 only: the tensor-bound BM >= 128 kernels keep the plain forms, with which the
// register allocation of BM = 256 does not spill.)
template <int B, bool kImad>
__device__ __forceinline__ uint32_t scale_pair(uint32_t word, uint32_t k16) {
  const uint32_t x = __byte_perm(word, 0u, 0x4040u | B | ((B + 1) << 8));  // [byte B, 0, byte B+1, 0]
  if constexpr (kImad) return mad_lo(x, k16, 0x70007000u);  // x * 16 + 0x70007000
  return x * 16u + 0x70007000u;
}
// bf16x2 a * {s.lo, s.lo} and a * {s.hi, s.hi} (the broadcast is an operand swizzle of HMUL2).
__device__ __forceinline__ uint32_t mul_lo(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {l, l};\nmul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
__device__ __forceinline__ uint32_t mul_hi(uint32_t a, uint32_t s) {
  uint32_t d;
  asm("{\n.reg .b16 l, h;\n.reg .b32 t;\nmov.b32 {l, h}, %2;\nmov.b32 t, {h, h};\nmul.rn.bf16x2 %0, %1, t;\n}"
      : "=r"(d)
      : "r"(a), "r"(s));
  return d;
}
// A word holds the 8 codes of one k16 step of a thread's wgmma A fragment, 4 bits per code but not
// contiguous: each 16-bit half holds one code of each of the 4 registers (low half: even k, high half:
// odd k), register j's sign bit at S_j and magnitude bits at C_j..C_j+2 of the half, with
//   j = 0: S 15, C 6  ->  w & M                                   (already in place)
//   j = 1: S 12, C 3  ->  (w << 3) & M
//   j = 2: S 14, C 0  ->  ((w & 0x40074007) * (2 + 64)) & M       (two shifted copies, no carries)
//   j = 3: S 13, C 9  ->  ((w << 2) & 0x80008000) | ((w >> 3) & 0x01C001C0)
// with M = 0x81C081C0: sign -> bit 15, magnitude -> bits 8..6 of each bf16, i.e. the code's value
// times 2^-126 (0.5 becomes a bf16 subnormal). prepare writes this layout (kRegSign / kRegMag).
__device__ constexpr int kRegSign[4] = {15, 12, 14, 13};
__device__ constexpr int kRegMag[4] = {6, 3, 0, 9};
// One k16 step of the wgmma A fragment: a[0] = (row g, k 2q..2q+1), a[1] = (row g+8, same k),
// a[2] = (row g, k + 8), a[3] = (row g+8, k + 8); s = scales {row g, row g+8} (scale_pair).
template <bool kImad>
__device__ __forceinline__ void dequant_step(uint32_t w, uint32_t s, uint32_t k2_29, uint32_t (&a)[4]) {
  constexpr uint32_t M = 0x81C081C0u;
  a[0] = mul_lo(w & M, s);
  a[1] = mul_hi((w << 3) & M, s);
  a[2] = mul_lo(((w & 0x40074007u) * 66u) & M, s);
  if constexpr (kImad) {
    a[3] = mul_hi(((w << 2) & 0x80008000u) | (mul_hi_u32(w, k2_29) & 0x01C001C0u), s);  // w >> 3
  } else {
    (void)k2_29;
    a[3] = mul_hi(((w << 2) & 0x80008000u) | ((w >> 3) & 0x01C001C0u), s);
  }
}

__device__ __forceinline__ uint16_t to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <int BM, int STAGES>
struct Smem {
  static constexpr int kA = BM * 128;  // one activation stage (BM rows x 64 bf16)
  static constexpr int kAOff = 0;
  static constexpr int kWOff = STAGES * kA;
  static constexpr int kBarOff = kWOff + STAGES * kChunkBytes;
  static constexpr int kBytes = 1024 /* alignment slack */ + kBarOff + 2 * STAGES * 8;
  // The split-K reduction stages each consumer thread's accumulators here once the pipeline is
  // drained: [BM / 8][256 threads] float4, over the (then idle) stage buffers.
  static constexpr int kReduceBytes = BM * 512;
  static_assert(BM == 256 || kReduceBytes <= kBarOff, "the split-K staging must fit in the stage buffers");
};

// ---- cluster and grid-dependency primitives (sm_90) ----------------------------------------------
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {  // release our smem writes, acquire the peers'
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float4 ld_peer(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}
// Programmatic dependent launch: wait for the grids this one depends on (a no-op when launched
// without the attribute), and let the next grid start its prologue while this one finishes.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// One output quad of a consumer thread ct (0..255): acc[4g .. 4g+3] -> D rows m0, m0 + 1 and columns
// n0, n0 + 8 (the wgmma D fragment of the swapped product), scaled by f.
template <int BM>
__device__ __forceinline__ void store_quad(const Params& p, int n_tile, int m_tile, int ct, int g, float a0, float a1,
                                           float a2, float a3, float f) {
  const int wg = ct >> 7, t = ct & 127, warp = t >> 5, lane = t & 31;
  const int n0 = n_tile * kTileN + wg * 64 + warp * 16 + (lane >> 2);
  const int m0 = m_tile * BM + 2 * (lane & 3) + 8 * g;
  const bool n0_ok = n0 < p.n, n1_ok = n0 + 8 < p.n;
  if (m0 < p.m) {
    uint16_t* row = p.d + int64_t(m0) * p.ld_d;
    if (n0_ok) row[n0] = to_bf16(a0 * f);
    if (n1_ok) row[n0 + 8] = to_bf16(a2 * f);
  }
  if (m0 + 1 < p.m) {
    uint16_t* row = p.d + int64_t(m0 + 1) * p.ld_d;
    if (n0_ok) row[n0] = to_bf16(a1 * f);
    if (n1_ok) row[n0 + 8] = to_bf16(a3 * f);
  }
}

template <int BM, int STAGES, int MINB, bool STREAMK>
__global__ void __launch_bounds__(threads_for(BM), MINB) w4a16_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                                                    const Params p) {
  using L = Smem<BM, STAGES>;
  constexpr bool kRealloc = BM == 256;
  constexpr bool kImad = BM <= 64;
  constexpr int kAcc = BM / 2;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sa = smem_u32(smem + L::kAOff);
  uint8_t* sw = smem + L::kWOff;
  const uint32_t full0 = smem_u32(smem + L::kBarOff);
  const uint32_t empty0 = full0 + STAGES * 8;

  // This CTA's chunks [u0, u1) of the prepared weight (chunk u = tile u / kblocks, k-block u % kblocks).
  int64_t u0, u1;
  int m_tile = 0;
  if constexpr (STREAMK) {
    u0 = streamk_start(blockIdx.x, p.units, p.ctas);
    u1 = streamk_start(int64_t(blockIdx.x) + 1, p.units, p.ctas);
  } else {
    m_tile = blockIdx.y;
    const int kb0 = blockIdx.z * p.kb_per_split;
    u0 = int64_t(blockIdx.x) * p.kblocks + kb0;
    u1 = u0 + min(p.kblocks - kb0, p.kb_per_split);  // >= 1 chunk (balanced splits)
  }
  const uint8_t* wsrc = p.chunks + size_t(u0) * kChunkBytes;

  if (threadIdx.x == kConsumers) {
    // Before the wait on the previous grid: only a hint to L2 (never data in this CTA's hands, so
    // a weight written by that grid is still read after it finished), so the first stages come
    // from L2 while the previous kernel drains.
    prefetch_l2(wsrc, uint32_t(min(u1 - u0, int64_t(STAGES))) * kChunkBytes);
  }
  if (threadIdx.x == 0) {
#pragma unroll 1
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // Everything below reads what earlier grids wrote (activations, alpha, the weight) or writes D.
  grid_dependency_wait();

  const int wg = threadIdx.x >> 7;
  if (wg == 2) {
    // ---- producer -----------------------------------------------------------------------------
    if constexpr (kRealloc) regs_dec<kRegsProducer>();
    if (threadIdx.x == kConsumers) {
      int s = 0;
      uint32_t ph = 0;
      int64_t kb = u0 % p.kblocks;
#pragma unroll 1
      for (int64_t u = u0; u < u1; ++u) {
        if (u - u0 >= STAGES) mbar_wait(empty0 + 8 * s, ph ^ 1u);
        const uint32_t bar = full0 + 8 * s;
        mbar_arrive_expect_tx(bar, L::kA + kChunkBytes);
        bulk_g2s(smem_u32(sw + s * kChunkBytes), p.chunks + size_t(u) * kChunkBytes, kChunkBytes, bar);
        tma_2d(sa + s * L::kA, &tmap_a, int32_t(kb) * kBlockK, m_tile * BM, bar);
        if (++kb == p.kblocks) kb = 0;
        if (++s == STAGES) {
          s = 0;
          ph ^= 1u;
        }
      }
    }
    // Exited threads do not hold up the cluster barriers below.
    return;
  }

  // ---- consumers ----------------------------------------------------------------------------------
  if constexpr (kRealloc) regs_inc<kRegsConsumer>();
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int ct = threadIdx.x;  // 0..255
  float acc[kAcc];
  uint32_t fa[4][4], fb[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) fa[i][j] = fb[i][j] = 0u;
  const uint8_t* codes_p = sw + wg * 2048 + t * 16;
  const uint8_t* scales_p = sw + kCodeBytes + wg * 256 + warp * 64 + (lane >> 2) * 8;
  const uint32_t codes_w = opaque(smem_u32(codes_p)), scales_w = opaque(smem_u32(scales_p));

  // Stage index and phase of the next stage to consume, tracked incrementally across segments.
  uint32_t stage = 0, phase = 0, prev = 0;
  const uint32_t desc_hi = uint32_t(1024 >> 4) | (1u << 30);  // SBO = 1 KiB, 128-byte swizzle
  const uint32_t desc_lo0 = ((sa >> 4) & 0x3FFFu) | (1u << 16);  // start address, LBO = 16 B (unused)
  auto issue = [&](uint32_t(&f)[4][4]) {
    mbar_wait(full0 + 8 * stage, phase);
    uint4 c;
    uint2 sc;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "r"(codes_w + stage * kChunkBytes) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sc.x), "=r"(sc.y) : "r"(scales_w + stage * kChunkBytes) : "memory");
    dequant_step<kImad>(c.x, scale_pair<0, kImad>(sc.x, p.k16), p.k2_29, f[0]);
    dequant_step<kImad>(c.y, scale_pair<2, kImad>(sc.x, p.k16), p.k2_29, f[1]);
    dequant_step<kImad>(c.z, scale_pair<0, kImad>(sc.y, p.k16), p.k2_29, f[2]);
    dequant_step<kImad>(c.w, scale_pair<2, kImad>(sc.y, p.k16), p.k2_29, f[3]);
    wg_fence();
    const uint32_t lo = desc_lo0 + stage * uint32_t(L::kA >> 4);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // +32 bytes per k16 step inside the 128-byte swizzled rows
      WgmmaRS<BM>::mma(acc, f[kk], (uint64_t(desc_hi) << 32) | uint64_t(lo + 2u * kk));
    wg_commit();
    prev = stage;
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  };
  // One arrival per warp hands a stage back. __syncwarp first: lane 0's arrive releases only its
  // own reads, so the other lanes' shared-memory reads of the stage must be ordered before it
  // (racecheck reports the bulk copy into the stage racing with them otherwise).
  auto release = [&](uint32_t s) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
  };
  const float f = __ldg(p.alpha) * __ldg(p.factor);

  // BM <= 16: mma.sync per warp (B fragments by ldmatrix from the 128-byte-swizzled activation
  // rows: 16-byte chunk c of row r sits at chunk c ^ (r & 7)); each warp hands its stage back as
  // soon as its operands are in registers. Larger BM: wgmma, double-buffered (below).
  constexpr bool kMma = BM <= 16;
  // Thread-invariant shared addresses, computed once (else the compiler rematerialises them
  // every chunk); the stage offsets advance incrementally.
  const uint32_t codes_a = codes_w, scales_a = scales_w;
  const uint32_t ldsm_a0 = opaque(sa + uint32_t(lane & 7) * 128u + uint32_t(((lane >> 3) ^ (lane & 7)) << 4));  // chunks 0..3
  const uint32_t ldsm_a1 = opaque(sa + uint32_t(lane & 7) * 128u + uint32_t((((lane >> 3) + 4) ^ (lane & 7)) << 4));  // 4..7
  uint32_t off_w = 0, off_a = 0;  // stage * kChunkBytes, stage * kA
  auto step_mma = [&]() {
    mbar_wait(full0 + 8 * stage, phase);
    uint4 c;
    uint2 sc;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(c.x), "=r"(c.y), "=r"(c.z), "=r"(c.w) : "r"(codes_a + off_w) : "memory");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(sc.x), "=r"(sc.y) : "r"(scales_a + off_w) : "memory");
    uint32_t b[4][BM / 8][2];
#pragma unroll
    for (int nb = 0; nb < BM / 8; ++nb) {
      ldsm_x4(ldsm_a0 + off_a + nb * 1024u, b[0][nb][0], b[0][nb][1], b[1][nb][0], b[1][nb][1]);
      ldsm_x4(ldsm_a1 + off_a + nb * 1024u, b[2][nb][0], b[2][nb][1], b[3][nb][0], b[3][nb][1]);
    }
    dequant_step<kImad>(c.x, scale_pair<0, kImad>(sc.x, p.k16), p.k2_29, fa[0]);
    dequant_step<kImad>(c.y, scale_pair<2, kImad>(sc.x, p.k16), p.k2_29, fa[1]);
    dequant_step<kImad>(c.z, scale_pair<0, kImad>(sc.y, p.k16), p.k2_29, fa[2]);
    dequant_step<kImad>(c.w, scale_pair<2, kImad>(sc.y, p.k16), p.k2_29, fa[3]);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int nb = 0; nb < BM / 8; ++nb) mma16816(acc + 4 * nb, fa[kk], b[kk][nb][0], b[kk][nb][1]);
    release(stage);
    off_w += kChunkBytes;
    off_a += uint32_t(L::kA);
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
      off_w = 0;
      off_a = 0;
    }
  };

#pragma unroll 1
  for (int64_t seg = u0; seg < u1;) {
    // One segment: the chunks of one tile inside [u0, u1).
    const int64_t n_tile = seg / p.kblocks;
    const int64_t seg_end = min(u1, (n_tile + 1) * p.kblocks);
    const int nk = int(seg_end - seg);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    if constexpr (kMma) {
#pragma unroll 1
      for (int it = 0; it < nk; ++it) step_mma();
    } else {
      fence_regs(acc);
      int it = 0;
#pragma unroll 1
      for (; it + 1 < nk; it += 2) {
        const uint32_t before = prev;
        issue(fa);
        wg_wait<1>();
        fence_regs(fb);
        if (it > 0) release(before);
        const uint32_t mid = prev;
        issue(fb);
        wg_wait<1>();
        fence_regs(fa);
        release(mid);
      }
      if (it < nk) {
        const uint32_t before = prev;
        issue(fa);
        wg_wait<1>();
        fence_regs(fb);
        if (it > 0) release(before);
      }
      wg_wait<0>();
      fence_regs(acc);
      fence_regs(fa);
      fence_regs(fb);
      release(prev);  // every stage of the segment is handed back
    }

    if constexpr (STREAMK) {
      if (seg == n_tile * p.kblocks && seg_end == (n_tile + 1) * p.kblocks) {
        // The whole tile is this CTA's: write D.
#pragma unroll
        for (int g = 0; g < BM / 8; ++g)
          store_quad<BM>(p, int(n_tile), 0, ct, g, acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3], f);
      } else {
        // Shared with other CTAs: the fp32 sums go to this CTA's slot for its first or last segment.
        const int which = seg == u0 ? 0 : 1;
        float4* slot = p.slots + (size_t(blockIdx.x) * 2 + which) * (BM / 8) * kConsumers + ct;
#pragma unroll
        for (int g = 0; g < BM / 8; ++g) slot[g * kConsumers] = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
      }
    } else {
      // ---- tile grid: one segment; split-K within the cluster through distributed shared memory ----
      // (BM = 256 is only chosen when the tiles fill the GPU: never split, see make_plan.)
      if constexpr (BM < 256) {
        if (p.splits > 1) {
          // Both consumer warpgroups must be done with the stage buffers (the other one may still
          // be reading the activations of its last stages) before they are overwritten.
          named_sync(1, kConsumers);
          float4* red = reinterpret_cast<float4*>(smem);
#pragma unroll
          for (int g = 0; g < BM / 8; ++g) red[g * kConsumers + ct] = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
          grid_launch_dependents();
          cluster_sync();
          // CTA r of the cluster reduces quads [r * Q / S, (r + 1) * Q / S), Q = BM / 8 * 256, adding
          // the splits in split order 0..S-1 (deterministic, the same on every run and replay).
          const uint32_t r = cluster_rank(), splits = uint32_t(p.splits);
          constexpr uint32_t kQuads = uint32_t(BM / 8) * kConsumers;
          const uint32_t lo = r * kQuads / splits, hi = (r + 1) * kQuads / splits;
          const uint32_t red_u32 = smem_u32(red);
#pragma unroll 1
          for (uint32_t q = lo + uint32_t(ct); q < hi; q += kConsumers) {
            float4 sum = ld_peer(red_u32 + q * 16u, 0);
#pragma unroll 1
            for (uint32_t s = 1; s < splits; ++s) {
              const float4 v = ld_peer(red_u32 + q * 16u, s);
              sum.x += v.x;
              sum.y += v.y;
              sum.z += v.z;
              sum.w += v.w;
            }
            store_quad<BM>(p, int(n_tile), m_tile, int(q % kConsumers), int(q / kConsumers), sum.x, sum.y, sum.z, sum.w, f);
          }
          cluster_sync();  // the peers' shared memory stays alive until every read of it is done
          return;
        }
      }
#pragma unroll
      for (int g = 0; g < BM / 8; ++g)
        store_quad<BM>(p, int(n_tile), m_tile, ct, g, acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3], f);
    }
    seg = seg_end;
  }
  grid_launch_dependents();
}

// Stream-K fixup: one CTA per weight tile; a tile shared by CTAs c_first..c_last of the GEMM gets
// their slots added in CTA order and written to D. Launched right after the GEMM, programmatically
// dependent on it: it waits for the GEMM to finish (and its writes to be visible) before reading.
template <int BM>
__global__ void __launch_bounds__(kConsumers) w4a16_fixup_kernel(const Params p) {
  grid_launch_dependents();  // the next kernel may start its prologue: this one only reads slots
  const int64_t n_tile = blockIdx.x;
  const int64_t c_first = streamk_owner(n_tile * p.kblocks, p.units, p.ctas);
  const int64_t c_last = streamk_owner((n_tile + 1) * p.kblocks - 1, p.units, p.ctas);
  if (c_first == c_last) return;  // the GEMM wrote this tile directly
  grid_dependency_wait();
  const int ct = threadIdx.x;
  const float f = __ldg(p.alpha) * __ldg(p.factor);
  constexpr int kQ = BM / 8;
#pragma unroll
  for (int g = 0; g < kQ; ++g) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (int64_t c = c_first; c <= c_last; ++c) {
      const int which = streamk_start(c, p.units, p.ctas) / p.kblocks == n_tile ? 0 : 1;
      const float4 v = __ldcg(p.slots + (size_t(c) * 2 + which) * kQ * kConsumers + g * kConsumers + ct);
      if (c == c_first) {
        sum = v;
      } else {
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
    }
    store_quad<BM>(p, int(n_tile), 0, ct, g, sum.x, sum.y, sum.z, sum.w, f);
  }
}

// ---- prepare ----------------------------------------------------------------------------------------
// Scale byte (fp8 e4m3) -> the kernel's encoding u = (E << 3) | m, value 2^(E - 10) * (1 + m / 8):
// every positive e4m3 (subnormals included) is exact with E in 1..18. Zero and NaN scales give u = 0
// and zero the block's codes; a negative scale flips the block's code signs.
// Returned packed: bits 0..7 = u, bit 8 = zero the codes, bit 9 = flip the code signs.
__device__ __forceinline__ uint32_t encode_scale(uint32_t f) {
  const uint32_t neg = (f & 0x80u) ? 0x200u : 0u;
  const uint32_t a = f & 0x7Fu;
  if (a == 0u || a == 0x7Fu) return 0x100u;
  const uint32_t e = a >> 3, m = a & 7u;
  uint32_t u;
  if (e > 0) {
    u = ((e + 3u) << 3) | m;
  } else if (m == 1u) {
    u = 1u << 3;
  } else if (m < 4u) {
    u = (2u << 3) | ((m - 2u) << 2);
  } else {
    u = (3u << 3) | ((m - 4u) << 1);
  }
  return u | neg;
}

__device__ __forceinline__ int64_t scale_offset(int64_t row, int block, int kb4) {
  return (row >> 7) * (int64_t(kb4) * 512) + int64_t(block >> 2) * 512 + (row & 31) * 16 + ((row & 127) >> 5) * 4 +
         (block & 3);
}

// One thread per (chunk, warpgroup, thread): its 16 bytes of codes; lanes with lane % 4 == 0 also
// write the 8 scale bytes of their row pair.
__global__ void __launch_bounds__(256) w4a16_prepare_kernel(const uint8_t* __restrict__ packed,
                                                            const uint8_t* __restrict__ scales,
                                                            const float* __restrict__ global_scale, int n, int k,
                                                            int kblocks, uint8_t* __restrict__ out) {
  const int64_t chunk = blockIdx.x;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  const int g = lane >> 2, q = lane & 3;
  const int tile = int(chunk / kblocks), kb = int(chunk % kblocks);
  const int64_t r0 = int64_t(tile) * kTileN + wg * 64 + warp * 16 + g;
  const int kblk16 = k / 16, kb4 = (kblk16 + 3) / 4;
  uint32_t sc[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = r0 + 8 * h;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int b = kb * 4 + kk;
      const uint32_t byte = (r < n && b < kblk16) ? scales[scale_offset(r, b, kb4)] : 0u;
      sc[h][kk] = encode_scale(byte);
    }
  }
  uint32_t words[4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = j & 1;
      const int64_t r = r0 + 8 * h;
      const int col = kb * kBlockK + 16 * kk + 2 * q + (j >= 2 ? 8 : 0);
      uint32_t byte = (r < n && col < k) ? packed[r * (k / 2) + col / 2] : 0u;  // low nibble: col, high: col + 1
      if (sc[h][kk] & 0x100u) byte = 0u;
      if (sc[h][kk] & 0x200u) byte ^= 0x88u;
      const uint32_t lo = byte & 0xFu, hi = byte >> 4;
      w |= ((lo >> 3) << kRegSign[j]) | ((lo & 7u) << kRegMag[j]);
      w |= ((hi >> 3) << (16 + kRegSign[j])) | ((hi & 7u) << (16 + kRegMag[j]));
    }
    words[kk] = w;
  }
  uint8_t* c = out + kHeaderBytes + chunk * kChunkBytes;
  *reinterpret_cast<uint4*>(c + wg * 2048 + t * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  if (q == 0) {
    uint32_t s[2];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      s[half] = (sc[0][2 * half] & 0xFFu) | ((sc[1][2 * half] & 0xFFu) << 8) | ((sc[0][2 * half + 1] & 0xFFu) << 16) |
                ((sc[1][2 * half + 1] & 0xFFu) << 24);
    *reinterpret_cast<uint2*>(c + kCodeBytes + wg * 256 + warp * 64 + g * 8) = make_uint2(s[0], s[1]);
  }
  if (chunk == 0 && threadIdx.x < kHeaderBytes / 4) {
    uint32_t v = 0;
    if (threadIdx.x == 0) v = __float_as_uint(524288.0f / __ldg(global_scale));  // 2^19 / global_scale
    if (threadIdx.x == 1) v = uint32_t(n);
    if (threadIdx.x == 2) v = uint32_t(k);
    reinterpret_cast<uint32_t*>(out)[threadIdx.x] = v;
  }
}

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
  constexpr auto kernel = w4a16_gemm_kernel<cfg.bm, cfg.stages, cfg.ctas_per_sm, kStreamK>;
  constexpr auto fixup = w4a16_fixup_kernel<cfg.bm>;
  constexpr int smem = Smem<cfg.bm, cfg.stages>::kBytes;
  constexpr int threads = threads_for(cfg.bm);
  // Everything that can fail is done before anything is enqueued.
  EncodeTiled encode = nullptr;
  if (int st = encode_fn(&encode); st != GS_OK) return st;
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(m)};
  const cuuint64_t strides[1] = {cuuint64_t(ld_a) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBlockK), cuuint32_t(cfg.bm)};
  const cuuint32_t elem_strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return GS_ERR_INVALID_ARGUMENT;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return graphsafe::cuda_failed(e);
  if (int st = ensure_smem<kernel>(device, smem); st != GS_OK) return st;
  dim3 grid(unsigned(plan.tiles_n), unsigned(plan.tiles_m), 1);
  if constexpr (kStreamK) {
    grid = dim3(unsigned(plan.ctas), 1, 1);
  } else {
    // The planner's split count, lowered until the device holds one cluster per tile at once.
    int64_t s = plan.splits;
    while (s > 1) {
      bool fits = false;
      if (int st = clusters_fit<kernel>(device, int(s), smem, threads, plan.tiles, &fits); st != GS_OK) return st;
      if (fits) break;
      do {
        --s;
      } while (s > 1 && cdiv(plan.kblocks, cdiv(plan.kblocks, s)) != s);  // balanced counts only
    }
    p.splits = int(s);
    p.kb_per_split = int(cdiv(plan.kblocks, s));
    grid.z = unsigned(s);
  }
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = 1;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = grid.z;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = grid;
  lc.blockDim = dim3(threads);
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  lc.attrs = attrs;
  lc.numAttrs = grid.z > 1 ? 2 : 1;
  cudaError_t e = cudaLaunchKernelEx(&lc, kernel, map, p);
  if (e == cudaSuccess && kStreamK && plan.fixup) {
    cudaLaunchConfig_t fc = lc;
    fc.gridDim = dim3(unsigned(plan.tiles_n), 1, 1);
    fc.blockDim = dim3(kConsumers);
    fc.dynamicSmemBytes = 0;
    fc.numAttrs = 1;
    e = cudaLaunchKernelEx(&fc, fixup, p);
  }
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
    case 3: return launch<3, false>(a, ld_a, p, plan, m, k, s);
    case 4: return launch<4, false>(a, ld_a, p, plan, m, k, s);
    default: return launch<5, false>(a, ld_a, p, plan, m, k, s);
  }
}

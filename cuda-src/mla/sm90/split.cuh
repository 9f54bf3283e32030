// The parts of the sm90 MLA split kernels that they share (kernel_seesaw.cuh, kernel_n.cuh, kernel_n_fp8.cuh): a
// split's tile range, staging Q, the TMA producer, the warp-specialised prologue, and writing a
// split's rows (or an empty split). The shared-memory layout is described in kernels.cuh.
#pragma once

#include "mla/sm90/primitives.cuh"

namespace graphsafe::mla_sm90 {

// What a split CTA computes: tiles [tile0, tile0 + n) of request b (of `seq` keys, clamped), as
// split (partial slot) `split`; `final_out` when it writes the request's output itself (no
// partial, no combine), and `active` false for a CTA that has nothing to do (n = 0 then is an
// empty request, whose item writes its zeros and +inf, or an empty split of one request).
struct SplitRange {
  int b;
  int split;
  int seq;
  int tile0;
  int n;
  bool final_out;
  bool active;
};
// Request b's length as one value for the whole CTA: thread 0 reads it once, every thread takes
// that copy. seq_lens is caller memory another stream may be writing meanwhile; read by each
// thread on its own, the producer and the math warps could disagree on the tile count and wait
// forever on barriers the other side never completes. Every thread of the CTA calls this once,
// before any role split.
__device__ __forceinline__ int cta_seq_len(const Params& p, int b) {
  __shared__ int s_seq;
  if (threadIdx.x == 0) s_seq = *reinterpret_cast<const volatile int32_t*>(p.seq_lens + b);
  __syncthreads();
  return s_seq;
}
// This CTA's work (every thread of the CTA calls it once, before any role split, and gets the same
// answer). One request (no schedule): split blockIdx.y of an even division of its tiles into
// num_splits, every split writing its partial (or, empty, LSE -inf) for the combine. A batch: the
// work item schedule.cuh ordered into slot (blockIdx.z, blockIdx.y), over the lengths it read once.
// `seq_of(b)`: request b's length as the whole CTA sees it (cta_seq_len), read only without a schedule.
template <class SeqOf>
__device__ __forceinline__ SplitRange split_range_of(const Params& p, SeqOf&& seq_of) {
  if (p.sched_lens == nullptr) {
    const int b = blockIdx.z, split = blockIdx.y;
    const int seq = max(0, min(seq_of(b), p.max_seq_len));
    const int tiles = (seq + kTileS - 1) / kTileS;
    const int per = (tiles + p.num_splits - 1) / p.num_splits;
    const int t0 = split * per;
    return SplitRange{b, split, seq, t0, max(0, min(tiles, t0 + per) - t0), p.num_splits == 1, true};
  }
  int b = blockIdx.z, c = blockIdx.y;
  if (p.sched_items != nullptr) {
    const int item = p.sched_items[blockIdx.z * p.num_splits + blockIdx.y];
    if (item < 0) return SplitRange{0, 0, 0, 0, 0, true, false};
    b = item >> 16;
    c = item & 0xFFFF;
  }
  const int seq = p.sched_lens[b];
  const int tiles = (seq + kTileS - 1) / kTileS;
  const int chunks = (tiles + p.chunk - 1) / p.chunk;
  const int t0 = c * p.chunk;
  const int n = max(0, min(tiles - t0, p.chunk));
  return SplitRange{b, c, seq, t0, n, chunks <= 1, n > 0 || (c == 0 && chunks == 0)};
}
__device__ __forceinline__ SplitRange split_range(const Params& p) {
  return split_range_of(p, [&](int b) { return cta_seq_len(p, b); });
}
// The split range of a CTA pair (a cluster of two along x: two row groups of one split, which
// share their tiles' conversion, fp8.cuh). Both CTAs must count the same tiles, or one would wait
// forever for the other's half of a box: rank 0 reads the request's length once and its peer takes
// that copy. `init` (thread 0 of each CTA: its barriers) runs before the one cluster barrier that
// publishes both to the peer. From here on neither CTA may exit before a last cluster_sync: the
// peer may still read its length, arrive on its barriers or write its stages.
template <class Init>
__device__ __forceinline__ SplitRange split_range_pair(const Params& p, Init&& init) {
  __shared__ int s_seq;
  const uint32_t rank = cluster_rank();
  if (threadIdx.x == 0) {
    init();
    fence_barrier_init();
    if (rank == 0 && p.sched_lens == nullptr) s_seq = *reinterpret_cast<const volatile int32_t*>(p.seq_lens + blockIdx.z);
  }
  cluster_sync();
  return split_range_of(p, [&](int) { return rank == 0 ? s_seq : ld_peer_s32(smem_u32(&s_seq), 0); });
}

// Query rows [row0, row0 + valid) of request b into `sq` (ROWS rows, swizzled K-major blocks of
// ROWS x 128 B); rows past `valid` are zero. NT threads (t = 0..NT-1) share the work.
// Aligned q (p.q_vec): every 16-byte piece by cp.async.cg (L2 only, no registers), all of a thread's
// pieces in flight at once, one wait. H200, scratch harness, graphs of 10, outputs bit-identical:
// Q staged 4.8 -> 3.2 us after kernel entry and the first S product 6.0 -> 4.4 (globaltimer probes,
// 128 heads 1 x 65,536); 128 heads 1 x 65,536 43.2 -> 41.7 us, 4 x 16,384 44.0 -> 42.4, 16 x 16,384
// 117.5 -> 115.8, 64 x 4096 114.1 -> 112.6; 32 heads 64 x 4096 89.3 -> 88.7; 16 heads 64 x 4096
// 83.6 -> 83.8 (noise level). Register loads in batches of 9 (the path before) took 4.8 us; in one
// batch of 18, 1-3 % slower than cp.async.
// Unaligned q: register loads of 16-bit elements in batches of kQBatch pieces before the batch's
// stores (a load -> store pair per piece waited one L2 round trip each).
// Both read through L2 only: the N kernel is launched programmatically dependent and q may come
// from the grid just before it. The load follows griddepcontrol.wait (that grid has completed and
// flushed), so the read-only path would see q too; L2-only is the conservative choice where it
// costs nothing measurable (fp8.cuh's page-table read is where it did).
constexpr int kQBatch = 9;  // unaligned path: 9 pieces a batch, 36 registers held at a time
// The 16-byte piece c (0..63 latent, 64..71 rope) of query row r of request b.
__device__ __forceinline__ const uint16_t* q_piece(const Params& p, int b, int r, int c) {
  const QueryRow qr = query_row(p, r);
  return c < 64 ? p.q_nope + b * p.q_nope_sb + qr.t * p.q_nope_st + qr.h * p.q_nope_sh + c * 8
                : p.q_pe + b * p.q_pe_sb + qr.t * p.q_pe_st + qr.h * p.q_pe_sh + (c - 64) * 8;
}
template <int ROWS, int NT>
__device__ __forceinline__ void load_q(uint8_t* sq, const Params& p, int b, int row0, int valid, int t) {
  constexpr int kItems = ROWS * 72;  // 16-byte pieces: 64 nope + 8 rope per row
  auto piece = [&](int r, int c) -> const uint16_t* { return q_piece(p, b, row0 + r, c); };
  auto dst = [&](int r, int c) { return sq + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4); };
  if (p.q_vec) {
    for (int idx = t; idx < kItems; idx += NT) {
      const int r = idx / 72, c = idx - r * 72;
      if (r < valid) {
        cp_async_16_cg(dst(r, c), piece(r, c));
      } else {
        *reinterpret_cast<uint4*>(dst(r, c)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cp_async_wait_all();
    return;
  }
#pragma unroll 1
  for (int base = t; base < kItems; base += kQBatch * NT) {
    uint4 v[kQBatch];
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int idx = base + j * NT;
      const int r = idx / 72, c = idx - r * 72;
      v[j] = make_uint4(0u, 0u, 0u, 0u);
      if (idx < kItems && r < valid) {
        const uint16_t* src = piece(r, c);
        uint16_t e[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) e[k] = __ldcg(src + k);
        v[j] = make_uint4(e[0] | (uint32_t(e[1]) << 16), e[2] | (uint32_t(e[3]) << 16), e[4] | (uint32_t(e[5]) << 16),
                          e[6] | (uint32_t(e[7]) << 16));
      }
    }
#pragma unroll
    for (int j = 0; j < kQBatch; ++j) {
      const int idx = base + j * NT;
      const int r = idx / 72, c = idx - r * 72;
      if (idx < kItems) *reinterpret_cast<uint4*>(dst(r, c)) = v[j];
    }
  }
}

// Zeroes V rows [valid, 64) of a tile (blocks 0..7): those tokens lie past seq_len, their bytes
// are whatever the cache holds (maybe NaN), and P = 0 times NaN would still be NaN.
__device__ __forceinline__ void zero_tail_rows(uint8_t* stage, int valid, int t, int nt) {
  const int count = (kTileS - valid) * 64;  // rows x 8 blocks x 8 chunks
  for (int idx = t; idx < count; idx += nt) {
    const int r = valid + (idx >> 6), blk = (idx >> 3) & 7, ch = idx & 7;
    *reinterpret_cast<uint4*>(stage + blk * kBlockBytes + r * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The producer of the N kernel's bf16/fp16 path: one thread streams the split's tiles into two
// stages with TMA (the page table read through L2 only: the kernel is launched programmatically
// dependent, see load_q).
// full[s] completes when a tile has landed; empty[s] when the consumers are done with it.
__device__ __forceinline__ void produce_tiles(const CUtensorMap* map, const Params& p, int b, const SplitRange& sr,
                                              uint32_t stages, uint32_t full0, uint32_t empty0) {
  const int64_t pt_row = int64_t(b) * p.page_table_stride;
  for (int i = 0; i < sr.n; ++i) {
    const int s = i & 1;
    const int tok = (sr.tile0 + i) * kTileS;
    // Issued before the wait below. A page index out of range is clamped into the cache, the rule
    // the sm100 path's sanitize pre-pass applies too (graphsafe_kernels/mla.h, "Device data").
    const int page = min(max(__ldcg(p.page_table + pt_row + tok / p.page_size), 0), p.num_pages - 1);
    const int row = page * p.page_size + tok % p.page_size;
    if (i >= 2) mbar_wait(empty0 + 8 * s, ((i >> 1) - 1) & 1);
    mbar_arrive_expect_tx(full0 + 8 * s, kStageBytes);
    const uint32_t dst = stages + s * kStageBytes;
#pragma unroll
    for (int c = 0; c < kBlocks; ++c) tma_load_2d_evict_first(dst + c * kBlockBytes, map, c * 64, row, full0 + 8 * s);
  }
}

// The warp-specialised prologue of the split kernels. Thread 0 runs `init` (the kernel's barriers)
// and fences it. Then the producer warpgroup gives its registers to the math warpgroups (kMathR per
// math thread, kProdR per producer thread), runs `produce(pt)` on each of its 128 threads (pt =
// 0..127), and returns false (the kernel returns: exited threads do not hold up the math barrier).
// The math threads take the registers and return true.
template <int kMathR, int kProdR, class Init, class Produce>
__device__ __forceinline__ bool enter_roles_init(int tid, Init&& init, Produce&& produce) {
  // setmaxnreg moves registers only within the CTA's launch allocation (kThreads x the launch
  // bound's 168): an increase the decreases do not pay for blocks forever.
  static_assert(2 * 128 * kMathR + 128 * kProdR <= kThreads * kLaunchRegs, "register split exceeds the CTA's allocation");
  if (tid == 0) {
    init();
    fence_barrier_init();
  }
  __syncthreads();

  if (tid >= kMathThreads) {
    regs_decrease<kProdR>();
    produce(tid - kMathThreads);
    return false;
  }
  regs_increase<kMathR>();
  return true;
}

// The prologue with the barrier layout the stage-pair kernels use, 8 bytes each from `bars`:
// kPairs two-stage pairs with the given arrival counts (full[2] first; empty[2] next), then the
// math barrier (kMathThreads), then kExtra barriers of `extra_count` arrivals.
template <int kPairs, int kExtra = 0>
__device__ __forceinline__ void init_barriers(uint32_t bars, const uint32_t (&pair_counts)[kPairs], uint32_t extra_count) {
  const uint32_t math_bar = bars + 16 * kPairs;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    mbar_init(bars + 16 * i, pair_counts[i]);
    mbar_init(bars + 16 * i + 8, pair_counts[i]);
  }
  mbar_init(math_bar, kMathThreads);
#pragma unroll
  for (int i = 0; i < kExtra; ++i) mbar_init(math_bar + 8 + 8 * i, extra_count);
}
template <int kPairs, int kMathR, int kProdR, int kExtra = 0, class Produce>
__device__ __forceinline__ bool enter_roles_with(int tid, uint32_t bars, const uint32_t (&pair_counts)[kPairs],
                                                 uint32_t extra_count, Produce&& produce) {
  return enter_roles_init<kMathR, kProdR>(
      tid, [&] { init_barriers<kPairs, kExtra>(bars, pair_counts, extra_count); }, produce);
}

// The prologue with the TMA producer (full barriers: one arrival, the producer's expect_tx).
template <int kPairs>
__device__ __forceinline__ bool enter_roles(const CUtensorMap* map, const Params& p, int b, const SplitRange& sr, int tid,
                                            uint32_t bars, const uint32_t (&pair_counts)[kPairs], uint32_t skv_a) {
  return enter_roles_with<kPairs, kMathRegs, kProducerRegs>(tid, bars, pair_counts, 0u, [&](int pt) {
    if (pt == 0) produce_tiles(map, p, b, sr, skv_a, bars, bars + 16);
  });
}

// Writes `rows` finished rows (fp32 in shared memory, row stride `stride` floats, normalised) in the
// output dtype to out (a CTA that writes its request's output) or in fp32 to the partial-O
// workspace (workspace.h says why fp32); and their LSE (fp32 either way).
// Where row r of request b writes its output: out[b, t, h, :] and lse[b, h, t] for its (t, h).
__device__ __forceinline__ uint16_t* out_row(const Params& p, int b, int r) {
  const QueryRow qr = query_row(p, r);
  return p.out + b * p.out_sb + qr.t * p.out_st + qr.h * p.out_sh;
}
__device__ __forceinline__ int64_t lse_index(const Params& p, int b, int r) {
  const QueryRow qr = query_row(p, r);
  return (int64_t(b) * p.num_heads + qr.h) * p.s_q + qr.t;
}
// The LSE a finished row reports: a row that attended no key (LSE -inf: l = 0) reports +inf, as
// FlashMLA does (its output is zeros), so an engine merging attention states by LSE weighs it 0
// either way; a split's partial keeps -inf, which the combine reads as "empty".
__device__ __forceinline__ float final_lse(float lse) { return lse == -INFINITY ? INFINITY : lse; }

template <bool F16>
__device__ __forceinline__ void store_rows(const float* so, int stride, int rows, int row0, const float* slse,
                                           const Params& p, const SplitRange& sr, int t, int nt) {
  const int R = p.rows, b = sr.b, split = sr.split;
  for (int idx = t; idx < rows * 64; idx += nt) {
    const int r = idx >> 6, c8 = idx & 63;
    const float4 x = *reinterpret_cast<const float4*>(so + r * stride + c8 * 8);
    const float4 y = *reinterpret_cast<const float4*>(so + r * stride + c8 * 8 + 4);
    if (sr.final_out) {
      const uint4 v = make_uint4(pack2<F16>(x.x, x.y), pack2<F16>(x.z, x.w), pack2<F16>(y.x, y.y), pack2<F16>(y.z, y.w));
      uint16_t* dst = out_row(p, b, row0 + r) + c8 * 8;
      if (p.out_vec) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          dst[2 * k] = uint16_t(w[k] & 0xFFFFu);
          dst[2 * k + 1] = uint16_t(w[k] >> 16);
        }
      }
    } else {
      float* dst = p.ws_o + ((int64_t(b) * p.num_splits + split) * R + row0 + r) * kNope + c8 * 8;
      *reinterpret_cast<float4*>(dst) = x;
      *reinterpret_cast<float4*>(dst + 4) = y;
    }
  }
  for (int r = t; r < rows; r += nt) {
    if (sr.final_out) {
      if (p.lse != nullptr) p.lse[lse_index(p, b, row0 + r)] = final_lse(slse[r]);
    } else {
      p.ws_lse[(int64_t(b) * p.num_splits + split) * R + row0 + r] = slse[r];
    }
  }
}

// The 64-row (seesaw) kernel's output: a math warpgroup's 64 x 256 accumulator (the MMA's
// m64n256 layout, columns col0 + 8 j + 2 q, rows r0 and r1 = r0 + 8) times the rows' 1/l, staged
// as fp32 rows in shared memory, then, after the math barrier, stored coalesced by store_rows.
constexpr int kOStageStride = 520;  // floats per staged row (conflict-free float2 stores)
template <bool F16>
__device__ __forceinline__ void stage_and_store_o64(float* so, const float (&o)[128], int col0, int q, int r0, int r1, float i0,
                                                    float i1, uint32_t math_bar, uint32_t& math_phase, int rows, int row0,
                                                    const float* s_lse, const Params& p, const SplitRange& sr, int tid) {
  const int cbase = col0 + 2 * q;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    *reinterpret_cast<float2*>(so + r0 * kOStageStride + cbase + 8 * j) = make_float2(o[4 * j] * i0, o[4 * j + 1] * i0);
    *reinterpret_cast<float2*>(so + r1 * kOStageStride + cbase + 8 * j) = make_float2(o[4 * j + 2] * i1, o[4 * j + 3] * i1);
  }
  mbar_sync(math_bar, math_phase);
  store_rows<F16>(so, kOStageStride, rows, row0, s_lse, p, sr, tid, kMathThreads);
}

// An empty split (or seq_len 0): a CTA that writes the output itself writes zeros and LSE = +inf
// (final_lse); a partial writes only LSE = -inf, which tells the combine kernel to skip (never
// read) its partial O.
template <bool F16>
__device__ __forceinline__ void write_empty(const Params& p, const SplitRange& sr, int row0, int rows, int t, int nt) {
  const int b = sr.b;
  if (sr.final_out) {
    for (int idx = t; idx < rows * kNope; idx += nt) {
      const int r = idx / kNope, d = idx - r * kNope;
      out_row(p, b, row0 + r)[d] = 0;
    }
    if (p.lse != nullptr)
      for (int r = t; r < rows; r += nt) p.lse[lse_index(p, b, row0 + r)] = INFINITY;
  } else {
    for (int r = t; r < rows; r += nt) p.ws_lse[(int64_t(b) * p.num_splits + sr.split) * p.rows + row0 + r] = -INFINITY;
  }
}

}  // namespace graphsafe::mla_sm90

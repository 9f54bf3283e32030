// The work schedule of a batched sm90 MLA decode (batch > 1): which (request, chunk) each split
// CTA computes, and in what order the GPU runs them. Written for this crate; see decode.cu.
//
// Why: with requests of different lengths (every real batch), a CTA per (request, split) in
// request order leaves the longest requests' CTAs starting late, after the short ones, and the
// step ends a long CTA after the average: FlashMLA's varlen test batches (normal lengths around s_k,
// sd s_k / 2) ran about 1.5x their balanced time in a list-scheduling model. FlashMLA balances
// with persistent CTAs walking a precomputed range of tiles across requests; here the grid stays a
// CTA per work item, and the items are ordered longest first (LPT), so no long item starts late:
// within a few percent of balanced in the same model.
//
// Work items. A request of T tiles (T = ceil(len / 64), len its clamped length) is cut into
// chunks of `chunk` tiles (the host's: ceil(T_max / splits)), n = ceil(T / chunk) of them; item
// (b, c) computes tiles [c chunk, min(T, (c + 1) chunk)). A request with one chunk writes its
// output directly (no partial, no combine); with more, each chunk writes a partial and the combine
// merges exactly n of them. An empty request (n = 0) is one item, (b, 0), which writes its zeros
// and +inf. Items: all of every request's full chunks first, then each request's last chunk and
// the empty requests, longest first; the CTAs past the last item do nothing.
//
// The schedule kernel (one CTA, before the split kernels, on the same stream) reads seq_lens once
// into the lens region (so every CTA and the combine see the same lengths, whatever another stream
// does to seq_lens meanwhile) and writes the items region. Batches above kSchedMaxSorted keep the
// request order (item (b, c) at b * splits + c: lengths read once, chunks as above, no reorder).
// Everything is a function of the lengths alone: the same lengths give the same items, and each
// item's result does not depend on where it runs, so the output is bit-identical whatever the order.
#pragma once

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include "mla/sm90/primitives.cuh"

namespace graphsafe::mla_sm90 {

// The kernel runs as one CTA sized to the batch (sched_threads): a 1024-thread sort of a batch of
// 64 took 7.2 us of every decode on an H100, longer than the combine; one warp takes 3.1 us
// there, 256 threads 3.5 us at a batch of 128 (graphs of 10 decodes,
// benches/anchors/flashmla/kernels.py).
constexpr int kSchedMaxThreads = 1024;
constexpr int kSchedPerThread = 2;
constexpr int kSchedMaxSorted = kSchedMaxThreads * kSchedPerThread;  // batches up to this are ordered

// Threads of the schedule kernel for a batch: enough to hold every request (two each), from one
// warp up; batches above kSchedMaxSorted take the largest, which only reads their lengths.
__host__ __device__ constexpr int sched_threads(int batch) {
  return batch <= 32 * kSchedPerThread ? 32 : batch <= 256 * kSchedPerThread ? 256 : kSchedMaxThreads;
}
constexpr int kSchedKeyBits = 11;  // sort keys 0..2047: 0..1023 a last chunk's size (desc), 1024 empty

// An item as the items region stores it: request b (< 65536) and chunk c (< 256), or -1 for none.
__host__ __device__ constexpr int32_t sched_item(int b, int c) { return (b << 16) | c; }

// Chunks of a request of `seq` tokens: ceil(T / chunk), T = ceil(seq / 64) (0 for seq 0).
__host__ __device__ inline int sched_chunks(int seq, int chunk) {
  const int tiles = (seq + kTileS - 1) / kTileS;
  return (tiles + chunk - 1) / chunk;
}

// Its sort key: the last chunk's size, largest first (quantised to 1024 steps of `chunk`), empty
// requests after every other.
__host__ __device__ inline uint32_t sched_key(int seq, int chunk) {
  const int tiles = (seq + kTileS - 1) / kTileS;
  const int n = (tiles + chunk - 1) / chunk;
  if (n == 0) return 1024u;
  const int last = tiles - (n - 1) * chunk;  // 1..chunk
  return uint32_t((uint64_t(chunk - last) * 1023u) / uint64_t(chunk));
}

// Launched with kThreads == sched_threads(p.batch) (launch_schedule below), so a sorted batch
// always fits the block's kThreads * kSchedPerThread slots.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) mla_sm90_schedule_kernel(const Params p) {
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kSchedPerThread, int32_t>;
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } tmp;
  const int B = p.batch, S = p.num_splits, t = threadIdx.x;
  // The lengths, read once (seq_lens is caller memory another stream may be writing) and clamped
  // as every kernel clamps them.
  for (int b = t; b < B; b += kThreads) {
    const int seq = *reinterpret_cast<const volatile int32_t*>(p.seq_lens + b);
    p.sched_lens[b] = max(0, min(seq, p.max_seq_len));
  }
  if (B > kThreads * kSchedPerThread) return;  // (B > kSchedMaxSorted) request order: the split kernels map (b, c) = (z, y)
  __syncthreads();  // the lens writes above are visible to the whole block (global memory, same CTA)

  // Blocked arrangement: thread t holds requests 2t, 2t + 1 (padding past B sorts last).
  uint32_t key[kSchedPerThread];
  int32_t req[kSchedPerThread];
#pragma unroll
  for (int i = 0; i < kSchedPerThread; ++i) {
    const int b = t * kSchedPerThread + i;
    req[i] = b;
    key[i] = b < B ? sched_key(p.sched_lens[b], p.chunk) : 2047u;
  }
  Sort(tmp.sort).Sort(key, req, 0, kSchedKeyBits);  // stable: equal keys keep request order
  __syncthreads();
  // Thread t now holds sorted positions 2t, 2t + 1. Full chunks first: each request's n - 1 of
  // them at the running sum of the requests before it in this order; then the last chunks (and the
  // empty requests) at full_total + position.
  int32_t n[kSchedPerThread], full = 0;
#pragma unroll
  for (int i = 0; i < kSchedPerThread; ++i) {
    n[i] = req[i] < B ? sched_chunks(p.sched_lens[req[i]], p.chunk) : 0;
    full += max(n[i] - 1, 0);
  }
  int32_t before = 0, full_total = 0;
  Scan(tmp.scan).ExclusiveSum(full, before, full_total);
#pragma unroll
  for (int i = 0; i < kSchedPerThread; ++i) {
    const int pos = t * kSchedPerThread + i;
    if (req[i] >= B) continue;
    for (int c = 0; c < n[i] - 1; ++c) p.sched_items[before++] = sched_item(req[i], c);
    p.sched_items[full_total + pos] = sched_item(req[i], max(n[i] - 1, 0));
  }
  for (int i = full_total + B + t; i < B * S; i += kThreads) p.sched_items[i] = -1;
}

// The schedule kernel for p.batch requests on `stream`, one CTA of sched_threads(p.batch).
inline void launch_schedule(const Params& p, cudaStream_t stream) {
  switch (sched_threads(p.batch)) {
    case 32: mla_sm90_schedule_kernel<32><<<1, 32, 0, stream>>>(p); break;
    case 256: mla_sm90_schedule_kernel<256><<<1, 256, 0, stream>>>(p); break;
    default: mla_sm90_schedule_kernel<kSchedMaxThreads><<<1, kSchedMaxThreads, 0, stream>>>(p); break;
  }
}

}  // namespace graphsafe::mla_sm90

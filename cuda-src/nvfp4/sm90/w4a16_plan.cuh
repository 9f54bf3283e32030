// Planning of graphsafe's Hopper weight-only NVFP4 GEMM (W4A16), shared by the host-only queries
// (plan.cu, built on every build) and the launcher (w4a16.cu, sm_90a): the prepared-weight layout,
// the tile for m, the split-K count and the workspace layout. Plain C++, no device code.
//
// Prepared weight (gs_nvfp4_w4a16_prepare writes it, the GEMM reads it):
//
//   bytes [0, 256)       header: float factor = 2^19 / global_scale (the GEMM's epilogue scale, see
//                        w4a16.cu), then int32 n, int32 k; the rest zero
//   bytes [256, ...)     [ceil(n / 128)][ceil(k / 64)] chunks of kChunkBytes = 4608 bytes, one per
//                        (128-row weight tile, 64-wide k-block): what one pipeline stage loads with
//                        a single bulk copy. Inside a chunk:
//                          [0, 4096)    codes: [warpgroup 0..1][thread 0..127][16 bytes]
//                          [4096, 4608) scales: [warpgroup 0..1][warp 0..3][group 0..7][8 bytes]
//                        Rows >= n and columns >= k are zero codes.
//
// Tiles: a CTA computes 128 weight rows (two consumer warpgroups of 64) x BM activation rows,
// BM in {8, 16, 32, 64, 128, 256} chosen by m; grid = (n tiles, m tiles, splits).
//
// Split-K when the tiles alone cannot fill the machine: the count minimising a per-SM cost model
// (make_plan), at most min(32, kblocks / 4), balanced so that no split is empty.
// Workspace (splits > 1 only, else 0):
//   partials  fp32 [splits][tiles][BM / 2][256]   at byte 0 (each consumer thread's accumulators)
//   counters  u32  [tiles]                        at byte round_up(partials, 256); zeroed on the
//                                                 stream before every launch (the workspace is
//                                                 shared with other kernels and shapes, which leave
//                                                 it dirty), and reset by the last CTA of a tile
//   total = round_up(partials, 256) + round_up(tiles x 4, 256)
#pragma once

#include <cstdint>

namespace graphsafe::nvfp4_sm90 {

constexpr int kTileN = 128;          // weight rows per CTA
constexpr int kBlockK = 64;          // k per pipeline stage
constexpr int kHeaderBytes = 256;    // prepared header
constexpr int kCodeBytes = 4096;     // codes of one chunk (128 rows x 64 k / 2)
constexpr int kScaleBytes = 512;     // scales of one chunk (128 rows x 4 blocks)
constexpr int kChunkBytes = kCodeBytes + kScaleBytes;
constexpr int kMaxSplits = 32;
constexpr int kMinKBlocksPerSplit = 4;
constexpr int32_t kMaxM = 1 << 22;   // grid.y = ceil(m / BM) stays below 65536
constexpr int32_t kMaxNK = 1 << 24;

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline uint64_t round256(uint64_t x) { return (x + 255) & ~uint64_t{255}; }

// Shapes the kernel supports (the op guarantees k and n multiples of 32; these are the limits).
inline bool shape_ok(int32_t m, int32_t n, int32_t k) {
  return m >= 1 && m <= kMaxM && n >= 32 && n <= kMaxNK && n % 32 == 0 && k >= 32 && k <= kMaxNK && k % 32 == 0;
}

inline uint64_t prepared_bytes(int32_t n, int32_t k) {
  return uint64_t(kHeaderBytes) + uint64_t(cdiv(n, kTileN)) * uint64_t(cdiv(k, kBlockK)) * uint64_t(kChunkBytes);
}

// The kernel configurations (w4a16.cu instantiates exactly these).
struct Config {
  int bm;           // activation rows per CTA (the wgmma N)
  int stages;       // pipeline depth
  int ctas_per_sm;  // occupancy the kernel is built for (__launch_bounds__ min blocks)
  int split_slots;  // CTAs per SM the split-K model aims for (measured on an H200: fewer, larger
                    // splits win for BM = 64, whose extra CTAs cost more partial traffic than they
                    // gain in latency hiding)
};
constexpr Config kConfigs[] = {
    {8, 8, 3, 3}, {16, 8, 3, 3}, {32, 8, 2, 2}, {64, 6, 2, 1}, {128, 8, 1, 1}, {256, 6, 1, 1},
};
constexpr int kNumConfigs = 6;

struct Plan {
  int config;        // index into kConfigs
  int bm;
  int tiles_n, tiles_m, tiles;
  int kblocks;       // ceil(k / 64)
  int splits;
  int kb_per_split;
  uint64_t partial_bytes;  // offset of the counters
  uint64_t workspace_bytes;
};

inline Plan make_plan(int32_t m, int32_t n, int32_t k, int32_t sm_count) {
  Plan p{};
  p.tiles_n = int(cdiv(n, kTileN));
  p.kblocks = int(cdiv(k, kBlockK));
  int c;
  if (m <= 8) c = 0;
  else if (m <= 16) c = 1;
  else if (m <= 32) c = 2;
  else if (m <= 64) c = 3;
  else if (m <= 128) c = 4;
  else c = (cdiv(m, 256) * p.tiles_n >= sm_count) ? 5 : 4;  // 128-row tiles while 256 cannot fill
  p.config = c;
  p.bm = kConfigs[c].bm;
  p.tiles_m = int(cdiv(m, p.bm));
  p.tiles = p.tiles_m * p.tiles_n;
  // Split count: the smallest-cost s, cost(s) = ceil(ctas / sm) * (ceil(kblocks / s) + c) / fill,
  // ctas = tiles * s, fill = min(1, ctas / (sm * split_slots)): per-SM work in k-blocks plus a fixed
  // cost per CTA c (3 k-blocks, plus the fp32 partial tile written and read back, in k-block-loads,
  // when split), inflated while the grid leaves CTA slots empty (a lone CTA streams slower). A
  // larger s must also win by 5%.
  const int64_t sm = sm_count > 0 ? sm_count : 1;
  const int64_t slots = sm * kConfigs[c].split_slots;
  int64_t s = 1;
  if (c != 5) {  // 256-row tiles are only chosen when they fill the GPU: never split
    int64_t max_s = p.kblocks / kMinKBlocksPerSplit;
    if (max_s > kMaxSplits) max_s = kMaxSplits;
    double best = 0.0;
    for (int64_t t = 1; t <= (max_s > 1 ? max_s : 1); ++t) {
      const int64_t kb = cdiv(p.kblocks, t);
      if (t > 1 && cdiv(p.kblocks, kb) != t) continue;  // an unbalanced count (it would leave a split empty)
      const int64_t ctas = int64_t(p.tiles) * t;
      const double fill = ctas >= slots ? 1.0 : double(ctas) / double(slots);
      const double fixed = 3.0 + (t > 1 ? double(p.bm) * 1024.0 / double(kChunkBytes + p.bm * 128) : 0.0);
      const double cost = double(cdiv(ctas, sm)) * (double(kb) + fixed) / fill;
      if (t == 1 || cost < best * 0.95) {
        best = cost;
        s = t;
      }
    }
  }
  p.kb_per_split = int(cdiv(p.kblocks, s));
  p.splits = int(cdiv(p.kblocks, p.kb_per_split));  // balanced: no empty split
  if (p.splits > 1) {
    p.partial_bytes = round256(uint64_t(p.splits) * uint64_t(p.tiles) * uint64_t(p.bm / 2) * 256u * 4u);
    p.workspace_bytes = p.partial_bytes + round256(uint64_t(p.tiles) * 4u);
  }
  return p;
}

}  // namespace graphsafe::nvfp4_sm90

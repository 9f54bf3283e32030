// Planning of graphsafe's Hopper weight-only NVFP4 GEMM (W4A16), shared by the host-only queries
// (plan.cu, built on every build) and the launcher (w4a16.cu, sm_90a): the prepared-weight layout,
// the tile for m and the split-K count. Plain C++, no device code; every size is computed in 64-bit
// arithmetic from inputs that shape_ok bounds, so nothing can overflow whatever the SM count.
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
// BM in {8, 16, 32, 64, 128, 192, 256} chosen by m; grid = (n tiles, m tiles, splits).
//
// Small m (configurations BM <= 32: the GEMM streams the weight) with at least 40 chunks per CTA
// slot, and m <= 64 with as many chunks where the tiles do not fill the SMs and each CTA's range
// touches at most two tiles (streamk_two_segments): stream-K. The prepared weight's
// chunks, in order, are the work units (tile-major, k inside); a grid of C = min(sm_count x CTAs
// per SM, units, 2^16) CTAs, all resident at once, each streams the contiguous range of chunks
// [floor(c U / C), floor((c + 1) U / C)) — every SM gets the same bytes whatever the tile count
// (a tile grid of 224 tiles on 132 SMs gives some SMs twice the work of others). A CTA's segment
// that covers a whole tile writes D directly; a segment of a tile shared with other CTAs writes
// its fp32 accumulators to a workspace slot, and a second, small kernel (launched programmatically
// dependent, so it is resident and waiting when the GEMM ends) adds each shared tile's slots in
// CTA order (deterministic) and writes D. Every slot the second kernel reads was written by the
// GEMM launched just before it: no counters, nothing to zero, a dirty workspace cannot matter.
// Workspace (only when some tile is shared: k > 64 and C does not divide the tile count, see make_plan):
//   slots  float4 [C][2 (first, last segment of the CTA)][BM / 8][256 consumer threads]
//   total = C * 2 * BM * 512 bytes
//
// With fewer chunks per slot the fixed cost of the fixup (a serialised step after the GEMM) weighs
// more than the stream-K balance gains (H200, m = 1 and 16: 8192 x 8192 ran 1.05-1.16x faster on
// the tile grid, 28672 x 8192 and 8192 x 28672 1.01-1.09x faster with stream-K; 20.7 and 72.4
// chunks per slot), so those take the tile grid too.
// Larger m (BM = 64, 128) and small stream-K problems: a tile grid (n tiles, m tiles, splits); when the tiles alone leave most
// CTA slots empty the splits of a tile form one thread-block cluster (1 x 1 x splits, at most 8,
// the portable size) and reduce through distributed shared memory in split order: no workspace.
// The split count: the largest s <= min(8, kblocks / 4) such that tiles * s CTAs fit in one wave
// (sm_count * CTAs per SM) and no split is empty; the launcher lowers it further if the device
// cannot hold that many clusters at once (cudaOccupancyMaxActiveClusters: GPCs fragment them).
// m > 128 takes 256-, 192- or 128-row tiles (split like the others, their accumulators staged over
// the idle stage buffers), whichever make_plan's cost estimates fastest. Measured on an H200:
// docs/notes/2026-12-nvfp4-log.md.
#pragma once

#include <cstdint>

namespace graphsafe::nvfp4_sm90 {

constexpr int kTileN = 128;          // weight rows per CTA
constexpr int kBlockK = 64;          // k per pipeline stage
constexpr int kHeaderBytes = 256;    // prepared header
constexpr int kCodeBytes = 4096;     // codes of one chunk (128 rows x 64 k / 2)
constexpr int kScaleBytes = 512;     // scales of one chunk (128 rows x 4 blocks)
constexpr int kChunkBytes = kCodeBytes + kScaleBytes;
constexpr int kMaxSplits = 8;        // the portable cluster size
constexpr int kMaxStreamKCtas = 1 << 16;  // keeps c * units in 64 bits (units < 2^35)
constexpr int kStreamKMinChunksPerCta = 40;
constexpr int kMinKBlocksPerSplit = 4;
constexpr int32_t kMaxM = 1 << 22;   // grid.y = ceil(m / BM) <= 2^15 (BM >= 128 beyond m = 128)
constexpr int32_t kMaxNK = 1 << 24;

constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shapes the kernel supports (the op guarantees k and n multiples of 32; these are the limits).
constexpr bool shape_ok(int32_t m, int32_t n, int32_t k) {
  return m >= 1 && m <= kMaxM && n >= 32 && n <= kMaxNK && n % 32 == 0 && k >= 32 && k <= kMaxNK && k % 32 == 0;
}

// At most 256 + 2^17 * 2^18 * 4608 < 2^48: no overflow for any shape shape_ok accepts.
constexpr uint64_t prepared_bytes(int32_t n, int32_t k) {
  return uint64_t(kHeaderBytes) + uint64_t(cdiv(n, kTileN)) * uint64_t(cdiv(k, kBlockK)) * uint64_t(kChunkBytes);
}

// The kernel configurations (w4a16.cu instantiates exactly these).
struct Config {
  int bm;           // activation rows per CTA (the wgmma N)
  int stages;       // pipeline depth (one chunk per stage)
  int ctas_per_sm;  // occupancy the kernel is built for (__launch_bounds__ min blocks)
};
// BM = 8 runs 4 CTAs per SM (9 stages each): 32 consumer warps hide more of the weight stream's
// latency than 24 (H200, m = 1, 28672 x 8192: 48.3 -> 45.0 us). BM = 64 has two configurations:
// at 2 CTAs per SM (config 3) there is no split-K (one wave must hold the tiles), at 1 CTA per SM
// (config 6) 224 tiles take two waves. So config 3 only where the tiles fill the GPU with no split,
// config 6 (split-K over the clusters) below that (H200, m = 64: 8192 x 8192 30.5 -> 24.4 us,
// 8192 x 28672 94 -> 76 us; 28672 x 8192 stays on config 3: 80.5 us there, 87 on config 6). Before
// the segment loop was restructured, config 3 also had its wgmma serialized by ptxas (C7512, 80
// registers); now (docs/notes/2026-12-nvfp4-log.md) it gets 92 and 28672 x 8192 runs 74.5 us.
constexpr Config kConfigs[] = {
    {8, 9, 4}, {16, 10, 3}, {32, 8, 2}, {64, 6, 2}, {128, 8, 1}, {256, 6, 1}, {64, 6, 1}, {192, 7, 1},
};
constexpr int kNumConfigs = 8;
// Above m = 128 (configurations 4, 7, 5: BM = 128, 192, 256, one CTA per SM) the time of one wave
// of tiles, relative to 128 rows. H200, m = 128 / 192 / 256 at 28672 x 8192 (224 tiles, two waves
// each): 55 / 68.5 / 82 us a wave. Not proportional to BM: each CTA dequantizes its 128 x 64
// weight chunk whatever BM, so taller tiles get more rows per dequantized weight. A 160-row tile
// (5 boxes of 32 rows, m64n160 wgmmas) took 71.5 us a wave, no faster than 192 rows: not kept.
constexpr double kWaveTime128 = 1.0, kWaveTime192 = 1.245, kWaveTime256 = 1.49;

struct Plan {
  int config;          // index into kConfigs
  bool streamk;        // configs 0..2 with units >= kStreamKMinChunksPerCta * slots; config 3 where make_plan's streamk64 holds
  int bm;
  int64_t tiles_n, tiles_m, tiles;
  int64_t kblocks;     // ceil(k / 64)
  int64_t splits;      // tile grid: 1..kMaxSplits, the cluster size along z (an upper bound, see above)
  int64_t kb_per_split;
  int64_t units;       // stream-K: chunks = tiles_n * kblocks
  int64_t ctas;        // stream-K: the grid
  bool fixup;          // stream-K: some tile is shared between CTAs (the second kernel runs)
  uint64_t workspace_bytes;
};

// Stream-K: the first chunk of CTA c, and the CTA whose range holds chunk u.
constexpr int64_t streamk_start(int64_t c, int64_t units, int64_t ctas) { return c * units / ctas; }
constexpr int64_t streamk_owner(int64_t u, int64_t units, int64_t ctas) { return ((u + 1) * ctas - 1) / units; }
// Whether no CTA's range touches more than two tiles: a range is at most ceil(units / ctas)
// chunks, and L chunks starting on a tile's last chunk reach into a third tile iff L >= kblocks + 2.
// The BM = 64 stream-K kernel walks exactly two segments. Under make_plan's other conditions for
// it (tiles_n < sm_count, ctas = 2 sm_count) a range is below kblocks / 2 + 1 chunks, so this holds
// already; it is checked anyway (and again by the launcher, and tests/w4a16_plan.rs checks every
// CTA's range), so that loosening those conditions cannot break the two-segment walk.
constexpr bool streamk_two_segments(int64_t units, int64_t ctas, int64_t kblocks) { return cdiv(units, ctas) <= kblocks + 1; }

// m, n, k must satisfy shape_ok and sm_count >= 1 (the callers check both).
constexpr Plan make_plan(int32_t m, int32_t n, int32_t k, int32_t sm_count) {
  Plan p{};
  p.tiles_n = cdiv(n, kTileN);
  p.kblocks = cdiv(k, kBlockK);
  const int64_t sm = sm_count > 0 ? sm_count : 1;
  // The split count of configuration cc over `tiles` tiles: the largest balanced s <= the cap
  // whose CTAs fit in one wave, else 1.
  auto splits_for = [&](int cc, int64_t tiles) {
    const int64_t slots = sm * kConfigs[cc].ctas_per_sm;  // <= 4 * (2^31 - 1)
    int64_t max_s = p.kblocks / kMinKBlocksPerSplit;
    if (max_s > kMaxSplits) max_s = kMaxSplits;
    for (int64_t t = max_s; t > 1; --t) {
      const int64_t kb = cdiv(p.kblocks, t);
      if (cdiv(p.kblocks, kb) != t) continue;  // unbalanced: a split would be empty
      if (tiles * t <= slots) return t;
    }
    return int64_t{1};
  };
  int c = 0;
  bool streamk64 = false;  // configuration 3 as stream-K
  if (m <= 8) c = 0;
  else if (m <= 16) c = 1;
  else if (m <= 32) c = 2;
  else if (m <= 64) {
    // tiles_m == 1. Where the tiles alone fill the GPU, configuration 3's tile grid (2 CTAs per
    // SM). Below that, stream-K on configuration 3 where its ranges fill the CTAs and touch at
    // most two tiles each (the kernel's two-segment walk), else configuration 6 (1 CTA per SM,
    // split-K clusters). H200, same processes: m = 64, 8192 x 28672 stream-K 81.1-81.4 us in
    // every run; configuration 6 71.6 in one process and 89.4-89.7 in three (m = 40 the same),
    // for a cause not measured (the placement of its 64 clusters is a guess). At 28672 x 8192 stream-K
    // lost to the tile grid (77.5 against 74.7 us).
    const int64_t slots3 = sm * kConfigs[3].ctas_per_sm, units = p.tiles_n * p.kblocks;
    streamk64 = p.tiles_n < sm && units >= kStreamKMinChunksPerCta * slots3 && slots3 <= kMaxStreamKCtas &&
                streamk_two_segments(units, slots3, p.kblocks);
    c = (streamk64 || p.tiles_n >= sm) ? 3 : 6;
  }
  else if (m <= 128) c = 4;
  else {
    // 256-, 192- or 128-row tiles (configurations 5, 7, 4), by waves x wave time x k-blocks per
    // split. Ties go to the taller tile.
    auto cost = [&](int cc) {
      const int64_t bm = kConfigs[cc].bm, tiles = cdiv(m, bm) * p.tiles_n, s = splits_for(cc, tiles);
      const int64_t waves = cdiv(tiles * s, sm * kConfigs[cc].ctas_per_sm);
      const double wave_time = cc == 5 ? kWaveTime256 : (cc == 7 ? kWaveTime192 : kWaveTime128);
      // In double, for the wave-time factor (the product stays below about 2^50).
      return double(waves) * wave_time * double(cdiv(p.kblocks, s));
    };
    c = 5;
    if (cost(7) < cost(c)) c = 7;
    if (cost(4) < cost(c)) c = 4;
  }
  p.config = c;
  p.bm = kConfigs[c].bm;
  p.tiles_m = cdiv(m, p.bm);
  p.tiles = p.tiles_m * p.tiles_n;  // <= 2^15 * 2^17
  const int64_t slots = sm * kConfigs[c].ctas_per_sm;  // <= 4 * (2^31 - 1)
  int64_t s = splits_for(c, p.tiles);
  p.splits = s;
  p.kb_per_split = cdiv(p.kblocks, s);
  p.units = p.tiles_n * p.kblocks;  // < 2^35
  // tiles_m == 1 there (m <= BM). Configuration 3 (BM = 64) only as streamk64 decided (which
  // includes the chunk count; its slots are slots3).
  p.streamk = c < 3 ? p.units >= kStreamKMinChunksPerCta * slots : (c == 3 && streamk64);
  if (p.streamk) {
    p.splits = 1;
    p.kb_per_split = p.kblocks;
    int64_t ctas = slots < p.units ? slots : p.units;
    if (ctas > kMaxStreamKCtas) ctas = kMaxStreamKCtas;
    p.ctas = ctas;
    // A tile is shared iff some CTA boundary floor(c * units / ctas), 0 < c < ctas, falls inside
    // it, i.e. is not a multiple of kblocks. With kblocks = 1 every boundary is a tile boundary.
    // With ctas | tiles_n every boundary is c * (tiles_n / ctas) * kblocks. Otherwise, with
    // g = gcd(tiles_n, ctas) and c' = ctas / g >= 2, c * tiles_n mod c' runs over every nonzero
    // residue as c runs over 1..c'-1; at residue c' - 1 the boundary lies
    // floor((c' - 1) * kblocks / c') >= 1 chunks into its tile when kblocks >= 2. So exactly:
    // (tests/w4a16_plan.rs checks it against the boundaries themselves.)
    p.fixup = p.kblocks > 1 && p.tiles_n % ctas != 0;
    if (p.fixup) p.workspace_bytes = uint64_t(ctas) * 2u * uint64_t(p.bm) * 512u;  // < 2^16 * 2^15
  }
  return p;
}

}  // namespace graphsafe::nvfp4_sm90

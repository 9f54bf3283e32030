//! The Hopper W4A16 plan on the CPU: over edge and random shapes and SM counts (up to i32::MAX,
//! where a 32-bit tile count used to overflow), the sizes the planner reports (prepared weight,
//! stream-K workspace) equal an exact 128-bit model of the layouts in
//! cuda-src/nvfp4/sm90/w4a16_plan.cuh, and shapes outside the kernel's limits are refused rather
//! than sized; the C ABI's graphsafe_nvfp4_plan says the same wherever its `int` arguments reach.

use graphsafe::capi::{graphsafe_nvfp4_plan, GraphsafeNvfp4Plan, GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_ERROR_INVALID_ARGUMENT, GRAPHSAFE_OK};
use graphsafe::ops::nvfp4::{self, Nvfp4Arch, W4a16Schedule};
use graphsafe::ops::tensor::DType;
use graphsafe::Error;

const MAX_M: u128 = 1 << 22;
const MAX_NK: u128 = 1 << 24;

/// The model: Some((prepared bytes, workspace bytes)) for a supported shape, None otherwise.
fn model(m: i64, n: i64, k: i64, sm: i64) -> Option<(u128, u128)> {
    let (m, n, k, sm) = (m as i128, n as i128, k as i128, sm as i128);
    if m < 1 || sm < 1 || sm > i32::MAX as i128 || n < 32 || k < 32 || n % 32 != 0 || k % 32 != 0 {
        return None;
    }
    let (m, n, k) = (m as u128, n as u128, k as u128);
    if m > MAX_M || n > MAX_NK || k > MAX_NK {
        return None;
    }
    // Header, then one 4608-byte chunk per (128-row tile, 64-wide k-block).
    let (tiles, kblocks) = (n.div_ceil(128), k.div_ceil(64));
    let prepared = 256 + tiles * kblocks * 4608;
    // m <= 64 with at least 40 chunks per CTA slot: stream-K over C = min(SMs x CTAs per SM, 2^16)
    // CTAs, CTA c starting at chunk floor(c x chunks / C); when a start falls inside a tile (that
    // tile is shared: the fixup kernel adds it), two partial-tile slots per CTA of
    // BM / 8 x 256 float4. For m = 33..64 (BM = 64, 2 per SM) only where the tiles number fewer
    // than the SMs, C <= 2^16 and no CTA's range reaches a third tile (ceil(chunks / C) <=
    // k-blocks + 1). Otherwise the tile grid,
    // whose split-K reduces in the cluster's shared memory: no workspace.
    let (bm, per_sm) = if m <= 8 { (8, 4) } else if m <= 16 { (16, 3) } else if m <= 32 { (32, 2) } else { (64, 2) };
    let slots = sm as u128 * per_sm;
    let two_segments = tiles < sm as u128 && slots <= 1 << 16 && (tiles * kblocks).div_ceil(slots) <= kblocks + 1;
    let ws = if (m <= 32 || (m <= 64 && two_segments)) && tiles * kblocks >= 40 * slots {
        let ctas = slots.min(1 << 16);
        let units = tiles * kblocks;
        let shared = (1..ctas).any(|c| (c * units / ctas) % kblocks != 0);
        if shared { ctas * 2 * bm * 512 } else { 0 }
    } else {
        0
    };
    Some((prepared, ws))
}

/// The C ABI's plan of the shape (its arguments are `int`s: None when one does not fit), or the
/// status it returned.
fn c_plan(m: i64, n: i64, k: i64, sm: i64) -> Option<Result<GraphsafeNvfp4Plan, i32>> {
    let [m, n, k, sm] = [m, n, k, sm].map(|v| i32::try_from(v).ok());
    let (m, n, k, sm) = (m?, n?, k?, sm?);
    let mut out = GraphsafeNvfp4Plan::default();
    // SAFETY: `out` is a writable GraphsafeNvfp4Plan.
    let s = unsafe { graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, m, n, k, GRAPHSAFE_DTYPE_BF16, sm, &mut out) };
    Some(if s == GRAPHSAFE_OK { Ok(out) } else { Err(s) })
}

static WITH_WORKSPACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn check(m: i64, n: i64, k: i64, sm: i64) -> bool {
    let got = nvfp4::plan(Nvfp4Arch::Sm90, m, n, k, DType::Bf16, sm);
    match (model(m, n, k, sm), got) {
        (Some((prepared, ws)), Ok(p)) => {
            if ws > 0 {
                WITH_WORKSPACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            assert_eq!(p.prepared_weight_bytes.map(u128::from), Some(prepared), "prepared bytes of ({m}, {n}, {k}) on {sm} SMs");
            assert_eq!(u128::from(p.workspace_bytes), ws, "workspace of ({m}, {n}, {k}) on {sm} SMs");
            assert_eq!((p.m as i64, p.n as i64, p.k as i64), (m, n, k));
            assert!(p.tile.is_none());
            check_schedule(m, n, k, sm, &p.schedule.expect("a Hopper plan carries the kernel's schedule"), ws);
            // What C callers are told (int arguments, u64 sizes, a zero tile on Hopper) is the model too.
            if let Some(c) = c_plan(m, n, k, sm) {
                let c = c.unwrap_or_else(|s| panic!("graphsafe_nvfp4_plan({m}, {n}, {k}) on {sm} SMs returned {s}"));
                assert_eq!(
                    (u128::from(c.prepared_weight_bytes), u128::from(c.workspace_bytes), [c.tile_m, c.tile_n, c.tile_k, c.cluster_m, c.cluster_n]),
                    (prepared, ws, [0; 5]),
                    "graphsafe_nvfp4_plan({m}, {n}, {k}) on {sm} SMs"
                );
            }
            true
        }
        (None, Err(Error::InvalidArgument { .. })) => {
            if let Some(c) = c_plan(m, n, k, sm) {
                assert_eq!(c.err(), Some(GRAPHSAFE_ERROR_INVALID_ARGUMENT), "graphsafe_nvfp4_plan({m}, {n}, {k}) on {sm} SMs");
            }
            false
        }
        (want, got) => panic!("({m}, {n}, {k}) on {sm} SMs: model {want:?}, planner {got:?}"),
    }
}

/// What the schedule must satisfy for the kernel to be launchable and its cluster reduction to
/// cover every tile exactly once (the stream-K fixup's workspace is checked against the model).
fn check_schedule(m: i64, n: i64, k: i64, sm: i64, s: &W4a16Schedule, ws: u128) {
    let at = format!("({m}, {n}, {k}) on {sm} SMs: {s:?}");
    let (m, n, k) = (m as u128, n as u128, k as u128);
    let bm = s.rows_per_cta as u128;
    // One of the kernel's configurations (w4a16_plan.cuh's kConfigs: rows, CTAs per SM).
    let configs = [(8u128, 4u32), (16, 3), (32, 2), (64, 2), (128, 1), (256, 1), (64, 1), (192, 1)];
    assert!(configs.contains(&(bm, s.ctas_per_sm)), "not a kernel configuration: {at}");
    assert!(m.div_ceil(bm) <= 65535, "grid.y is the m tiles: {at}");
    // m <= 128 fits one tile of the smallest configuration that holds it (64 rows come in two).
    if m <= 128 {
        let want = [8u128, 16, 32, 64, 128].into_iter().find(|&b| b >= m).unwrap();
        assert_eq!(bm, want, "{at}");
    } else {
        assert!(bm >= 128, "{at}");
    }
    let slots = sm as u128 * s.ctas_per_sm as u128;
    let kblocks = k.div_ceil(64);
    if s.stream_k {
        assert!(m <= 64 && s.splits == 1 && (s.ctas as u128) == slots.min(n.div_ceil(128) * kblocks).min(1 << 16), "{at}");
        // Only configurations 0..3 have a stream-K kernel (64 rows: the 2-CTA-per-SM one).
        assert!(bm <= 32 || s.ctas_per_sm == 2, "{at}");
        if m > 32 {
            // The BM = 64 kernel walks two segments: no CTA's range (any of at most 2^16) may
            // touch a third tile.
            let (units, ctas) = (n.div_ceil(128) * kblocks, s.ctas as u128);
            let third = (0..ctas).any(|c| {
                let (u0, u1) = (c * units / ctas, (c + 1) * units / ctas);
                u1 > u0 && (u1 - 1) / kblocks - u0 / kblocks >= 2
            });
            assert!(!third, "a CTA's range touches three tiles: {at}");
        }
    } else {
        assert!(ws == 0 && (1..=8).contains(&s.splits), "the tile grid needs no workspace: {at}");
        let (tiles, splits) = (m.div_ceil(bm) * n.div_ceil(128), s.splits as u128);
        assert_eq!(s.ctas as u128, tiles * splits, "{at}");
        if splits > 1 {
            // One wave, at least 4 k-blocks per split, no split empty.
            let per = kblocks.div_ceil(splits);
            assert!(tiles * splits <= slots && kblocks / splits >= 4 && kblocks.div_ceil(per) == splits, "{at}");
        }
    }
}

/// The choices measured on an H200 (docs/notes/2026-12-nvfp4-log.md) and the ones tests/gpu_nvfp4.rs relies
/// on for its cluster shapes: (m, n, k) -> (rows per CTA, CTAs per SM, splits) on 132 SMs.
#[test]
fn w4a16_schedules_on_an_h200_are_the_measured_ones() {
    for ((m, n, k), want) in [
        ((256i64, 8192i64, 8192i64), (256u32, 1u32, 2u32)), // 256-row tiles split 2 ways: 52.4 -> 46.9 us
        ((200, 8192, 8192), (256, 1, 2)),
        ((300, 28672, 8192), (192, 1, 1)), // 2 x 192 rows: 448 tiles in 4 waves (128 rows: 672 in 6; 321 us)
        ((192, 28672, 8192), (192, 1, 1)), // 163 -> 137 us against 256-row tiles
        ((1030, 3328, 512), (256, 1, 1)),  // 130 tiles of 256 rows in one wave (192: 156 in two)
        ((4096, 8192, 8192), (256, 1, 1)),
        ((64, 8192, 8192), (64, 1, 2)),  // 64 tiles: one CTA per SM, split over the cluster
        ((48, 28672, 2048), (64, 2, 1)), // 224 tiles fill the GPU at two per SM
        ((64, 28672, 8192), (64, 2, 1)), // the same (stream-K measured slower there)
        ((200, 4096, 2048), (256, 1, 4)), // tests/gpu_nvfp4.rs's 4-way and 2-way 256-row splits
        ((256, 8192, 1024), (256, 1, 2)),
        ((129, 2048, 2048), (192, 1, 8)), // and its partial tiles: 3 boxes of 3 (192 rows), 2 of 3,
        ((300, 2048, 1024), (192, 1, 4)), // 1 of 4 (256 rows, the last of 1030)
        ((300, 8192, 1024), (192, 1, 1)), // 192 rows unsplit (D written straight from the accumulators)
    ] {
        let s = nvfp4::plan(Nvfp4Arch::Sm90, m, n, k, DType::Bf16, 132).unwrap().schedule.unwrap();
        assert_eq!((s.rows_per_cta, s.ctas_per_sm, s.splits), want, "({m}, {n}, {k}): {s:?}");
        assert!(!s.stream_k);
    }
    let p = nvfp4::plan(Nvfp4Arch::Sm90, 1, 28672, 8192, DType::Bf16, 132).unwrap();
    let s = p.schedule.unwrap();
    assert!(s.stream_k && s.ctas == 528 && p.workspace_bytes > 0, "{p:?}");
    // m = 33..64 with fewer tiles than SMs and many chunks: stream-K over 264 CTAs of 64 rows,
    // each range within two tiles (28672 x 8192 keeps its tile grid, above).
    for (m, n, k) in [(64i64, 8192i64, 28672i64), (33, 8192, 28672), (40, 16384, 8192)] {
        let p = nvfp4::plan(Nvfp4Arch::Sm90, m, n, k, DType::Bf16, 132).unwrap();
        let s = p.schedule.unwrap();
        assert!(s.stream_k && s.rows_per_cta == 64 && s.ctas_per_sm == 2 && s.ctas == 264 && p.workspace_bytes > 0, "({m}, {n}, {k}): {p:?}");
    }
    // Blackwell plans have a CUTLASS tile and no W4A16 schedule.
    assert!(nvfp4::plan(Nvfp4Arch::Sm100, 1, 8192, 8192, DType::Bf16, 148).unwrap().schedule.is_none());
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Log-uniform in 1..=max, sometimes a multiple of 32 near a power of two.
    fn dim(&mut self, max: u64) -> i64 {
        let bits = 1 + self.below(64 - max.leading_zeros() as u64);
        let v = (self.next() >> (64 - bits)).max(1);
        match self.below(4) {
            0 => v as i64,
            1 => (v.div_ceil(32) * 32) as i64,
            2 => ((1u64 << (bits - 1)).max(32) as i64) + [-32i64, 0, 32][self.below(3) as usize],
            _ => (v.min(max)) as i64,
        }
    }
}

#[test]
fn w4a16_plan_sizes_equal_the_exact_model() {
    let edges_m = [1i64, 2, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 4096, (1 << 22) - 1, 1 << 22, (1 << 22) + 1, 0, -1];
    let edges_nk = [32i64, 64, 96, 128, 160, 416, 8192, 28672, (1 << 24) - 32, 1 << 24, (1 << 24) + 32, 0, 31, 48];
    let edges_sm = [1i64, 2, 78, 114, 132, 148, 170, 1 << 16, i32::MAX as i64 / 3, i32::MAX as i64, i32::MAX as i64 + 1, 0, -5];
    let (mut supported, mut refused) = (0usize, 0usize);
    for &m in &edges_m {
        for &n in &edges_nk {
            for &k in &[32i64, 8192, 1 << 24, 48] {
                for &sm in &edges_sm {
                    if check(m, n, k, sm) { supported += 1 } else { refused += 1 }
                }
            }
        }
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..4000 {
        let m = rng.dim(1 << 23);
        let n = rng.dim(1 << 25);
        let k = rng.dim(1 << 25);
        let sm = match rng.below(3) {
            0 => rng.dim(256),
            1 => rng.dim(i32::MAX as u64),
            _ => edges_sm[rng.below(edges_sm.len() as u64) as usize],
        };
        if check(m, n, k, sm) { supported += 1 } else { refused += 1 }
    }
    // Stream-K shapes that need a workspace, on realistic SM counts and huge ones.
    for &sm in &[132i64, 114, 1 << 20] {
        for &(m, n, k) in &[(1i64, 16384i64, 8192i64), (16, 28672, 8192), (32, 8192, 28672), (8, 1 << 24, 4096), (64, 8192, 28672), (40, 4096, 1 << 24), (64, 8192, 1 << 24)] {
            check(m, n, k, sm);
        }
    }
    let with_ws = WITH_WORKSPACE.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{supported} supported ({with_ws} with a stream-K workspace) and {refused} refused shapes agree with the model");
    assert!(supported >= 1000 && refused >= 100 && with_ws >= 50, "{supported} supported, {with_ws} with workspace, {refused} refused");
}

/// The stream-K shapes of tests/gpu_nvfp4.rs with shared tiles really run stream-K (they need a
/// workspace) on a 132-SM H200: when the planner's slot counts change, those GPU tests would
/// otherwise quietly test the tile grid (the change to 4 CTAs per SM for m <= 8 turned the m = 1
/// and 2 ones into tile grids once, and their too-small-workspace checks were skipped).
#[test]
fn the_gpu_tests_stream_k_shapes_are_stream_k_on_an_h200() {
    for (m, n, k) in [(1i64, 16384i64, 10752i64), (2, 16384, 10752), (9, 16384, 8192), (17, 8448, 10240)] {
        let ws = nvfp4::plan(Nvfp4Arch::Sm90, m, n, k, DType::Bf16, 132).unwrap().workspace_bytes;
        assert!(ws > 0, "({m}, {n}, {k}) is no longer stream-K with shared tiles on 132 SMs");
    }
}

//! NVFP4's scale-factor sizes and offsets against the 128x4 swizzle of include/graphsafe_kernels/nvfp4.h.

use super::*;

// ---- NVFP4 sizes ------------------------------------------------------------------------------

fn sf_model(rows: i64, kk: i64) -> u128 {
    div_up(rows as u128, 128) * 128 * div_up(kk as u128 / 16, 4) * 4
}

/// The documented swizzle: (m / 128)·(KB4·512) + (b / 4)·512 + (m % 32)·16 + ((m % 128) / 32)·4 + b % 4.
fn sf_offset_model(kk: i64, m: i64, b: i64) -> u128 {
    let kb4 = div_up(kk as u128 / 16, 4);
    let (m, b) = (m as u128, b as u128);
    (m / 128) * (kb4 * 512) + (b / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + b % 4
}

#[test]
fn nvfp4_sizes_equal_the_exact_model() {
    let mut rng = Rng(0x6e76_6670_3473_697a); // "nvfp4siz"
    let mut cases = 0;
    // The case: 18446744065119617024 (an int ceil_div wrapping) instead of 8589934592.
    assert_eq!(nvfp4::scale_bytes(2_147_483_521, 16).unwrap(), 8_589_934_592);
    for _ in 0..4000 {
        let rows = rng.pick_or_out(1, i32::MAX as i64);
        let kk = if rng.below(10) == 0 { rng.pick_or_out(1, i32::MAX as i64) } else { 16 * rng.pick(1, i32::MAX as i64 / 16) };
        let got = nvfp4::scale_bytes(rows, kk);
        if (1..=i32::MAX as i64).contains(&rows) && (1..=i32::MAX as i64).contains(&kk) && kk % 16 == 0 {
            assert_eq!(got.unwrap() as u128, sf_model(rows, kk), "rows={rows} k={kk}");
        } else {
            invalid(got, &format!("scale_bytes({rows}, {kk})"));
        }
        cases += 1;
    }
    // CUTLASS's own layout function against the documented formula, up to where its int32
    // offsets would wrap (the glue refuses past that).
    for _ in 0..3000 {
        let rows = rng.pick(1, i32::MAX as i64);
        let kk = 16 * rng.pick(1, i32::MAX as i64 / 16);
        let (pr, pb) = (div_up(rows as u128, 128) * 128, div_up(kk as u128 / 16, 4) * 4);
        let (row, block) = (rng.below(pr as u64) as i32, rng.below(pb as u64) as i32);
        let mut off = 0u64;
        // SAFETY: host function; off is a local.
        let st = unsafe { k::gs_nvfp4_cutlass_scale_offset(rows as i32, kk as i32, row, block, &mut off) };
        if sf_model(rows, kk) <= I32_MAX {
            assert_eq!(st, 0, "rows={rows} k={kk}");
            assert_eq!(off as u128, sf_offset_model(kk, row as i64, block as i64), "rows={rows} k={kk} ({row}, {block})");
        } else {
            assert_eq!(st, k::GsStatus::GS_ERR_INVALID_ARGUMENT.0 as i32, "rows={rows} k={kk}: an int32 layout would wrap");
        }
        cases += 1;
    }
    // The Blackwell plans: the production tile rule, CUTLASS's 0-byte workspace, and a refusal
    // where CUTLASS's int32 scale-factor indexing would wrap.
    for _ in 0..2000 {
        let m = rng.pick_or_out(1, i32::MAX as i64);
        let n = 32 * rng.pick(1, i32::MAX as i64 / 32);
        let kk = 32 * rng.pick(1, i32::MAX as i64 / 32);
        let arch = if rng.below(2) == 0 { Nvfp4Arch::Sm100 } else { Nvfp4Arch::Sm120 };
        let got = nvfp4::plan(arch, m, n, kk, DType::Bf16, 148);
        let ctx = format!("{arch:?} m={m} n={n} k={kk}");
        let ok = (1..=i32::MAX as i64).contains(&m) && sf_model(m, kk) <= I32_MAX && sf_model(n, kk) <= I32_MAX;
        if !ok {
            invalid(got, &ctx);
        } else {
            let p = got.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let t = |m, n, k, cm| Some(Tile { m, n, k, cluster_m: cm, cluster_n: 1 });
            let want = match arch {
                Nvfp4Arch::Sm100 if m <= 16 => t(128, 128, 256, 1),
                Nvfp4Arch::Sm100 if m <= 256 => t(256, 128, 256, 2),
                Nvfp4Arch::Sm100 => t(256, 256, 256, 2),
                _ if m <= 256 => t(128, 128, 128, 1),
                _ => t(256, 128, 128, 1),
            };
            assert_eq!((p.tile, p.workspace_bytes, p.prepared_weight_bytes), (want, 0, None), "{ctx}");
        }
        cases += 1;
    }
    eprintln!("{cases} NVFP4 sizes equal the model");
}

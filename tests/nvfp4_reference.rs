//! The host NVFP4 reference: exact values of every code, rounding at every tie, scale edge cases,
//! and the swizzled scale layout against CUTLASS's own (computed by its headers in the glue).

use graphsafe::ops::nvfp4::reference::*;
use graphsafe::sys::kernels as k;

#[test]
fn all_16_e2m1_codes_round_trip_exactly() {
    for code in 0u8..16 {
        let v = e2m1_to_f32(code);
        let back = f32_to_e2m1(v);
        // -0 (code 8) encodes as +0 by definition.
        assert_eq!(back, if code == 8 { 0 } else { code }, "code {code} value {v}");
    }
    assert_eq!((0..8).map(e2m1_to_f32).collect::<Vec<_>>(), vec![0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
}

#[test]
fn e2m1_ties_go_to_the_even_code_and_large_values_saturate() {
    // (input, expected code)
    for (x, c) in [(0.25f32, 0u8), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (0.2499, 0), (0.2501, 1),
        (5.0001, 7), (6.0, 7), (7.0, 7), (1e30, 7), (f32::INFINITY, 7), (-f32::INFINITY, 15), (-0.75, 10), (-0.1, 0), (f32::NAN, 0)]
    {
        assert_eq!(f32_to_e2m1(x), c, "x = {x}");
    }
}

#[test]
fn every_e4m3_value_round_trips_and_rounding_is_to_nearest_even() {
    for b in 0u8..=255 {
        if b & 0x7F == 0x7F {
            assert!(e4m3_to_f32(b).is_nan());
            continue;
        }
        assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "byte {b:#x} = {}", e4m3_to_f32(b));
    }
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    // Saturation, ties and subnormals.
    assert_eq!(f32_to_e4m3(1e9), 0x7E);
    assert_eq!(f32_to_e4m3(-500.0), 0xFE);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
    assert_eq!(f32_to_e4m3(1.0625), 0x38); // tie between 1.0 (man 0) and 1.125 (man 1): even
    assert_eq!(f32_to_e4m3(1.1875), 0x3A); // tie between 1.125 and 1.25: even (man 2)
    assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00); // half the smallest subnormal: ties to even (0)
    assert_eq!(f32_to_e4m3(3.0 * 2f32.powi(-10)), 0x02); // 1.5 subnormal steps: ties to even (2)
    assert_eq!(f32_to_e4m3(0.0), 0x00);
    // Every midpoint between neighbours rounds to the even one.
    for b in 0u8..0x7E {
        let (lo, hi) = (e4m3_to_f32(b) as f64, e4m3_to_f32(b + 1) as f64);
        let mid = ((lo + hi) / 2.0) as f32;
        if mid as f64 == (lo + hi) / 2.0 {
            assert_eq!(f32_to_e4m3(mid), if b % 2 == 0 { b } else { b + 1 }, "midpoint of {b:#x}");
        }
    }
}

#[test]
fn quantize_round_trips_representable_values_exactly() {
    // Blocks whose values are e2m1 values times a power-of-two scale come back exactly.
    let (m, kk) = (3usize, 64usize);
    let gs = 1.0f32;
    let mut x = vec![0f32; m * kk];
    for (i, v) in x.iter_mut().enumerate() {
        let sf = 2f32.powi((i / 16 % 4) as i32 - 1); // 0.5, 1, 2, 4 per block
        *v = e2m1_to_f32((i % 16) as u8) * sf;
    }
    // Each block's amax is 6·sf, so its scale is exactly sf and every element is representable.
    let (packed, scales) = quantize(&x, m, kk, gs).unwrap();
    let back = dequantize(&packed, &scales, m, kk, gs).unwrap();
    assert_eq!(back.iter().map(|v| if *v == 0.0 { 0.0 } else { *v }).collect::<Vec<_>>(), x.iter().map(|v| if *v == 0.0 { 0.0 } else { *v }).collect::<Vec<_>>());
}

#[test]
fn scale_edge_cases() {
    let kk = 32;
    // All zeros: scale 0, codes 0.
    let (p, s) = quantize(&vec![0.0; kk], 1, kk, 1.0).unwrap();
    assert!(p.iter().all(|&b| b == 0) && s.iter().all(|&b| b == 0));
    // NaNs are ignored for the scale and encode as +0; Inf saturates the scale and its element.
    let mut x = vec![1.0f32; kk];
    x[0] = f32::NAN;
    x[1] = f32::INFINITY;
    x[17] = -f32::INFINITY;
    let (p, s) = quantize(&x, 1, kk, 1.0).unwrap();
    assert_eq!(s[scale_offset(kk, 0, 0)], 0x7E);
    assert_eq!(p[0] & 0xF, 0);
    assert_eq!(p[0] >> 4, 7);
    assert_eq!(p[8] >> 4, 15);
    // A tiny block gets a subnormal scale, not zero.
    let (_, s) = quantize(&vec![1e-2f32; kk], 1, kk, 1.0).unwrap();
    assert!(s[0] != 0 && s[0] < 0x08, "{:#x}", s[0]);
    // Global scale maps the tensor's amax to 448·6.
    assert_eq!(global_scale(&[0.5, -3.0, f32::NAN]), 448.0 * 6.0 / 3.0);
    assert_eq!(global_scale(&[0.0, 0.0]), 1.0);
    assert_eq!(global_scale(&[f32::INFINITY]), 1.0);
}

#[test]
fn swizzled_scale_offsets_equal_cutlass_layout() {
    let mut n = 0;
    for &(rows, kk) in &[(1usize, 32usize), (100, 64), (128, 256), (300, 96), (513, 1024), (1000, 8192)] {
        let mut bytes = 0u64;
        // SAFETY: host functions; out-pointers to locals.
        assert_eq!(unsafe { k::gs_nvfp4_scale_bytes(rows as i32, kk as i32, &mut bytes) }, 0);
        assert_eq!(bytes as usize, scale_bytes(rows, kk));
        let padded_rows = rows.div_ceil(128) * 128;
        let padded_blocks = (kk / 16).div_ceil(4) * 4;
        let mut seen = vec![false; bytes as usize];
        for r in (0..padded_rows).step_by(7).chain([padded_rows - 1]) {
            for b in 0..padded_blocks {
                let mut off = 0u64;
                assert_eq!(unsafe { k::gs_nvfp4_cutlass_scale_offset(rows as i32, kk as i32, r as i32, b as i32, &mut off) }, 0);
                assert_eq!(off as usize, scale_offset(kk, r, b), "rows={rows} k={kk} row={r} block={b}");
                assert!(!seen[off as usize], "two scales share offset {off}");
                seen[off as usize] = true;
                n += 1;
            }
        }
    }
    assert!(n > 1000, "{n} offsets compared");
}

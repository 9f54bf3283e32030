//! The host reference of NVFP4: the exact algorithm the GPU quantize implements
//! (`include/graphsafe_kernels/nvfp4.h` states it), so GPU output can be compared bit for bit.

use crate::error::{Error, Result};

/// The eight e2m1 magnitudes, by code (bit 3 is the sign).
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// Elements along K per scale factor.
pub const BLOCK: usize = 16;

/// The value of an e2m1 code (low 4 bits).
pub fn e2m1_to_f32(code: u8) -> f32 {
    let v = E2M1_VALUES[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Encodes `x` as e2m1: nearest magnitude, ties to the even code; |x| > 6 saturates; NaN and
/// values rounding to zero give +0.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let a = x.abs();
    // Midpoints between consecutive magnitudes; at a tie the even code (low bit 0) wins.
    const MID: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let mut code = 7u8;
    for (i, &m) in MID.iter().enumerate() {
        if a < m || (a == m && i % 2 == 0) {
            code = i as u8;
            break;
        }
    }
    if code == 0 {
        return 0;
    }
    if x.is_sign_negative() {
        code | 8
    } else {
        code
    }
}

/// The value of an fp8 e4m3 (fn) byte.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 7) as f32;
    if exp == 0xF && (b & 7) == 7 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// fp8 e4m3 (fn) of `x`: round to nearest even, saturate to ±448, subnormals kept, NaN → NaN.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs() as f64;
    if a >= 448.0 {
        return sign | 0x7E;
    }
    // Candidates are exact in f64: pick the nearest representable magnitude, ties to even code.
    // Subnormal step 2^-9; normal steps 2^(e-3).
    let (code, _) = if a < 2f64.powi(-6) {
        let q = a / 2f64.powi(-9); // in [0, 8)
        let r = round_half_even(q);
        (r as u8, ()) // r == 8 is the first normal (exp 1, man 0): code 8
    } else {
        // The exact binary exponent of a (a normal f64 here), clamped to e4m3's normal range.
        let e = (((a.to_bits() >> 52) & 0x7FF) as i32 - 1023).clamp(-6, 8);
        let step = 2f64.powi(e - 3);
        let q = a / step; // in [8, 16)
        let r = round_half_even(q) as i32; // 8..=16
        let (e, r) = if r == 16 { (e + 1, 8) } else { (e, r) };
        let exp_field = (e + 7) as u8;
        ((exp_field << 3) | (r as u8 - 8), ())
    };
    sign | code.min(0x7E)
}

fn round_half_even(q: f64) -> f64 {
    let f = q.floor();
    let d = q - f;
    if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else {
        f
    }
}

/// Bytes of the swizzled scale tensor for an [rows, k] operand (saturating at `usize::MAX`).
pub fn scale_bytes(rows: usize, k: usize) -> usize {
    (rows.div_ceil(128).saturating_mul(128)).saturating_mul((k / BLOCK).div_ceil(4) * 4)
}

/// Byte offset of scale (row, block) in CUTLASS's Sm1xxBlkScaledConfig<16> layout (128x4 atoms).
pub fn scale_offset(k: usize, row: usize, block: usize) -> usize {
    let kb4 = (k / BLOCK).div_ceil(4);
    (row / 128) * (kb4 * 512) + (block / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + (block % 4)
}

/// `m * k` elements, refusing (rather than panicking on) a shape that does not fit `have` or
/// the address space, or a `k` the format does not take.
fn checked_elements(what: &str, m: usize, k: usize, have: usize) -> Result<usize> {
    if k == 0 || k % (2 * BLOCK) != 0 {
        return Err(Error::invalid("k", format!("a positive multiple of {}", 2 * BLOCK), k));
    }
    let n = m.checked_mul(k).ok_or_else(|| Error::invalid("m * k", "a product that fits in usize", format!("{m} * {k}")))?;
    if have < n {
        return Err(Error::invalid(what, format!("at least {n} elements ([{m}, {k}])"), have));
    }
    Ok(n)
}

/// Quantizes `x` ([m, k] row-major f32, values already rounded from bf16/fp16) with `global_scale`:
/// (packed [m, k/2], swizzled scales). `InvalidArgument` when k is not a positive multiple of 32
/// or `x` holds fewer than m·k values.
pub fn quantize(x: &[f32], m: usize, k: usize, global_scale: f32) -> Result<(Vec<u8>, Vec<u8>)> {
    let n = checked_elements("x", m, k, x.len())?;
    let mut packed = vec![0u8; n / 2];
    let mut scales = vec![0u8; scale_bytes(m, k)];
    for r in 0..m {
        for b in 0..k / BLOCK {
            let blk = &x[r * k + b * BLOCK..r * k + (b + 1) * BLOCK];
            let amax = blk.iter().fold(0f32, |m, v| if v.is_nan() { m } else { m.max(v.abs()) });
            let sf = f32_to_e4m3(amax / 6.0 * global_scale);
            let sf_f = e4m3_to_f32(sf);
            let inv = if sf_f == 0.0 { 0.0 } else { global_scale / sf_f };
            scales[scale_offset(k, r, b)] = sf;
            for (i, &v) in blk.iter().enumerate() {
                let q = f32_to_e2m1(v * inv);
                let col = b * BLOCK + i;
                packed[r * k / 2 + col / 2] |= if col % 2 == 0 { q } else { q << 4 };
            }
        }
    }
    Ok((packed, scales))
}

/// Dequantizes to f32 ([m, k] row-major): e2m1 * sf / global_scale. `InvalidArgument` when k is
/// not a positive multiple of 32, or `packed` / `scales` hold fewer bytes than an [m, k] operand has.
pub fn dequantize(packed: &[u8], scales: &[u8], m: usize, k: usize, global_scale: f32) -> Result<Vec<f32>> {
    let n = checked_elements("packed (as e2m1 values)", m, k, packed.len().saturating_mul(2))?;
    if scales.len() < scale_bytes(m, k) {
        return Err(Error::invalid("scales", format!("at least {} bytes (scale_bytes({m}, {k}))", scale_bytes(m, k)), scales.len()));
    }
    let mut out = vec![0f32; n];
    for r in 0..m {
        for c in 0..k {
            let byte = packed[r * k / 2 + c / 2];
            let q = if c % 2 == 0 { byte & 0xF } else { byte >> 4 };
            let sf = e4m3_to_f32(scales[scale_offset(k, r, c / BLOCK)]);
            out[r * k + c] = e2m1_to_f32(q) * sf / global_scale;
        }
    }
    Ok(out)
}

/// `448 * 6 / amax(|x|)`, or 1 when amax is 0 or not finite (what `gs_nvfp4_global_scale` computes).
pub fn global_scale(x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| if v.is_nan() { m } else { m.max(v.abs()) });
    if amax == 0.0 || !amax.is_finite() {
        1.0
    } else {
        448.0 * 6.0 / amax
    }
}

//! Host numerics of tests/gpu_cudnn.rs: bf16/fp16/fp8 e4m3 encodings (round to nearest even),
//! random operands with their exact values, and outputs read back as f64.

use crate::common::random_f32;
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::ops::tensor::DType;

pub(super) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}
pub(super) fn bf16_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}
pub(super) fn f16_bits(x: f32) -> u16 {
    // Round-to-nearest-even for |x| < 65504 (inputs here are in [-1, 1]).
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}
pub(super) fn f16_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    sign * if e == 0 { m * 2f32.powi(-24) } else { (1.0 + m / 1024.0) * 2f32.powi(e - 15) }
}
pub(super) fn e4m3_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    sign * if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

/// Device bytes and exact host values of `n` random elements of `dtype` (in about [-1, 1]).
pub(super) fn random_operand(n: usize, dtype: DType, seed: u64) -> (Vec<u8>, Vec<f64>) {
    let v = random_f32(n, seed);
    match dtype {
        DType::Bf16 => {
            let bits: Vec<u16> = v.iter().map(|&x| bf16_bits(x)).collect();
            (bits.iter().flat_map(|b| b.to_le_bytes()).collect(), bits.iter().map(|&b| bf16_f32(b) as f64).collect())
        }
        DType::Fp16 => {
            let bits: Vec<u16> = v.iter().map(|&x| f16_bits(x)).collect();
            (bits.iter().flat_map(|b| b.to_le_bytes()).collect(), bits.iter().map(|&b| f16_f32(b) as f64).collect())
        }
        DType::Fp8E4m3 => {
            // Exponents 4..=8 (values 2^-3 .. ~1.9): no NaN, no subnormal surprises.
            let bytes: Vec<u8> = v.iter().map(|&x| {
                let u = ((x + 1.0) * 1e6) as u32;
                let sign = if x < 0.0 { 0x80 } else { 0 };
                sign | ((4 + (u % 5) as u8) << 3) | ((u / 7) % 8) as u8
            }).collect();
            let vals = bytes.iter().map(|&b| e4m3_f32(b) as f64).collect();
            (bytes, vals)
        }
        other => panic!("no random operand for {other}"),
    }
}

pub(super) fn read_out(buf: &DeviceBuffer, dtype: DType, stream: &Stream) -> Vec<f64> {
    match dtype {
        DType::Bf16 => buf.to_host_vec::<u16>(stream).unwrap().iter().map(|&b| bf16_f32(b) as f64).collect(),
        DType::Fp16 => buf.to_host_vec::<u16>(stream).unwrap().iter().map(|&b| f16_f32(b) as f64).collect(),
        DType::F32 => buf.to_host_vec::<f32>(stream).unwrap().iter().map(|&v| v as f64).collect(),
        other => panic!("no output of {other}"),
    }
}

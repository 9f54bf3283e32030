//! Quantize, dequantize and the global scale on every arch: bit-identical to the host reference
//! on random, adversarial, large and strided inputs.

use super::*;

#[test]
fn quantize_and_dequantize_are_bit_identical_to_the_host_reference() {
    let Some((ctx, stream)) = gpu() else { return };
    let mut cases = 0;
    for dt in [DType::Bf16, DType::Fp16] {
        for &(m, k) in &[(1usize, 32usize), (7, 64), (9, 96), (128, 256), (300, 1024), (1000, 4096)] {
            for finite in [true, false] {
                let mut x = inputs(m, k, (m * 31 + k) as u64, dt);
                if finite {
                    x.iter_mut().filter(|v| !v.is_finite()).for_each(|v| *v = 1.5);
                }
                let (bits, xf) = to_bits(&x, dt);
                let xb = DeviceBuffer::from_host(&stream, &bits).unwrap();
                let xt = Tensor::contiguous(&xb, dt, &[m, k]);
                // Global scale on the device equals the host's, bit for bit.
                let gs_dev = DeviceBuffer::alloc_zeroed(&stream, 4).unwrap();
                nvfp4::global_scale(&xt, &gs_dev, &stream).unwrap();
                let gs = gs_dev.to_host_vec::<f32>(&stream).unwrap()[0];
                assert_eq!(gs.to_bits(), r::global_scale(&xf).to_bits(), "{dt} {m}x{k} finite={finite}");
                let packed = DeviceBuffer::alloc(&ctx, m * k / 2).unwrap();
                let scales = DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap();
                scales.memset_u8(0xAB, &stream).unwrap(); // dirty: padding must be written as 0
                let q = Nvfp4Matrix::new(&packed, &scales, &gs_dev, m, k);
                nvfp4::quantize(&Nvfp4QuantizeArgs::new(xt.clone(), &gs_dev, q.clone()), &stream).unwrap();
                let (want_p, want_s) = r::quantize(&xf, m, k, gs).unwrap();
                assert_eq!(q.packed.to_host_vec::<u8>(&stream).unwrap(), want_p, "{dt} {m}x{k} packed");
                assert_eq!(q.scales.to_host_vec::<u8>(&stream).unwrap(), want_s, "{dt} {m}x{k} scales");
                let out = DeviceBuffer::alloc(&ctx, m * k * 2).unwrap();
                nvfp4::dequantize(&q, &Tensor::contiguous(&out, dt, &[m, k]), &stream).unwrap();
                let (want_d, _) = to_bits(&r::dequantize(&want_p, &want_s, m, k, gs).unwrap(), dt);
                assert_eq!(out.to_host_vec::<u16>(&stream).unwrap(), want_d, "{dt} {m}x{k} dequantized");
                cases += 1;
            }
        }
    }
    eprintln!("{cases} quantize cases bit-identical");
}

/// Inputs large enough for the two-blocks-a-thread quantize (the walk every large activation or
/// weight takes), bit-identical to the host reference in every code and scale byte: rows of
/// k / 16 = 2 mod 4 blocks (a group's padding blocks), k above 8,192, padding rows, one non-finite
/// block mid-tensor (the exact slow path), and strided inputs whose gaps hold NaN (the kernel
/// must read none of them).
#[test]
fn quantize_of_large_and_strided_inputs_is_bit_identical() {
    let Some((ctx, stream)) = gpu() else { return };
    let mut cases = 0;
    for dt in [DType::Bf16, DType::Fp16] {
        for &(m, k, ld) in &[(1000usize, 8224usize, 8224usize), (2100, 4096, 4096), (1100, 4160, 4200), (600, 16416, 16424)] {
            let mut x = inputs(m, k, (m * 17 + k) as u64, dt);
            x.iter_mut().filter(|v| !v.is_finite()).for_each(|v| *v = -2.75);
            x[(m / 2) * k + 5] = f32::NAN; // one non-finite block mid-tensor takes the exact slow path
            let (bits, xf) = to_bits(&x, dt);
            let nan = if dt == DType::Fp16 { 0x7E00u16 } else { 0x7FC0u16 };
            let mut strided = vec![nan; m * ld];
            for r in 0..m {
                strided[r * ld..r * ld + k].copy_from_slice(&bits[r * k..(r + 1) * k]);
            }
            let xb = DeviceBuffer::from_host(&stream, &strided).unwrap();
            let xt = Tensor::strided(&xb, 0, dt, &[m, k], &[ld, 1]);
            let gs = r::global_scale(&xf);
            let gs_dev = DeviceBuffer::from_host(&stream, &[gs]).unwrap();
            let (p, sc) = (DeviceBuffer::alloc(&ctx, m * k / 2).unwrap(), DeviceBuffer::alloc(&ctx, r::scale_bytes(m, k)).unwrap());
            p.memset_u8(0xAB, &stream).unwrap();
            sc.memset_u8(0xAB, &stream).unwrap(); // dirty: padding must be written as 0
            let q = Nvfp4Matrix::new(&p, &sc, &gs_dev, m, k);
            nvfp4::quantize(&Nvfp4QuantizeArgs::new(xt.clone(), &gs_dev, q.clone()), &stream).unwrap();
            let (want_p, want_s) = r::quantize(&xf, m, k, gs).unwrap();
            let (got_p, got_s) = (p.to_host_vec::<u8>(&stream).unwrap(), sc.to_host_vec::<u8>(&stream).unwrap());
            let first = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
            assert_eq!(first(&got_p, &want_p), None, "{dt} {m}x{k} ld {ld}: first differing code byte");
            assert_eq!(first(&got_s, &want_s), None, "{dt} {m}x{k} ld {ld}: first differing scale byte");
            cases += 1;
        }
    }
    eprintln!("{cases} large or strided quantize cases bit-identical");
}

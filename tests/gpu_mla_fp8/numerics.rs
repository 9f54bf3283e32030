//! Numerics: against the f64 CPU reference of the dequantised cache, every e4m3 code exactly, the
//! 656-byte format equal to a native decode of its values (bit for bit at 48..128 heads, within
//! bf16 rounding below); captured replay equal to eager (the per-tensor scale read at replay), and
//! too small a captured workspace refused.

use super::*;

#[test]
fn sm90_fp8_matches_the_dequantized_reference_over_46_shapes() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let all = shapes();
    assert_eq!(all.len(), 46);
    let mut worst = (0f64, 0f64);
    for s in &all {
        let p = build(&stream, s);
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        assert_eq!(plan.kv_format, s.kind);
        let out = bf16_out(&p, &stream);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let (eo, el) = reference_errors(&p, &out, &lse, false);
        eprintln!("{} h={} page={} B={} max_seq={} splits={} scale={}: out {eo:.2e} lse {el:.2e}", s.kind, s.heads, s.page, p.batch, p.max_seq, plan.num_splits, s.scale);
        assert!(eo <= 2e-2, "{s:?}: output error {eo}");
        assert!(el <= 1e-3, "{s:?}: lse error {el}");
        for (b, &len) in s.seq_lens.iter().enumerate() {
            if len <= 0 {
                let row = &out[b * s.heads * 512..(b + 1) * s.heads * 512];
                assert!(row.iter().all(|&v| v == 0.0), "{s:?}: empty request {b} is not zeros");
            }
        }
        worst = (worst.0.max(eo), worst.1.max(el));
    }
    eprintln!("{} shapes, worst output error {:.3e}, worst lse error {:.3e}", all.len(), worst.0, worst.1);
}

/// The value the N8 kernel's 656-byte path gives a lone token's code `e` of a group with scale `s`
/// (kernel_n_fp8.cuh): the scale times 2^-E rounded to fp16 (E puts |s| in [64, 128)), the
/// product rounded to fp16, times 2^E, rounded to bf16.
fn n8_ds_mla_value(e: f32, s: f32) -> f32 {
    let pow2 = |x: i32| f32::from_bits(((127 + x) as u32) << 23); // exact, |x| <= 126
    let ex = ((s.abs().to_bits() >> 23) & 0xFF) as i32 - 127 - 6;
    let ex = ex.clamp(-100, 100);
    let down = half::f16::from_f32(s * pow2(-ex)).to_f32();
    bf16::from_f32(half::f16::from_f32(down * e).to_f32() * pow2(ex)).to_f32()
}

/// One token per request makes the output that token's dequantised V row (softmax weight 1), so
/// every e4m3 code, times every scale, must come out exactly as the host's bf16(scale · e4m3);
/// the 656-byte format at 16 heads (the N8 kernel: scale and product rounded to fp16 first)
/// exactly as `n8_ds_mla_value`, and within one bf16 step of bf16(scale · e4m3).
#[test]
fn sm90_fp8_dequantises_every_code_exactly() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    // 16 and 32 heads: the N8 kernel (32: the PV step in two half-step buffers); 128: the seesaw RS
    // kernel (per-tensor) and the seesaw kernel's converting producer (656-byte).
    use KvFormatKind::{Fp8DsMla as Ds, Fp8PerTensor as Pt};
    for (kind, heads) in [(Pt, 16), (Ds, 16), (Pt, 32), (Ds, 32), (Pt, 128), (Ds, 128)] {
        for scale in [1.0f32, 0.375, 1.0 / 3.0, 2f32.powi(-12), 7.5, -0.5] {
            let s = Shape { kind, heads, page: 64, seq_lens: vec![1; 2], splits: None, scale, seed: 900 };
            let mut p = build(&stream, &s);
            // Token 0 of each request's page: codes 0..=255 twice in the latent, NaN codes as 0.
            let latent: Vec<u8> = (0..512).map(|d| (d % 256) as u8).map(|c| if c & 0x7F == 0x7F { 0 } else { c }).collect();
            let groups = if kind == KvFormatKind::Fp8DsMla { [scale, scale * 1.5, scale / 3.0, -scale] } else { [scale; 4] };
            edit_first_token(&mut p, &stream, &[0, 1], |t| {
                t[..512].copy_from_slice(&latent);
                if kind == KvFormatKind::Fp8DsMla {
                    set_group_scales(t, groups);
                }
            });
            decode(&args(&p), &mut ws, &stream).unwrap();
            let out = p.out.to_host_vec::<u16>(&stream).unwrap();
            for b in 0..2 {
                for h in 0..heads {
                    for d in 0..512 {
                        // As values: a -0 code comes out as +0 (the accumulator starts at +0).
                        let (e, sg) = (e4m3_value(latent[d]), groups[d / 128]);
                        let exact = bf16::from_f32(e * sg).to_f32();
                        let want = if kind == KvFormatKind::Fp8DsMla && heads <= 32 { n8_ds_mla_value(e, sg) } else { exact };
                        let got = bf16::from_bits(out[(b * heads + h) * 512 + d]).to_f32();
                        assert_eq!(got, want, "{kind} {heads} heads, scale {scale}: request {b} head {h} dim {d} (code {:#04x})", latent[d]);
                        let step = (bf16::from_f32(exact.abs()).to_bits() as i32 - bf16::from_f32(got.abs()).to_bits() as i32).abs();
                        assert!(step <= 1 && (got == 0.0 || got.signum() == exact.signum()), "{kind} {heads} heads, scale {scale}: dim {d}: {got} is not within a bf16 step of {exact}");
                    }
                }
            }
        }
    }
}

#[test]
fn sm90_fp8_captured_replay_equals_eager_and_reads_the_scale_at_replay() {
    let Some(mut stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for s in [
        Shape { kind: KvFormatKind::Fp8PerTensor, heads: 16, page: 64, seq_lens: vec![4000, 1, 77, 2048], splits: None, scale: 1.0 / 64.0, seed: 950 },
        Shape { kind: KvFormatKind::Fp8DsMla, heads: 32, page: 128, seq_lens: vec![9000], splits: Some(40), scale: 1.0 / 64.0, seed: 951 },
        Shape { kind: KvFormatKind::Fp8PerTensor, heads: 128, page: 64, seq_lens: vec![3000, 1, 700], splits: None, scale: 1.0 / 64.0, seed: 952 },
        Shape { kind: KvFormatKind::Fp8DsMla, heads: 64, page: 128, seq_lens: vec![9000, 64], splits: Some(12), scale: 1.0 / 64.0, seed: 953 },
        // Two row groups: the 656-byte format's CTA pairs (bulk copies into the peer's stages).
        Shape { kind: KvFormatKind::Fp8DsMla, heads: 128, page: 64, seq_lens: vec![3000, 1, 700], splits: Some(3), scale: 1.0 / 64.0, seed: 954 },
    ] {
        let p = build(&stream, &s);
        let a = args(&p);
        let plan = decode(&a, &mut ws, &stream).unwrap();
        let eager = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
        // The eager result with another per-tensor scale, for the replay after the scale changed.
        let other = 1.0f32 / 16.0;
        let eager_other = (s.kind == KvFormatKind::Fp8PerTensor).then(|| {
            p.scale.copy_from_host(&[other], &stream).unwrap();
            decode(&a, &mut ws, &stream).unwrap();
            let r = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
            p.scale.copy_from_host(&[s.scale], &stream).unwrap();
            r
        });
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut ws).unwrap();
            let ca = captured_args(&mut cap, &a);
            assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
            cap.end().unwrap().instantiate().unwrap()
        };
        ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap(); // retire the captured workspace
        for i in 0..10 {
            p.out.memset_u8(0, &stream).unwrap();
            p.lse.memset_u8(0, &stream).unwrap();
            exec.launch(&stream).unwrap();
            let got = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
            assert!(got == eager, "{s:?}: replay {i} differs from eager");
        }
        if let Some(eager_other) = eager_other {
            assert!(eager_other != eager, "the scale must change the result");
            p.scale.copy_from_host(&[other], &stream).unwrap();
            exec.launch(&stream).unwrap();
            let got = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
            assert!(got == eager_other, "{s:?}: the replay did not read the new scale");
        }
    }
}

#[test]
fn sm90_fp8_capture_with_too_small_a_workspace_is_refused() {
    let Some(mut stream) = hopper_gpu(SM90) else { return };
    let s = Shape { kind: KvFormatKind::Fp8DsMla, heads: 16, page: 64, seq_lens: vec![8192], splits: Some(32), scale: 1.0 / 64.0, seed: 960 };
    let p = build(&stream, &s);
    let a = args(&p);
    let needed = a.plan(graphsafe::ops::mla::MlaArch::Sm90, 132, std::ptr::null_mut()).unwrap().workspace_bytes;
    common::capture_with_too_small_a_workspace_is_refused(&mut stream, needed, |cap, w| {
        let ca = captured_args(cap, &a);
        decode_captured(&ca, w, cap)
    });
}

/// A decode over the 656-byte cache against the native decode over a bf16 cache holding its
/// dequantised values bf16(scale · e4m3) and the rope as stored. At 48..128 heads both run the
/// seesaw kernel over the same bf16 stage contents (the fp8 one converted by its producer), so
/// they must agree bit for bit: a box converted wrong, late or into the wrong place would not. At
/// 16/32 heads the kernels differ (the N8 kernel, fp16 math, against the N kernel): two summation
/// orders, so within bf16 rounding of P (1e-2 of the largest output), and the keys themselves
/// differ by up to a bf16 step (fp16-rounded, `dequantize_ds_mla_fp16_rounded`), so the LSE to 1e-3.
#[test]
fn sm90_ds_mla_equals_native_over_its_dequantised_values() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let cases: [(usize, usize, Vec<i32>, Option<u32>); 6] = [
        (16, 64, vec![4096, 77, 1000], None),
        (32, 128, vec![3000, 129], Some(5)),
        (64, 64, vec![2048, 1, 640], None),
        (96, 64, vec![700, 1500], None),
        (128, 128, vec![4096, 333], None),
        (128, 64, vec![9000], Some(16)),
    ];
    for (heads, page, seq_lens, splits) in cases {
        let s = Shape { kind: KvFormatKind::Fp8DsMla, heads, page, seq_lens, splits, scale: 1.0 / 64.0, seed: 1000 + heads as u64 };
        let p = build(&stream, &s);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let fp8 = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
        let values = dequantize_ds_mla(&p.kv.to_host_vec::<u8>(&stream).unwrap()).unwrap();
        let bits: Vec<u16> = values.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        assert!(values.iter().all(|&v| bf16::from_f32(v).to_f32() == v), "the dequantised values are bf16 values");
        let native_kv = DeviceBuffer::from_host(&stream, &bits).unwrap();
        let mut a = args(&p);
        a.kv_cache = Tensor::contiguous(&native_kv, DType::Bf16, &[p.pages, s.page, 576]);
        a.kv_format = KvFormat::Native;
        p.out.memset_u8(0xFF, &stream).unwrap();
        p.lse.memset_u8(0xFF, &stream).unwrap();
        decode(&a, &mut ws, &stream).unwrap();
        let native = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
        if heads > 32 {
            assert!(fp8 == native, "{heads} heads {:?}: the 656-byte decode differs from the native decode of the same values", s.seq_lens);
        } else {
            let f = |b: &u16| bf16::from_bits(*b).to_f32() as f64;
            let top = native.0.iter().map(f).fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            let eo = fp8.0.iter().zip(&native.0).map(|(a, b)| (f(a) - f(b)).abs()).fold(0f64, f64::max) / top;
            let el = fp8.1.iter().zip(&native.1).map(|(&a, &b)| (f32::from_bits(a) as f64 - f32::from_bits(b) as f64).abs()).fold(0f64, f64::max);
            assert!(eo <= 1e-2, "{heads} heads {:?}: output differs from the native decode of the same values by {eo}", s.seq_lens);
            assert!(el <= 1e-3, "{heads} heads {:?}: lse differs by {el}", s.seq_lens);
            eprintln!("{heads} heads, page {page}, lengths {:?}: the 656-byte decode is within {eo:.1e} / lse {el:.1e} of the bf16 one", s.seq_lens);
        }
    }
}

/// The 656-byte format's group scales spread over 2^-14..2^1, by page (so by tile, in a random
/// order along each request): at 16 and 32 heads the N8 kernel keeps O in units of a power of two
/// per 128-dim group that grows with the largest scale seen and rescales O when a tile needs a
/// larger one, and scores in units of a per-token power of two. Against the f64 reference of the
/// fp16-rounded keys, with the reference test's tolerances; a rescale missed or applied twice
/// would be off by powers of two.
#[test]
fn sm90_ds_mla_scales_over_a_wide_range_match_the_reference() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for (heads, seq_lens, splits) in [(16, vec![3000, 700, 64], None), (32, vec![2500, 1300], Some(3)), (16, vec![4096], Some(2))] {
        let s = Shape { kind: KvFormatKind::Fp8DsMla, heads, page: 64, seq_lens, splits, scale: 1.0, seed: 7100 + heads as u64 };
        let mut p = build(&stream, &s);
        let mut bytes = p.kv.to_host_vec::<u8>(&stream).unwrap();
        let mut st = 77u64;
        for (row, t) in bytes.chunks_mut(DS_MLA_TOKEN_BYTES).enumerate() {
            let page = row / s.page;
            let mut groups = [0f32; 4];
            for (g, v) in groups.iter_mut().enumerate() {
                let u = (lcg(&mut st) % 1024) as f32 / 1024.0;
                *v = 2f32.powi(((page * 7 + g * 3) % 16) as i32 - 14) * (0.5 + u / 2.0);
            }
            set_group_scales(t, groups);
        }
        replace_ds_mla_cache(&mut p, &stream, &bytes);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let out = bf16_out(&p, &stream);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        // Each request against its own largest output: their scales differ by powers of two.
        let (eo, el) = reference_errors(&p, &out, &lse, true);
        eprintln!("{heads} heads {:?} splits {splits:?}: out {eo:.2e} (per request) lse {el:.2e}", s.seq_lens);
        assert!(eo <= 2e-2, "{heads} heads {:?}: output error {eo}", s.seq_lens);
        assert!(el <= 1e-3, "{heads} heads {:?}: lse error {el}", s.seq_lens);
    }
}

/// A 656-byte token whose four group scales are all zero (or tiny) still carries its bf16 rope:
/// at 16 and 32 heads the N8 kernel's per-token offset 2^-E, which also multiplies the rope, is
/// floored (2^30), so a rope of 1,000 keeps the scores finite and the decode equals the
/// reference (an unfloored offset of 2^100 overflowed f32 in the rope's products). Tokens with
/// scales 0, 2^-130 (subnormal) and 2^-40 in the middle of requests, two splits.
#[test]
fn sm90_ds_mla_zero_scale_tokens_keep_their_rope() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for heads in [16, 32] {
        let s = Shape { kind: KvFormatKind::Fp8DsMla, heads, page: 64, seq_lens: vec![300, 129], splits: Some(2), scale: 1.0 / 64.0, seed: 7300 + heads as u64 };
        let mut p = build(&stream, &s);
        let mut bytes = p.kv.to_host_vec::<u8>(&stream).unwrap();
        for (b, &len) in s.seq_lens.iter().enumerate() {
            for (k, tiny) in [0f32, f32::from_bits(1 << 20), 2f32.powi(-40)].into_iter().enumerate() {
                let pos = (len as usize) * (k + 1) / 4;
                let row = p.host.3[b * p.max_pages + pos / s.page] as usize * s.page + pos % s.page;
                let t = &mut bytes[row * DS_MLA_TOKEN_BYTES..(row + 1) * DS_MLA_TOKEN_BYTES];
                set_group_scales(t, [tiny; 4]);
                for r in 0..64 {
                    let v = bf16::from_f32(if r % 2 == 0 { 1000.0 } else { -750.0 });
                    t[528 + 2 * r..530 + 2 * r].copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
        }
        replace_ds_mla_cache(&mut p, &stream, &bytes);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let out = bf16_out(&p, &stream);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        assert!(out.iter().chain(&lse).all(|v| v.is_finite()), "{heads} heads: a zero-scale token made the decode non-finite");
        let (eo, el) = reference_errors(&p, &out, &lse, false);
        eprintln!("{heads} heads: out {eo:.2e} lse {el:.2e}");
        assert!(eo <= 2e-2, "{heads} heads: output error {eo}");
        assert!(el <= 1e-3, "{heads} heads: lse error {el}");
    }
}

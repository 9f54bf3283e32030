//! Device data cannot break the fp8 decode (invariant 10): garbage scales and NaN codes stay in
//! their requests, and the lengths and pages follow the contract both back-ends share.

use super::*;

/// The scales are device data, like `seq_lens`: never trusted, read as they are. A NaN or zero
/// per-tensor scale gives NaN or zeros (and LSE = ln(len)) and finishes; a NaN group scale in one
/// token of one request of a 656-byte cache makes that request NaN and leaves the others
/// bit-identical to a clean run (no hang, nothing outside the request's own rows).
#[test]
fn sm90_fp8_garbage_scales_stay_in_their_requests_and_never_hang() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let lens = vec![300, 300, 300];
    // 16 heads: the N8 kernel; 128: the seesaw RS kernel (per-tensor) and the seesaw kernel (656-byte:
    // its producer reads each box's scales as it converts it).
    for heads in [16usize, 128] {
        // Per-tensor: NaN, then 0.
        let s = Shape { kind: KvFormatKind::Fp8PerTensor, heads, page: 64, seq_lens: lens.clone(), splits: None, scale: f32::NAN, seed: 970 };
        let p = build(&stream, &s);
        decode(&args(&p), &mut ws, &stream).unwrap();
        assert!(bf16_out(&p, &stream).iter().all(|v| v.is_nan()), "a NaN scale must give NaN everywhere");
        assert!(p.lse.to_host_vec::<f32>(&stream).unwrap().iter().all(|v| v.is_nan()), "and a NaN LSE, not an empty request's +inf");
        p.scale.copy_from_host(&[0.0f32], &stream).unwrap();
        decode(&args(&p), &mut ws, &stream).unwrap();
        assert!(bf16_out(&p, &stream).iter().all(|&v| v == 0.0), "a zero scale makes K = V = 0: the output is 0");
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        assert!(lse.iter().all(|&l| (l - 300f32.ln()).abs() < 1e-3), "uniform softmax over 300 tokens: {lse:?}");

        // 656-byte cache: one NaN group scale in request 1's first token.
        let s = Shape { kind: KvFormatKind::Fp8DsMla, heads, page: 64, seq_lens: lens.clone(), splits: None, scale: 1.0 / 64.0, seed: 971 };
        let mut p = build(&stream, &s);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let clean = p.out.to_host_vec::<u16>(&stream).unwrap();
        edit_first_token(&mut p, &stream, &[1], |t| t[512..516].copy_from_slice(&f32::NAN.to_le_bytes()));
        decode(&args(&p), &mut ws, &stream).unwrap();
        let got = p.out.to_host_vec::<u16>(&stream).unwrap();
        let n = heads * 512;
        assert_eq!(&got[..n], &clean[..n], "request 0 changed");
        assert_eq!(&got[2 * n..], &clean[2 * n..], "request 2 changed");
        assert!(got[n..2 * n].iter().all(|&b| bf16::from_bits(b).is_nan()), "request 1 must be NaN");
    }
}

/// The shared device-data contract (include/graphsafe_kernels/mla.h, "Device data") through the
/// fp8 producer's own page clamp and length handling: lengths 0 and negative give zeros and +inf,
/// an over-long length equals max_seq_len, and bad page indices in the columns a request reads
/// (-1, i32::MIN, pages, pages + 3, i32::MAX) give exactly the result of their clamped values.
fn fp8_device_data_contract(stream: &Stream, s: Shape) {
    let mut ws = Workspace::new(stream, 0).unwrap();
    let p = build(stream, &s);
    let a = args(&p);
    let run = |seq: &[i32], table: &[i32], ws: &mut Workspace| {
        p.seq_lens.copy_from_host(seq, stream).unwrap();
        p.page_table.copy_from_host(table, stream).unwrap();
        p.out.memset_u8(0x77, stream).unwrap();
        p.lse.memset_u8(0x77, stream).unwrap();
        decode(&a, ws, stream).unwrap();
        (p.out.to_host_vec::<u16>(stream).unwrap(), p.lse.to_host_vec::<u32>(stream).unwrap())
    };
    let (h, m) = (s.heads, p.max_seq as i32);
    let table = p.host.3.clone();
    let good = s.seq_lens.clone();
    assert_eq!(good[2], m, "request 2 has the longest length");
    let (out_ref, lse_ref) = run(&good, &table, &mut ws);
    let mut lens = good.clone();
    lens[0] = 0;
    lens[1] = -7;
    lens[2] = m + 5000;
    let (out_b, lse_b) = run(&lens, &table, &mut ws);
    let row = h * 512;
    for r in 0..2 {
        assert!(out_b[r * row..(r + 1) * row].iter().all(|&v| v == 0), "{s:?}: request {r} is empty: zeros");
        assert!(lse_b[r * h..(r + 1) * h].iter().all(|&v| v == f32::INFINITY.to_bits()), "{s:?}: request {r}: +inf");
    }
    assert_eq!(out_b[2 * row..], out_ref[2 * row..], "{s:?}: over-long equals max_seq_len");
    assert_eq!(lse_b[2 * h..], lse_ref[2 * h..], "{s:?}");
    let (pages, mp, page) = (p.pages as i32, p.max_pages, s.page);
    let (mut bad, mut fixed) = (table.clone(), table.clone());
    let weird = [-1, i32::MIN, pages, pages + 3, i32::MAX];
    for b in 0..p.batch {
        let used = (good[b].max(0) as usize).div_ceil(page);
        for j in 0..mp {
            let i = b * mp + j;
            if j >= used {
                bad[i] = i32::MIN + j as i32; // never read
            } else if (b + j) % 3 == 0 {
                bad[i] = weird[(b + j) % weird.len()];
                fixed[i] = bad[i].clamp(0, pages - 1);
            }
        }
    }
    let (out_fixed, lse_fixed) = run(&good, &fixed, &mut ws);
    let (out_bad, lse_bad) = run(&good, &bad, &mut ws);
    assert_eq!(out_bad, out_fixed, "{s:?}: bad pages read as their clamped value");
    assert_eq!(lse_bad, lse_fixed, "{s:?}");
}

#[test]
fn sm90_fp8_device_data_follows_the_shared_contract() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    for (kind, heads, page, lens) in [
        (KvFormatKind::Fp8PerTensor, 16, 64, vec![300, 200, 640]),
        (KvFormatKind::Fp8DsMla, 32, 128, vec![129, 1, 1000]),
        (KvFormatKind::Fp8DsMla, 16, 64, vec![65, 64, 4097]),
        (KvFormatKind::Fp8PerTensor, 32, 128, vec![1, 2, 300]),
        (KvFormatKind::Fp8PerTensor, 128, 64, vec![300, 1, 640]),
        (KvFormatKind::Fp8DsMla, 64, 128, vec![129, 2, 1000]),
    ] {
        fp8_device_data_contract(&stream, Shape { kind, heads, page, seq_lens: lens, splits: None, scale: 1.0 / 64.0, seed: 990 });
    }
}

/// e4m3's NaN codes (0x7F, 0xFF) are read as finite values below 2^17 times their scale (the
/// header's contract), not as NaN: one token whose latent holds them comes out finite.
#[test]
fn sm90_fp8_nan_codes_read_as_finite_values() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for (kind, heads) in [(KvFormatKind::Fp8PerTensor, 16), (KvFormatKind::Fp8DsMla, 16), (KvFormatKind::Fp8PerTensor, 128), (KvFormatKind::Fp8DsMla, 128)] {
        let s = Shape { kind, heads, page: 64, seq_lens: vec![1], splits: None, scale: 1.0, seed: 995 };
        let mut p = build(&stream, &s);
        edit_first_token(&mut p, &stream, &[0], |t| {
            for (d, code) in t[..512].iter_mut().enumerate() {
                *code = if d % 2 == 0 { 0x7F } else { 0xFF };
            }
            if kind == KvFormatKind::Fp8DsMla {
                set_group_scales(t, [1.0; 4]);
            }
        });
        decode(&args(&p), &mut ws, &stream).unwrap();
        let out = bf16_out(&p, &stream);
        assert!(out.iter().all(|v| v.is_finite() && v.abs() < 131072.0), "{kind}: a NaN code came out as {:?}", out.iter().find(|v| !v.is_finite() || v.abs() >= 131072.0));
    }
}

/// At 16 and 32 heads both fp8 caches run the N8 kernel, and the per-tensor cache above 32 rows the
/// seesaw RS kernel: both convert without a NaN check and rerun a split with NaN codes read as
/// +448 when its output came out NaN. Pinned exactly: a request whose tokens hold NaN codes (0x7F
/// and 0xFF) must equal, bit for bit, the same request with those codes replaced by 0x7E (+448),
/// and the other requests of the batch must equal a decode without any NaN code (the rerun is per
/// split and request). Two splits, so a rerun split's partials meet a clean split's in the combine.
#[test]
fn sm90_fp8_nan_codes_rerun_as_448_and_stay_in_their_request() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for (kind, heads) in [
        (KvFormatKind::Fp8PerTensor, 16),
        (KvFormatKind::Fp8PerTensor, 32),
        (KvFormatKind::Fp8DsMla, 16),
        (KvFormatKind::Fp8DsMla, 32),
        (KvFormatKind::Fp8PerTensor, 128),
    ] {
        // The codes: all 576 of a per-tensor token, the 512 latent ones of a 656-byte token.
        let codes = if kind == KvFormatKind::Fp8DsMla { 512 } else { 576 };
        let s = Shape { kind, heads, page: 64, seq_lens: vec![300, 200, 129], splits: Some(2), scale: 1.0 / 64.0, seed: 4242 };
        let mut clean = build(&stream, &s);
        decode(&args(&clean), &mut ws, &stream).unwrap();
        let base = bf16_out(&clean, &stream);
        let poison = |t: &mut [u8]| {
            for (d, code) in t[..codes].iter_mut().enumerate() {
                if d % 5 == 0 {
                    *code = if d % 2 == 0 { 0x7F } else { 0xFF };
                }
            }
        };
        let as_448 = |t: &mut [u8]| {
            for (d, code) in t[..codes].iter_mut().enumerate() {
                if d % 5 == 0 {
                    *code = 0x7E;
                }
            }
        };
        let mut nan = build(&stream, &s);
        edit_first_token(&mut nan, &stream, &[1], poison);
        decode(&args(&nan), &mut ws, &stream).unwrap();
        let got = bf16_out(&nan, &stream);
        edit_first_token(&mut clean, &stream, &[1], as_448);
        decode(&args(&clean), &mut ws, &stream).unwrap();
        let want = bf16_out(&clean, &stream);
        let row = heads * 512;
        for b in 0..3 {
            let (g, w) = (&got[b * row..(b + 1) * row], if b == 1 { &want[b * row..(b + 1) * row] } else { &base[b * row..(b + 1) * row] });
            let diff = g.iter().zip(w).position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(diff.is_none(), "{kind} {heads} heads, request {b}: element {diff:?} differs ({:?} vs {:?})", diff.map(|i| g[i]), diff.map(|i| w[i]));
        }
        assert!(got[row..2 * row].iter().all(|v| v.is_finite()), "{kind} {heads} heads: the NaN-coded request came out non-finite");
    }
}

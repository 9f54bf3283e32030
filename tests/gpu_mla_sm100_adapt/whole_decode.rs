//! The whole adapted decode on Blackwell (skipped elsewhere, naming the arch): bit for bit against
//! CUTLASS's direct decode of the expanded problem, against the CPU reference, and replayed.

use super::*;

// ---- the whole decode, on Blackwell ---------------------------------------------------------------

fn decode_cases() -> Vec<Case> {
    let c = |dtype, heads, s_q, causal, page, seq_lens: Vec<i32>, padded, seed| {
        let max_seq = *seq_lens.iter().max().unwrap() as usize;
        Case { dtype, heads, s_q, causal, page, max_seq, seq_lens, padded, bad_pages: false, seed }
    };
    use DType::{Bf16, Fp16, Fp8E4m3};
    vec![
        c(Bf16, 16, 2, true, 64, vec![300, 1, 0, 129, 2048], false, 20),
        c(Fp16, 32, 4, false, 128, vec![1000, 77, 4096], true, 21),
        c(Bf16, 1, 3, true, 32, vec![2, 700, 3], true, 22),
        c(Fp8E4m3, 16, 2, true, 128, vec![5000, 1, 128], false, 23),
        c(Fp8E4m3, 100, 1, false, 64, vec![333, 4097], true, 24),
        // One request, one token, fewer heads: B' = 1 splits the sequence over the dense staging.
        c(Bf16, 64, 1, false, 64, vec![20_000], true, 25),
        c(Fp16, 128, 8, true, 128, vec![8, 9, 4000, 7], false, 26),
    ]
}

/// A 16-bit output element as f32.
fn out_value(bits: u16, dt: DType) -> f32 {
    if dt == DType::Fp16 {
        f16::from_bits(bits).to_f32()
    } else {
        bf16::from_bits(bits).to_f32()
    }
}

/// The same decode as CUTLASS's own shape: B' requests of one token of 128 heads, q padded with
/// zero heads and each token's causal length, over copies of the page-table rows: (out [B', 128,
/// 512] bits, lse [B', 128] bits) of a direct decode.
fn direct_expanded(stream: &Stream, p: &Problem, ws: &mut Workspace) -> (Vec<u16>, Vec<u32>) {
    let c = &p.c;
    let (kb, e) = (c.kernel_batch(), c.elem());
    let ([nb, nt, nh], [pb, pt, ph]) = (c.strides(512), c.strides(64));
    let mut qn = vec![0u8; kb * 128 * 512 * e];
    let mut qp = vec![0u8; kb * 128 * 64 * e];
    let mut lens = vec![0i32; kb];
    let mut table = vec![0i32; kb * p.table_stride];
    for b in 0..c.batch() {
        for t in 0..c.s_q {
            let j = b * c.s_q + t;
            lens[j] = c.kernel_len(b, t);
            table[j * p.table_stride..(j + 1) * p.table_stride].copy_from_slice(&p.table[b * p.table_stride..(b + 1) * p.table_stride]);
            for h in 0..c.heads {
                let (n, r) = ((b * nb + t * nt + h * nh) * e, (b * pb + t * pt + h * ph) * e);
                qn[(j * 128 + h) * 512 * e..][..512 * e].copy_from_slice(&p.qn.0[n..n + 512 * e]);
                qp[(j * 128 + h) * 64 * e..][..64 * e].copy_from_slice(&p.qp.0[r..r + 64 * e]);
            }
        }
    }
    let dev = |bytes: &[u8]| DeviceBuffer::from_host(stream, bytes).unwrap();
    let (qn, qp) = (dev(&qn), dev(&qp));
    let lens_d = DeviceBuffer::from_host(stream, &lens).unwrap();
    let table_d = DeviceBuffer::from_host(stream, &table).unwrap();
    let out = DeviceBuffer::alloc_zeroed(stream, kb * 128 * 512 * 2).unwrap();
    let lse = DeviceBuffer::alloc_zeroed(stream, kb * 128 * 4).unwrap();
    let a = MlaDecodeArgs::new(
        Tensor::contiguous(&qn, c.dtype, &[kb, 128, 512]),
        Tensor::contiguous(&qp, c.dtype, &[kb, 128, 64]),
        Tensor::contiguous(&p.kv, c.dtype, &[p.pages, c.page, 576]),
        Tensor::contiguous(&lens_d, DType::I32, &[kb]),
        Tensor::contiguous(&table_d, DType::I32, &[kb, p.table_stride]),
        Tensor::contiguous(&out, c.out_dtype(), &[kb, 128, 512]),
    )
    .with_lse(Tensor::contiguous(&lse, DType::F32, &[kb, 128]))
    .with_max_seq_len(c.max_seq as u32);
    decode(&a, ws, stream).unwrap();
    (out.to_host_vec::<u16>(stream).unwrap(), lse.to_host_vec::<u32>(stream).unwrap())
}

#[test]
fn sm100_adapted_decodes_equal_cutlass_on_the_expanded_problem_and_the_reference() {
    let Some((ctx, stream)) = gpu() else { return };
    if !blackwell(&ctx) {
        return;
    }
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for c in decode_cases() {
        let p = build(&stream, &c);
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        assert_eq!((plan.num_heads as usize, plan.s_q as usize), (c.heads, c.s_q));
        let out = p.out.to_host_vec::<u16>(&stream).unwrap();
        let lse = p.lse.to_host_vec::<u32>(&stream).unwrap();
        let (d_out, d_lse) = direct_expanded(&stream, &p, &mut ws);
        let [sb, st, sh] = c.strides(512);
        let (b_n, h_n, s_n) = (c.batch(), c.heads, c.s_q);
        let mut mine = (Vec::new(), Vec::new());
        for b in 0..b_n {
            for t in 0..s_n {
                let j = b * s_n + t;
                let empty = c.kernel_len(b, t) == 0;
                for h in 0..h_n {
                    let row = &out[b * sb + t * st + h * sh..][..512];
                    let l = lse[(b * h_n + h) * s_n + t];
                    // Bit for bit what CUTLASS computes for that row of the expanded problem (its
                    // other rows are independent of the padding), also for rows with no key.
                    assert_eq!(row, &d_out[(j * 128 + h) * 512..][..512], "{c:?}: out[{b}, {t}, {h}]");
                    assert_eq!(l, d_lse[j * 128 + h], "{c:?}: lse[{b}, {h}, {t}]");
                    if empty {
                        assert!(row.iter().all(|&v| v == 0) && f32::from_bits(l) == f32::INFINITY, "{c:?}: row ({b}, {t}, {h}) attends no key");
                    }
                    mine.0.extend(row.iter().map(|&v| out_value(v, c.out_dtype())));
                    mine.1.push(f32::from_bits(l));
                }
            }
        }
        // bf16 / fp16 also against the CPU reference of the decode as the caller states it (its
        // own s_q and causal rule, independent of the expansion above; fp8's P rounding makes a
        // tolerance a guess, and the comparison above covers it).
        if c.dtype == DType::Fp8E4m3 {
            continue;
        }
        let ([nb, nt, nh], [pb, pt, ph]) = (c.strides(512), c.strides(64));
        let (mut qn, mut qp) = (Vec::new(), Vec::new());
        for b in 0..b_n {
            for t in 0..s_n {
                for h in 0..h_n {
                    qn.extend_from_slice(&p.qn.1[b * nb + t * nt + h * nh..][..512]);
                    qp.extend_from_slice(&p.qp.1[b * pb + t * pt + h * ph..][..64]);
                }
            }
        }
        let hp = HostProblem {
            q_nope: &qn,
            q_pe: &qp,
            kv: &p.kv_host.1,
            seq_lens: &c.seq_lens,
            page_table: &p.table,
            page_table_stride: p.table_stride,
            page_size: c.page,
            num_heads: h_n,
            s_q: s_n,
            causal: c.causal,
            sm_scale: 1.0 / 576f32.sqrt(),
        };
        // out [B, s_q, H, 512] (the order `mine` was gathered in), lse [B, H, s_q].
        let (r_out, r_lse) = cpu_decode(&hp).unwrap();
        assert_eq!(r_out.len(), mine.0.len());
        let lse_bht: Vec<f32> = (0..b_n * h_n * s_n).map(|i| mine.1[(i / (h_n * s_n) * s_n + i % s_n) * h_n + i / s_n % h_n]).collect();
        let scale = r_out.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-6);
        let e_out = mine.0.iter().zip(&r_out).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs())) / scale;
        let mut e_lse = 0f64;
        for (&a, &r) in lse_bht.iter().zip(&r_lse) {
            if r.is_infinite() {
                assert_eq!(a, r, "{c:?}: a row with no key");
            } else {
                e_lse = e_lse.max((a as f64 - r as f64).abs());
            }
        }
        assert!(e_out <= 2e-2 && e_lse <= 1e-3, "{c:?}: vs the CPU reference {e_out} {e_lse}");
    }
}

#[test]
fn sm100_captured_adapted_decode_replays_bit_for_bit() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !blackwell(&ctx) {
        return;
    }
    let c = Case { dtype: DType::Bf16, heads: 16, s_q: 2, causal: true, page: 64, max_seq: 4096, seq_lens: vec![4096, 1, 0, 2000], padded: true, bad_pages: true, seed: 30 };
    let p = build(&stream, &c);
    let a = args(&p);
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let plan = decode(&a, &mut ws, &stream).unwrap();
    let (eager_out, eager_lse) = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let ca = a.bind(&mut cap).unwrap();
        assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
        cap.end().unwrap().instantiate().unwrap()
    };
    // Retire the captured workspace: the graph keeps it; a new decode's staging lands elsewhere.
    ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap();
    let _churn = common::churn(&stream, &[1 << 20, 3 << 20, 7 << 20], 4);
    for _ in 0..50 {
        p.out.memset_u8(0x11, &stream).unwrap();
        p.lse.memset_u8(0x22, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(p.out.to_host_vec::<u16>(&stream).unwrap(), eager_out);
        assert_eq!(p.lse.to_host_vec::<u32>(&stream).unwrap(), eager_lse);
    }
}

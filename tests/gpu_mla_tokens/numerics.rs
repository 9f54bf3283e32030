//! Tokens and any head count against the references: the f64 CPU reference on small shapes and the
//! GPU reference per token on large ones, native and fp8 caches.

use super::*;

/// Every head count FlashMLA's tests use (1, 3, 9, 63, 64, 126, 128) and the TP splits (16, 32), with
/// 1, 2 and 4 tokens, causal and not, short, long and empty requests (a causal token before its
/// request's first key too), bf16 and fp16, default and forced splits: against the GPU reference, and
/// the small ones against the f64 CPU reference as well.
#[test]
fn tokens_and_any_head_count_match_the_references() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let reference = GpuReference::load(stream.context()).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let mut shapes = Vec::new();
    let mut seed = 100;
    for heads in [1usize, 3, 9, 16, 32, 63, 64, 126, 128] {
        for s_q in [1usize, 2, 4] {
            for causal in [false, true] {
                seed += 1;
                let dtype = if seed % 2 == 0 { DType::Bf16 } else { DType::Fp16 };
                // 20 and 140 as FlashMLA's s_k; 3 < s_q = 4: its first causal tokens see nothing.
                let seq_lens = vec![20, 140, 3, 0, 64, 129];
                shapes.push(Shape { cache: Cache::Native(dtype), heads, s_q, causal, page: 64, seq_lens, splits: None, seed });
            }
        }
    }
    // Longer requests, many splits (each split's rows partly past their causal limits), page 128.
    for (heads, s_q, splits) in [(128usize, 2usize, Some(3u32)), (16, 2, Some(5)), (32, 2, None), (9, 16, Some(7)), (1, 16, None), (64, 3, Some(2)), (128, 4, None)] {
        seed += 1;
        shapes.push(Shape { cache: Cache::Native(DType::Bf16), heads, s_q, causal: true, page: 128, seq_lens: vec![4096, 130, 1, 2050, 7], splits, seed });
    }
    for (heads, s_q) in [(128usize, 2usize), (16, 2), (64, 1)] {
        seed += 1;
        shapes.push(Shape { cache: Cache::Native(DType::Bf16), heads, s_q, causal: true, page: 64, seq_lens: (0..64).map(|i| 512 + 97 * i).collect(), splits: None, seed });
    }
    let (mut worst, mut vs_cpu) = ((0f64, 0f64), 0);
    for s in &shapes {
        let p = build(&stream, s);
        let (out, lse, splits) = run(&stream, &mut ws, &p);
        let (r_out, r_lse) = gpu_reference(&stream, &reference, &p);
        let e = check(s, &out, &lse, &r_out, &r_lse, 2e-2);
        worst = (worst.0.max(e.0), worst.1.max(e.1));
        let rows = p.batch * s.s_q * s.heads;
        if rows * p.max_seq <= 200_000 {
            let (qn, qp, kv, pt) = &p.host;
            let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: s.heads, s_q: s.s_q, causal: s.causal, sm_scale: p.sm_scale };
            let (c_out, c_lse) = cpu_decode(&hp).unwrap();
            check(s, &r_out, &r_lse, &c_out, &c_lse, 1e-4); // the GPU reference itself
            check(s, &out, &lse, &c_out, &c_lse, 2e-2);
            vs_cpu += 1;
        }
        eprintln!("{:?} h={} s_q={} causal={} B={} max_seq={} splits={splits}: out {:.2e} lse {:.2e}", s.cache, s.heads, s.s_q, s.causal, p.batch, p.max_seq, e.0, e.1);
    }
    eprintln!("{} shapes ({vs_cpu} also against the CPU reference), worst output error {:.3e}, worst lse error {:.3e}", shapes.len(), worst.0, worst.1);
    assert!(vs_cpu >= 40, "{vs_cpu}");
}

/// Both fp8 caches with any head count and query tokens: the decode equals the f64 reference over
/// the dequantised cache (bf16 rounding of P and of the fp16-scaled products).
#[test]
fn fp8_caches_with_tokens_and_any_head_count_match_the_reference() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let mut n = 0;
    for kind in [KvFormatKind::Fp8PerTensor, KvFormatKind::Fp8DsMla] {
        for (i, &(heads, s_q)) in [(1usize, 2usize), (3, 4), (9, 2), (16, 2), (32, 1), (63, 1), (64, 2), (126, 1), (128, 2), (12, 3)].iter().enumerate() {
            for causal in [false, true] {
                let s = Shape { cache: Cache::Fp8(kind), heads, s_q, causal, page: 64, seq_lens: vec![20, 140, 2, 0], splits: if i % 3 == 0 { Some(2) } else { None }, seed: 900 + i as u64 };
                let p = build(&stream, &s);
                let (out, lse, _) = run(&stream, &mut ws, &p);
                let (qn, qp, kv, pt) = &p.host;
                let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: heads, s_q, causal, sm_scale: p.sm_scale };
                let (c_out, c_lse) = cpu_decode(&hp).unwrap();
                let (eo, el) = check(&s, &out, &lse, &c_out, &c_lse, 2e-2);
                eprintln!("{kind} h={heads} s_q={s_q} causal={causal}: out {eo:.2e} lse {el:.2e}");
                n += 1;
            }
        }
    }
    assert_eq!(n, 40);
}

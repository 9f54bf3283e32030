//! The adaptation's pre-pass and post-pass alone, byte for byte against a host model of the rule
//! (plain CUDA: they run on Hopper too), and their refusals.

use super::*;

fn put_i32(region: &mut [u8], at: u64, i: usize, v: i32) {
    let o = at as usize + 4 * i;
    region[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// What the pre-pass must leave in a region that held FILL everywhere (mla.h, gs_mla_sanitize).
fn pre_pass_model(p: &Problem, l: &sm100::SanitizeLayout) -> Vec<u8> {
    let c = &p.c;
    let mut region = vec![FILL; l.bytes as usize];
    let cols = l.columns as usize;
    for b in 0..c.batch() {
        for t in 0..c.s_q {
            let j = b * c.s_q + t;
            let len = c.kernel_len(b, t);
            let run = len.max(1);
            put_i32(&mut region, l.lens_offset, j, len);
            put_i32(&mut region, l.kernel_lens_offset, j, run);
            let used = (run as usize).div_ceil(c.page);
            for col in 0..cols {
                let v = if col < used { p.table[b * p.table_stride + col].clamp(0, p.pages as i32 - 1) } else { 0 };
                put_i32(&mut region, l.page_table_offset, j * cols + col, v);
            }
        }
    }
    if l.adapted {
        let e = c.elem();
        let ([nb, nt, nh], [pb, pt, ph]) = (c.strides(512), c.strides(64));
        for b in 0..c.batch() {
            for t in 0..c.s_q {
                let j = b * c.s_q + t;
                for h in 0..128 {
                    let dst = l.q_offset as usize + (j * 128 + h) * 576 * e;
                    if h < c.heads {
                        let n = (b * nb + t * nt + h * nh) * e;
                        let r = (b * pb + t * pt + h * ph) * e;
                        region[dst..dst + 512 * e].copy_from_slice(&p.qn.0[n..n + 512 * e]);
                        region[dst + 512 * e..dst + 576 * e].copy_from_slice(&p.qp.0[r..r + 64 * e]);
                    } else {
                        region[dst..dst + 576 * e].fill(0);
                    }
                }
            }
        }
    }
    region
}

/// Which part of the region byte `i` is in, for messages.
fn part(l: &sm100::SanitizeLayout, i: u64) -> &'static str {
    let parts = [(l.lens_offset, "lens"), (l.kernel_lens_offset, "kernel lens"), (l.page_table_offset, "page table"), (l.lse_offset, "lse staging"), (l.q_offset, "q staging"), (l.out_offset, "out staging")];
    parts.iter().rev().find(|(at, _)| i >= *at).map_or("?", |(_, name)| name)
}

fn pass_cases() -> Vec<Case> {
    let c = |dtype, heads, s_q, causal, page, max_seq, seq_lens: Vec<i32>, padded, seed| Case { dtype, heads, s_q, causal, page, max_seq, seq_lens, padded, bad_pages: true, seed };
    use DType::{Bf16, Fp16, Fp8E4m3};
    vec![
        // MTP at TP 8: 16 heads, 2 causal tokens; empty, negative, over-long, one-token and
        // exact-page lengths (a causal row before the first key: length 1, token 0).
        c(Bf16, 16, 2, true, 64, 1000, vec![0, -5, i32::MIN, 1, 1000, 1001, i32::MAX, 64, 65, 129, 2], false, 1),
        c(Bf16, 16, 2, true, 64, 1000, vec![0, -5, 1, 1000, 1001, i32::MAX, 64, 65, 129, 2], true, 2),
        // Not causal: every token gets the whole length.
        c(Fp16, 64, 4, false, 16, 300, vec![300, 17, 0, 299, 5000], false, 3),
        // Every head count class: one head, an odd count, 127 (one padding head), 128 with tokens.
        c(Bf16, 1, 3, true, 128, 700, vec![700, 2, 3, 0], true, 4),
        c(Fp16, 9, 16, true, 32, 513, vec![513, 15, 16, 17, 1], true, 5),
        c(Bf16, 127, 1, false, 64, 200, vec![200, 0, 64], false, 6),
        c(Fp16, 128, 2, true, 64, 200, vec![200, 1, 0], false, 7),
        // fp8 queries: 1-byte elements, vector and byte copies.
        c(Fp8E4m3, 16, 2, true, 128, 4096, vec![4096, 0, 1, 130], false, 8),
        c(Fp8E4m3, 3, 5, false, 8, 100, vec![100, 4, 0], true, 9),
        // One request of one token with fewer heads: the split plan (B' = 1), so the LSE part
        // also serves as CUTLASS's split scratch.
        c(Bf16, 32, 1, false, 64, 20_000, vec![19_999], false, 10),
        // Direct (one token of 128 heads): no staging, q never read.
        c(Bf16, 128, 1, true, 64, 1000, vec![0, 1000, 7, -1], false, 11),
        // Many kernel requests.
        c(Bf16, 16, 8, true, 64, 256, (0..150).map(|i| [0, 1, 5, 64, 200, 256, 300, -2][i % 8]).collect(), false, 12),
    ]
}

#[test]
fn adapted_pre_pass_writes_exactly_the_host_model() {
    let Some((ctx, stream)) = gpu() else { return };
    if !passes_built(&ctx) {
        return;
    }
    let mut checked = 0usize;
    for c in pass_cases() {
        let p = build(&stream, &c);
        let l = layout_of(&p);
        assert_eq!((l.kernel_batch as usize, l.adapted), (c.kernel_batch(), !c.is_direct()), "{c:?}");
        let region = DeviceBuffer::alloc(&ctx, l.bytes as usize).unwrap();
        region.memset_u8(FILL, &stream).unwrap();
        let got_layout = sm100::pre_pass(&args(&p), SMS, &region, &stream).unwrap();
        assert_eq!(got_layout, l, "{c:?}");
        let got = region.to_host_vec::<u8>(&stream).unwrap();
        let want = pre_pass_model(&p, &l);
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{c:?}: region byte {i} ({}) is {:#04x}, the model says {:#04x} (layout {l:?})", part(&l, i as u64), got[i], want[i]);
        }
        // The pre-pass writes nothing of the caller's.
        assert!(p.out.to_host_vec::<u16>(&stream).unwrap().iter().all(|&v| v == 0x3C3C), "{c:?}: out written");
        assert!(p.lse.to_host_vec::<f32>(&stream).unwrap().iter().all(|&v| v == 1.5), "{c:?}: lse written");
        checked += got.len();
    }
    eprintln!("{checked} region bytes equal the host model");
}

#[test]
fn adapted_post_pass_writes_exactly_the_host_model() {
    let Some((ctx, stream)) = gpu() else { return };
    if !passes_built(&ctx) {
        return;
    }
    for c in pass_cases() {
        let p = build(&stream, &c);
        let l = layout_of(&p);
        let kb = c.kernel_batch();
        // What CUTLASS would have left: lengths (every third row attends no key), and, adapted, a
        // staged output and LSE of random bits (NaN payloads included: copied as they are).
        let mut rng = Rng(c.seed ^ 0xF00D);
        let lens: Vec<i32> = (0..kb).map(|j| if j % 3 == 1 { 0 } else { 1 + (rng.next() % 5000) as i32 }).collect();
        let staged_out: Vec<u16> = (0..kb * 128 * 512).map(|_| rng.next() as u16).collect();
        let staged_lse: Vec<u32> = (0..kb * 128).map(|_| rng.next() as u32).collect();
        let mut host = vec![FILL; l.bytes as usize];
        for (j, &v) in lens.iter().enumerate() {
            put_i32(&mut host, l.lens_offset, j, v);
        }
        if l.adapted {
            let o = l.out_offset as usize;
            host[o..o + staged_out.len() * 2].copy_from_slice(&staged_out.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
            let o = l.lse_offset as usize;
            host[o..o + staged_lse.len() * 4].copy_from_slice(&staged_lse.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        }
        let region = DeviceBuffer::from_host(&stream, &host).unwrap();
        assert_eq!(sm100::post_pass(&args(&p), SMS, &region, &stream).unwrap(), l, "{c:?}");
        assert_eq!(region.to_host_vec::<u8>(&stream).unwrap(), host, "{c:?}: the post-pass writes nothing in the region");

        // The model: every element of out and lse the caller's buffers hold.
        let mut want_out = vec![0x3C3Cu16; c.extent(512)];
        let mut want_lse = vec![1.5f32.to_bits(); c.batch() * c.heads * c.s_q];
        let [sb, st, sh] = c.strides(512);
        for b in 0..c.batch() {
            for t in 0..c.s_q {
                let j = b * c.s_q + t;
                let empty = lens[j] == 0;
                if l.adapted || empty {
                    for h in 0..c.heads {
                        for d in 0..512 {
                            want_out[b * sb + t * st + h * sh + d] = if empty { 0 } else { staged_out[(j * 128 + h) * 512 + d] };
                        }
                        want_lse[(b * c.heads + h) * c.s_q + t] = if empty { f32::INFINITY.to_bits() } else { staged_lse[j * 128 + h] };
                    }
                }
            }
        }
        let got_out = p.out.to_host_vec::<u16>(&stream).unwrap();
        if let Some(i) = got_out.iter().zip(&want_out).position(|(a, b)| a != b) {
            panic!("{c:?}: out element {i} (request {}, offset {}) is {:#06x}, the model says {:#06x}", i / sb, i % sb, got_out[i], want_out[i]);
        }
        let got_lse = p.lse.to_host_vec::<u32>(&stream).unwrap();
        if let Some(i) = got_lse.iter().zip(&want_lse).position(|(a, b)| a != b) {
            panic!("{c:?}: lse {i} is {:#010x}, the model says {:#010x}", got_lse[i], want_lse[i]);
        }
    }
}

#[test]
fn adapted_passes_refuse_and_enqueue_nothing() {
    let Some((ctx, stream)) = gpu() else { return };
    if !passes_built(&ctx) {
        return;
    }
    let c = pass_cases().remove(0);
    let p = build(&stream, &c);
    let l = layout_of(&p);
    let small = DeviceBuffer::alloc(&ctx, l.bytes as usize - 16).unwrap();
    small.memset_u8(FILL, &stream).unwrap();
    for pass in [sm100::pre_pass, sm100::post_pass] {
        let e = pass(&args(&p), SMS, &small, &stream).unwrap_err();
        assert_eq!(e, graphsafe::Error::WorkspaceTooSmall { needed: l.bytes, capacity: l.bytes - 16 });
    }
    assert!(small.to_host_vec::<u8>(&stream).unwrap().iter().all(|&v| v == FILL));
    assert!(p.out.to_host_vec::<u16>(&stream).unwrap().iter().all(|&v| v == 0x3C3C));
    // More kernel requests than CUTLASS's grid takes: 4096 requests of 16 tokens (one-token pages
    // keep the cache small).
    let many = Case { heads: 1, s_q: 16, page: 1, max_seq: 1, seq_lens: vec![1; 4096], padded: false, ..c };
    let p = build(&stream, &many);
    let region = DeviceBuffer::alloc(&ctx, 1 << 20).unwrap();
    region.memset_u8(FILL, &stream).unwrap();
    let e = sm100::pre_pass(&args(&p), SMS, &region, &stream).unwrap_err();
    assert!(matches!(&e, graphsafe::Error::InvalidArgument { what, .. } if what.contains("batch x s_q")), "{e}");
    assert!(region.to_host_vec::<u8>(&stream).unwrap().iter().all(|&v| v == FILL));
}

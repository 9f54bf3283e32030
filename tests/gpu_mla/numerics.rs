//! The decode against the references, captured replay equal to eager, a too-small captured
//! workspace refused, a NaN confined to its request, and the sm90 N kernel's dependent launch.

use super::*;

#[test]
fn sm90_matches_the_reference_over_30_shapes() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let reference = GpuReference::load(&ctx).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let all = shapes();
    assert!(all.len() >= 30);
    let mut worst = (0f64, 0f64);
    for s in &all {
        let p = build(&stream, s);
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        let out = to_f32(&p.out.to_host_vec::<u16>(&stream).unwrap(), s.dtype);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let gp = GpuProblem {
            dtype: s.dtype,
            q_nope: &p.q_nope,
            q_pe: &p.q_pe,
            kv: &p.kv,
            seq_lens: &p.seq_lens,
            page_table: &p.page_table,
            page_table_stride: p.max_pages,
            page_size: s.page,
            batch: p.batch,
            num_heads: s.heads,
            max_seq_len: p.max_seq,
            sm_scale: p.sm_scale,
        };
        let (r_out, r_lse) = reference.run(&gp, &stream).unwrap();
        let (eo, el) = errors(&out, &lse, &r_out, &r_lse);
        eprintln!("{:?} h={} page={} B={} max_seq={} splits={}: out {eo:.2e} lse {el:.2e}", s.dtype, s.heads, s.page, p.batch, p.max_seq, plan.num_splits);
        assert!(eo <= 2e-2, "{s:?}: output error {eo}");
        assert!(el <= 1e-3, "{s:?}: lse error {el}");
        worst = (worst.0.max(eo), worst.1.max(el));
        if let Some((qn, qp, kv, pt)) = &p.host {
            // The GPU reference itself against the f64 CPU reference.
            let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: s.heads, s_q: 1, causal: false, sm_scale: p.sm_scale };
            let (c_out, c_lse) = cpu_decode(&hp).unwrap();
            let (ro, rl) = errors(&r_out, &r_lse, &c_out, &c_lse);
            assert!(ro <= 1e-4 && rl <= 1e-4, "{s:?}: GPU reference vs CPU reference {ro} {rl}");
            let (eo, el) = errors(&out, &lse, &c_out, &c_lse);
            assert!(eo <= 2e-2 && el <= 1e-3, "{s:?}: vs CPU reference {eo} {el}");
        }
    }
    eprintln!("{} shapes, worst output error {:.3e}, worst lse error {:.3e}", all.len(), worst.0, worst.1);
}

#[test]
fn sm90_captured_replay_equals_eager_bit_for_bit() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for s in [
        Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![4000, 1, 77, 2048], splits: None, seed: 50 },
        Shape { dtype: DType::Fp16, heads: 16, page: 128, seq_lens: vec![9000], splits: Some(40), seed: 51 },
    ] {
        let p = build(&stream, &s);
        let a = args(&p);
        let plan = decode(&a, &mut ws, &stream).unwrap();
        let eager_out = p.out.to_host_vec::<u16>(&stream).unwrap();
        let eager_lse = p.lse.to_host_vec::<u32>(&stream).unwrap();
        // Pre-grown by the eager call; capture with exactly that workspace.
        let exec = {
            let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let w = cap.bind_workspace(&mut ws).unwrap();
            let ca = captured_args(&mut cap, &a);
            assert_eq!(decode_captured(&ca, &w, &cap).unwrap(), plan);
            cap.end().unwrap().instantiate().unwrap()
        };
        ws.ensure_size(ws.capacity() * 2 + (1 << 20), &stream).unwrap(); // retire the captured workspace
        for _ in 0..20 {
            p.out.memset_u8(0, &stream).unwrap();
            p.lse.memset_u8(0, &stream).unwrap();
            exec.launch(&stream).unwrap();
            assert_eq!(p.out.to_host_vec::<u16>(&stream).unwrap(), eager_out, "{s:?}");
            assert_eq!(p.lse.to_host_vec::<u32>(&stream).unwrap(), eager_lse, "{s:?}");
        }
    }
}

#[test]
fn sm90_capture_with_too_small_a_workspace_is_refused() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let s = Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![8192], splits: Some(32), seed: 60 };
    let p = build(&stream, &s);
    let a = args(&p);
    let needed = a.plan(graphsafe::ops::mla::MlaArch::Sm90, 132, std::ptr::null_mut()).unwrap().workspace_bytes;
    common::capture_with_too_small_a_workspace_is_refused(&mut stream, needed, |cap, w| {
        let ca = captured_args(cap, &a);
        decode_captured(&ca, w, cap)
    });
}

#[test]
fn sm100_decode_runs_on_blackwell_and_skips_elsewhere() {
    let Some((ctx, stream)) = gpu() else { return };
    let cc = ctx.device().compute_capability().unwrap();
    let sm100 = graphsafe::arch::MlaArch::Sm100;
    if graphsafe::arch::mla(cc).ok() != Some(sm100) {
        eprintln!("SKIP: the CUTLASS MLA kernel needs {} and a build with {}; this GPU is sm_{}{}", sm100.gpus(), sm100.targets(), cc.0, cc.1);
        return;
    }
    let reference = GpuReference::load(&ctx).unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for s in [
        Shape { dtype: DType::Bf16, heads: 128, page: 128, seq_lens: vec![4096, 1, 300], splits: None, seed: 70 },
        Shape { dtype: DType::Fp16, heads: 128, page: 64, seq_lens: vec![65_536], splits: None, seed: 71 },
    ] {
        let p = build(&stream, &s);
        decode(&args(&p), &mut ws, &stream).unwrap();
        let out = to_f32(&p.out.to_host_vec::<u16>(&stream).unwrap(), s.dtype);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let gp = GpuProblem { dtype: s.dtype, q_nope: &p.q_nope, q_pe: &p.q_pe, kv: &p.kv, seq_lens: &p.seq_lens, page_table: &p.page_table, page_table_stride: p.max_pages, page_size: s.page, batch: p.batch, num_heads: 128, max_seq_len: p.max_seq, sm_scale: p.sm_scale };
        let (r_out, r_lse) = reference.run(&gp, &stream).unwrap();
        let (eo, el) = errors(&out, &lse, &r_out, &r_lse);
        assert!(eo <= 2e-2 && el <= 1e-3, "{s:?}: {eo} {el}");
    }
}

/// A NaN in the cache (a rope value of one token: its scores are NaN for every head) makes its
/// request's whole output and LSE NaN, whatever the split count (at 1 split the NaN tile's CTA
/// writes the output; at 4..64 its partial goes through the combine),
/// and leaves the other request bit-identical to the run without it.
#[test]
fn sm90_a_nan_in_the_cache_makes_its_request_nan_at_every_split_count() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let s = Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![5000, 5000], splits: None, seed: 95 };
    let p = build(&stream, &s);
    let clean = p.kv.to_host_vec::<u16>(&stream).unwrap();
    let table = p.page_table.to_host_vec::<i32>(&stream).unwrap();
    let tok = 1234usize; // of request 0
    let page = table[tok / s.page] as usize;
    let mut dirty = clean.clone();
    dirty[(page * s.page + tok % s.page) * 576 + 520] = 0x7FC0; // bf16 NaN
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let (h, row) = (s.heads, s.heads * 512);
    for splits in [1u32, 4, 8, 16, 64] {
        let mut a = args(&p);
        a.num_splits = Some(splits);
        let run = |kv: &[u16], ws: &mut Workspace| {
            p.kv.copy_from_host(kv, &stream).unwrap();
            p.out.memset_u8(0, &stream).unwrap();
            p.lse.memset_u8(0, &stream).unwrap();
            decode(&a, ws, &stream).unwrap();
            (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<f32>(&stream).unwrap())
        };
        let (out_c, lse_c) = run(&clean, &mut ws);
        let (out_n, lse_n) = run(&dirty, &mut ws);
        assert!(out_c.iter().all(|&v| v & 0x7FFF <= 0x7F80) && lse_c.iter().all(|v| v.is_finite()), "splits {splits}: clean run");
        let finite = out_n[..row].iter().filter(|&&v| v & 0x7FFF <= 0x7F80).count();
        assert_eq!(finite, 0, "splits {splits}: {finite} of request 0's outputs are not NaN");
        assert!(lse_n[..h].iter().all(|v| v.is_nan()), "splits {splits}: request 0's LSE");
        assert_eq!(out_n[row..], out_c[row..], "splits {splits}: request 1 changed");
        assert_eq!(lse_n[h..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), lse_c[h..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "splits {splits}");
    }
}

/// Invariant 13 (docs/ARCHITECTURE.md) for the sm90 N kernel and its combine, both launched
/// programmatically dependent: a decode whose q_nope is the output the decode just before it on
/// the stream wrote, with nothing between them. B's N kernel may be resident while A's combine
/// still runs (the combine lets the next grid launch at entry), so a read of q before its
/// griddepcontrol.wait would see the NaN A's output is filled with first. The two decodes share a
/// workspace, so B's combine reading the partials before B's N kernel finished would add A's.
/// Eager rounds and graph replays, bit-identical to B run alone from a copy of A's output.
#[test]
fn sm90_n_kernel_reads_what_the_previous_decode_just_wrote() {
    let Some((ctx, mut stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    let lens = vec![3000, 4096, 77, 2500];
    let sa = Shape { dtype: DType::Bf16, heads: 16, page: 64, seq_lens: lens.clone(), splits: Some(4), seed: 90 };
    let sb = Shape { seed: 91, ..sa.clone() };
    let (pa, pb) = (build(&stream, &sa), build(&stream, &sb));
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let aa = args(&pa);
    let plan = decode(&aa, &mut ws, &stream).unwrap();
    assert!(plan.num_splits > 1, "the combine must run: {plan:?}");
    let out_a = pa.out.to_host_vec::<u16>(&stream).unwrap();
    // B alone, its q_nope a copy of A's output uploaded from the host.
    let q_copy = DeviceBuffer::from_host(&stream, &out_a).unwrap();
    let mut ab = args(&pb);
    ab.q_nope = Tensor::contiguous(&q_copy, DType::Bf16, &[pb.batch, 16, 512]);
    decode(&ab, &mut ws, &stream).unwrap();
    let (want_out, want_lse) = (pb.out.to_host_vec::<u16>(&stream).unwrap(), pb.lse.to_host_vec::<u32>(&stream).unwrap());
    assert!(to_f32(&want_out, DType::Bf16).iter().all(|v| v.is_finite()), "B alone: non-finite output");
    // B reading A's output buffer directly, right after A.
    ab.q_nope = Tensor::contiguous(&pa.out, DType::Bf16, &[pb.batch, 16, 512]);
    for round in 0..5 {
        pa.out.memset_u8(0xFF, &stream).unwrap(); // bf16 NaN
        pb.out.memset_u8(0, &stream).unwrap();
        decode(&aa, &mut ws, &stream).unwrap();
        decode(&ab, &mut ws, &stream).unwrap();
        assert_eq!(pa.out.to_host_vec::<u16>(&stream).unwrap(), out_a, "eager round {round}: A");
        assert_eq!(pb.out.to_host_vec::<u16>(&stream).unwrap(), want_out, "eager round {round}: B's output");
        assert_eq!(pb.lse.to_host_vec::<u32>(&stream).unwrap(), want_lse, "eager round {round}: B's LSE");
    }
    let exec = {
        let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let w = cap.bind_workspace(&mut ws).unwrap();
        let ca = captured_args(&mut cap, &aa);
        let mut cb = captured_args(&mut cap, &ab);
        cb.q_nope = ab.q_nope.clone().with_mem(cap.bind_buffer(&pa.out).unwrap());
        decode_captured(&ca, &w, &cap).unwrap();
        decode_captured(&cb, &w, &cap).unwrap();
        cap.end().unwrap().instantiate().unwrap()
    };
    for replay in 0..5 {
        pa.out.memset_u8(0xFF, &stream).unwrap();
        pb.out.memset_u8(0, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(pb.out.to_host_vec::<u16>(&stream).unwrap(), want_out, "replay {replay}: B's output");
        assert_eq!(pb.lse.to_host_vec::<u32>(&stream).unwrap(), want_lse, "replay {replay}: B's LSE");
    }
}

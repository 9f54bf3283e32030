//! Invariant 10, device data cannot break a kernel: sm100's sanitize passes against a host model,
//! and both back-ends on bad lengths and pages.

use super::*;

// ---- device data: the contract both back-ends share (include/graphsafe_kernels/mla.h) ---------

/// The arch this build has kernels for on this GPU, or None (with a SKIP line).
fn built_arch_for(ctx: &Arc<Context>) -> Option<&'static str> {
    let cc = ctx.device().compute_capability().unwrap();
    let Some(arch) = graphsafe::arch::target_for_cc(cc).map(|t| t.name) else {
        eprintln!("SKIP: the sanitize kernels are built for every row of the arch table ({}); this GPU is sm_{}{}", graphsafe::arch::all_target_names(), cc.0, cc.1);
        return None;
    };
    if !graphsafe::build_info::has_arch(arch) {
        eprintln!("SKIP: this build has no {arch} kernels (built for {})", graphsafe::build_info::archs().join(","));
        return None;
    }
    Some(arch)
}

/// One pre-pass input: lengths, the caller's page table and how it is laid out.
struct SanitizeCase {
    seq_lens: Vec<i32>,
    max_seq: i64,
    page: i64,
    num_pages: i64,
    splits: i64,
    stride: usize,
    table: Vec<i32>,
}

/// What the pre-pass must write (include/graphsafe_kernels/mla.h, gs_mla_sanitize), byte for byte,
/// over a region that held `fill` everywhere.
fn sanitize_model(c: &SanitizeCase, l: &graphsafe::ops::mla::sm100::SanitizeLayout, fill: u8) -> Vec<u8> {
    let mut region = vec![fill; l.bytes as usize];
    let put = |region: &mut Vec<u8>, at: u64, i: usize, v: i32| {
        let o = at as usize + 4 * i;
        region[o..o + 4].copy_from_slice(&v.to_le_bytes());
    };
    let cols = l.columns as usize;
    for (b, &s) in c.seq_lens.iter().enumerate() {
        let len = (s.max(0) as i64).min(c.max_seq) as i32;
        let run = len.max(1);
        put(&mut region, l.lens_offset, b, len);
        put(&mut region, l.kernel_lens_offset, b, run);
        let used = (run as usize).div_ceil(c.page as usize);
        for j in 0..cols {
            let v = if j < used { c.table[b * c.stride + j].clamp(0, c.num_pages as i32 - 1) } else { 0 };
            put(&mut region, l.page_table_offset, b * cols + j, v);
        }
    }
    region
}

fn sanitize_cases() -> Vec<SanitizeCase> {
    let bad = [-1, i32::MIN, 40, 41, 1000, i32::MAX];
    let mut rng = 0x5eed_u64;
    let mut next = move || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as i32
    };
    let mut cases = Vec::new();
    // Zero, negative, over-long and exact lengths; a page table mixing valid and bad indices.
    let lens = vec![0, -5, i32::MIN, 1, 1000, 1001, i32::MAX, 64, 65, 127, 128, 129, 999];
    let b = lens.len();
    let stride = 16 + 3; // ceil(1000 / 64) = 16 columns used at most, 3 spare
    let table = (0..b * stride).map(|i| if i % 3 == 0 { bad[i % bad.len()] } else { next().rem_euclid(40) }).collect();
    cases.push(SanitizeCase { seq_lens: lens, max_seq: 1000, page: 64, num_pages: 40, splits: 1, stride, table });
    // One request, one-token pages, split-KV (the LSE scratch is counted, never written).
    for len in [0, -1, 1, 4999, 5000, 77_777] {
        let table = (0..5000).map(|i| if i % 7 == 0 { bad[i % bad.len()] } else { next().rem_euclid(3) }).collect();
        cases.push(SanitizeCase { seq_lens: vec![len], max_seq: 5000, page: 1, num_pages: 3, splits: 16, stride: 5000, table });
    }
    // Rows exactly as wide as the length needs (ceil(129 / 16) = 9): reads stay in each row.
    let lens = vec![129, 200, 0, 17, -3, 16];
    let table = (0..lens.len() * 9).map(|i| if i % 4 == 1 { bad[i % bad.len()] } else { next().rem_euclid(40) }).collect();
    cases.push(SanitizeCase { seq_lens: lens, max_seq: 129, page: 16, num_pages: 40, splits: 1, stride: 9, table });
    // Many requests, TMA-sized pages.
    let lens: Vec<i32> = (0..300).map(|i| [0, 1, 128, 129, 300, 301, -9][i % 7]).collect();
    let table = (0..300 * 3).map(|i| if i % 5 == 0 { bad[i % bad.len()] } else { next().rem_euclid(3) }).collect();
    cases.push(SanitizeCase { seq_lens: lens, max_seq: 300, page: 128, num_pages: 3, splits: 1, stride: 3, table });
    cases
}

#[test]
fn sanitize_pre_pass_writes_exactly_the_host_model() {
    let Some((ctx, stream)) = gpu() else { return };
    if built_arch_for(&ctx).is_none() {
        return;
    }
    use graphsafe::ops::mla::sm100;
    const FILL: u8 = 0xA5;
    let mut checked = 0usize;
    for c in sanitize_cases() {
        let b = c.seq_lens.len() as i64;
        let l = sm100::sanitize_layout(b, c.max_seq, c.page, c.splits).unwrap();
        let seq = DeviceBuffer::from_host(&stream, &c.seq_lens).unwrap();
        // The caller's table exactly as large as its rows reach: an over-read is out of bounds.
        let row = (c.max_seq as usize).div_ceil(c.page as usize);
        let table = DeviceBuffer::from_host(&stream, &c.table[..(b as usize - 1) * c.stride + row]).unwrap();
        let region = DeviceBuffer::alloc(&ctx, l.bytes as usize).unwrap();
        region.memset_u8(FILL, &stream).unwrap();
        let got_layout = sm100::sanitize(&stream, &seq, &table, c.stride, (b, c.max_seq, c.page, c.num_pages, c.splits), &region).unwrap();
        assert_eq!(got_layout, l);
        let got = region.to_host_vec::<u8>(&stream).unwrap();
        let want = sanitize_model(&c, &l, FILL);
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(first.is_none(), "batch {b} max_seq {} page {}: byte {} differs (layout {l:?})", c.max_seq, c.page, first.unwrap_or(0));
        checked += got.len();
    }
    // A refusal enqueues nothing: too small a region, or rows that overlap.
    let c = &sanitize_cases()[0];
    let b = c.seq_lens.len() as i64;
    let l = sm100::sanitize_layout(b, c.max_seq, c.page, 1).unwrap();
    let seq = DeviceBuffer::from_host(&stream, &c.seq_lens).unwrap();
    let table = DeviceBuffer::from_host(&stream, &c.table).unwrap();
    let small = DeviceBuffer::alloc(&ctx, l.bytes as usize - 4).unwrap();
    small.memset_u8(FILL, &stream).unwrap();
    assert!(matches!(sm100::sanitize(&stream, &seq, &table, c.stride, (b, c.max_seq, c.page, c.num_pages, 1), &small), Err(graphsafe::Error::InvalidArgument { .. })));
    // Stride 15 is below the 16 columns a row of max_seq / page uses: refused for the stride (which
    // is checked before the region's size), not for anything else.
    let overlap = sm100::sanitize(&stream, &seq, &table, 15, (b, c.max_seq, c.page, c.num_pages, 1), &small);
    assert!(matches!(&overlap, Err(graphsafe::Error::InvalidArgument { what, .. }) if what == "page_table_stride"), "{overlap:?}");
    assert!(small.to_host_vec::<u8>(&stream).unwrap().iter().all(|&v| v == FILL));
    eprintln!("{checked} sanitized bytes equal the host model");
}

#[test]
fn sanitize_post_pass_writes_only_the_empty_requests() {
    let Some((ctx, stream)) = gpu() else { return };
    if built_arch_for(&ctx).is_none() {
        return;
    }
    use graphsafe::ops::mla::sm100;
    let lens: Vec<i32> = vec![0, 5, 0, 0, 1, 77, 0];
    let b = lens.len();
    let l = sm100::sanitize_layout(b as i64, 100, 64, 1).unwrap();
    let region = DeviceBuffer::alloc_zeroed(&stream, l.bytes as usize).unwrap();
    let lens_bytes: Vec<u8> = lens.iter().flat_map(|v| v.to_le_bytes()).collect();
    region.copy_from_host_at(l.lens_offset as usize, &lens_bytes, &stream).unwrap();
    // Padded strides: the gaps between heads and between requests must stay untouched.
    let (sh, sb) = (512 + 8, 128 * (512 + 8) + 24);
    let n_out = (b - 1) * sb + 127 * sh + 512;
    for with_lse in [true, false] {
        let out = DeviceBuffer::from_host(&stream, &vec![0x3C3Cu16; n_out]).unwrap();
        let lse = DeviceBuffer::from_host(&stream, &vec![1.5f32; b * 128]).unwrap();
        sm100::sanitize_finish(&stream, &region, &l, b as i64, (&out, sb, sh), with_lse.then_some(&lse)).unwrap();
        let o = out.to_host_vec::<u16>(&stream).unwrap();
        for (i, &v) in o.iter().enumerate() {
            let (req, rest) = (i / sb, i % sb);
            let inside = rest / sh < 128 && rest % sh < 512;
            let want = if inside && lens[req] == 0 { 0 } else { 0x3C3C };
            assert_eq!(v, want, "out element {i} (request {req}, offset {rest})");
        }
        let got = lse.to_host_vec::<f32>(&stream).unwrap();
        for (i, &v) in got.iter().enumerate() {
            let want = if with_lse && lens[i / 128] == 0 { f32::INFINITY } else { 1.5 };
            assert_eq!(v.to_bits(), want.to_bits(), "lse {i}");
        }
    }
}

/// The contract on a whole decode: lengths <= 0 give zeros and +inf, lengths past max_seq_len
/// equal max_seq_len, bad page indices equal the clamped ones, unread columns may hold anything.
/// Runs on the back-end this GPU has (the sm90 kernel on Hopper, CUTLASS's on Blackwell).
fn device_data_contract(ctx: &Arc<Context>, stream: &Stream, s: Shape) {
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
    let table = p.page_table.to_host_vec::<i32>(stream).unwrap();
    let good_lens = s.seq_lens.clone();
    let (out_ref, lse_ref) = run(&good_lens, &table, &mut ws);
    // Requests 0 and 1 emptied (0, negative), request 2 over-long (== max_seq_len when clamped).
    let mut lens = good_lens.clone();
    lens[0] = 0;
    lens[1] = -7;
    lens[2] = m + 5000;
    let mut clamped = lens.clone();
    clamped[2] = m;
    let (out_c, lse_c) = run(&clamped, &table, &mut ws);
    let (out_b, lse_b) = run(&lens, &table, &mut ws);
    let row = h * 512;
    for r in 0..2 {
        assert!(out_b[r * row..(r + 1) * row].iter().all(|&v| v == 0), "{s:?}: request {r} is empty: zeros");
        assert!(lse_b[r * h..(r + 1) * h].iter().all(|&v| v == f32::INFINITY.to_bits()), "{s:?}: request {r}: +inf");
    }
    assert_eq!(out_b[2 * row..], out_c[2 * row..], "{s:?}: over-long equals max_seq_len");
    assert_eq!(lse_b[2 * h..], lse_c[2 * h..], "{s:?}");
    // Request 2 at max_seq_len equals the reference run's when its length was already max.
    assert_eq!(good_lens[2], m, "the shapes below give request 2 the longest length");
    assert_eq!(out_b[2 * row..3 * row], out_ref[2 * row..3 * row], "{s:?}");
    assert_eq!(lse_b[2 * h..3 * h], lse_ref[2 * h..3 * h], "{s:?}");
    // Bad page indices in the columns a request reads equal their clamped values; columns past
    // the length are never read, so garbage there changes nothing.
    let (pages, mp, page) = (p.pages as i32, p.max_pages, s.page);
    let mut bad = table.clone();
    let mut fixed = table.clone();
    let weird = [-1, i32::MIN, pages, pages + 3, i32::MAX];
    for b in 0..p.batch {
        let used = (good_lens[b].max(0) as usize).div_ceil(page);
        for j in 0..mp {
            let i = b * mp + j;
            if j >= used {
                bad[i] = i32::MIN + j as i32;
            } else if (b + j) % 3 == 0 {
                bad[i] = weird[(b + j) % weird.len()];
                fixed[i] = bad[i].clamp(0, pages - 1);
            }
        }
    }
    let (out_fixed, lse_fixed) = run(&good_lens, &fixed, &mut ws);
    let (out_bad, lse_bad) = run(&good_lens, &bad, &mut ws);
    assert_eq!(out_bad, out_fixed, "{s:?}: bad pages read as their clamped value");
    assert_eq!(lse_bad, lse_fixed, "{s:?}");
    let _ = ctx;
}

#[test]
fn sm90_device_data_follows_the_shared_contract() {
    let Some((ctx, stream)) = gpu() else { return };
    if !hopper(&ctx) {
        return;
    }
    for s in [
        Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![700, 64, 4000, 129, 1], splits: None, seed: 80 },
        Shape { dtype: DType::Fp16, heads: 16, page: 128, seq_lens: vec![300, 300, 300], splits: Some(4), seed: 81 },
        Shape { dtype: DType::Bf16, heads: 64, page: 64, seq_lens: vec![2048, 5, 2048, 2048], splits: Some(2), seed: 82 },
        // The seesaw kernel at 4 and 16 splits with empty requests (the split counts at which the
        // cluster reduction of branch wip/seesaw-cluster writes out itself / leaves two partials).
        Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![700, 64, 4000, 129, 1], splits: Some(4), seed: 83 },
        Shape { dtype: DType::Fp16, heads: 64, page: 64, seq_lens: vec![700, 64, 4000, 129, 1], splits: Some(16), seed: 84 },
    ] {
        device_data_contract(&ctx, &stream, s);
    }
}

#[test]
fn sm100_device_data_follows_the_shared_contract_on_blackwell() {
    let Some((ctx, stream)) = gpu() else { return };
    let cc = ctx.device().compute_capability().unwrap();
    let sm100 = graphsafe::arch::MlaArch::Sm100;
    if graphsafe::arch::mla(cc).ok() != Some(sm100) {
        eprintln!("SKIP: the CUTLASS MLA kernel needs {} and a build with {}; this GPU is sm_{}{}", sm100.gpus(), sm100.targets(), cc.0, cc.1);
        return;
    }
    for s in [
        // batch > 1 with an empty request: the persistent split that hangs CUTLASS 4.2 unsanitized.
        Shape { dtype: DType::Bf16, heads: 128, page: 128, seq_lens: vec![700, 64, 4000, 129, 1], splits: None, seed: 90 },
        Shape { dtype: DType::Fp16, heads: 128, page: 32, seq_lens: vec![300, 300, 300], splits: None, seed: 91 },
    ] {
        device_data_contract(&ctx, &stream, s);
    }
    // Batch 1, split-KV, no lse: CUTLASS 4.2 writes the per-split LSE only when it has an lse
    // pointer, so without the scratch its reduction would weigh the splits by whatever another
    // decode left in the workspace (here: a different problem's).
    let s = Shape { dtype: DType::Bf16, heads: 128, page: 64, seq_lens: vec![9000], splits: None, seed: 92 };
    let p = build(&stream, &s);
    let other = build(&stream, &Shape { seed: 93, ..s.clone() });
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let plan = decode(&args(&p), &mut ws, &stream).unwrap();
    assert!(plan.num_splits > 1);
    let with_lse = p.out.to_host_vec::<u16>(&stream).unwrap();
    decode(&args(&other), &mut ws, &stream).unwrap();
    let mut a = args(&p);
    a.lse = None;
    decode(&a, &mut ws, &stream).unwrap();
    assert_eq!(p.out.to_host_vec::<u16>(&stream).unwrap(), with_lse);
}

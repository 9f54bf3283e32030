//! The sm100 decode's adaptation on the GPU: what graphsafe runs around CUTLASS's kernel (which
//! takes one query token of 128 heads per request) so that a decode of fewer heads or of `s_q`
//! query tokens, causal or not, runs on it (include/graphsafe_kernels/mla.h, "the shapes graphsafe
//! adapts"):
//!
//! * the pre-pass: each token a kernel request of its own over its request's page-table row, with
//!   its causal length, and q copied into the workspace's `[B', 128, 576]` staging with the
//!   padding heads zero — byte for byte against a host model of the rule, every other byte of the
//!   region untouched;
//! * the post-pass: the real heads of CUTLASS's staged output and LSE copied back into the
//!   caller's `[B, s_q, H, 512]` out (any 16-byte strides) and `[B, H, s_q]` lse, rows that attend no key
//!   as zeros and `+inf` — against the same model, every byte between the rows untouched.
//!
//! The passes are plain CUDA built for every arch, so those tests run on Hopper too. The whole
//! decode needs Blackwell and skips elsewhere, naming the arch: an adapted decode bit for bit
//! against CUTLASS's own direct decode of the expanded, padded problem (so every dtype, fp8
//! included, without a tolerance), bf16/fp16 against the CPU reference of the tokens' decode, and
//! a captured replay equal to eager.

mod common;

use common::{gpu, random_f32};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::reference::{cpu_decode, e4m3_value, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, sm100, MlaArch, MlaDecodeArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::{bf16, f16};
use std::sync::Arc;

/// The passes are planned as for a B200 (the SM count only enters the split count).
const SMS: u32 = 148;
const FILL: u8 = 0xA5;

/// The passes run on every arch this build has kernels for; None (with a SKIP line) otherwise.
fn passes_built(ctx: &Arc<Context>) -> bool {
    let cc = ctx.device().compute_capability().unwrap();
    let Some(arch) = graphsafe::arch::target_for_cc(cc).map(|t| t.name) else {
        eprintln!("SKIP: the sanitize kernels are built for every row of the arch table ({}); this GPU is sm_{}{}", graphsafe::arch::all_target_names(), cc.0, cc.1);
        return false;
    };
    if !graphsafe::build_info::has_arch(arch) {
        eprintln!("SKIP: this build has no {arch} kernels (built for {})", graphsafe::build_info::archs().join(","));
        return false;
    }
    true
}

/// CUTLASS's kernel runs here: a Blackwell GPU and a build with its row.
fn blackwell(ctx: &Arc<Context>) -> bool {
    let cc = ctx.device().compute_capability().unwrap();
    let sm100 = MlaArch::Sm100;
    if graphsafe::arch::mla(cc).ok() != Some(sm100) {
        eprintln!("SKIP: the CUTLASS MLA kernel needs {} and a build with {}; this GPU is sm_{}{}", sm100.gpus(), sm100.targets(), cc.0, cc.1);
        return false;
    }
    true
}

#[derive(Clone, Debug)]
struct Case {
    /// q's (and the cache's) element type.
    dtype: DType,
    heads: usize,
    s_q: usize,
    causal: bool,
    page: usize,
    max_seq: usize,
    seq_lens: Vec<i32>,
    /// q and out strides that are not multiples of 16 bytes (the element-by-element copies), else
    /// dense (the 16-byte vector copies).
    padded: bool,
    /// Page-table entries outside the cache in the columns a request uses (the pre-pass clamps
    /// them; the end-to-end tests keep them valid, to compare with CUTLASS's own decode).
    bad_pages: bool,
    seed: u64,
}

impl Case {
    fn batch(&self) -> usize {
        self.seq_lens.len()
    }
    fn kernel_batch(&self) -> usize {
        self.batch() * self.s_q
    }
    fn elem(&self) -> usize {
        self.dtype.size()
    }
    fn out_dtype(&self) -> DType {
        if self.dtype == DType::Fp16 {
            DType::Fp16
        } else {
            DType::Bf16
        }
    }
    fn kv_dtype(&self) -> DType {
        match self.dtype {
            DType::Fp16 => DType::Fp16,
            DType::Fp8E4m3 => DType::Fp8E4m3,
            _ => DType::Bf16,
        }
    }
    fn is_direct(&self) -> bool {
        self.heads == 128 && self.s_q == 1
    }
    /// (batch, token, head) strides in elements of a `[B, s_q, H, dim]` operand.
    fn strides(&self, dim: usize) -> [usize; 3] {
        if self.padded {
            // Not dense, but multiples of 16 elements: the decode takes only 16-byte strides
            // (16-byte vector and TMA loads; fp8 queries are one byte an element).
            let head = dim + 16;
            let token = self.heads * head + 32;
            [self.s_q * token + 48, token, head]
        } else {
            [self.s_q * self.heads * dim, self.heads * dim, dim]
        }
    }
    /// Elements a `[B, s_q, H, dim]` operand with these strides spans.
    fn extent(&self, dim: usize) -> usize {
        let [sb, st, sh] = self.strides(dim);
        (self.batch() - 1) * sb + (self.s_q - 1) * st + (self.heads - 1) * sh + dim
    }
    fn columns(&self) -> usize {
        self.max_seq.div_ceil(self.page)
    }
    /// Kernel request j = b * s_q + t's length: the rule the pre-pass applies (mla.h).
    fn kernel_len(&self, b: usize, t: usize) -> i32 {
        let full = (self.seq_lens[b].max(0) as i64).min(self.max_seq as i64);
        let len = if self.causal { full - (self.s_q - 1 - t) as i64 } else { full };
        len.max(0) as i32
    }
}

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `n` random elements of `dtype` as little-endian bytes, and their values: bf16/fp16 from
/// [-1, 1), fp8 e4m3 codes of magnitude below 2 (no NaN code).
fn values(dtype: DType, n: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    match dtype {
        DType::Bf16 => random_f32(n, seed).iter().map(|&x| bf16::from_f32(x)).fold((Vec::new(), Vec::new()), |(mut b, mut v), h| {
            b.extend(h.to_bits().to_le_bytes());
            v.push(h.to_f32());
            (b, v)
        }),
        DType::Fp16 => random_f32(n, seed).iter().map(|&x| f16::from_f32(x)).fold((Vec::new(), Vec::new()), |(mut b, mut v), h| {
            b.extend(h.to_bits().to_le_bytes());
            v.push(h.to_f32());
            (b, v)
        }),
        DType::Fp8E4m3 => {
            let mut rng = Rng(seed);
            let codes: Vec<u8> = (0..n).map(|_| rng.next() as u8 & 0xBF).collect(); // exponent below 8: no NaN code
            let v = codes.iter().map(|&c| e4m3_value(c)).collect();
            (codes, v)
        }
        other => panic!("no values for {other}"),
    }
}

/// One case's device buffers and the host copies the models read.
struct Problem {
    c: Case,
    pages: usize,
    table_stride: usize,
    q_nope: DeviceBuffer,
    q_pe: DeviceBuffer,
    kv: DeviceBuffer,
    seq_lens: DeviceBuffer,
    page_table: DeviceBuffer,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    /// q's bytes, and values (for the CPU reference).
    qn: (Vec<u8>, Vec<f32>),
    qp: (Vec<u8>, Vec<f32>),
    kv_host: (Vec<u8>, Vec<f32>),
    table: Vec<i32>,
}

fn build(stream: &Stream, c: &Case) -> Problem {
    let b = c.batch();
    let table_stride = c.columns() + 2; // spare columns: rows are not tight
    let used: usize = c.seq_lens.iter().map(|&l| (l.clamp(0, c.max_seq as i32) as usize).div_ceil(c.page)).sum();
    let pages = used + 3;
    let mut rng = Rng(c.seed);
    // A shuffled permutation of the pages for the columns a request uses; anything (also bad
    // indices) in the others, which nothing may read.
    let mut perm: Vec<i32> = (0..pages as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.next() as usize % (i + 1));
    }
    let bad = [-1, i32::MIN, pages as i32, pages as i32 + 7, i32::MAX];
    let mut table: Vec<i32> = (0..b * table_stride).map(|i| bad[i % bad.len()]).collect();
    let mut next = 0;
    for (bi, &l) in c.seq_lens.iter().enumerate() {
        for col in 0..(l.clamp(0, c.max_seq as i32) as usize).div_ceil(c.page) {
            table[bi * table_stride + col] = if c.bad_pages && col % 3 == 1 { bad[(bi + col) % bad.len()] } else { perm[next] };
            next += 1;
        }
    }
    let qn = values(c.dtype, c.extent(512), c.seed + 1);
    let qp = values(c.dtype, c.extent(64), c.seed + 2);
    let kv_host = values(c.dtype, pages * c.page * 576, c.seed + 3);
    let out_elems = c.extent(512);
    Problem {
        c: c.clone(),
        pages,
        table_stride,
        q_nope: DeviceBuffer::from_host(stream, &qn.0).unwrap(),
        q_pe: DeviceBuffer::from_host(stream, &qp.0).unwrap(),
        kv: DeviceBuffer::from_host(stream, &kv_host.0).unwrap(),
        seq_lens: DeviceBuffer::from_host(stream, &c.seq_lens).unwrap(),
        page_table: DeviceBuffer::from_host(stream, &table).unwrap(),
        out: DeviceBuffer::from_host(stream, &vec![0x3C3Cu16; out_elems]).unwrap(),
        lse: DeviceBuffer::from_host(stream, &vec![1.5f32; b * c.heads * c.s_q]).unwrap(),
        qn,
        qp,
        kv_host,
        table,
    }
}

fn args(p: &Problem) -> MlaDecodeArgs<&DeviceBuffer> {
    let c = &p.c;
    let (b, s, h) = (c.batch(), c.s_q, c.heads);
    let rows = |buf, dt, dim| {
        let [sb, st, sh] = c.strides(dim);
        Tensor::strided(buf, 0, dt, &[b, s, h, dim], &[sb, st, sh, 1])
    };
    MlaDecodeArgs::new(
        rows(&p.q_nope, c.dtype, 512),
        rows(&p.q_pe, c.dtype, 64),
        Tensor::contiguous(&p.kv, c.dtype, &[p.pages, c.page, 576]),
        Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        Tensor::contiguous(&p.page_table, DType::I32, &[b, p.table_stride]),
        rows(&p.out, c.out_dtype(), 512),
    )
    .with_lse(Tensor::contiguous(&p.lse, DType::F32, &[b, h, s]))
    .with_max_seq_len(c.max_seq as u32)
    .with_causal(c.causal)
}

/// The region's layout for the case as the decode plans it.
fn layout_of(p: &Problem) -> sm100::SanitizeLayout {
    let c = &p.c;
    let plan = args(p).plan(MlaArch::Sm100, SMS, std::ptr::null_mut()).unwrap();
    let shape = sm100::Shape::new(c.kv_dtype(), c.batch() as i64, c.max_seq as i64, c.page as i64, SMS as i64).with_heads(c.heads as i64).with_s_q(c.s_q as i64);
    sm100::layout(&shape, plan.num_splits as i64).unwrap()
}

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

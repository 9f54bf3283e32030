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
#[path = "gpu_mla_sm100_adapt/passes.rs"]
mod passes;
#[path = "gpu_mla_sm100_adapt/whole_decode.rs"]
mod whole_decode;

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

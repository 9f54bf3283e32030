//! MLA decode over fp8 KV caches on the sm90 kernels (16 and 32 heads: the N8 kernel for the
//! per-tensor cache, the N kernel's raw ring for the 656-byte one; 48..128 heads: the M64 kernel's
//! in-place dequantisation): numerics against the f64
//! CPU reference of the dequantised cache over 40 shapes, every e4m3 code dequantised exactly,
//! captured replay bit-identical to eager (and reading the per-tensor scale at replay), and a
//! capture with too small a workspace refused with nothing captured. Skips without a Hopper GPU
//! (fails instead under GRAPHSAFE_REQUIRE_GPU=1 when there is no GPU at all).

mod common;

use common::mla::{hopper_gpu, lcg};
use common::random_f32;
use graphsafe::driver::{DeviceBuffer, Stream};
use graphsafe::graph::{CaptureMode, CapturedBuffer};
use graphsafe::ops::mla::reference::{cpu_decode, dequantize_ds_mla, dequantize_fp8_per_tensor, e4m3_value, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, KvFormat, KvFormatKind, MlaDecodeArgs, DS_MLA_TOKEN_BYTES};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use half::bf16;

#[derive(Clone, Debug)]
struct Shape {
    kind: KvFormatKind,
    heads: usize,
    page: usize,
    seq_lens: Vec<i32>,
    splits: Option<u32>,
    /// Per-tensor: the scale. 656-byte format: the largest group scale (each is drawn in
    /// [scale / 16, scale]).
    scale: f32,
    seed: u64,
}

type Problem = common::mla::Problem<Shape>;

/// Where these decodes run.
const SM90: &str = "the fp8 KV caches run on the sm90 MLA kernel";

/// Random e4m3 codes, never e4m3's NaN (0x7F, 0xFF): caches written by saturating conversions hold
/// none, and the kernel reads them as a finite value.
fn codes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n).map(|_| (lcg(&mut s) & 0xFF) as u8).map(|c| if c & 0x7F == 0x7F { c ^ 1 } else { c }).collect()
}

fn build(stream: &Stream, s: &Shape) -> Problem {
    let batch = s.seq_lens.len();
    let max_seq = *s.seq_lens.iter().max().unwrap() as usize;
    let max_pages = max_seq.div_ceil(s.page) + 1;
    let used: usize = s.seq_lens.iter().map(|&l| (l.max(0) as usize).div_ceil(s.page)).sum();
    let pages = used + 2;
    let mut perm: Vec<i32> = (0..pages as i32).collect();
    let mut st = s.seed | 1;
    for i in (1..perm.len()).rev() {
        perm.swap(i, lcg(&mut st) as usize % (i + 1));
    }
    let mut pt = vec![perm[pages - 1]; batch * max_pages];
    let mut next = 0;
    for b in 0..batch {
        for p in 0..(s.seq_lens[b].max(0) as usize).div_ceil(s.page) {
            pt[b * max_pages + p] = perm[next];
            next += 1;
        }
    }
    let h = s.heads;
    let q = |n, seed| -> (Vec<u16>, Vec<f32>) { random_f32(n, seed).into_iter().map(bf16::from_f32).map(|v| (v.to_bits(), v.to_f32())).unzip() };
    let (qn_bits, qn) = q(batch * h * 512, s.seed + 1);
    let (qp_bits, qp) = q(batch * h * 64, s.seed + 2);
    let tokens = pages * s.page;
    let (kv_bytes, kv) = match s.kind {
        KvFormatKind::Fp8PerTensor => {
            let c = codes(tokens * 576, s.seed + 3);
            let kv = dequantize_fp8_per_tensor(&c, s.scale);
            (c, kv)
        }
        KvFormatKind::Fp8DsMla => {
            let c = codes(tokens * 512, s.seed + 3);
            let rope = random_f32(tokens * 64, s.seed + 4);
            let mut st = s.seed + 5;
            let mut bytes = Vec::with_capacity(tokens * DS_MLA_TOKEN_BYTES);
            for t in 0..tokens {
                bytes.extend_from_slice(&c[t * 512..(t + 1) * 512]);
                for _ in 0..4 {
                    let u = (lcg(&mut st) % 1024) as f32 / 1024.0;
                    bytes.extend_from_slice(&(s.scale * (1.0 / 16.0 + u * 15.0 / 16.0)).to_le_bytes());
                }
                for r in 0..64 {
                    bytes.extend_from_slice(&bf16::from_f32(rope[t * 64 + r]).to_bits().to_le_bytes());
                }
            }
            let kv = dequantize_ds_mla(&bytes).unwrap();
            (bytes, kv)
        }
        KvFormatKind::Native => unreachable!("fp8 tests"),
    };
    Problem {
        shape: s.clone(),
        batch,
        max_seq,
        max_pages,
        pages,
        q_nope: DeviceBuffer::from_host(stream, &qn_bits).unwrap(),
        q_pe: DeviceBuffer::from_host(stream, &qp_bits).unwrap(),
        kv: DeviceBuffer::from_host(stream, &kv_bytes).unwrap(),
        scale: DeviceBuffer::from_host(stream, &[s.scale]).unwrap(),
        seq_lens: DeviceBuffer::from_host(stream, &s.seq_lens).unwrap(),
        page_table: DeviceBuffer::from_host(stream, &pt).unwrap(),
        out: DeviceBuffer::alloc_zeroed(stream, batch * h * 512 * 2).unwrap(),
        lse: DeviceBuffer::alloc_zeroed(stream, batch * h * 4).unwrap(),
        host: (qn, qp, kv, pt),
        sm_scale: 1.0 / (576f32).sqrt(),
    }
}

fn args(p: &Problem) -> MlaDecodeArgs<&DeviceBuffer> {
    let (b, h) = (p.batch, p.shape.heads);
    let (kv_dt, kv_row) = p.shape.kind.cache_element(DType::Bf16);
    let kv_cache = Tensor::contiguous(&p.kv, kv_dt, &[p.pages, p.shape.page, kv_row]);
    let kv_format = match p.shape.kind {
        KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(&p.scale, DType::F32, &[1]) },
        _ => KvFormat::Fp8DsMla,
    };
    MlaDecodeArgs::new(
        Tensor::contiguous(&p.q_nope, DType::Bf16, &[b, h, 512]),
        Tensor::contiguous(&p.q_pe, DType::Bf16, &[b, h, 64]),
        kv_cache,
        Tensor::contiguous(&p.seq_lens, DType::I32, &[b]),
        Tensor::contiguous(&p.page_table, DType::I32, &[b, p.max_pages]),
        Tensor::contiguous(&p.out, DType::Bf16, &[b, h, 512]),
    )
    .with_kv_format(kv_format)
    .with_lse(Tensor::contiguous(&p.lse, DType::F32, &[b, h]))
    .with_sm_scale(p.sm_scale)
    .with_max_seq_len(p.max_seq as u32)
    .with_num_splits(p.shape.splits)
}

/// The same arguments over buffers bound to `cap` (the graph keeps them alive, the scale too).
fn captured_args<'c>(cap: &mut graphsafe::graph::Capture<'_, 'c>, a: &MlaDecodeArgs<&DeviceBuffer>) -> MlaDecodeArgs<CapturedBuffer<'c>> {
    a.bind(cap).unwrap()
}

fn bf16_out(p: &Problem, stream: &Stream) -> Vec<f32> {
    p.out.to_host_vec::<u16>(stream).unwrap().into_iter().map(|b| bf16::from_bits(b).to_f32()).collect()
}

/// Rewrites, on the device, token 0 of the first page of each request in `requests`: `edit` gets
/// that token's bytes (576 for the per-tensor format, 656 for DeepSeek's).
fn edit_first_token(p: &mut Problem, stream: &Stream, requests: &[usize], edit: impl Fn(&mut [u8])) {
    let token = p.shape.kind.token_bytes(DType::Bf16);
    let mut bytes = p.kv.to_host_vec::<u8>(stream).unwrap();
    for &b in requests {
        let row = p.host.3[b * p.max_pages] as usize * p.shape.page;
        edit(&mut bytes[row * token..(row + 1) * token]);
    }
    p.kv = DeviceBuffer::from_host(stream, &bytes).unwrap();
}

/// The four f32 group scales of a 656-byte token.
fn set_group_scales(t: &mut [u8], scales: [f32; 4]) {
    for (g, v) in scales.iter().enumerate() {
        t[512 + 4 * g..516 + 4 * g].copy_from_slice(&v.to_le_bytes());
    }
}

fn shapes() -> Vec<Shape> {
    use KvFormatKind::{Fp8DsMla as Ds, Fp8PerTensor as Pt};
    let s = |kind, heads, page, seq_lens: Vec<i32>, splits, scale, seed| Shape { kind, heads, page, seq_lens, splits, scale, seed };
    let mut v = Vec::new();
    for (i, kind) in [Pt, Ds].into_iter().enumerate() {
        let k = 100 * i as u64;
        v.extend([
            s(kind, 16, 64, vec![1], None, 1.0 / 64.0, k + 1),
            s(kind, 32, 128, vec![1, 2, 3], None, 1.0 / 64.0, k + 2),
            s(kind, 16, 64, vec![63, 64, 65], None, 1.0 / 32.0, k + 3),
            s(kind, 32, 64, vec![127, 128, 129], Some(2), 1.0 / 32.0, k + 4),
            s(kind, 16, 128, vec![4096], None, 1.0 / 64.0, k + 5),
            s(kind, 32, 64, vec![4096; 4], None, 1.0 / 64.0, k + 6),
            s(kind, 16, 64, vec![700, 1, 0, 2048, 33, -5], None, 1.0 / 64.0, k + 7),
            s(kind, 32, 128, vec![1000, 999, 998], Some(1), 1.0 / 64.0, k + 8),
            s(kind, 16, 64, vec![16_384], Some(64), 1.0 / 64.0, k + 9),
            // Logits of tens (a peaked softmax) and a tiny scale (values near 2^-15).
            s(kind, 16, 64, vec![640; 3], None, 0.25, k + 10),
            s(kind, 32, 128, vec![300, 5000], Some(7), 1.0 / 4096.0, k + 11),
            s(kind, 16, 64, (1..=12).map(|i| i * 97).collect(), None, 1.0 / 64.0, k + 12),
            // A negative scale: the softmax's maximum must be taken of the scaled scores.
            s(kind, 32, 64, vec![500, 77], None, -1.0 / 32.0, k + 13),
            // 48..128 heads: the M64 kernel (64-head groups; 48 and 96 leave a group part-empty).
            s(kind, 64, 64, vec![1], None, 1.0 / 64.0, k + 21),
            s(kind, 128, 128, vec![63, 64, 65], None, 1.0 / 32.0, k + 22),
            s(kind, 48, 64, vec![700, 0, 129], None, 1.0 / 64.0, k + 23),
            s(kind, 128, 64, vec![4096, 1000], Some(3), 1.0 / 64.0, k + 24),
            s(kind, 96, 128, vec![300, 5000], Some(7), 1.0 / 4096.0, k + 25),
            s(kind, 128, 64, vec![640; 2], None, 0.25, k + 26),
            s(kind, 64, 64, vec![500, 77], None, -1.0 / 32.0, k + 27),
        ]);
    }
    v
}

#[test]
fn sm90_fp8_matches_the_dequantized_reference_over_40_shapes() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let all = shapes();
    assert_eq!(all.len(), 40);
    let mut worst = (0f64, 0f64);
    for s in &all {
        let p = build(&stream, s);
        let plan = decode(&args(&p), &mut ws, &stream).unwrap();
        assert_eq!(plan.kv_format, s.kind);
        let out = bf16_out(&p, &stream);
        let lse = p.lse.to_host_vec::<f32>(&stream).unwrap();
        let (qn, qp, kv, pt) = &p.host;
        let hp = HostProblem { q_nope: qn, q_pe: qp, kv, seq_lens: &s.seq_lens, page_table: pt, page_table_stride: p.max_pages, page_size: s.page, num_heads: s.heads, s_q: 1, causal: false, sm_scale: p.sm_scale };
        let (r_out, r_lse) = cpu_decode(&hp).unwrap();
        let scale = r_out.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
        let eo = out.iter().zip(&r_out).fold(0f64, |m, (&a, &r)| m.max((a as f64 - r as f64).abs())) / scale;
        let mut el = 0f64;
        for (&a, &r) in lse.iter().zip(&r_lse) {
            if r == f32::INFINITY {
                assert_eq!(a, f32::INFINITY, "{s:?}: an empty request's lse");
            } else {
                // Absolute, relative beyond |lse| = 100 (f32 sums of 576 products of that size).
                el = el.max((a as f64 - r as f64).abs() / (r.abs() as f64 / 100.0).max(1.0));
            }
        }
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

/// One token per request makes the output that token's dequantised V row (softmax weight 1), so
/// every e4m3 code, times every scale, must come out exactly as the host's bf16(scale · e4m3).
#[test]
fn sm90_fp8_dequantises_every_code_exactly() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    // 16 heads: the N kernel; 128: the M64 kernel's in-place dequantisation.
    for (kind, heads) in [(KvFormatKind::Fp8PerTensor, 16), (KvFormatKind::Fp8DsMla, 16), (KvFormatKind::Fp8PerTensor, 128), (KvFormatKind::Fp8DsMla, 128)] {
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
                        let want = bf16::from_f32(e4m3_value(latent[d]) * groups[d / 128]).to_f32();
                        let got = bf16::from_bits(out[(b * heads + h) * 512 + d]).to_f32();
                        assert_eq!(got, want, "{kind} {heads} heads, scale {scale}: request {b} head {h} dim {d} (code {:#04x})", latent[d]);
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

/// The scales are device data, like `seq_lens`: never trusted, read as they are. A NaN or zero
/// per-tensor scale gives NaN or zeros (and LSE = ln(len)) and finishes; a NaN group scale in one
/// token of one request of a 656-byte cache makes that request NaN and leaves the others
/// bit-identical to a clean run (no hang, nothing outside the request's own rows).
#[test]
fn sm90_fp8_garbage_scales_stay_in_their_requests_and_never_hang() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    let lens = vec![300, 300, 300];
    // 16 heads: the N kernel; 128: the M64 kernel (whose scales are read before being overwritten in place).
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

/// At 16 and 32 heads the per-tensor cache runs the N8 kernel, which converts without a NaN check
/// and reruns a split with NaN codes read as +448 when its output came out NaN. Pinned exactly: a
/// request whose tokens hold NaN codes (0x7F and 0xFF) must equal, bit for bit, the same request
/// with those codes replaced by 0x7E (+448), and the other requests of the batch must equal a
/// decode without any NaN code (the rerun is per split and request). Two splits, so a rerun split's
/// partials meet a clean split's in the combine.
#[test]
fn sm90_fp8_nan_codes_rerun_as_448_and_stay_in_their_request() {
    let Some(stream) = hopper_gpu(SM90) else { return };
    let mut ws = Workspace::new(&stream, 0).unwrap();
    for heads in [16, 32] {
        let s = Shape { kind: KvFormatKind::Fp8PerTensor, heads, page: 64, seq_lens: vec![300, 200, 129], splits: Some(2), scale: 1.0 / 64.0, seed: 4242 };
        let mut clean = build(&stream, &s);
        decode(&args(&clean), &mut ws, &stream).unwrap();
        let base = bf16_out(&clean, &stream);
        let poison = |t: &mut [u8]| {
            for (d, code) in t[..576].iter_mut().enumerate() {
                if d % 5 == 0 {
                    *code = if d % 2 == 0 { 0x7F } else { 0xFF };
                }
            }
        };
        let as_448 = |t: &mut [u8]| {
            for (d, code) in t[..576].iter_mut().enumerate() {
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
            assert!(diff.is_none(), "{heads} heads, request {b}: element {diff:?} differs ({:?} vs {:?})", diff.map(|i| g[i]), diff.map(|i| w[i]));
        }
        assert!(got[row..2 * row].iter().all(|v| v.is_finite()), "{heads} heads: the NaN-coded request came out non-finite");
    }
}

/// The 656-byte format's stages hold exactly bf16(scale · e4m3) and the rope as stored. At 16 and
/// 32 heads both formats run the N kernel with the same math, so a decode over the 656-byte cache
/// must equal, bit for bit, the native decode over a bf16 cache holding those values: a value the
/// dequantisation got wrong or raced (the N kernel's raw ring) shows here even where it would hide
/// inside the reference test's tolerance. At 48..128 heads the native cache runs the seesaw kernel
/// and the fp8 one the M64 kernel (in-place conversion): two summation orders, so there the two
/// must agree to within bf16 rounding of P (1e-2 of the largest output, 1e-4 in the LSE).
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
        let bits: Vec<u16> = p.host.2.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        assert!(p.host.2.iter().all(|&v| bf16::from_f32(v).to_f32() == v), "the dequantised values are bf16 values");
        let native_kv = DeviceBuffer::from_host(&stream, &bits).unwrap();
        let mut a = args(&p);
        a.kv_cache = Tensor::contiguous(&native_kv, DType::Bf16, &[p.pages, s.page, 576]);
        a.kv_format = KvFormat::Native;
        p.out.memset_u8(0xFF, &stream).unwrap();
        p.lse.memset_u8(0xFF, &stream).unwrap();
        decode(&a, &mut ws, &stream).unwrap();
        let native = (p.out.to_host_vec::<u16>(&stream).unwrap(), p.lse.to_host_vec::<u32>(&stream).unwrap());
        if heads <= 32 {
            assert!(fp8.0 == native.0, "{heads} heads {:?}: output differs from the native decode of the same values", s.seq_lens);
            assert!(fp8.1 == native.1, "{heads} heads {:?}: lse differs", s.seq_lens);
            eprintln!("{heads} heads, page {page}, lengths {:?}: the 656-byte decode equals the bf16 one bit for bit", s.seq_lens);
        } else {
            let f = |b: &u16| bf16::from_bits(*b).to_f32() as f64;
            let top = native.0.iter().map(f).fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            let eo = fp8.0.iter().zip(&native.0).map(|(a, b)| (f(a) - f(b)).abs()).fold(0f64, f64::max) / top;
            let el = fp8.1.iter().zip(&native.1).map(|(&a, &b)| (f32::from_bits(a) as f64 - f32::from_bits(b) as f64).abs()).fold(0f64, f64::max);
            assert!(eo <= 1e-2, "{heads} heads {:?}: output differs from the native decode of the same values by {eo}", s.seq_lens);
            assert!(el <= 1e-4, "{heads} heads {:?}: lse differs by {el}", s.seq_lens);
            eprintln!("{heads} heads, page {page}, lengths {:?}: the 656-byte decode (M64) is within {eo:.1e} / lse {el:.1e} of the bf16 one (seesaw)", s.seq_lens);
        }
    }
}

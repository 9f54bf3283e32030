//! References for the MLA decode: a CPU one in f64 for small shapes, and a simple GPU kernel
//! (`cuda-src/mla/reference.cu`, fp32, one CTA per (head, request)) for large ones.

use crate::driver::{Context, DeviceBuffer, Function, KernelLaunch, Module, Stream};
use crate::error::{Error, Result};
use crate::graph::op_target::OpTarget;
use crate::sys::module_kernels::{self, MlaReference};
use crate::sys::Fatbin;
use std::sync::Arc;

use super::{DType, LATENT_DIM, ROPE_DIM};

const ROW: usize = LATENT_DIM + ROPE_DIM;

/// Host inputs of a decode, already as f32 (values exactly representable in the kernel's dtype).
pub struct HostProblem<'a> {
    /// [B, s_q, H, 512]
    pub q_nope: &'a [f32],
    /// [B, s_q, H, 64]
    pub q_pe: &'a [f32],
    /// [pages, page_size, 576]
    pub kv: &'a [f32],
    /// \[B\]
    pub seq_lens: &'a [i32],
    /// [B, page_table_stride]
    pub page_table: &'a [i32],
    /// Row stride of page_table.
    pub page_table_stride: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Query tokens per request.
    pub s_q: usize,
    /// Token t of s_q attends keys `0 ..= len - s_q + t` (else every key).
    pub causal: bool,
    /// Softmax scale.
    pub sm_scale: f32,
}

/// CPU reference in f64: (out [B, s_q, H, 512], lse [B, H, s_q]). A query row that attends no key
/// (a zero-length request, or a causal token before the first key) gives zeros and +inf.
/// Device data is read as the kernels read it (`graphsafe_kernels/mla.h`, "Device data"): a
/// negative length is an empty request, a page index is clamped into the cache. A length is
/// clamped to page_table_stride · page_size, the most the table can name; the decode clamps to
/// its `max_seq_len`, which may be less: compare with lengths of at most `max_seq_len`.
/// `InvalidArgument` for host buffers shorter than the shapes they describe, a page size of 0, or
/// a cache that is not whole pages (none, if a request has tokens).
pub fn cpu_decode(p: &HostProblem) -> Result<(Vec<f32>, Vec<f32>)> {
    let b = p.seq_lens.len();
    let h = p.num_heads;
    let sq = p.s_q;
    if sq == 0 {
        return Err(Error::invalid("s_q", "at least 1", 0));
    }
    let need = |what: &str, have: usize, per: usize, count: usize| -> Result<usize> {
        let n = count.checked_mul(per).ok_or_else(|| Error::invalid(what, "a size that fits in usize", format!("{count} x {per}")))?;
        if have < n {
            return Err(Error::invalid(what, format!("at least {n} values"), have));
        }
        Ok(n)
    };
    let bh = b.checked_mul(h).and_then(|n| n.checked_mul(sq)).ok_or_else(|| Error::invalid("batch x s_q x heads", "a product that fits in usize", format!("{b} x {sq} x {h}")))?;
    let out_len = need("q_nope", p.q_nope.len(), LATENT_DIM, bh)?;
    need("q_pe", p.q_pe.len(), ROPE_DIM, bh)?;
    need("page_table", p.page_table.len(), p.page_table_stride, b)?;
    if p.page_size == 0 {
        return Err(Error::invalid("page_size", "at least 1", 0));
    }
    let page_values = p.page_size.checked_mul(ROW).ok_or_else(|| Error::invalid("page_size", "a page that fits in usize", p.page_size))?;
    if p.kv.len() % page_values != 0 {
        return Err(Error::invalid("kv", format!("whole pages of {} values", page_values), p.kv.len()));
    }
    let pages = p.kv.len() / page_values;
    let max_len = p.page_table_stride.saturating_mul(p.page_size);
    let mut out = vec![0f32; out_len];
    let mut lse = vec![f32::INFINITY; bh];
    for bi in 0..b {
        let seq = (p.seq_lens[bi].max(0) as usize).min(max_len);
        if seq > 0 && pages == 0 {
            return Err(Error::invalid("kv", "at least one page", 0));
        }
        let page = |t: usize| (p.page_table[bi * p.page_table_stride + t / p.page_size].max(0) as usize).min(pages.saturating_sub(1));
        let rows: Vec<usize> = (0..seq).map(|t| page(t) * p.page_size + t % p.page_size).collect();
        for (ti, hi) in (0..sq).flat_map(|t| (0..h).map(move |hh| (t, hh))) {
            let q = (bi * sq + ti) * h + hi; // [B, s_q, H]
            let keys = if p.causal { (seq + ti + 1).saturating_sub(sq) } else { seq };
            let mut scores = Vec::with_capacity(keys);
            for &r in &rows[..keys] {
                let kv = &p.kv[r * ROW..(r + 1) * ROW];
                let mut acc = 0f64;
                for (d, &k) in kv.iter().enumerate().take(LATENT_DIM) {
                    acc += p.q_nope[q * LATENT_DIM + d] as f64 * k as f64;
                }
                for d in 0..ROPE_DIM {
                    acc += p.q_pe[q * ROPE_DIM + d] as f64 * kv[LATENT_DIM + d] as f64;
                }
                scores.push(acc * p.sm_scale as f64);
            }
            if keys == 0 {
                continue;
            }
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..LATENT_DIM {
                let mut acc = 0f64;
                for (i, &r) in rows[..keys].iter().enumerate() {
                    acc += w[i] * p.kv[r * ROW + d] as f64;
                }
                out[q * LATENT_DIM + d] = (acc / sum) as f32;
            }
            lse[(bi * h + hi) * sq + ti] = (mx + sum.ln()) as f32; // [B, H, s_q]
        }
    }
    Ok((out, lse))
}

/// The value of an fp8 e4m3 code (NaN for 0x7F and 0xFF, e4m3 having no infinities).
pub fn e4m3_value(code: u8) -> f32 {
    let (sign, e, m) = (if code & 0x80 != 0 { -1.0f32 } else { 1.0 }, (code >> 3) & 0xF, code & 7);
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 { m as f32 / 8.0 * 2f32.powi(-6) } else { (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7) };
    sign * mag
}

/// A per-tensor fp8 cache ([tokens, 576] e4m3 codes, [`super::KvFormat::Fp8PerTensor`])
/// dequantised: `scale · e4m3` for every value, the product rounded once to f32.
pub fn dequantize_fp8_per_tensor(codes: &[u8], scale: f32) -> Vec<f32> {
    codes.iter().map(|&c| e4m3_value(c) * scale).collect()
}

/// A DeepSeek V3.2 cache ([tokens, 656] bytes, [`super::KvFormat::Fp8DsMla`]) dequantised to
/// [tokens, 576] as the kernel defines it from 33 query rows up: latent value d is
/// `bf16(scale[d / 128] · e4m3)` (the product in f32, rounded once to bf16: the per-token scales
/// cannot be factored out of Q·K, so K is dequantised to the tensor cores' bf16, as FlashMLA's
/// fp8 kernels do), the rope the stored bf16 values. Up to 32 rows the sm90 kernel rounds to fp16
/// instead: [`dequantize_ds_mla_fp16_rounded`].
/// `InvalidArgument` when `bytes` is not a whole number of tokens.
pub fn dequantize_ds_mla(bytes: &[u8]) -> Result<Vec<f32>> {
    const TOKEN: usize = super::DS_MLA_TOKEN_BYTES;
    if bytes.len() % TOKEN != 0 {
        return Err(Error::invalid("bytes", format!("a whole number of {TOKEN}-byte tokens"), bytes.len()));
    }
    let mut out = Vec::with_capacity(bytes.len() / TOKEN * ROW);
    for t in bytes.chunks_exact(TOKEN) {
        let scale = |g: usize| f32::from_le_bytes(t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].try_into().expect("4 bytes"));
        let s = [scale(0), scale(1), scale(2), scale(3)];
        out.extend(t[..LATENT_DIM].iter().enumerate().map(|(d, &c)| half::bf16::from_f32(e4m3_value(c) * s[d / 128]).to_f32()));
        let rope = &t[LATENT_DIM + 16..];
        out.extend(rope.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)));
    }
    Ok(out)
}

/// The keys of a DeepSeek V3.2 cache ([tokens, 656] bytes) as the sm90 kernel computes with them
/// at up to 32 query rows (`s_q × heads`), where it multiplies the scales in while converting, in
/// fp16: per token, E is the power of two that puts its largest |group scale| · 2^-E in [64, 128)
/// (clamped to [-30, 100]); latent value d is `fp16(fp16(scale[d / 128] · 2^-E) · e4m3) · 2^E`,
/// the scale and the product each rounded to fp16's 11 significant bits; the rope the stored bf16
/// values. Where the scaled scale and product are fp16 normals (at least 2^-14) that is within
/// one bf16 step of [`dequantize_ds_mla`]'s `bf16(scale · e4m3)` and closer to the exact product;
/// otherwise (a group scale below 2^-20 of its token's largest, or a tiny product) fp16
/// subnormals round with an absolute error below 2^-25 · 449 · 2^E, i.e. below 2^-22 of the
/// token's largest scale (2^-46 for a token whose scales are all below 2^-24). Its values (V) round the same way with the
/// exponent of the largest scale of their 128-dim group over a split's tiles (clamped to
/// [-100, 100]) instead of the token's, so V agrees with these to fp16 rounding and the same
/// bounds. More query rows compute with [`dequantize_ds_mla`]'s values.
/// `InvalidArgument` when `bytes` is not a whole number of tokens.
pub fn dequantize_ds_mla_fp16_rounded(bytes: &[u8]) -> Result<Vec<f32>> {
    let mut out = dequantize_ds_mla(bytes)?;
    for (t, row) in bytes.chunks_exact(super::DS_MLA_TOKEN_BYTES).zip(out.chunks_exact_mut(ROW)) {
        let scale = |g: usize| f32::from_le_bytes(t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].try_into().expect("4 bytes"));
        let s = [scale(0), scale(1), scale(2), scale(3)];
        // f32::max drops NaNs, as the kernel's fmaxf does.
        let m = s.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = (((m.to_bits() >> 23) & 0xFF) as i32 - 127 - 6).clamp(-30, 100);
        let down = s.map(|v| half::f16::from_f32(v * pow2(-e)).to_f32());
        for (d, v) in row[..LATENT_DIM].iter_mut().enumerate() {
            *v = half::f16::from_f32(down[d / 128] * e4m3_value(t[d])).to_f32() * pow2(e);
        }
    }
    Ok(out)
}

/// 2^e as an f32, exactly (|e| <= 126).
fn pow2(e: i32) -> f32 {
    f32::from_bits(((127 + e) as u32) << 23)
}

/// The GPU reference kernel (`gs_mla_reference`), loaded into one context.
pub struct GpuReference {
    k: Function,
}

/// Device inputs of the GPU reference (q contiguous, bf16 or fp16).
pub struct GpuProblem<'a> {
    /// Element type of q and kv (bf16 or fp16).
    pub dtype: DType,
    /// [B, H, 512] contiguous.
    pub q_nope: &'a DeviceBuffer,
    /// [B, H, 64] contiguous.
    pub q_pe: &'a DeviceBuffer,
    /// [pages, page_size, 576].
    pub kv: &'a DeviceBuffer,
    /// \[B\] i32.
    pub seq_lens: &'a DeviceBuffer,
    /// [B, stride] i32.
    pub page_table: &'a DeviceBuffer,
    /// Row stride of page_table.
    pub page_table_stride: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Requests.
    pub batch: usize,
    /// Heads.
    pub num_heads: usize,
    /// Bound of seq_lens.
    pub max_seq_len: usize,
    /// Softmax scale.
    pub sm_scale: f32,
}

impl GpuReference {
    /// Loads the kernel (every arch of the build has it).
    pub fn load(ctx: &Arc<Context>) -> Result<GpuReference> {
        let image = Fatbin::MLA_REFERENCE.ok_or_else(|| Error::ArchUnsupported { op: "mla reference", need: "a build with any GPU arch".into(), have: "none".into() })?;
        Ok(GpuReference { k: Module::load_embedded(ctx, image)?.function("gs_mla_reference")? })
    }

    /// Runs it: (out [B, H, 512] f32, lse [B, H] f32), read back to the host. Device lengths are
    /// clamped to `0..=max_seq_len` and page indices into the cache, as by the decode kernels.
    pub fn run(&self, p: &GpuProblem, stream: &Stream) -> Result<(Vec<f32>, Vec<f32>)> {
        let dtype = match p.dtype {
            DType::Bf16 => 0i32,
            DType::Fp16 => 1,
            _ => return Err(Error::invalid("dtype", "bf16 or fp16", p.dtype)),
        };
        let u32_of = |what: &str, v: usize| u32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^32", v));
        let bytes = |what: &str, parts: &[usize]| {
            parts.iter().try_fold(1usize, |a, &n| a.checked_mul(n)).ok_or_else(|| Error::invalid(what, "a size that fits in memory", format!("{parts:?}")))
        };
        let (b, h) = (p.batch, p.num_heads);
        let scratch = DeviceBuffer::alloc(stream.context(), bytes("scratch", &[b, h, p.max_seq_len.max(1), 4])?.max(4))?;
        let out = DeviceBuffer::alloc_zeroed(stream, bytes("out", &[b, h, LATENT_DIM, 4])?)?;
        let lse = DeviceBuffer::alloc_zeroed(stream, bytes("lse", &[b, h, 4])?)?;
        let mut target = OpTarget::eager(stream, None)?;
        let r = MlaReference {
            dtype,
            batch: u32_of("batch", b)?,
            num_heads: u32_of("num_heads", h)?,
            max_seq_len: u32_of("max_seq_len", p.max_seq_len)?,
            page_size: u32_of("page_size", p.page_size)?,
            page_table_stride: u32_of("page_table_stride", p.page_table_stride)?,
            sm_scale: p.sm_scale,
            q_nope: target.admit("q_nope", &p.q_nope)?,
            q_pe: target.admit("q_pe", &p.q_pe)?,
            kv: target.admit("kv", &p.kv)?,
            seq_lens: target.admit("seq_lens", &p.seq_lens)?,
            page_table: target.admit("page_table", &p.page_table)?,
            scratch: target.admit("scratch", &&scratch)?,
            out: target.admit("out", &&out)?,
            lse: target.admit("lse", &&lse)?,
        };
        let launch = KernelLaunch::new(&self.k, module_kernels::mla_reference(&r)?)?;
        target.check_launch(&launch)?;
        target.commit()?.kernel(launch)?;
        Ok((out.to_host_vec::<f32>(stream)?, lse.to_host_vec::<f32>(stream)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values_are_the_format_s() {
        assert_eq!(e4m3_value(0x00), 0.0);
        assert_eq!(e4m3_value(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_value(0x07), 7.0 * 2f32.powi(-9)); // largest subnormal
        assert_eq!(e4m3_value(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3_value(0x38), 1.0);
        assert_eq!(e4m3_value(0xB8), -1.0);
        assert_eq!(e4m3_value(0x7E), 448.0); // largest finite
        assert!(e4m3_value(0x7F).is_nan() && e4m3_value(0xFF).is_nan());
        // Strictly increasing over the positive codes, and the negative codes mirror them.
        for c in 0..0x7Eu8 {
            assert!(e4m3_value(c) < e4m3_value(c + 1), "{c:#x}");
            assert_eq!(e4m3_value(c | 0x80), -e4m3_value(c));
        }
    }

    #[test]
    fn a_ds_mla_token_dequantises_by_its_group_scales_and_keeps_its_rope() {
        let mut t = vec![0u8; super::super::DS_MLA_TOKEN_BYTES];
        t[..LATENT_DIM].fill(0x38); // 1.0
        for (g, s) in [0.5f32, 2.0, -1.0, 0.125].iter().enumerate() {
            t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
        }
        for r in 0..ROPE_DIM {
            let bits = half::bf16::from_f32(r as f32 - 3.5).to_bits();
            t[LATENT_DIM + 16 + 2 * r..LATENT_DIM + 18 + 2 * r].copy_from_slice(&bits.to_le_bytes());
        }
        let v = dequantize_ds_mla(&t).unwrap();
        assert_eq!(v.len(), ROW);
        assert_eq!((v[0], v[127], v[128], v[300], v[511]), (0.5, 0.5, 2.0, -1.0, 0.125));
        // The product is rounded to bf16: 1.0 x 0.1 is bf16's 0.1.
        t[LATENT_DIM..LATENT_DIM + 4].copy_from_slice(&0.1f32.to_le_bytes());
        assert_eq!(dequantize_ds_mla(&t).unwrap()[0], half::bf16::from_f32(0.1).to_f32());
        assert!(dequantize_ds_mla(&t[1..]).is_err(), "a partial token is refused");
        assert_eq!((v[512], v[575]), (-3.5, 59.5));
    }

    #[test]
    fn the_fp16_rounded_ds_mla_keys_are_within_a_bf16_step_of_the_bf16_ones() {
        let mut t = vec![0u8; super::super::DS_MLA_TOKEN_BYTES];
        for (d, c) in t[..LATENT_DIM].iter_mut().enumerate() {
            *c = if (d as u8) & 0x7F == 0x7F { 0 } else { d as u8 };
        }
        // 1/3 and 0.1 are not fp16 values: the scale's own rounding shows.
        for (g, s) in [1.0f32 / 3.0, 0.1, -7.5, 2f32.powi(-12)].iter().enumerate() {
            t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
        }
        let (b, f) = (dequantize_ds_mla(&t).unwrap(), dequantize_ds_mla_fp16_rounded(&t).unwrap());
        assert_eq!(b[LATENT_DIM..], f[LATENT_DIM..], "the rope as stored");
        let mut differ = 0;
        for d in 0..LATENT_DIM {
            let exact = e4m3_value(t[d]) as f64 * [1.0f64 / 3.0, 0.1f32 as f64, -7.5, 2f64.powi(-12)][d / 128];
            let ulp = |v: f32| half::bf16::from_f32(v.abs()).to_bits() as i32;
            assert!((ulp(b[d]) - ulp(f[d])).abs() <= 1, "dim {d}: {} against bf16 {}", f[d], b[d]);
            // Closer to the exact product than bf16's rounding allows: 2^-10 relative (fp16's
            // scale and product roundings) where bf16 has 2^-9.
            assert!((f[d] as f64 - exact).abs() <= exact.abs() * 2f64.powi(-10), "dim {d}: {} against {exact}", f[d]);
            differ += usize::from(b[d] != f[d]);
        }
        assert!(differ > 0, "the two roundings must be told apart by this data");
        // The largest scale lands in [64, 128): 7.5 . 2^-E = 120 (E = -4), exact.
        assert_eq!(f[256 + 0x38], -7.5, "code 0x38 (1.0) of the -7.5 group");
        assert!(dequantize_ds_mla_fp16_rounded(&t[1..]).is_err(), "a partial token is refused");
        // The stated bounds, group scales from the token's largest down to 2^-30 of it, every
        // code: where the scaled scale or product is an fp16 subnormal, an absolute error below
        // 2^-22 of that largest scale; within a bf16 step wherever both are normals.
        for k in 0..=30 {
            let big = 3.0f32;
            let small = big * 2f32.powi(-k) * 0.7;
            for (g, s) in [big, small, -small, small * 0.55].iter().enumerate() {
                t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
            }
            let (b, f) = (dequantize_ds_mla(&t).unwrap(), dequantize_ds_mla_fp16_rounded(&t).unwrap());
            for d in 128..LATENT_DIM {
                let s = f32::from_le_bytes(t[LATENT_DIM + 4 * (d / 128)..LATENT_DIM + 4 * (d / 128) + 4].try_into().unwrap());
                let exact = e4m3_value(t[d]) as f64 * s as f64;
                // 2^-10 relative (two fp16 roundings) or 2^-22 of the largest scale absolute.
                let bound = (exact.abs() * 2f64.powi(-10)).max(big as f64 * 2f64.powi(-22));
                assert!((f[d] as f64 - exact).abs() <= bound, "scale ratio 2^-{k}, dim {d}: {} against {exact}", f[d]);
                // 2^-E = 32 here (3 . 32 in [64, 128)): both scaled values fp16 normals.
                if s.abs() * 32.0 >= 2f32.powi(-14) && exact.abs() * 32.0 >= 2f64.powi(-14) {
                    let ulp = |v: f32| half::bf16::from_f32(v.abs()).to_bits() as i32;
                    assert!((ulp(b[d]) - ulp(f[d])).abs() <= 1, "scale ratio 2^-{k}, dim {d}: {} against bf16 {}", f[d], b[d]);
                }
            }
        }
        // The offset's floor (2^30): scales of 2^-40 keep 2^-40 . 1.0 exactly, zero scales give 0.
        for (g, s) in [2f32.powi(-40), 0.0, 2f32.powi(-40), 0.0].iter().enumerate() {
            t[LATENT_DIM + 4 * g..LATENT_DIM + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
        }
        let f = dequantize_ds_mla_fp16_rounded(&t).unwrap();
        // Codes 0x38 (1.0) at dims 0x38 and 256 + 0x38; dim 128 + 0x38 holds 0xB8 (-1.0).
        assert_eq!((f[0x38], f[128 + 0x38], f[256 + 0x38]), (2f32.powi(-40), 0.0, 2f32.powi(-40)));
    }
}

//! References for the MLA decode: a CPU one in f64 for small shapes, and a simple GPU kernel
//! (`cuda-src/mla/reference.cu`, fp32, one CTA per (head, request)) for large ones.

use crate::driver::testing::{MlaReference, MlaReferenceKernel};
use crate::driver::{Context, DeviceBuffer, Stream};
use crate::error::{Error, Result};
use crate::graph::target::Target;
use std::sync::Arc;

use super::{KvDtype, LATENT_DIM, ROPE_DIM};

const ROW: usize = LATENT_DIM + ROPE_DIM;

/// Host inputs of a decode, already as f32 (values exactly representable in the kernel's dtype).
pub struct HostProblem<'a> {
    /// [B, H, 512]
    pub q_nope: &'a [f32],
    /// [B, H, 64]
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
    /// Softmax scale.
    pub sm_scale: f32,
}

/// CPU reference in f64: (out [B, H, 512], lse [B, H]). A zero-length request gives zeros and -inf.
pub fn cpu_decode(p: &HostProblem) -> (Vec<f32>, Vec<f32>) {
    let b = p.seq_lens.len();
    let h = p.num_heads;
    let mut out = vec![0f32; b * h * LATENT_DIM];
    let mut lse = vec![f32::NEG_INFINITY; b * h];
    for bi in 0..b {
        let seq = p.seq_lens[bi].max(0) as usize;
        let rows: Vec<usize> = (0..seq)
            .map(|t| p.page_table[bi * p.page_table_stride + t / p.page_size] as usize * p.page_size + t % p.page_size)
            .collect();
        for hi in 0..h {
            let q = bi * h + hi;
            let mut scores = Vec::with_capacity(seq);
            for &r in &rows {
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
            if seq == 0 {
                continue;
            }
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..LATENT_DIM {
                let mut acc = 0f64;
                for (i, &r) in rows.iter().enumerate() {
                    acc += w[i] * p.kv[r * ROW + d] as f64;
                }
                out[q * LATENT_DIM + d] = (acc / sum) as f32;
            }
            lse[q] = (mx + sum.ln()) as f32;
        }
    }
    (out, lse)
}

/// The GPU reference kernel, loaded into one context.
pub struct GpuReference {
    k: MlaReferenceKernel,
}

/// Device inputs of the GPU reference (q contiguous, bf16 or fp16).
pub struct GpuProblem<'a> {
    /// Element type of q and kv (bf16 or fp16).
    pub dtype: KvDtype,
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
    /// Loads the kernel.
    pub fn load(ctx: &Arc<Context>) -> Result<GpuReference> {
        Ok(GpuReference { k: MlaReferenceKernel::load(ctx)? })
    }

    /// Runs it: (out [B, H, 512] f32, lse [B, H] f32), read back to the host. Device lengths are
    /// clamped to `0..=max_seq_len` and page indices into the cache, as by the decode kernels.
    pub fn run(&self, p: &GpuProblem, stream: &Stream) -> Result<(Vec<f32>, Vec<f32>)> {
        let dtype = match p.dtype {
            KvDtype::Bf16 => 0i32,
            KvDtype::Fp16 => 1,
            KvDtype::Fp8E4m3 => return Err(Error::invalid("dtype", "bf16 or fp16", p.dtype)),
        };
        let u32_of = |what: &str, v: usize| u32::try_from(v).map_err(|_| Error::invalid(what, "a value below 2^32", v));
        let bytes = |what: &str, parts: &[usize]| {
            parts.iter().try_fold(1usize, |a, &n| a.checked_mul(n)).ok_or_else(|| Error::invalid(what, "a size that fits in memory", format!("{parts:?}")))
        };
        let (b, h) = (p.batch, p.num_heads);
        let scratch = DeviceBuffer::alloc(stream.context(), bytes("scratch", &[b, h, p.max_seq_len.max(1), 4])?.max(4))?;
        let out = DeviceBuffer::alloc_zeroed(stream, bytes("out", &[b, h, LATENT_DIM, 4])?)?;
        let lse = DeviceBuffer::alloc_zeroed(stream, bytes("lse", &[b, h, 4])?)?;
        let mut target = Target::eager(stream, None)?;
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
        let launch = self.k.launch(&r)?;
        target.commit()?;
        target.launch(launch)?;
        Ok((out.to_host_vec::<f32>(stream)?, lse.to_host_vec::<f32>(stream)?))
    }
}

//! References for the MLA decode: a CPU one in f64 for small shapes, and a simple GPU kernel
//! (`cuda-src/mla/reference.cu`, fp32, one CTA per (head, request)) for large ones.

use crate::driver::{Context, DeviceBuffer, Function, LaunchConfig, Module, Stream};
use crate::error::{Error, Result};
use crate::sys::cuda as c;
use std::ffi::c_void;
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
    f: Function,
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
        let image = crate::sys::modules::MLA_REFERENCE
            .ok_or_else(|| Error::ArchUnsupported { op: "mla reference", need: "a build with any GPU arch".into(), have: "none".into() })?;
        Ok(GpuReference { f: Module::load(ctx, image)?.function("gs_mla_reference")? })
    }

    /// Runs it: (out [B, H, 512] f32, lse [B, H] f32), read back to the host.
    pub fn run(&self, p: &GpuProblem, stream: &Stream) -> Result<(Vec<f32>, Vec<f32>)> {
        let dtype = match p.dtype {
            KvDtype::Bf16 => 0i32,
            KvDtype::Fp16 => 1,
            KvDtype::Fp8E4m3 => return Err(Error::invalid("dtype", "bf16 or fp16", p.dtype)),
        };
        let (b, h) = (p.batch, p.num_heads);
        let scratch = DeviceBuffer::alloc(stream.context(), (b * h * p.max_seq_len.max(1) * 4).max(4))?;
        let out = DeviceBuffer::alloc_zeroed(stream, b * h * LATENT_DIM * 4)?;
        let lse = DeviceBuffer::alloc_zeroed(stream, b * h * 4)?;
        let mut ptrs: [c::CUdeviceptr; 9] = [
            p.q_nope.device_ptr(),
            p.q_pe.device_ptr(),
            p.kv.device_ptr(),
            p.seq_lens.device_ptr(),
            p.page_table.device_ptr(),
            scratch.device_ptr(),
            out.device_ptr(),
            lse.device_ptr(),
            0,
        ];
        let (mut pts, mut ps, mut nh, mut dt, mut scale, mut ms) =
            (p.page_table_stride as i32, p.page_size as i32, h as i32, dtype, p.sm_scale, p.max_seq_len as i32);
        let mut params: [*mut c_void; 14] = [
            (&mut ptrs[0] as *mut c::CUdeviceptr).cast(),
            (&mut ptrs[1] as *mut c::CUdeviceptr).cast(),
            (&mut ptrs[2] as *mut c::CUdeviceptr).cast(),
            (&mut ptrs[3] as *mut c::CUdeviceptr).cast(),
            (&mut ptrs[4] as *mut c::CUdeviceptr).cast(),
            (&mut pts as *mut i32).cast(),
            (&mut ps as *mut i32).cast(),
            (&mut nh as *mut i32).cast(),
            (&mut dt as *mut i32).cast(),
            (&mut scale as *mut f32).cast(),
            (&mut ptrs[5] as *mut c::CUdeviceptr).cast(),
            (&mut ms as *mut i32).cast(),
            (&mut ptrs[6] as *mut c::CUdeviceptr).cast(),
            (&mut ptrs[7] as *mut c::CUdeviceptr).cast(),
        ];
        let cfg = LaunchConfig { grid: crate::driver::Dim3::new(h as u32, b as u32, 1), block: crate::driver::Dim3::x(256), shared_mem_bytes: 0, cluster: None };
        // SAFETY: parameters match the kernel's signature; every buffer lives until the reads below.
        unsafe { self.f.launch(&cfg, stream, &mut params)? };
        Ok((out.to_host_vec::<f32>(stream)?, lse.to_host_vec::<f32>(stream)?))
    }
}

//! Shared by the MLA decode tests over paged caches (tests/gpu_mla_fp8.rs, tests/gpu_mla_tokens.rs):
//! one decode problem on the device beside its host copy, the generator of their deterministic
//! choices, and the check that the GPU runs the sm90 MLA kernel.

use super::{gpu, runs_backends};
use graphsafe::arch::{Backend, MlaArch};
use graphsafe::driver::{DeviceBuffer, Stream};

/// One step of the tests' linear congruential generator (page permutations, e4m3 codes, scales).
pub fn lcg(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// One decode of shape `S` on the device: its buffers, the sizes they were made for, and the host
/// copy the references read.
pub struct Problem<S> {
    pub shape: S,
    pub batch: usize,
    pub max_seq: usize,
    pub max_pages: usize,
    pub pages: usize,
    pub q_nope: DeviceBuffer,
    pub q_pe: DeviceBuffer,
    pub kv: DeviceBuffer,
    pub scale: DeviceBuffer,
    pub seq_lens: DeviceBuffer,
    pub page_table: DeviceBuffer,
    pub out: DeviceBuffer,
    pub lse: DeviceBuffer,
    /// q_nope `[B, s_q, H, 512]` and q_pe `[B, s_q, H, 64]`, the cache as f32 `[tokens, 576]`
    /// (dequantised; NaN where nothing may be read), and the page table as the kernel reads it.
    pub host: (Vec<f32>, Vec<f32>, Vec<f32>, Vec<i32>),
    pub sm_scale: f32,
}

/// The GPU's stream when the arch table runs the sm90 MLA back-end on it (Hopper), where `what`
/// runs; else `None`, with the reason printed (and a missing GPU fails under
/// GRAPHSAFE_REQUIRE_GPU=1, see `gpu`).
pub fn hopper_gpu(what: &str) -> Option<Stream> {
    let (ctx, stream) = gpu()?;
    let cc = ctx.device().compute_capability().unwrap();
    runs_backends(cc, &[Backend::Mla(MlaArch::Sm90)], what).then_some(stream)
}

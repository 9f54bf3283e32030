//! Deterministic random inputs shared by the benchmarks (honest inputs: constant data inflates
//! tensor-core throughput on these GPUs).
#![allow(dead_code)]

/// xorshift64*: `n` fast deterministic random words, lazily (the MLA caches need billions).
pub fn random_u64s(n: usize, seed: u64) -> impl Iterator<Item = u64> {
    let mut s = seed | 1;
    (0..n).map(move |_| {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// `n` random bytes.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut v: Vec<u8> = random_u64s(n.div_ceil(8), seed).flat_map(|w| w.to_le_bytes()).collect();
    v.truncate(n);
    v
}

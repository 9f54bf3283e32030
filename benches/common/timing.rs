//! Measurement helpers shared by the benchmarks.
#![allow(dead_code)]

use graphsafe::driver::{Context, Event, Stream};
use std::sync::Arc;

/// The median (upper middle for even lengths).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// GPU µs per call of each contender: 3 warm-up calls each, then `batches` event-timed batches
/// of `per` calls, contenders alternating batch by batch (so drift hits all alike); medians.
pub fn gpu_times(stream: &Stream, ctx: &Arc<Context>, per: usize, batches: usize, runs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for r in runs.iter_mut() {
        for _ in 0..3 {
            r();
        }
    }
    let (s, e) = (Event::new(ctx, true).unwrap(), Event::new(ctx, true).unwrap());
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    for _ in 0..batches {
        for (i, r) in runs.iter_mut().enumerate() {
            s.record(stream).unwrap();
            for _ in 0..per {
                r();
            }
            e.record(stream).unwrap();
            e.synchronize().unwrap();
            t[i].push(e.elapsed_ms(&s).unwrap() as f64 * 1e3 / per as f64);
        }
    }
    t.into_iter().map(median).collect()
}

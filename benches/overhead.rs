//! The cost of graphsafe's safe API against raw driver calls, in one process on one GPU:
//! eager launch of an empty kernel, and replay of graphs of 1, 10 and 100 such nodes.
//!
//! Method: warm-up, then raw and safe alternating call by call: host time per call (median of 3000
//! single calls each) and GPU-side time per call from CUDA events (median of 25 batches of 1000
//! each, batches alternating).
//! Prints a table and one JSON line (`BENCH_JSON {...}`). Run: `cargo bench --bench overhead`.

#[path = "common/timing.rs"]
mod timing;
use timing::median;
use graphsafe::driver::{Context, Event, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::TestKernels;
use graphsafe::sys::cuda as c;
use graphsafe::sys::driver::api;
use std::time::Instant;

const SINGLE: usize = 3000;
const BATCHES: usize = 25;
const PER_BATCH: usize = 1000;


fn ok(r: c::CUresult) {
    assert_eq!(r, c::CUresult::CUDA_SUCCESS, "driver call failed");
}

/// Host µs per call (single calls, `a` and `b` alternating) and GPU-timed µs per call (batches of
/// `PER_BATCH`, alternating) for two ways of doing the same thing: (a host, b host, a gpu, b gpu).
fn measure_pair(stream: &Stream, ctx: &std::sync::Arc<Context>, mut a: impl FnMut(), mut b: impl FnMut()) -> [f64; 4] {
    let (mut ha, mut hb) = (Vec::with_capacity(SINGLE), Vec::with_capacity(SINGLE));
    for i in 0..2 * SINGLE {
        let t = Instant::now();
        if i % 2 == 0 { a() } else { b() }
        let us = t.elapsed().as_secs_f64() * 1e6;
        if i % 2 == 0 { ha.push(us) } else { hb.push(us) }
        if i % 512 == 511 {
            stream.synchronize().unwrap();
        }
    }
    stream.synchronize().unwrap();
    let (s, e) = (Event::new(ctx, true).unwrap(), Event::new(ctx, true).unwrap());
    let (mut da, mut db) = (Vec::with_capacity(BATCHES), Vec::with_capacity(BATCHES));
    for i in 0..2 * BATCHES {
        s.record(stream).unwrap();
        for _ in 0..PER_BATCH {
            if i % 2 == 0 { a() } else { b() }
        }
        e.record(stream).unwrap();
        e.synchronize().unwrap();
        let us = e.elapsed_ms(&s).unwrap() as f64 * 1e3 / PER_BATCH as f64;
        if i % 2 == 0 { da.push(us) } else { db.push(us) }
    }
    [median(ha), median(hb), median(da), median(db)]
}

fn main() {
    let ctx = match Context::new(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("overhead bench: no GPU ({e})");
            std::process::exit(if std::env::var("GRAPHSAFE_REQUIRE_GPU").as_deref() == Ok("1") { 1 } else { 0 });
        }
    };
    // The raw driver calls below (cuLaunchKernel) need the context current on this thread, and
    // graphsafe restores whatever the caller had current (invariant 12): they run inside
    // `with_current`, the scope that makes it current.
    ctx.with_current(|| bench(&ctx)).unwrap();
}

fn bench(ctx: &std::sync::Arc<Context>) {
    let ctx = ctx.clone();
    let mut stream = Stream::new(&ctx).unwrap();
    let k = TestKernels::load(&ctx).unwrap();
    let a = api().unwrap();
    let launch = a.cuLaunchKernel().unwrap().f;
    let f = k.empty_function().raw();
    // Not `raw()`: that marks the stream shared, and replays on it would then ask the driver about
    // foreign captures (the cost this bench compares against a bare cuGraphLaunch). The raw
    // captures below are begun and ended on this thread with no replay in between.
    // SAFETY: as said: no capture of the raw handle is open while graphsafe replays on the stream.
    let s_raw = unsafe { stream.raw_unshared() };
    let raw_launch = move || {
        // SAFETY: the empty kernel takes no parameters; stream and function are live.
        ok(unsafe { launch(f, 1, 1, 1, 32, 1, 1, 0, s_raw, std::ptr::null_mut(), std::ptr::null_mut()) })
    };
    // Warm-up.
    for _ in 0..2000 {
        raw_launch();
        k.empty(&stream).unwrap();
    }
    stream.synchronize().unwrap();

    let mut rows = Vec::new();
    // Interleave raw and safe in halves to cancel drift: raw, safe, raw, safe.
    {
        let [rh, sh, rd, sd] = measure_pair(&stream, &ctx, raw_launch, || k.empty(&stream).unwrap());
        rows.push(("eager launch, empty kernel".to_string(), rh, sh, rd, sd));
    }

    for nodes in [1usize, 10, 100] {
        // Raw: capture and instantiate with direct driver calls, replay with cuGraphLaunch.
        let begin = a.cuStreamBeginCapture().unwrap().f;
        let end = a.cuStreamEndCapture().unwrap().f;
        let inst = a.cuGraphInstantiateWithFlags().unwrap().f;
        let glaunch = a.cuGraphLaunch().unwrap().f;
        let mut raw_graph: c::CUgraph = std::ptr::null_mut();
        let mut raw_exec: c::CUgraphExec = std::ptr::null_mut();
        // SAFETY: plain driver calls on live handles.
        unsafe {
            ok(begin(s_raw, c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
            for _ in 0..nodes {
                raw_launch();
            }
            ok(end(s_raw, &mut raw_graph));
            ok(inst(&mut raw_exec, raw_graph, 0));
        }
        // Safe: the same through graphsafe.
        let exec = {
            let cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
            for _ in 0..nodes {
                k.empty_captured(&cap).unwrap();
            }
            cap.end().unwrap().instantiate().unwrap()
        };
        exec.upload(&stream).unwrap();
        let raw_replay = || {
            // SAFETY: live executable and stream.
            ok(unsafe { glaunch(raw_exec, s_raw) })
        };
        for _ in 0..200 {
            raw_replay();
            exec.launch(&stream).unwrap();
        }
        stream.synchronize().unwrap();
        let [rh, sh, rd, sd] = measure_pair(&stream, &ctx, raw_replay, || exec.launch(&stream).unwrap());
        rows.push((format!("graph replay, {nodes} node(s)"), rh, sh, rd, sd));
        // SAFETY: created above, destroyed once.
        unsafe {
            ok((a.cuGraphExecDestroy().unwrap().f)(raw_exec));
            ok((a.cuGraphDestroy().unwrap().f)(raw_graph));
        }
    }

    let info = ctx.device().info().unwrap();
    println!("overhead of the safe API on {} ({} SMs); µs per call, medians", info.name, info.sm_count);
    println!("{:<30} {:>10} {:>10} {:>7}   {:>10} {:>10} {:>7}", "", "raw host", "safe host", "ratio", "raw gpu", "safe gpu", "ratio");
    let mut json = Vec::new();
    for (label, rh, sh, rd, sd) in &rows {
        println!("{label:<30} {rh:>10.3} {sh:>10.3} {:>7.3}   {rd:>10.3} {sd:>10.3} {:>7.3}", sh / rh, sd / rd);
        json.push(format!(
            "{{\"case\":\"{label}\",\"raw_host_us\":{rh:.4},\"safe_host_us\":{sh:.4},\"host_ratio\":{:.4},\"raw_gpu_us\":{rd:.4},\"safe_gpu_us\":{sd:.4},\"gpu_ratio\":{:.4}}}",
            sh / rh,
            sd / rd
        ));
    }
    println!("BENCH_JSON {{\"bench\":\"overhead\",\"device\":\"{}\",\"rows\":[{}]}}", info.name, json.join(","));
}

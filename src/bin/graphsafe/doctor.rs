//! `graphsafe doctor`: what this build contains and what this machine has. A machine without a
//! driver or GPU is a normal answer (exit 0).

use graphsafe::{build_info, driver};

pub fn run(json: bool) -> i32 {
    let driver_state = match driver::driver_version() {
        Ok((maj, min)) => Ok(format!("CUDA {maj}.{min} ({})", graphsafe::sys::driver::api().map(|a| a.library).unwrap_or("?"))),
        Err(e) => Err(e.to_string()),
    };
    let gpus: Result<Vec<driver::DeviceInfo>, String> = if driver_state.is_ok() {
        driver::device_count()
            .and_then(|n| (0..n).map(|i| driver::Device::get(i)?.info()).collect())
            .map_err(|e| e.to_string())
    } else {
        Ok(Vec::new())
    };
    if json {
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "kernel_archs": build_info::archs(),
            "arch_table": graphsafe::arch::TARGETS.iter().map(|t| serde_json::json!({
                "name": t.name,
                "runs_on": t.runs_on.iter().map(|&cc| graphsafe::arch::cc_name(cc)).collect::<Vec<_>>(),
                "gpus": t.gpus,
                "mla": t.mla,
                "nvfp4": t.nvfp4,
                "built": graphsafe::arch::is_built(t),
            })).collect::<Vec<_>>(),
            "skipped_units": build_info::skipped_units(),
            "cuda_toolkit": { "version": build_info::CUDA_VERSION, "source": build_info::CUDA_SOURCE },
            "cutlass": { "version": build_info::CUTLASS_VERSION, "source": build_info::CUTLASS_SOURCE },
            "driver": match &driver_state { Ok(s) => serde_json::json!({"present": true, "version": s}),
                                             Err(e) => serde_json::json!({"present": false, "reason": e}) },
            "cudnn": match graphsafe::ops::cudnn::library_info() {
                Ok((v, lib)) => serde_json::json!({"present": true, "version": v.to_string(), "library": lib}),
                Err(e) => serde_json::json!({"present": false, "reason": e.to_string()}),
            },
            "gpus": match &gpus { Ok(g) => serde_json::json!(g), Err(e) => serde_json::json!({"error": e}) },
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("plain JSON values serialize"));
        return 0;
    }
    println!("graphsafe {}", env!("CARGO_PKG_VERSION"));
    println!("kernels built for: {}", build_info::archs().join(", "));
    let skipped = build_info::skipped_units();
    if !skipped.is_empty() {
        println!("  left out by GRAPHSAFE_CUDA_ARCHS: {}", skipped.join(", "));
    }
    println!("CUDA toolkit: {} ({})", build_info::CUDA_VERSION, build_info::CUDA_SOURCE);
    println!("CUTLASS: {} ({})", build_info::CUTLASS_VERSION, build_info::CUTLASS_SOURCE);
    match &driver_state {
        Ok(s) => println!("driver: {s}"),
        Err(e) => println!("driver: not present ({e})"),
    }
    match graphsafe::ops::cudnn::library_info() {
        Ok((v, lib)) => println!("cuDNN: {v} ({lib})"),
        Err(e) => println!("cuDNN: not found ({e})"),
    }
    match &gpus {
        Ok(g) if g.is_empty() => println!("GPUs: none"),
        Ok(g) => {
            for d in g {
                println!(
                    "GPU {}: {}, sm_{}{}, {} SMs, {:.1} GiB; {}",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.sm_count,
                    d.total_memory as f64 / (1u64 << 30) as f64,
                    kernels_for(d.compute_capability)
                );
            }
        }
        Err(e) => println!("GPUs: could not list ({e})"),
    }
    0
}

/// What this build runs on a GPU: its arch-table row and the back-end of each op, or why none.
fn kernels_for(cc: (i32, i32)) -> String {
    let Some(t) = graphsafe::arch::target_for_cc(cc) else {
        return "no graphsafe kernels for this GPU".into();
    };
    if !graphsafe::arch::is_built(t) {
        return format!("kernels: {} (not in this build: GRAPHSAFE_CUDA_ARCHS)", t.name);
    }
    let name = |b: Option<&'static str>| b.unwrap_or("none");
    format!("kernels: {} (mla {}, nvfp4 {})", t.name, name(t.mla.map(|b| b.name())), name(t.nvfp4.map(|b| b.name())))
}

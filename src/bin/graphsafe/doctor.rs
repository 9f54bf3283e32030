//! `graphsafe doctor`: what this build contains and what this machine has. A machine without a
//! driver or GPU is a normal answer (exit 0); a driver too old for the CUDA runtime this build
//! bundles is not (exit 1: no kernel could launch).

use graphsafe::build_info::{self, DriverFit};
use graphsafe::driver;

/// The bundled runtime as "13.0", and what it needs of the driver, in words.
fn runtime_requirement() -> Option<(String, String)> {
    let (maj, min) = build_info::runtime_version()?;
    let linux = build_info::min_linux_driver(maj).map(|d| format!(" (Linux driver {d} or newer)")).unwrap_or_default();
    Some((format!("{maj}.{min}"), format!("a driver for CUDA {maj}.0 or newer{linux}")))
}

/// The NVIDIA kernel module's release, e.g. "580.82.07", where the system says it.
fn driver_release() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    let after = line.split("Kernel Module").nth(1)?;
    after.split_whitespace().next().map(str::to_string)
}

/// One line on how the driver fits the runtime; `None` where there is nothing to compare.
fn fit_line(driver: (i32, i32)) -> Option<(DriverFit, String)> {
    let (runtime, needs) = runtime_requirement()?;
    let fit = build_info::driver_fit(driver);
    let (dmaj, dmin) = driver;
    let text = match fit {
        DriverFit::Supported => format!("the driver (CUDA {dmaj}.{dmin}) runs the bundled CUDA {runtime} runtime"),
        DriverFit::MinorVersionCompatible => format!(
            "the driver (CUDA {dmaj}.{dmin}) runs the bundled CUDA {runtime} runtime through CUDA's minor version compatibility (a driver for {runtime} or newer is better)"
        ),
        DriverFit::TooOld => format!(
            "DRIVER TOO OLD: it supports CUDA {dmaj}.{dmin}, and the bundled CUDA {runtime} runtime needs {needs}: every kernel launch would fail (cudaErrorInsufficientDriver); update the driver"
        ),
        DriverFit::NoRuntime => return None,
    };
    Some((fit, text))
}

pub fn run(json: bool) -> i32 {
    let driver_state = match driver::driver_version() {
        Ok((maj, min)) => Ok(format!("CUDA {maj}.{min} ({})", graphsafe::sys::driver::api().map(|a| a.library).unwrap_or("?"))),
        Err(e) => Err(e.to_string()),
    };
    let fit = driver::driver_version().ok().and_then(fit_line);
    let too_old = matches!(fit, Some((DriverFit::TooOld, _)));
    let gpus: Result<Vec<driver::DeviceInfo>, String> = if driver_state.is_ok() {
        driver::device_count()
            .and_then(|n| (0..n).map(|i| driver::Device::get(i)?.info()).collect())
            .map_err(|e| e.to_string())
    } else {
        Ok(Vec::new())
    };
    if json {
        let v = serde_json::json!({
            "schema_version": crate::JSON_SCHEMA_VERSION,
            "version": env!("CARGO_PKG_VERSION"),
            "kernel_archs": build_info::archs(),
            "arch_table": graphsafe::arch::TARGETS.iter().map(|t| {
                let mut row = serde_json::json!({
                    "name": t.name,
                    "runs_on": t.runs_on.iter().map(|&cc| graphsafe::arch::cc_name(cc)).collect::<Vec<_>>(),
                    "gpus": t.gpus,
                    "built": graphsafe::arch::is_built(t),
                });
                // One key per op with back-ends ("mla": "sm100", null where it has no kernel).
                for op in graphsafe::arch::Op::WITH_BACKENDS {
                    row[op.name()] = t.backend(op).map(|b| b.name()).into();
                }
                row
            }).collect::<Vec<_>>(),
            "skipped_units": build_info::skipped_units(),
            "cuda_toolkit": { "version": build_info::CUDA_VERSION, "source": build_info::CUDA_SOURCE },
            "cuda_runtime": match runtime_requirement() {
                Some((v, needs)) => serde_json::json!({"bundled": v, "needs": needs}),
                None => serde_json::Value::Null,
            },
            "cutlass": { "version": build_info::CUTLASS_VERSION, "source": build_info::CUTLASS_SOURCE },
            "driver": match &driver_state { Ok(s) => serde_json::json!({
                                                 "present": true, "version": s, "release": driver_release(),
                                                 "runtime_fit": fit.as_ref().map(|(f, _)| match f {
                                                     DriverFit::Supported => "supported",
                                                     DriverFit::MinorVersionCompatible => "minor_version_compatible",
                                                     DriverFit::TooOld => "too_old",
                                                     DriverFit::NoRuntime => "no_runtime",
                                                 }),
                                                 "runtime_fit_text": fit.as_ref().map(|(_, t)| t) }),
                                             Err(e) => serde_json::json!({"present": false, "reason": e}) },
            "cudnn": match graphsafe::ops::cudnn::library_info() {
                Ok((v, lib)) => serde_json::json!({"present": true, "version": v.to_string(), "library": lib}),
                Err(e) => serde_json::json!({"present": false, "reason": e.to_string()}),
            },
            "gpus": match &gpus { Ok(g) => serde_json::json!(g), Err(e) => serde_json::json!({"error": e}) },
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("plain JSON values serialize"));
        return if too_old { 1 } else { 0 };
    }
    println!("graphsafe {}", env!("CARGO_PKG_VERSION"));
    println!("kernels built for: {}", build_info::archs().join(", "));
    let skipped = build_info::skipped_units();
    if !skipped.is_empty() {
        println!("  left out by GRAPHSAFE_CUDA_ARCHS: {}", skipped.join(", "));
    }
    println!("CUDA toolkit: {} ({})", build_info::CUDA_VERSION, build_info::CUDA_SOURCE);
    println!("CUTLASS: {} ({})", build_info::CUTLASS_VERSION, build_info::CUTLASS_SOURCE);
    match runtime_requirement() {
        Some((v, needs)) => println!("CUDA runtime (bundled with the kernels): {v}, needs {needs}"),
        None => println!("CUDA runtime: none (a build without kernels)"),
    }
    match &driver_state {
        Ok(s) => match driver_release() {
            Some(r) => println!("driver: {s}, NVIDIA {r}"),
            None => println!("driver: {s}"),
        },
        Err(e) => println!("driver: not present ({e})"),
    }
    if let Some((_, text)) = &fit {
        println!("  {text}");
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
    if too_old {
        1
    } else {
        0
    }
}

/// What this build runs on a GPU: its arch-table row and the back-end of each op, or why none.
fn kernels_for(cc: (i32, i32)) -> String {
    let Some(t) = graphsafe::arch::target_for_cc(cc) else {
        return "no graphsafe kernels for this GPU".into();
    };
    if !graphsafe::arch::is_built(t) {
        return format!("kernels: {} (not in this build: GRAPHSAFE_CUDA_ARCHS)", t.name);
    }
    let per_op: Vec<String> = graphsafe::arch::Op::WITH_BACKENDS.iter().map(|&op| format!("{} {}", op.name(), t.backend(op).map_or("none", |b| b.name()))).collect();
    format!("kernels: {} ({})", t.name, per_op.join(", "))
}

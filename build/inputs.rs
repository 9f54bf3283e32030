//! The build script's environment inputs, checked before anything is built: a bad value is a
//! one-line error naming the variable and the values it accepts, never a build that half-works
//! (`GRAPHSAFE_CUDA_ARCHS=","` used to select no arch, compile not even the host-only planning
//! units, and fail at link time as a wall of undefined `gs_*` symbols).
//!
//! Plain functions of the values, with no dependencies, so `tests/build_inputs.rs` includes this
//! file and tests them without running a build.

/// Every arch the kernels are built for, in canonical order.
pub const ALL_ARCHS: &[&str] = &["sm_90a", "sm_100a", "sm_120a"];

/// The archs `GRAPHSAFE_CUDA_ARCHS` selects: all of them when unset or blank, else the listed
/// ones (deduplicated, canonical order, so the same set always hashes the same).
pub fn archs(value: Option<&str>) -> Result<Vec<String>, String> {
    let accepted = format!("a comma-separated subset of {} (or unset for all three)", ALL_ARCHS.join(","));
    let v = match value {
        Some(v) if !v.trim().is_empty() => v,
        _ => return Ok(ALL_ARCHS.iter().map(|s| s.to_string()).collect()),
    };
    let mut out: Vec<String> = Vec::new();
    for a in v.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        if !ALL_ARCHS.contains(&a) {
            return Err(format!("graphsafe: GRAPHSAFE_CUDA_ARCHS={v:?} names unknown arch {a:?}; expected {accepted}"));
        }
        if !out.iter().any(|x| x == a) {
            out.push(a.to_string());
        }
    }
    if out.is_empty() {
        return Err(format!("graphsafe: GRAPHSAFE_CUDA_ARCHS={v:?} selects no arch; expected {accepted}"));
    }
    out.sort_by_key(|a| ALL_ARCHS.iter().position(|x| x == a));
    Ok(out)
}

/// `GRAPHSAFE_OFFLINE`: `1` forbids downloads; unset, empty or `0` allows them. Anything else
/// (`true`, `yes`) is refused rather than silently read as "online".
pub fn offline(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("graphsafe: GRAPHSAFE_OFFLINE={other:?} is not understood; expected 1 (no downloads) or 0/unset")),
    }
}

/// `GRAPHSAFE_BINDINGS` (feature `bindgen`): `write` regenerates the checked-in bindings; unset,
/// empty or `check` compares them and fails on drift.
pub fn bindings_write(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("check") => Ok(false),
        Some("write") => Ok(true),
        Some(other) => Err(format!("graphsafe: GRAPHSAFE_BINDINGS={other:?} is not understood; expected write, check or unset")),
    }
}

/// Every input above, from the environment; the first bad one is the error.
pub fn check_environment() -> Result<(), String> {
    let var = |k: &str| std::env::var(k).ok();
    archs(var("GRAPHSAFE_CUDA_ARCHS").as_deref())?;
    offline(var("GRAPHSAFE_OFFLINE").as_deref())?;
    bindings_write(var("GRAPHSAFE_BINDINGS").as_deref())?;
    Ok(())
}

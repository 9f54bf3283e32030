//! The build script's environment inputs, checked before anything is built: a bad value is a
//! one-line error naming the variable and the values it accepts, never a build that half-works
//! (`GRAPHSAFE_CUDA_ARCHS=","` used to select no arch, compile not even the host-only planning
//! units, and fail at link time as a wall of undefined `gs_*` symbols).
//!
//! Plain functions of the values, depending only on the arch table (`src/arch_table.rs`, itself
//! dependency-free), so `tests/build_inputs.rs` includes both files and tests them without
//! running a build.

use crate::arch_table::{all_target_names, parse_target, target_named, Op, TARGETS};

/// The archs `GRAPHSAFE_CUDA_ARCHS` selects: every row of the arch table (`src/arch_table.rs`)
/// when unset or blank, else the listed ones (deduplicated, in table order, so the same set
/// always hashes the same). A row is named as the table names it (`sm_100f`) or by a compute
/// capability it runs on (`sm_103`, `sm_100a`): the GPU a person has in front of them.
pub fn archs(value: Option<&str>) -> Result<Vec<String>, String> {
    let all = all_target_names();
    let rows: Vec<String> = TARGETS.iter().map(|t| format!("{} ({})", t.name, t.runs_on_names())).collect();
    let accepted = format!("a comma-separated subset of {all} (or unset for all; a GPU's compute capability names its row: {})", rows.join(", "));
    let v = match value {
        Some(v) if !v.trim().is_empty() => v,
        _ => return Ok(TARGETS.iter().map(|t| t.name.to_string()).collect()),
    };
    let mut out: Vec<String> = Vec::new();
    for a in v.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let Some(t) = parse_target(a) else {
            return Err(format!("graphsafe: GRAPHSAFE_CUDA_ARCHS={v:?} names unknown arch {a:?}; expected {accepted}"));
        };
        if !out.iter().any(|x| x == t.name) {
            out.push(t.name.to_string());
        }
    }
    if out.is_empty() {
        return Err(format!("graphsafe: GRAPHSAFE_CUDA_ARCHS={v:?} selects no arch; expected {accepted}"));
    }
    out.sort_by_key(|a| TARGETS.iter().position(|t| t.name == a));
    Ok(out)
}

/// A `// graphsafe-build: archs=` value (build/kernels.rs documents it), resolved to (the rows it selects in table order, its `op:back-end` selectors).
pub fn directive_archs(value: &str) -> Result<(Vec<String>, Vec<String>), String> {
    let mut rows: Vec<&str> = Vec::new();
    let mut backends = Vec::new();
    for sel in value.split(',').filter(|s| !s.is_empty()) {
        let picked: Vec<&str> = match sel.split_once(':') {
            None if sel == "all" => TARGETS.iter().map(|t| t.name).collect(),
            None => vec![target_named(sel).map(|t| t.name).ok_or_else(|| {
                let ops: Vec<String> = Op::WITH_BACKENDS.iter().map(|o| format!("{}:<back-end>", o.name())).collect();
                format!("unknown arch {sel:?} in archs= (the arch table, src/arch_table.rs, has {}; or all, {})", all_target_names(), ops.join(", "))
            })?],
            Some((op, b)) => {
                let ops = Op::WITH_BACKENDS.map(Op::name);
                let op = Op::WITH_BACKENDS.into_iter().find(|o| o.name() == op).ok_or_else(|| format!("unknown op {op:?} in archs={sel} (expected {})", ops.join(" or ")))?;
                let backend = op.backends().find(|x| x.name() == b).ok_or_else(|| {
                    let known: Vec<&str> = op.backends().map(|x| x.name()).collect();
                    format!("unknown {} back-end {b:?} in archs= (expected one of {})", op.name().to_uppercase(), known.join(", "))
                })?;
                backends.push(backend.selector());
                TARGETS.iter().filter(|t| t.backends.contains(&backend)).map(|t| t.name).collect()
            }
        };
        rows.extend(picked);
    }
    if rows.is_empty() {
        return Err(format!("archs={value:?} selects no row of the arch table"));
    }
    let ordered = TARGETS.iter().map(|t| t.name).filter(|n| rows.contains(n)).map(str::to_string).collect();
    Ok((ordered, backends))
}

/// The first back-end a selected row names that no unit implements (`implemented`: every
/// `op:back-end` selector of the directives), as the build's one-line error.
pub fn missing_backend(selected: &[String], implemented: &[String]) -> Option<String> {
    for t in TARGETS.iter().filter(|t| selected.iter().any(|s| s == t.name)) {
        for w in t.backends.iter().map(|b| b.selector()) {
            if !implemented.contains(&w) {
                return Some(format!("graphsafe: src/arch_table.rs gives {} the back-end {w}, but no cuda-src unit says archs={w}", t.name));
            }
        }
    }
    None
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

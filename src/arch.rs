//! GPU targets and dispatch, from one table.
//!
//! The table ([`TARGETS`], `src/arch_table.rs`) is shared with `build.rs`, which compiles every
//! `cuda-src` unit for the rows it selects; everything here answers from the same rows:
//!
//! * running an op ([`mla`], [`nvfp4`], [`target_for`]) looks for a row that runs on the device's
//!   compute capability, has a back-end for the op, **and was built**; otherwise
//!   [`Error::ArchUnsupported`] says which GPUs the op runs on, or which arch the build lacks;
//! * planning ([`plan_mla`], [`plan_nvfp4`], [`mla_for_abi`], [`nvfp4_for_abi`]) is host-only and
//!   works on every build, so it consults the whole table;
//! * [`require_fp4_tensor_cores`] is what cuDNN's NVFP4 engines need, whatever was built;
//! * [`sm_count_of`] and [`gpu_named`] answer for a GPU by name ([`GPUS`]), to plan for a GPU that
//!   is not at hand.
//!
//! A compute capability is served by at most one row; a family row (`sm_100f`) serves several.

#[path = "arch_table.rs"]
mod table;

pub use table::*;

use crate::error::{Error, Result};

/// The rows this build compiled kernels for (`GRAPHSAFE_CUDA_ARCHS`), in table order.
pub fn built() -> impl Iterator<Item = &'static Target> {
    TARGETS.iter().filter(|t| crate::build_info::has_arch(t.name))
}

/// Whether this build has `t`'s kernels.
pub fn is_built(t: &Target) -> bool {
    crate::build_info::has_arch(t.name)
}

/// `"sm_90 (H100, H200, GH200) or sm_100/sm_103 (B200, …)"`: where `op` has a kernel.
pub fn need(op: Op) -> String {
    let rows: Vec<String> = TARGETS.iter().filter(|t| op.runs_on(t)).map(Target::describe).collect();
    match rows.split_last() {
        None => "a GPU graphsafe has kernels for".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// `"sm_120 (RTX 50, …)"`, or just `"sm_89"` for a GPU the table does not know.
fn have(cc: (i32, i32)) -> String {
    match target_for_cc(cc) {
        Some(t) => format!("{} ({})", cc_name(cc), t.gpus),
        None => cc_name(cc),
    }
}

/// The row that runs `op` on compute capability `cc` in this build. `ArchUnsupported` names the
/// GPUs the op runs on when the table has no kernel for it there, or the arch to build when the
/// table has one but `GRAPHSAFE_CUDA_ARCHS` left it out.
pub fn target_for(op: Op, cc: (i32, i32)) -> Result<&'static Target> {
    let unsupported = || Error::ArchUnsupported { op: op.label(), need: need(op), have: have(cc) };
    let t = target_for_cc(cc).filter(|t| op.runs_on(t)).ok_or_else(unsupported)?;
    if !is_built(t) {
        let built: Vec<&str> = built().map(|t| t.name).collect();
        return Err(Error::ArchUnsupported {
            op: op.label(),
            need: format!("a build with {} (GRAPHSAFE_CUDA_ARCHS)", t.name),
            have: format!("{}, built for {}", cc_name(cc), if built.is_empty() { "no arch".into() } else { built.join(",") }),
        });
    }
    Ok(t)
}

/// The MLA back-end that runs on `cc` in this build ([`target_for`]'s errors).
pub fn mla(cc: (i32, i32)) -> Result<MlaArch> {
    let t = target_for(Op::Mla, cc)?;
    t.mla().ok_or_else(|| Error::ArchUnsupported { op: Op::Mla.label(), need: need(Op::Mla), have: have(cc) })
}

/// The NVFP4 back-end that runs on `cc` in this build ([`target_for`]'s errors).
pub fn nvfp4(cc: (i32, i32)) -> Result<Nvfp4Arch> {
    let t = target_for(Op::Nvfp4, cc)?;
    t.nvfp4().ok_or_else(|| Error::ArchUnsupported { op: Op::Nvfp4.label(), need: need(Op::Nvfp4), have: have(cc) })
}

/// `"sm_90 (…), sm_100 (…) or sm_120 (…)"`-style list of what planning accepts for `op`.
fn plan_expected(op: Op) -> String {
    let names: Vec<String> = TARGETS
        .iter()
        .filter(|t| op.runs_on(t))
        .map(|t| format!("{} or {}", t.name, t.runs_on_names()))
        .collect();
    format!("a target with {} kernels: {}", op.label(), names.join("; "))
}

/// Planning: the MLA back-end of the row `name` names ([`parse_target`]: `sm_100f`, `sm_103`,
/// `sm_100a`, …), whether or not this build has it. `InvalidArgument` (`arch`) otherwise.
pub fn plan_mla(name: &str) -> Result<MlaArch> {
    parse_target(name).and_then(|t| t.mla()).ok_or_else(|| Error::invalid("arch", plan_expected(Op::Mla), name))
}

/// Planning: the NVFP4 back-end of the row `name` names, as [`plan_mla`].
pub fn plan_nvfp4(name: &str) -> Result<Nvfp4Arch> {
    parse_target(name).and_then(|t| t.nvfp4()).ok_or_else(|| Error::invalid("arch", plan_expected(Op::Nvfp4), name))
}

/// The C ABI's `arch` argument: a compute capability as `major * 10 + minor` (90, 100, 103, 120,
/// 121; the `GRAPHSAFE_ARCH_SM*` constants are such numbers).
fn target_for_abi(arch: i32) -> Option<&'static Target> {
    if !(10..=999).contains(&arch) {
        return None;
    }
    target_for_cc((arch / 10, arch % 10))
}

/// Planning through the C ABI: the MLA back-end for `arch` (a compute capability × 10 + minor).
pub fn mla_for_abi(arch: i32) -> Result<MlaArch> {
    target_for_abi(arch).and_then(|t| t.mla()).ok_or_else(|| Error::invalid("arch", abi_expected(Op::Mla), arch))
}

/// Planning through the C ABI: the NVFP4 back-end for `arch`, as [`mla_for_abi`].
pub fn nvfp4_for_abi(arch: i32) -> Result<Nvfp4Arch> {
    target_for_abi(arch).and_then(|t| t.nvfp4()).ok_or_else(|| Error::invalid("arch", abi_expected(Op::Nvfp4), arch))
}

fn abi_expected(op: Op) -> String {
    let ccs: Vec<String> = TARGETS
        .iter()
        .filter(|t| op.runs_on(t))
        .flat_map(|t| t.runs_on.iter().map(|&(maj, min)| (maj * 10 + min).to_string()))
        .collect();
    format!("a compute capability x10 with {} kernels ({})", op.label(), ccs.join(", "))
}

/// The GPUs with FP4 tensor cores (what cuDNN's NVFP4 engines need), from the table whatever this
/// build compiled: `ArchUnsupported` for `op` naming them otherwise.
pub fn require_fp4_tensor_cores(op: &'static str, cc: (i32, i32)) -> Result<()> {
    let fp4 = |t: &Target| t.nvfp4().is_some_and(Nvfp4Arch::fp4_tensor_cores);
    if target_for_cc(cc).is_some_and(fp4) {
        return Ok(());
    }
    let rows: Vec<String> = TARGETS.iter().filter(|t| fp4(t)).map(Target::describe).collect();
    Err(Error::ArchUnsupported { op, need: format!("a Blackwell GPU (FP4 tensor cores): {}", rows.join(" or ")), have: cc_name(cc) })
}

/// `"RTX 5090"`, `"NVIDIA GeForce RTX 5090"`, `"rtx-5090"` → `"rtx5090"`: a name as [`gpu_named`]
/// compares it (case, spaces, `-`, `_` and the vendor's prefixes do not matter).
fn gpu_key(name: &str) -> String {
    let mut k: String = name.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect();
    for prefix in ["nvidia", "geforce"] {
        if let Some(rest) = k.strip_prefix(prefix) {
            k = rest.to_string();
        }
    }
    k
}

/// The GPU of [`GPUS`] called `name` (its name or an alias; case, spaces, hyphens and an
/// "NVIDIA"/"GeForce" prefix do not matter).
///
/// ```
/// let gpu = graphsafe::arch::gpu_named("NVIDIA H200").unwrap();
/// assert_eq!((gpu.compute_capability, gpu.sm_count), ((9, 0), 132));
/// assert!(graphsafe::arch::gpu_named("H300").is_none());
/// ```
pub fn gpu_named(name: &str) -> Option<&'static Gpu> {
    let key = gpu_key(name);
    GPUS.iter().find(|g| gpu_key(g.name) == key || g.aliases.iter().any(|a| gpu_key(a) == key))
}

/// The names [`gpu_named`] knows, comma separated (for messages).
pub fn gpu_names() -> String {
    GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
}

/// The SM count of the GPU called `name` (the planners' `sm_count`); an unknown name is refused
/// with every name known ([`Error::InvalidArgument`], `gpu`).
///
/// ```
/// use graphsafe::arch::sm_count_of;
/// assert_eq!(sm_count_of("H200")?, 132);
/// assert_eq!(sm_count_of("B200")?, 148);
/// assert_eq!(sm_count_of("RTX 5090")?, 170);
/// assert!(sm_count_of("Voodoo 2").is_err());
/// # Ok::<(), graphsafe::Error>(())
/// ```
pub fn sm_count_of(name: &str) -> Result<u32> {
    gpu_named(name)
        .map(|g| g.sm_count)
        .ok_or_else(|| Error::invalid("gpu", format!("a GPU graphsafe knows by name ({}), or its SM count given explicitly", gpu_names()), name))
}

impl Backend {
    /// The rows that run it, comma separated (`"sm_100f"`): what a build needs for it.
    pub fn targets(self) -> String {
        self.rows().map(|t| t.name).collect::<Vec<_>>().join(",")
    }

    /// The GPUs it runs on: `"sm_100/sm_103 (B200, GB200, B300, GB300)"`.
    pub fn gpus(self) -> String {
        self.rows().map(Target::describe).collect::<Vec<_>>().join(" or ")
    }

    fn rows(self) -> impl Iterator<Item = &'static Target> {
        TARGETS.iter().filter(move |t| t.backends.contains(&self))
    }
}

impl MlaArch {
    /// The rows this back-end runs on, comma separated (`"sm_100f"`): what a build needs for it.
    pub fn targets(self) -> String {
        Backend::Mla(self).targets()
    }

    /// The GPUs it runs on: `"sm_100/sm_103 (B200, GB200, B300, GB300)"`.
    pub fn gpus(self) -> String {
        Backend::Mla(self).gpus()
    }
}

impl Nvfp4Arch {
    /// The rows this back-end runs on, comma separated: what a build needs for it.
    pub fn targets(self) -> String {
        Backend::Nvfp4(self).targets()
    }

    /// The GPUs it runs on: `"sm_120/sm_121 (RTX 50, RTX PRO Blackwell, DGX Spark)"`.
    pub fn gpus(self) -> String {
        Backend::Nvfp4(self).gpus()
    }
}

/// Serialized as its [`MlaArch::name`] (`"sm100"`), as the derived form did before the table.
impl serde::Serialize for MlaArch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_unit_variant("MlaArch", *self as u32, self.name())
    }
}

/// Serialized as its [`Nvfp4Arch::name`] (`"sm120"`).
impl serde::Serialize for Nvfp4Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_unit_variant("Nvfp4Arch", *self as u32, self.name())
    }
}

/// Parses any name [`plan_nvfp4`] accepts (`sm_90`, `sm_100f`, `sm_103`, `sm_121`, …).
impl std::str::FromStr for Nvfp4Arch {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        plan_nvfp4(s)
    }
}

/// Parses any name [`plan_mla`] accepts (`sm_90`, `sm_100f`, `sm_103`, …).
impl std::str::FromStr for MlaArch {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        plan_mla(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_compute_capability_is_in_two_rows_and_names_are_unique() {
        let mut ccs: Vec<(i32, i32)> = TARGETS.iter().flat_map(|t| t.runs_on.iter().copied()).collect();
        let n = ccs.len();
        ccs.sort();
        ccs.dedup();
        assert_eq!(ccs.len(), n, "a compute capability in two rows");
        for (i, t) in TARGETS.iter().enumerate() {
            assert!(TARGETS[..i].iter().all(|u| u.name != t.name), "{} twice", t.name);
            assert!(!t.runs_on.is_empty() && !t.gencode.is_empty(), "{}", t.name);
            // The SASS nvcc writes is the row's name, so build_info, cfgs and cuobjdump agree.
            assert!(t.gencode.iter().all(|g| g.ends_with(&format!("code={}", t.name))), "{}", t.name);
            // Every compute capability it runs on parses back to it.
            for &cc in t.runs_on {
                assert_eq!(parse_target(&cc_name(cc)), Some(t));
            }
        }
    }

    #[test]
    fn every_back_end_has_a_row_and_every_row_one_back_end_per_op() {
        for b in Backend::ALL {
            assert!(!b.targets().is_empty(), "{b:?}");
            assert!(Op::WITH_BACKENDS.contains(&b.op()), "{b:?}");
            assert_eq!(Backend::from_selector(&b.selector()), Some(b));
        }
        // Backend::ALL is every op enum's ALL, each once.
        let mut all: Vec<Backend> = MlaArch::ALL.map(Backend::Mla).into_iter().chain(Nvfp4Arch::ALL.map(Backend::Nvfp4)).collect();
        assert_eq!(Backend::ALL.to_vec(), all);
        all.dedup();
        assert_eq!(all.len(), Backend::ALL.len());
        for t in TARGETS {
            for op in Op::WITH_BACKENDS {
                assert!(t.backends.iter().filter(|b| b.op() == op).count() <= 1, "{}: two {} back-ends", t.name, op.name());
            }
            assert_eq!(t.mla().map(Backend::Mla), t.backend(Op::Mla), "{}", t.name);
            assert_eq!(t.nvfp4().map(Backend::Nvfp4), t.backend(Op::Nvfp4), "{}", t.name);
        }
        assert_eq!(Backend::from_selector("mla:sm120"), None);
    }

    #[test]
    fn every_back_end_has_sass_checks_that_survive_the_manifest() {
        for b in Backend::ALL {
            assert!(b.sass().iter().any(|c| c.mma && c.min > 0), "{b:?}: no check for tensor-core MMA (a trap body would pass)");
        }
        for c in Backend::ALL.iter().flat_map(|b| b.sass()).chain(EVERY_ROW_SASS) {
            // Tab-separated in the build manifest, then an `awk -v` value (which reads backslashes).
            for field in [c.what, c.kernel] {
                assert!(!field.is_empty() && !field.contains(['\t', '\n', '\\']), "{c:?}");
            }
        }
    }

    #[test]
    fn names_people_type_find_their_row() {
        let name = |s: &str| parse_target(s).map(|t| t.name);
        assert_eq!(name("sm_90a"), Some("sm_90a"));
        assert_eq!(name("sm_90"), Some("sm_90a"));
        assert_eq!(name("sm90"), Some("sm_90a"));
        assert_eq!(name("90"), Some("sm_90a"));
        // Arch-specific spellings of the family's GPUs (the names before the family rows).
        assert_eq!(name("sm_100a"), Some("sm_100f"));
        assert_eq!(name("sm_120a"), Some("sm_120f"));
        // The GPUs the family targets add: B300 and DGX Spark.
        assert_eq!(name("sm_103"), Some("sm_100f"));
        assert_eq!(name("sm_103a"), Some("sm_100f"));
        assert_eq!(name("sm_121"), Some("sm_120f"));
        assert_eq!(name(" sm_100f "), Some("sm_100f"));
        for bad in ["", "sm_", "sm_1000", "sm_10x", "all", "sm_9"] {
            assert_eq!(name(bad), None, "{bad:?}");
        }
        // Every compute capability no row runs on finds nothing, in each spelling (taken from the
        // table, so that a new row never turns one of them into a supported GPU here).
        for cc in (1..=15).flat_map(|major| (0..=9).map(move |minor| (major, minor))).filter(|&cc| target_for_cc(cc).is_none()) {
            let n = cc_name(cc);
            for spelling in [n.clone(), format!("{n}a"), format!("{n}f"), n.replace('_', ""), n[3..].to_string()] {
                assert_eq!(name(&spelling), None, "{spelling}");
            }
        }
        assert_eq!(target_for_cc(cc_without_row()), None);
    }

    #[test]
    fn planning_takes_every_row_and_refuses_an_op_where_it_has_no_kernel() {
        assert_eq!(plan_mla("sm_90").unwrap(), MlaArch::Sm90);
        assert_eq!(plan_mla("sm_103").unwrap(), MlaArch::Sm100);
        assert_eq!(plan_nvfp4("sm_121").unwrap(), Nvfp4Arch::Sm120);
        assert_eq!("sm_100f".parse::<Nvfp4Arch>().unwrap(), Nvfp4Arch::Sm100);
        // A GPU MLA has no kernel for: refused, naming every target it does have and no other.
        let no_mla = cc_name(cc_without(Op::Mla));
        match plan_mla(&no_mla) {
            Err(Error::InvalidArgument { what, expected, got }) => {
                assert_eq!((what.as_str(), got.as_str()), ("arch", no_mla.as_str()));
                for t in TARGETS {
                    assert_eq!(expected.contains(&format!("{} or", t.name)), t.mla().is_some(), "{}: {expected}", t.name);
                }
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(mla_for_abi(100).unwrap(), MlaArch::Sm100);
        assert_eq!(mla_for_abi(103).unwrap(), MlaArch::Sm100);
        assert_eq!(nvfp4_for_abi(121).unwrap(), Nvfp4Arch::Sm120);
        // Refused: numbers that are no compute capability, one no row runs on, and every
        // compute capability of the rows without an MLA kernel.
        let abi = |(major, minor): (i32, i32)| major * 10 + minor;
        let no_mla = TARGETS.iter().filter(|t| t.mla().is_none()).flat_map(|t| t.runs_on.iter().copied().map(abi));
        for bad in [0, -1, 1000, i32::MIN, i32::MAX, abi(cc_without_row())].into_iter().chain(no_mla) {
            assert!(matches!(mla_for_abi(bad), Err(Error::InvalidArgument { .. })), "{bad}");
        }
        assert!(matches!(nvfp4_for_abi(abi(cc_without_row())), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn running_names_the_gpus_or_the_missing_build() {
        // A GPU MLA has no kernel for: the refusal names the GPUs of every row with one, and this
        // GPU with the table's name for it where it has a row.
        let no_mla = cc_without(Op::Mla);
        match mla(no_mla) {
            Err(Error::ArchUnsupported { op, need, have }) => {
                assert_eq!(op, "mla decode");
                for t in TARGETS.iter().filter(|t| t.mla().is_some()) {
                    assert!(need.contains(&t.describe()), "{need} does not name {}", t.name);
                }
                assert!(have.starts_with(&cc_name(no_mla)), "{have}");
                if let Some(t) = target_for_cc(no_mla) {
                    assert!(have.contains(t.gpus), "{have}");
                }
            }
            other => panic!("{other:?}"),
        }
        let unknown = cc_without_row();
        assert!(matches!(nvfp4(unknown), Err(Error::ArchUnsupported { have, .. }) if have == cc_name(unknown)));
        for t in TARGETS {
            for &cc in t.runs_on {
                let r = target_for(Op::Kernels, cc);
                if is_built(t) {
                    assert_eq!(r.unwrap(), t);
                } else {
                    match r {
                        Err(Error::ArchUnsupported { need, .. }) => assert!(need.contains(t.name), "{need}"),
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn the_plan_default_runs_every_op() {
        let t = target_named(PLAN_DEFAULT).unwrap_or_else(|| panic!("{PLAN_DEFAULT} is no row"));
        for op in Op::WITH_BACKENDS {
            assert!(op.runs_on(t), "{}: no {} kernel for `graphsafe plan {}` to default to", t.name, op.label(), op.name());
        }
    }

    #[test]
    fn cc_without_an_op_has_no_kernel_for_it() {
        for op in Op::WITH_BACKENDS.into_iter().chain([Op::Kernels]) {
            let cc = cc_without(op);
            assert!(!target_for_cc(cc).is_some_and(|t| op.runs_on(t)), "{}: {}", op.name(), cc_name(cc));
        }
        // Every row builds the arch-neutral kernels: only a GPU with no row lacks them.
        assert_eq!(cc_without(Op::Kernels), cc_without_row());
    }

    #[test]
    fn fp4_tensor_cores_are_the_blackwell_rows() {
        for cc in [(10, 0), (10, 3), (12, 0), (12, 1)] {
            assert!(require_fp4_tensor_cores("x", cc).is_ok(), "{cc:?}");
        }
        // Hopper's rows, and a GPU no row runs on.
        let without: Vec<(i32, i32)> =
            TARGETS.iter().filter(|t| !t.nvfp4().is_some_and(Nvfp4Arch::fp4_tensor_cores)).flat_map(|t| t.runs_on.iter().copied()).chain([cc_without_row()]).collect();
        assert!(without.contains(&(9, 0)), "{without:?}");
        for cc in without {
            match require_fp4_tensor_cores("x", cc) {
                Err(Error::ArchUnsupported { need, have, .. }) => {
                    assert!(need.contains("Blackwell") && need.contains("sm_100/sm_103") && need.contains("sm_120/sm_121"), "{need}");
                    assert_eq!(have, cc_name(cc));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn every_row_plans_for_its_reference_gpu_and_every_gpu_has_a_row() {
        for t in TARGETS {
            let g = gpu_named(t.reference_gpu).unwrap_or_else(|| panic!("{}: {} is not in GPUS", t.name, t.reference_gpu));
            assert_eq!(g.sm_count, t.sm_count, "{}", t.name);
            assert!(t.runs_on.contains(&g.compute_capability), "{}", t.name);
        }
        for (i, g) in GPUS.iter().enumerate() {
            assert!(target_for_cc(g.compute_capability).is_some(), "{} has no row", g.name);
            assert!(g.sm_count > 0);
            // No name (or alias) finds two GPUs.
            for n in std::iter::once(&g.name).chain(g.aliases) {
                assert_eq!(gpu_named(n), Some(g), "{n}");
                assert!(GPUS[..i].iter().all(|o| gpu_key(o.name) != gpu_key(n)), "{n} twice");
            }
        }
    }

    #[test]
    fn sm_counts_by_the_names_people_type() {
        assert_eq!(sm_count_of("H200").unwrap(), 132);
        assert_eq!(sm_count_of("h100 pcie").unwrap(), 114);
        assert_eq!(sm_count_of("NVIDIA GeForce RTX 5090").unwrap(), 170);
        assert_eq!(sm_count_of("rtx-5070-ti").unwrap(), 70);
        assert_eq!(sm_count_of("GB10").unwrap(), 48);
        match sm_count_of("RTX 4090") {
            Err(Error::InvalidArgument { what, expected, got }) => {
                assert_eq!((what.as_str(), got.as_str()), ("gpu", "RTX 4090"));
                for g in GPUS {
                    assert!(expected.contains(g.name), "{expected} does not list {}", g.name);
                }
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn back_ends_serialize_as_before() {
        assert_eq!(serde_json::to_string(&MlaArch::Sm100).unwrap(), "\"sm100\"");
        assert_eq!(serde_json::to_string(&Nvfp4Arch::Sm90).unwrap(), "\"sm90\"");
        assert_eq!(serde_json::to_string(&Nvfp4Arch::Sm120).unwrap(), "\"sm120\"");
    }
}

//! The one table of GPU targets: every arch graphsafe compiles kernels for, the compute
//! capabilities its SASS runs on, and which back-end each op uses there (in the spirit of
//! CUTLASS's `arch_mappings.h`).
//!
//! This file has no dependencies on purpose: `build.rs` includes it with `#[path]` to pick the
//! nvcc targets, validate `GRAPHSAFE_CUDA_ARCHS` and the `// graphsafe-build: archs=` directives
//! of `cuda-src/`, and emit the `graphsafe_arch` / `graphsafe_mla` / `graphsafe_nvfp4` cfgs; the
//! crate re-exports it as [`crate::arch`], whose lookups drive run-time dispatch, the planners'
//! arch arguments (CLI and C ABI) and `graphsafe doctor`. Both sides read the same rows, so the
//! build and the dispatch cannot disagree about what runs where.
//!
//! Back-ends are registered here as data: each row lists its [`Backend`]s, and every reader
//! (cfgs, directives, the build manifest and `scripts/check-sass`, dispatch, planning, the CLI's
//! help and errors, `graphsafe doctor`) iterates them instead of naming rows. Adding a GPU whose
//! kernels an existing back-end has is a row here (and its reference GPU in [`GPUS`] if that is
//! new), and nothing else (the README lists back-ends, not rows): `scripts/check-arch-row` proves
//! it by adding the row to a scratch copy of the repository and building and testing that. A new
//! back-end is also a variant of its op's enum with its SASS checks ([`Backend::sass`]), the
//! `cuda-src` units that say `archs=<op>:<it>`, its launch arm in `src/sys/glue/` and its line in
//! the README's back-end table (`tests/readme_gpus.rs`).

/// What a kernel lookup is for: one op with a back-end per row (a column of [`TARGETS`]), or the
/// arch-neutral kernels every row builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// MLA decode ([`MlaArch`]).
    Mla,
    /// NVFP4 GEMM ([`Nvfp4Arch`]).
    Nvfp4,
    /// The arch-neutral kernels every row builds (MLA sanitizer and GPU reference, NVFP4
    /// quantize, the graph-safety test kernels).
    Kernels,
}

impl Op {
    /// The ops whose kernel depends on the row: each is a column of the table, a cfg
    /// (`graphsafe_mla`), a directive selector (`archs=mla:sm100`) and a field of the build
    /// manifest (`mla=sm100`). Everything that lists back-ends iterates this, so a new op is a
    /// variant here and in [`Backend`], not a new arm in every reader.
    pub const WITH_BACKENDS: [Op; 2] = [Op::Mla, Op::Nvfp4];

    /// Its name in cfgs (`graphsafe_mla`), directives (`archs=mla:sm100`), the build manifest and
    /// `graphsafe doctor --json`.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Mla => "mla",
            Op::Nvfp4 => "nvfp4",
            Op::Kernels => "kernels",
        }
    }

    /// The name errors give it.
    pub const fn label(self) -> &'static str {
        match self {
            Op::Mla => "mla decode",
            Op::Nvfp4 => "nvfp4 gemm",
            Op::Kernels => "graphsafe kernels",
        }
    }

    /// Its back-ends, in [`Backend::ALL`] order (none for [`Op::Kernels`]).
    pub fn backends(self) -> impl Iterator<Item = Backend> {
        Backend::ALL.into_iter().filter(move |b| b.op() == self)
    }

    /// Whether `t` has a kernel for this op.
    pub fn runs_on(self, t: &Target) -> bool {
        self == Op::Kernels || t.backend(self).is_some()
    }
}

/// MLA decode back-ends: a kernel family, not a GPU (every row naming one runs the same code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlaArch {
    /// Hopper: graphsafe's split-KV kernel + combine (bf16/fp16, pages of 64 or 128).
    Sm90,
    /// Blackwell datacenter: CUTLASS 4.2's kernel (bf16/fp16/fp8, 128 heads, pages ≤ 128, power of two).
    Sm100,
}

impl MlaArch {
    /// Every MLA back-end.
    pub const ALL: [MlaArch; 2] = [MlaArch::Sm90, MlaArch::Sm100];

    /// Its name in cfgs (`graphsafe_mla = "sm100"`), directives (`archs=mla:sm100`) and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            MlaArch::Sm90 => "sm90",
            MlaArch::Sm100 => "sm100",
        }
    }
}

/// NVFP4 GEMM back-ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nvfp4Arch {
    /// Hopper: weight-only FP4 GEMM (bf16 activations).
    Sm90,
    /// Blackwell datacenter: CUTLASS block-scaled GEMM (tcgen05).
    Sm100,
    /// Blackwell GeForce / workstation / DGX Spark: CUTLASS block-scaled GEMM (warp-level MMA).
    Sm120,
}

impl Nvfp4Arch {
    /// Every NVFP4 back-end.
    pub const ALL: [Nvfp4Arch; 3] = [Nvfp4Arch::Sm90, Nvfp4Arch::Sm100, Nvfp4Arch::Sm120];

    /// Its name in cfgs (`graphsafe_nvfp4 = "sm120"`), directives (`archs=nvfp4:sm120`) and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Nvfp4Arch::Sm90 => "sm90",
            Nvfp4Arch::Sm100 => "sm100",
            Nvfp4Arch::Sm120 => "sm120",
        }
    }

    /// Whether the GPUs it serves have FP4 tensor cores (block-scaled MMA), which is what cuDNN's
    /// NVFP4 engines need too.
    pub const fn fp4_tensor_cores(self) -> bool {
        !matches!(self, Nvfp4Arch::Sm90)
    }
}

/// One op's back-end: what a row of [`TARGETS`] lists for each op it has a kernel for. The build
/// emits one cfg per back-end its rows run (`graphsafe_mla = "sm100"`), the `cuda-src` units
/// that implement it say so (`archs=mla:sm100`), and run-time dispatch matches on the op's own
/// enum ([`MlaArch`], [`Nvfp4Arch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// An MLA decode back-end.
    Mla(MlaArch),
    /// An NVFP4 GEMM back-end.
    Nvfp4(Nvfp4Arch),
}

impl Backend {
    /// Every back-end of every op: each op's `ALL`, in [`Op::WITH_BACKENDS`] order.
    pub const ALL: [Backend; MlaArch::ALL.len() + Nvfp4Arch::ALL.len()] = {
        let mut all = [Backend::Mla(MlaArch::Sm90); MlaArch::ALL.len() + Nvfp4Arch::ALL.len()];
        let mut i = 0;
        while i < MlaArch::ALL.len() {
            all[i] = Backend::Mla(MlaArch::ALL[i]);
            i += 1;
        }
        let mut j = 0;
        while j < Nvfp4Arch::ALL.len() {
            all[i + j] = Backend::Nvfp4(Nvfp4Arch::ALL[j]);
            j += 1;
        }
        all
    };

    /// The op it runs.
    pub const fn op(self) -> Op {
        match self {
            Backend::Mla(_) => Op::Mla,
            Backend::Nvfp4(_) => Op::Nvfp4,
        }
    }

    /// Its name among the op's back-ends (`"sm100"`): the cfg's value, and JSON's.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Mla(b) => b.name(),
            Backend::Nvfp4(b) => b.name(),
        }
    }

    /// `"mla:sm100"`: how a `// graphsafe-build: archs=` directive selects the rows that run it.
    pub fn selector(self) -> String {
        format!("{}:{}", self.op().name(), self.name())
    }

    /// The back-end a selector names (`"mla:sm100"`), if any.
    pub fn from_selector(s: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.selector() == s)
    }

    /// What `scripts/check-sass` requires of its kernels in the SASS of every row that runs it
    /// (through the build manifest, `build/kernels.rs`). Never empty, and at least one check
    /// requires tensor-core MMA: a CUTLASS kernel compiled without CUTLASS's arch macros still
    /// links, but is a trap body with none.
    pub const fn sass(self) -> &'static [SassCheck] {
        match self {
            // N: 2 widths x bf16/fp16; N8: 2 widths x 2 fp8 formats; seesaw: bf16, fp16, the 656-byte
            // format unpaired and paired; seesaw RS: the per-tensor fp8 format.
            Backend::Mla(MlaArch::Sm90) => &[SassCheck { what: "sm90 MLA decode kernels", kernel: "mla_sm90_(n|n8|seesaw|seesaw_rs)_kernel", min: 13, mma: true }],
            Backend::Mla(MlaArch::Sm100) => SM100_MLA_SASS,
            Backend::Nvfp4(Nvfp4Arch::Sm90) => &[SassCheck { what: "W4A16 GEMM kernels", kernel: "w4a16_gemm_kernel", min: 1, mma: true }],
            // 3 tiles x bf16/fp16 outputs.
            Backend::Nvfp4(Nvfp4Arch::Sm100) => {
                &[SassCheck { what: "NVFP4 GEMMs", kernel: "GemmUniversal.*MainloopSm100TmaUmmaWarpSpecializedBlockScaled", min: 6, mma: true }]
            }
            // 2 tiles x bf16/fp16 outputs.
            Backend::Nvfp4(Nvfp4Arch::Sm120) => {
                &[SassCheck { what: "NVFP4 GEMMs", kernel: "GemmUniversal.*MainloopSm120TmaWarpSpecializedBlockScaled", min: 4, mma: true }]
            }
        }
    }
}

/// A kernel requirement `scripts/check-sass` checks in the SASS of a row: at least `min`
/// kernels whose mangled name matches `kernel` (an awk extended regular expression: no tab,
/// newline or backslash, as it travels in the tab-separated build manifest and through
/// `awk -v`), each with tensor-core MMA instructions (`UTC*MMA`, `OMMA`, `HGMMA`, …) when `mma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SassCheck {
    /// What the kernels are, for the report.
    pub what: &'static str,
    /// The pattern their mangled names match.
    pub kernel: &'static str,
    /// How many kernels must match, at least.
    pub min: u32,
    /// Whether every matching kernel must contain tensor-core MMA instructions.
    pub mma: bool,
}

/// CUTLASS's sm100 MLA kernel: its 12 instantiations (element type x {persistent, individual}
/// tile scheduler x {TMA, cp.async} loader: `kIsCpAsync` is `Lb0`/`Lb1` in the mangled name),
/// each present, all with tcgen05 MMA (UTCHMMA), and the split-KV reduction kernels.
const SM100_MLA_SASS: &[SassCheck] = &[
    SassCheck { what: "MLA kernels", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized", min: 12, mma: true },
    SassCheck { what: "MLA reduction kernels", kernel: "Sm100FmhaMlaReductionKernel", min: 2, mma: false },
    SassCheck { what: "MLA kernel bf16/persistent/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_10bfloat16_tEfSC_fNS2_.*Sm100MlaPersistentTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel bf16/persistent/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_10bfloat16_tEfSC_fNS2_.*Sm100MlaPersistentTileSchedulerELb1E", min: 1, mma: true },
    SassCheck { what: "MLA kernel bf16/individual/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_10bfloat16_tEfSC_fNS2_.*Sm100MlaIndividualTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel bf16/individual/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_10bfloat16_tEfSC_fNS2_.*Sm100MlaIndividualTileSchedulerELb1E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp16/persistent/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_6half_tEfSC_fNS2_.*Sm100MlaPersistentTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp16/persistent/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_6half_tEfSC_fNS2_.*Sm100MlaPersistentTileSchedulerELb1E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp16/individual/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_6half_tEfSC_fNS2_.*Sm100MlaIndividualTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp16/individual/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_6half_tEfSC_fNS2_.*Sm100MlaIndividualTileSchedulerELb1E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp8/persistent/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_12float_e4m3_tEfNS_10bfloat16_tEfNS2_.*Sm100MlaPersistentTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp8/persistent/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_12float_e4m3_tEfNS_10bfloat16_tEfNS2_.*Sm100MlaPersistentTileSchedulerELb1E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp8/individual/TMA", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_12float_e4m3_tEfNS_10bfloat16_tEfNS2_.*Sm100MlaIndividualTileSchedulerELb0E", min: 1, mma: true },
    SassCheck { what: "MLA kernel fp8/individual/cp.async", kernel: "Sm100FmhaMlaKernelTmaWarpspecialized.*NS_12float_e4m3_tEfNS_10bfloat16_tEfNS2_.*Sm100MlaIndividualTileSchedulerELb1E", min: 1, mma: true },
];

/// What `scripts/check-sass` requires in the SASS of every row, whatever its back-ends: the
/// arch-neutral MLA sanitize pre-pass and post-pass (`archs=all`).
pub const EVERY_ROW_SASS: &[SassCheck] = &[
    SassCheck { what: "MLA sanitize pre-pass", kernel: "mla_sanitize_kernel", min: 1, mma: false },
    SassCheck { what: "MLA sanitize post-pass", kernel: "mla_sanitize_finish_kernel", min: 1, mma: false },
];

/// One compile target: a row of [`TARGETS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// nvcc's name for the SASS (`code=`): the value of `GRAPHSAFE_CUDA_ARCHS`, of the
    /// `// graphsafe-build: archs=` directives and of the `graphsafe_arch` cfg, and what
    /// `build_info::archs()` and `cuobjdump` (`arch = …`) report.
    pub name: &'static str,
    /// nvcc `-gencode=` values (each becomes one `-gencode=<value>` flag).
    pub gencode: &'static [&'static str],
    /// The compute capabilities this SASS runs on: several for a family target (`sm_100f`: any
    /// GPU of the sm_100 family). No compute capability is in two rows.
    pub runs_on: &'static [(i32, i32)],
    /// The GPUs, for messages.
    pub gpus: &'static str,
    /// The GPU planners assume for the row when given no SM count (a name in [`GPUS`]).
    pub reference_gpu: &'static str,
    /// The back-end of each op that has a kernel here, at most one per op; an op missing from
    /// the list has no kernel on this row.
    pub backends: &'static [Backend],
    /// The oldest CUDA toolkit whose nvcc compiles this target (family targets came in 12.9);
    /// `build/toolchain.rs` refuses an older one for a build that selects the row.
    pub min_cuda: (u32, u32),
    /// SMs of [`Target::reference_gpu`]: what planners assume when asked to plan for the row
    /// without an SM count (`graphsafe plan … --arch …`).
    pub sm_count: u32,
}

impl Target {
    /// The back-end `op` runs here, `None` where it has no kernel.
    pub fn backend(&self, op: Op) -> Option<Backend> {
        self.backends.iter().copied().find(|b| b.op() == op)
    }

    /// The MLA decode back-end here, `None` where MLA has no kernel.
    pub fn mla(&self) -> Option<MlaArch> {
        self.backends.iter().find_map(|b| match *b {
            Backend::Mla(m) => Some(m),
            _ => None,
        })
    }

    /// The NVFP4 GEMM back-end here, `None` where NVFP4 has no kernel.
    pub fn nvfp4(&self) -> Option<Nvfp4Arch> {
        self.backends.iter().find_map(|b| match *b {
            Backend::Nvfp4(n) => Some(n),
            _ => None,
        })
    }
}

/// Every target, in canonical order (the default build builds all of them; `GRAPHSAFE_CUDA_ARCHS`
/// narrows it). Every row also builds the arch-neutral kernels (`archs=all`: MLA sanitizer and
/// GPU reference, NVFP4 quantize, the graph-safety test kernels).
///
/// The Blackwell rows are family targets (CUDA 12.9+): `sm_100f` SASS runs on B200/GB200
/// (sm_100) and B300/GB300 (sm_103), `sm_120f` on RTX 50 / RTX PRO (sm_120) and DGX Spark
/// (sm_121). CUTLASS 4.2 enables its tcgen05 and block-scaled paths for them
/// (`CUTLASS_ARCH_MMA_SM100F_ENABLED` / `SM120F_ENABLED`), and the kernels compile to the same
/// instructions as for `sm_100a` / `sm_120a` (docs/ARCHITECTURE.md, "Kernels per arch").
pub const TARGETS: &[Target] = &[
    Target {
        name: "sm_90a",
        gencode: &["arch=compute_90a,code=sm_90a"],
        runs_on: &[(9, 0)],
        gpus: "H100, H200, GH200",
        reference_gpu: "H100",
        backends: &[Backend::Mla(MlaArch::Sm90), Backend::Nvfp4(Nvfp4Arch::Sm90)],
        min_cuda: (12, 0),
        sm_count: 132,
    },
    Target {
        name: "sm_100f",
        gencode: &["arch=compute_100f,code=sm_100f"],
        runs_on: &[(10, 0), (10, 3)],
        gpus: "B200, GB200, B300, GB300",
        reference_gpu: "B200",
        backends: &[Backend::Mla(MlaArch::Sm100), Backend::Nvfp4(Nvfp4Arch::Sm100)],
        min_cuda: (12, 9),
        sm_count: 148,
    },
    Target {
        name: "sm_120f",
        gencode: &["arch=compute_120f,code=sm_120f"],
        runs_on: &[(12, 0), (12, 1)],
        gpus: "RTX 50, RTX PRO Blackwell, DGX Spark",
        reference_gpu: "RTX 5090",
        backends: &[Backend::Nvfp4(Nvfp4Arch::Sm120)],
        min_cuda: (12, 9),
        sm_count: 170,
    },
];

/// A GPU by the name people use for it, for planning without the GPU at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its name, as NVIDIA markets it (without "NVIDIA" or "GeForce").
    pub name: &'static str,
    /// Other names it goes by.
    pub aliases: &'static [&'static str],
    /// Its compute capability.
    pub compute_capability: (i32, i32),
    /// Its SM count (what the driver reports as `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`, and
    /// what the planners' `sm_count` means).
    pub sm_count: u32,
}

/// The GPUs graphsafe knows by name: the reference GPU of every row of [`TARGETS`], and the other
/// GPUs of those rows whose SM counts NVIDIA's specifications fix (a Blackwell SM has 128 CUDA
/// cores, so e.g. the RTX 5090's 21,760 cores are 170 SMs). GPUs missing here are planned with
/// their SM count given explicitly (`graphsafe doctor` reports it).
pub const GPUS: &[Gpu] = &[
    Gpu { name: "H100", aliases: &["H100 SXM", "H100 SXM5"], compute_capability: (9, 0), sm_count: 132 },
    Gpu { name: "H100 PCIe", aliases: &[], compute_capability: (9, 0), sm_count: 114 },
    Gpu { name: "H200", aliases: &["H200 SXM"], compute_capability: (9, 0), sm_count: 132 },
    Gpu { name: "GH200", aliases: &[], compute_capability: (9, 0), sm_count: 132 },
    Gpu { name: "B200", aliases: &[], compute_capability: (10, 0), sm_count: 148 },
    Gpu { name: "GB200", aliases: &[], compute_capability: (10, 0), sm_count: 148 },
    Gpu { name: "RTX 5090", aliases: &[], compute_capability: (12, 0), sm_count: 170 },
    Gpu { name: "RTX 5080", aliases: &[], compute_capability: (12, 0), sm_count: 84 },
    Gpu { name: "RTX 5070 Ti", aliases: &[], compute_capability: (12, 0), sm_count: 70 },
    Gpu { name: "RTX 5070", aliases: &[], compute_capability: (12, 0), sm_count: 48 },
    Gpu { name: "RTX PRO 6000 Blackwell", aliases: &["RTX PRO 6000"], compute_capability: (12, 0), sm_count: 188 },
    Gpu { name: "DGX Spark", aliases: &["GB10"], compute_capability: (12, 1), sm_count: 48 },
];

/// The row whose SASS runs on compute capability `cc`.
pub fn target_for_cc(cc: (i32, i32)) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.runs_on.contains(&cc))
}

/// The row named `name` exactly (`"sm_100f"`).
pub fn target_named(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// A row by any name a person would type: its own (`sm_100f`), a compute capability (`sm_103`,
/// `sm103`, `103`), or a compute capability's arch-specific or family spelling (`sm_100a`,
/// `sm_121f`): the row whose SASS runs there.
pub fn parse_target(s: &str) -> Option<&'static Target> {
    let s = s.trim();
    if let Some(t) = target_named(s) {
        return Some(t);
    }
    target_for_cc(parse_cc(s)?)
}

/// `sm_103`, `sm103`, `103`, `sm_100a`, `sm_121f` → the compute capability (major, minor).
pub fn parse_cc(s: &str) -> Option<(i32, i32)> {
    let digits = s.strip_prefix("sm_").or_else(|| s.strip_prefix("sm")).unwrap_or(s);
    let digits = digits.strip_suffix(['a', 'f']).unwrap_or(digits);
    if digits.len() < 2 || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i32 = digits.parse().ok()?;
    Some((n / 10, n % 10))
}

/// `(10, 3)` → `"sm_103"`: how messages name a compute capability.
pub fn cc_name(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

impl Target {
    /// `"sm_100/sm_103"`: the compute capabilities, as messages name them.
    pub fn runs_on_names(&self) -> String {
        self.runs_on.iter().map(|&cc| cc_name(cc)).collect::<Vec<_>>().join("/")
    }

    /// `"sm_100/sm_103 (B200, GB200, B300, GB300)"`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.runs_on_names(), self.gpus)
    }
}

/// The canonical names of every row, comma separated (messages, the default arch set).
pub fn all_target_names() -> String {
    TARGETS.iter().map(|t| t.name).collect::<Vec<_>>().join(",")
}

/// A compute capability no row runs on, for tests of refusals: one major version past the newest
/// row's, so that adding a row (even for the next GPU) never turns such a test's "unsupported"
/// GPU into a supported one.
#[doc(hidden)]
pub fn cc_without_row() -> (i32, i32) {
    let newest = TARGETS.iter().flat_map(|t| t.runs_on.iter().map(|cc| cc.0)).max().unwrap_or(0);
    (newest + 1, 0)
}

/// A compute capability where `op` has no kernel, for tests of that refusal: the first one of the
/// first row without a back-end for `op` (so the refusal can name GPUs the table knows), else
/// [`cc_without_row`]. Tests take it from here rather than naming a GPU, so that giving that GPU
/// a back-end never turns their "unsupported" case into a supported one.
#[doc(hidden)]
pub fn cc_without(op: Op) -> (i32, i32) {
    TARGETS.iter().find(|t| !op.runs_on(t)).map_or_else(cc_without_row, |t| t.runs_on[0])
}

/// The row `graphsafe plan` plans for when `--arch` is not given, for every op: so it must have a
/// kernel for each (a test in `src/arch.rs` holds it to that). Datacenter Blackwell, whose MLA
/// kernel runs 128 heads, the CLI's default head count.
pub const PLAN_DEFAULT: &str = "sm_100f";

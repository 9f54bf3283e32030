//! Finding the CUDA toolkit and CUTLASS, or provisioning the pinned ones (see `provision.rs`).

use crate::provision;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A CUDA toolkit that can compile for the selected rows of the arch table.
pub struct Cuda {
    pub home: PathBuf,
    pub nvcc: PathBuf,
    /// `nvcc --version` output: part of every object's cache key.
    pub version_text: String,
    /// e.g. "13.0.88" (the `V…` field of `nvcc --version`).
    pub version: String,
    /// Where `cuda.h`, `cuda_runtime.h` live (bindgen input; the runtime's version).
    pub include: PathBuf,
    /// Where `libcudart_static.a` lives.
    pub lib: PathBuf,
    /// How it was found, for `graphsafe doctor`.
    pub source: String,
}

/// CUTLASS sources: `include/` and `examples/`.
pub struct Cutlass {
    pub root: PathBuf,
    pub version: String,
    pub source: String,
}

/// Search order (docs/ARCHITECTURE.md): GRAPHSAFE_CUDA_HOME, CUDA_HOME, CUDA_PATH, nvcc on PATH,
/// /usr/local/cuda; else the pinned wheels in the cache.
/// `selected`: the arch table rows being built; the toolkit must be new enough for each.
pub fn find_cuda(cache: &Path, selected: &[String]) -> Result<Cuda, String> {
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    for var in ["GRAPHSAFE_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            candidates.push((PathBuf::from(v), format!("${var}")));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("nvcc").is_file() {
                if let Some(home) = dir.parent() {
                    candidates.push((home.to_path_buf(), "nvcc on PATH".into()));
                }
                break;
            }
        }
    }
    candidates.push((PathBuf::from("/usr/local/cuda"), "/usr/local/cuda".into()));

    for (home, source) in candidates {
        if home.join("bin/nvcc").is_file() {
            return from_home(&home, source, selected);
        }
        if source.starts_with('$') {
            // An explicit variable that points at nothing is a mistake worth stopping for.
            return Err(format!("graphsafe: {source} = {} has no bin/nvcc", home.display()));
        }
    }

    let pins: Vec<&provision::Pin> = provision::CUDA_PINS.iter().collect();
    let dir = provision::pin_dir_name("cuda-13.0.88", &pins);
    let root = provision::ensure(cache, &dir, &pins, "CUDA 13.0.88 compiler")?;
    from_home(&root.join("nvidia/cu13"), format!("provisioned wheels in {}", root.display()), selected)
}

/// The oldest toolkit graphsafe is built with whatever the archs (CUTLASS 4.2's Blackwell headers).
const MIN_CUDA: (u32, u32) = (12, 8);

fn from_home(home: &Path, source: String, selected: &[String]) -> Result<Cuda, String> {
    let nvcc = home.join("bin/nvcc");
    let out = Command::new(&nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("graphsafe: running {} --version: {e}", nvcc.display()))?;
    let version_text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = version_text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('V'))
        .unwrap_or("unknown")
        .trim_end_matches(',')
        .to_string();
    let have = parse_major_minor(&version);
    let (need, why) = crate::arch_table::TARGETS
        .iter()
        .filter(|t| selected.iter().any(|a| a == t.name))
        .map(|t| (t.min_cuda, t.name.to_string()))
        .fold((MIN_CUDA, "graphsafe".to_string()), |a, b| if b.0 > a.0 { b } else { a });
    if have < need {
        return Err(format!(
            "graphsafe: {} is CUDA {version}; {why} needs CUDA >= {}.{}. Unset the variable \
             (the pinned 13.0 compiler is then provisioned) or point it at a newer toolkit.",
            nvcc.display(),
            need.0,
            need.1
        ));
    }
    let arch_dir = format!("targets/{}-linux", std::env::consts::ARCH);
    let include = [home.join("include"), home.join(&arch_dir).join("include")]
        .into_iter()
        .find(|p| p.join("cuda.h").is_file())
        .ok_or_else(|| format!("graphsafe: no cuda.h under {}", home.display()))?;
    let lib = [home.join("lib64"), home.join("lib"), home.join(&arch_dir).join("lib")]
        .into_iter()
        .find(|p| p.join("libcudart_static.a").is_file())
        .ok_or_else(|| format!("graphsafe: no libcudart_static.a under {}", home.display()))?;
    Ok(Cuda { home: home.to_path_buf(), nvcc, version_text, version, include, lib, source })
}

fn parse_major_minor(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// CUTLASS_DIR (a checkout or install with include/ and examples/), else the pinned wheel.
pub fn find_cutlass(cache: &Path) -> Result<Cutlass, String> {
    if let Some(dir) = std::env::var_os("CUTLASS_DIR").filter(|v| !v.is_empty()) {
        let root = PathBuf::from(dir);
        if !root.join("include/cutlass/cutlass.h").is_file() {
            return Err(format!("graphsafe: CUTLASS_DIR={} has no include/cutlass/cutlass.h", root.display()));
        }
        if !root.join("examples/77_blackwell_fmha").is_dir() {
            return Err(format!(
                "graphsafe: CUTLASS_DIR={} has no examples/77_blackwell_fmha (the MLA kernel lives there)",
                root.display()
            ));
        }
        let version = version_from_header(&root).unwrap_or_else(|| "unknown".into());
        return Ok(Cutlass { root, version, source: "$CUTLASS_DIR".into() });
    }
    let pins = [&provision::CUTLASS_PIN];
    let dir = provision::pin_dir_name("cutlass-4.2.0.0", &pins);
    let base = provision::ensure(cache, &dir, &pins, "CUTLASS 4.2.0.0")?;
    let root = base.join("cutlass_library/source");
    let version = version_from_header(&root).unwrap_or_else(|| "unknown".into());
    Ok(Cutlass { root, version, source: format!("provisioned wheel in {}", base.display()) })
}

/// "4.2.0" from include/cutlass/version.h.
fn version_from_header(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join("include/cutlass/version.h")).ok()?;
    let field = |name: &str| -> Option<String> {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("#define {name} ")))
            .and_then(|l| l.split_whitespace().nth(2))
            .map(str::to_string)
    };
    Some(format!("{}.{}.{}", field("CUTLASS_MAJOR")?, field("CUTLASS_MINOR")?, field("CUTLASS_PATCH")?))
}

/// The version of the CUDA runtime the kernels are linked with (`CUDART_VERSION` of the toolkit's
/// cuda_runtime_api.h, e.g. 13000 for 13.0): what `graphsafe doctor` compares the driver with.
pub fn cudart_version(include: &Path) -> Result<u32, String> {
    let header = include.join("cuda_runtime_api.h");
    let text = std::fs::read_to_string(&header).map_err(|e| format!("graphsafe: {}: {e}", header.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("#define CUDART_VERSION")?.trim().parse().ok())
        .ok_or_else(|| format!("graphsafe: no CUDART_VERSION in {}", header.display()))
}

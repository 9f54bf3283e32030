//! Provisioning of the pinned CUDA compiler and CUTLASS from the Python package index.
//!
//! Used only when no CUDA toolkit is installed (see `toolchain.rs` for the search order). The wheels
//! are fetched with `pip download --no-deps`, verified against the sha256 pins below, and unpacked
//! into `<cache>/toolchain/<pin-id>/`, outside `target/`, so `cargo clean` never downloads them again.
//! Unpacking goes to a staging folder that is renamed into place at the end: two builds racing
//! (e.g. `cargo test` and `gpu-bundle` with different target dirs) can both provision, the first
//! rename wins and neither ever sees a half-unpacked toolchain.

use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One pinned wheel: PyPI name, exact version, and the sha256 of the wheel per platform.
pub struct Pin {
    pub name: &'static str,
    pub version: &'static str,
    pub x86_64: &'static str,
    pub aarch64: &'static str,
}

/// The CUDA 13.0 compiler and the headers/static runtime it needs. docs/ARCHITECTURE.md has the pins.
pub const CUDA_PINS: &[Pin] = &[
    Pin {
        name: "nvidia-cuda-nvcc",
        version: "13.0.88",
        x86_64: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
        aarch64: "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f",
    },
    Pin {
        name: "nvidia-cuda-crt",
        version: "13.0.88",
        x86_64: "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
        aarch64: "ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003",
    },
    Pin {
        name: "nvidia-nvvm",
        version: "13.0.88",
        x86_64: "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
        aarch64: "c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1",
    },
    Pin {
        name: "nvidia-cuda-runtime",
        version: "13.0.96",
        x86_64: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
        aarch64: "ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55",
    },
    Pin {
        name: "nvidia-cuda-cccl",
        version: "13.0.85",
        x86_64: "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
        aarch64: "6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c",
    },
];

/// CUTLASS 4.2.0 (headers and examples under `cutlass_library/source/`); a pure-Python wheel.
pub const CUTLASS_PIN: Pin = Pin {
    name: "nvidia-cutlass",
    version: "4.2.0.0",
    x86_64: "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6",
    aarch64: "f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6",
};

/// The folder under the cache that a set of pins unpacks into; changes whenever a pin changes.
pub fn pin_dir_name(prefix: &str, pins: &[&Pin]) -> String {
    let mut h = Sha256::new();
    for p in pins {
        h.update(p.name);
        h.update(p.version);
        h.update(p.x86_64);
        h.update(p.aarch64);
    }
    let digest = hex(&h.finalize());
    format!("{prefix}-{}", &digest[..12])
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn expected_sha(pin: &Pin) -> Result<&'static str, String> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(pin.x86_64),
        "aarch64" => Ok(pin.aarch64),
        other => Err(format!(
            "graphsafe: no pinned {}=={} wheel for host architecture {other}; install a CUDA toolkit \
             (>= 12.8) and set CUDA_HOME, or set GRAPHSAFE_CUDA_HOME",
            pin.name, pin.version
        )),
    }
}

/// Makes sure `<cache>/toolchain/<dir_name>` holds the unpacked wheels of `pins`; returns it.
/// `what` names the thing for messages ("CUDA 13.0.88 compiler", "CUTLASS 4.2.0.0").
pub fn ensure(cache: &Path, dir_name: &str, pins: &[&Pin], what: &str) -> Result<PathBuf, String> {
    let root = cache.join("toolchain");
    let dest = root.join(dir_name);
    if dest.join(".complete").exists() {
        return Ok(dest);
    }
    if crate::inputs::offline(std::env::var("GRAPHSAFE_OFFLINE").ok().as_deref())? {
        return Err(format!(
            "graphsafe: GRAPHSAFE_OFFLINE=1 forbids downloading the {what}, and none is available.\n\
             Either install a CUDA toolkit >= 12.8 and set CUDA_HOME (or GRAPHSAFE_CUDA_HOME, or put nvcc on PATH),\n\
             and CUTLASS 4.2 sources with CUTLASS_DIR=<checkout with include/ and examples/>,\n\
             or allow the download once (unset GRAPHSAFE_OFFLINE): it is cached in {}.",
            root.display()
        ));
    }
    let specs: Vec<String> = pins.iter().map(|p| format!("{}=={}", p.name, p.version)).collect();
    // The one line of output a provisioning build prints (cargo shows warnings from build scripts).
    println!(
        "cargo:warning=graphsafe: no CUDA toolkit found; provisioning the pinned {what} from PyPI into {} (once)",
        dest.display()
    );
    let downloads = cache.join("downloads");
    fs::create_dir_all(&downloads).map_err(|e| format!("creating {}: {e}", downloads.display()))?;

    let mut wheels = Vec::new();
    for pin in pins {
        let want = expected_sha(pin)?;
        if let Some(found) = find_verified_wheel(&downloads, pin, want) {
            wheels.push(found);
            continue;
        }
        let out = Command::new(python())
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d"])
            .arg(&downloads)
            .arg(format!("{}=={}", pin.name, pin.version))
            .output()
            .map_err(|e| {
                format!(
                    "graphsafe: could not run `{} -m pip` to provision the {what} ({e}). Install python3 with pip, \
                     or install a CUDA toolkit and set CUDA_HOME.",
                    python()
                )
            })?;
        if !out.status.success() {
            return Err(format!(
                "graphsafe: `pip download {}` failed while provisioning the {what}:\n{}\n\
                 Set GRAPHSAFE_CUDA_HOME/CUDA_HOME to an installed toolkit and CUTLASS_DIR to CUTLASS 4.2, \
                 or fix pip's access to the package index (PIP_INDEX_URL).",
                specs.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        match find_verified_wheel(&downloads, pin, want) {
            Some(found) => wheels.push(found),
            None => {
                return Err(format!(
                    "graphsafe: the downloaded {}=={} wheel in {} does not have the pinned sha256 {want}; \
                     refusing to use it (delete it to retry)",
                    pin.name,
                    pin.version,
                    downloads.display()
                ))
            }
        }
    }

    let staging = root.join(format!(".{dir_name}.staging-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(|e| format!("creating {}: {e}", staging.display()))?;
    for wheel in &wheels {
        unzip_with_modes(wheel, &staging)?;
    }
    fs::write(staging.join(".complete"), specs.join("\n")).map_err(|e| e.to_string())?;
    match fs::rename(&staging, &dest) {
        Ok(()) => {}
        // Another build won the race: its copy is identical (same verified wheels).
        Err(_) if dest.join(".complete").exists() => {
            let _ = fs::remove_dir_all(&staging);
        }
        Err(e) => return Err(format!("moving {} into place: {e}", dest.display())),
    }
    Ok(dest)
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// A wheel of this pin already in the downloads folder whose sha256 matches.
fn find_verified_wheel(dir: &Path, pin: &Pin, sha: &str) -> Option<PathBuf> {
    let prefix = format!("{}-{}-", pin.name.replace('-', "_"), pin.version);
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with(&prefix) && name.ends_with(".whl") && sha256_file(&entry.path()).ok()?.as_str() == sha {
            return Some(entry.path());
        }
    }
    None
}

/// Unpacks a wheel keeping the unix permission bits (Python's `zipfile.extractall` drops them, and
/// nvcc, ptxas and cicc must stay executable).
fn unzip_with_modes(wheel: &Path, dest: &Path) -> Result<(), String> {
    const SCRIPT: &str = r#"
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        if mode and not info.is_dir():
            os.chmod(path, mode)
"#;
    let status = Command::new(python())
        .arg("-c")
        .arg(SCRIPT)
        .arg(wheel)
        .arg(dest)
        .status()
        .map_err(|e| format!("running python3 to unpack {}: {e}", wheel.display()))?;
    if !status.success() {
        return Err(format!("unpacking {} failed", wheel.display()));
    }
    Ok(())
}

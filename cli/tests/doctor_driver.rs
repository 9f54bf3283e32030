//! `graphsafe doctor` compares the installed driver with the CUDA runtime this build bundles
//! (13.0 with the provisioned toolkit: it needs a driver for CUDA 13.0, Linux 580 or newer).
//! The drivers here are one-function libraries compiled with gcc, answering cuDriverGetVersion
//! as a 570 driver (CUDA 12.8) and a 580 driver (CUDA 13.0) would; the rest is missing, which
//! doctor reports without failing.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A driver library whose cuInit succeeds and whose cuDriverGetVersion answers `version`.
fn fake_driver(version: i32) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("doctor-drivers");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("cuda_{version}.c"));
    let lib = dir.join(format!("libcuda_{version}.so"));
    std::fs::write(&src, format!("int cuInit(unsigned f) {{ (void)f; return 0; }}\nint cuDriverGetVersion(int* v) {{ *v = {version}; return 0; }}\n")).unwrap();
    let st = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&src).status().expect("gcc (required by the CLI tests)");
    assert!(st.success(), "gcc failed to build {}", lib.display());
    lib
}

fn doctor(driver: &PathBuf, json: bool) -> Output {
    let exe = std::env::var("GRAPHSAFE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_graphsafe").to_string());
    let mut c = Command::new(exe);
    c.arg("doctor").env("GRAPHSAFE_CUDA_DRIVER", driver);
    if json {
        c.arg("--json");
    }
    c.output().expect("run graphsafe doctor")
}

/// The bundled runtime's major version, from doctor's own report (a build with kernels).
fn bundled_major() -> Option<i32> {
    graphsafe::build_info::runtime_version().map(|(major, _)| major)
}

#[test]
fn a_driver_older_than_the_bundled_runtime_is_named_too_old_with_the_version_it_needs() {
    let Some(major) = bundled_major() else { return eprintln!("SKIP: a build without kernels bundles no runtime") };
    // A driver one major version behind the runtime (a 570 driver for the 13.0 runtime).
    let out = doctor(&fake_driver((major - 1) * 1000 + 80), false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("DRIVER TOO OLD"), "{text}");
    assert!(text.contains(&format!("needs a driver for CUDA {major}.0 or newer")), "{text}");
    if major == 13 {
        assert!(text.contains("580.65.06"), "{text}");
    }
    let out = doctor(&fake_driver((major - 1) * 1000 + 80), true);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["driver"]["runtime_fit"], "too_old");
    assert!(v["cuda_runtime"]["bundled"].as_str().unwrap().starts_with(&format!("{major}.")));
}

#[test]
fn a_driver_for_the_bundled_runtime_is_accepted() {
    let Some(major) = bundled_major() else { return eprintln!("SKIP: a build without kernels bundles no runtime") };
    let (rmaj, rmin) = graphsafe::build_info::runtime_version().unwrap();
    let out = doctor(&fake_driver(rmaj * 1000 + rmin * 10), false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("runs the bundled CUDA {major}.")), "{text}");
    assert!(!text.contains("TOO OLD"), "{text}");
    let out = doctor(&fake_driver(rmaj * 1000 + rmin * 10), true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["driver"]["runtime_fit"], "supported");
}

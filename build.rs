//! Build script: finds (or provisions) the CUDA compiler and CUTLASS, compiles `cuda-src/` with a
//! content-addressed object cache, links the kernels and `cudart_static` into one object that
//! exports only the `gs_*` glue, embeds the fatbins the driver layer loads, and (feature `bindgen`)
//! checks the checked-in bindings for drift.
//! The pieces live in `build/`; README.md lists the environment variables, docs/ARCHITECTURE.md the design.

// The arch table the crate dispatches from (`graphsafe::arch`): one file, read by both.
#[path = "src/arch_table.rs"]
#[allow(dead_code)] // the crate uses the lookups the build does not
mod arch_table;
#[cfg(feature = "bindgen")]
#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/inputs.rs"]
mod inputs;
#[path = "build/kernels.rs"]
mod kernels;
#[path = "build/provision.rs"]
mod provision;
#[path = "build/toolchain.rs"]
mod toolchain;

use std::path::{Path, PathBuf};

const ENV_INPUTS: &[&str] = &[
    "DOCS_RS",
    "GRAPHSAFE_CUDA_HOME",
    "CUDA_HOME",
    "CUDA_PATH",
    "PATH",
    "CUTLASS_DIR",
    "GRAPHSAFE_CUDA_ARCHS",
    "GRAPHSAFE_CACHE_DIR",
    "GRAPHSAFE_OFFLINE",
    "GRAPHSAFE_BINDINGS",
    "XDG_CACHE_HOME",
    "PYTHON",
];

fn main() {
    if let Err(e) = run() {
        // A build-script error is the one place a panic is the interface.
        panic!("\n{e}\n");
    }
}

/// Where the provisioned toolchain and the object cache live: outside target/, shared by every
/// profile and every clone on this machine.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GRAPHSAFE_CACHE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("graphsafe");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache/graphsafe");
    }
    PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("graphsafe-cache")
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for p in ["build.rs", "build", "src/arch_table.rs", "cuda-src", "include/graphsafe_kernels.h", "include/graphsafe_kernels", "cbindgen.toml"] {
        println!("cargo:rerun-if-changed={p}");
    }
    for v in ENV_INPUTS {
        println!("cargo:rerun-if-env-changed={v}");
    }
    // One cfg per selected row, and one per back-end those rows run: code that launches a
    // back-end's glue is `#[cfg(graphsafe_mla = "sm100")]`, which stays right when rows change.
    let quoted = |names: Vec<&str>| names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
    println!("cargo::rustc-check-cfg=cfg(graphsafe_arch, values({}))", quoted(arch_table::TARGETS.iter().map(|t| t.name).collect()));
    for op in arch_table::Op::WITH_BACKENDS {
        println!("cargo::rustc-check-cfg=cfg(graphsafe_{}, values({}))", op.name(), quoted(op.backends().map(|b| b.name()).collect()));
    }
    println!("cargo::rustc-check-cfg=cfg(graphsafe_no_kernels)");

    inputs::check_environment()?;
    // docs.rs builds documentation with no CUDA toolkit and no network: no kernels, nothing linked.
    if std::env::var_os("DOCS_RS").is_some() {
        return docs_only(&manifest_dir, &out_dir, "DOCS_RS is set (a docs.rs build)");
    }
    let cache = cache_dir();
    let offline = inputs::offline(std::env::var("GRAPHSAFE_OFFLINE").ok().as_deref())?;
    let selected = kernels::selected_archs()?;
    let found = toolchain::find_cuda(&cache, &selected).and_then(|cuda| Ok((cuda, toolchain::find_cutlass(&cache)?)));
    let (cuda, cutlass) = match found {
        Ok(v) => v,
        // Offline with no toolkit: what can be built is the documentation (`cargo doc`). Say
        // clearly that nothing else will link, and how to get the kernels.
        Err(e) if offline => {
            println!("cargo:warning=graphsafe: building WITHOUT kernels (documentation only; binaries will not link): {}", e.lines().next().unwrap_or(""));
            return docs_only(&manifest_dir, &out_dir, "no CUDA toolkit or CUTLASS was found and GRAPHSAFE_OFFLINE=1 forbids provisioning them");
        }
        Err(e) => return Err(e),
    };

    let units = kernels::scan(&manifest_dir.join("cuda-src"), &selected)?;
    let ctx = kernels::Ctx { cuda: &cuda, cutlass: &cutlass, manifest_dir: &manifest_dir, cache: &cache, out_dir: &out_dir };
    let built = kernels::build_all(&ctx, &units)?;
    kernels::prelink(&out_dir, &built.objects, &cuda.lib)?;
    kernels::write_modules_rs(&out_dir, &built, &units)?;
    kernels::write_manifest(&out_dir, &selected, &units, &built)?;

    link(&out_dir);
    // For dependents (`links = "graphsafe"`): clib/build.rs refuses a C library without kernels.
    println!("cargo::metadata=kernels={}", selected.join(","));
    let mut backends: Vec<String> = Vec::new();
    for t in arch_table::TARGETS.iter().filter(|t| selected.iter().any(|a| a == t.name)) {
        println!("cargo:rustc-cfg=graphsafe_arch=\"{}\"", t.name);
        backends.extend(t.backends.iter().map(|b| format!("graphsafe_{}=\"{}\"", b.op().name(), b.name())));
    }
    backends.sort();
    backends.dedup();
    for b in backends {
        println!("cargo:rustc-cfg={b}");
    }
    let skipped: Vec<String> =
        built.skipped.iter().map(|(s, a)| format!("{s}({})", a.join("|"))).collect();
    report_build(&[
        ("ARCHS", &selected.join(",")),
        ("CUDA_VERSION", &cuda.version),
        ("CUDART_VERSION", &toolchain::cudart_version(&cuda.include)?.to_string()),
        ("CUDA_SOURCE", &cuda.source),
        ("CUTLASS_VERSION", &cutlass.version),
        ("CUTLASS_SOURCE", &cutlass.source),
        ("SKIPPED_UNITS", &skipped.join(",")),
        ("CUDA_HOME", &cuda.home.to_string_lossy()),
        ("CUDA_INCLUDE", &cuda.include.to_string_lossy()),
    ]);
    if built.compiled > 0 {
        println!(
            "cargo:warning=graphsafe: compiled {} CUDA unit(s), {} from cache ({})",
            built.compiled,
            built.cached,
            cache.join("objects").display()
        );
    }

    #[cfg(feature = "bindgen")]
    {
        // The C header is generated from src/capi: rerun when it changes (only with this feature).
        println!("cargo:rerun-if-changed=src/capi");
        bindings::check_or_write(&manifest_dir.join("src/sys/kernels_bindings.rs"), &bindings::kernels(&manifest_dir));
        bindings::check_or_write(&manifest_dir.join("src/sys/cuda_bindings.rs"), &bindings::cuda(&cuda.include));
        bindings::check_or_write(&manifest_dir.join("include/graphsafe.h"), &bindings::c_header(&manifest_dir));
    }
    Ok(())
}

/// A build without kernels, for documentation: the fatbin constants are all `None`, no archs are
/// reported, nothing is compiled or linked, and the crate docs say so (`graphsafe_no_kernels`).
fn docs_only(manifest_dir: &Path, out_dir: &Path, why: &str) -> Result<(), String> {
    let units = kernels::scan(&manifest_dir.join("cuda-src"), &[])?;
    let built = kernels::Built { objects: Vec::new(), units: Vec::new(), fatbins: Vec::new(), skipped: Vec::new(), compiled: 0, cached: 0 };
    kernels::write_modules_rs(out_dir, &built, &units)?;
    println!("cargo:rustc-cfg=graphsafe_no_kernels");
    println!("cargo::metadata=kernels=none: {why}");
    report_build(&[
        ("ARCHS", ""),
        ("CUDA_VERSION", "none"),
        ("CUDART_VERSION", "0"),
        ("CUDA_SOURCE", &format!("none: {why}")),
        ("CUTLASS_VERSION", "none"),
        ("CUTLASS_SOURCE", "none"),
        ("SKIPPED_UNITS", ""),
        ("CUDA_HOME", ""),
        ("CUDA_INCLUDE", ""),
    ]);
    Ok(())
}

/// What `graphsafe doctor` (`graphsafe::build_info`, src/lib.rs) reports about this build: one `GRAPHSAFE_BUILD_*`
/// compile-time variable per field, the same set for a kernel build and a docs-only one.
fn report_build(fields: &[(&str, &str)]) {
    for (k, v) in fields {
        println!("cargo:rustc-env=GRAPHSAFE_BUILD_{k}={v}");
    }
}

fn link(out_dir: &Path) {
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    // One object: the kernels with the CUDA runtime (cudart_static) linked in and every symbol but
    // the `gs_*` glue made local (build/kernels.rs, `prelink`), so a program that has a CUDA
    // runtime of its own keeps it, and graphsafe keeps its own. cudart_static opens libcuda.so.1
    // itself at first use, so nothing here links the driver: the crate builds and its CPU tests run
    // on machines with no driver. What the runtime needs from the system:
    println!("cargo:rustc-link-lib=static=graphsafe_kernels");
    for l in ["stdc++", "dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
}

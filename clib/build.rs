//! Refuses to build the C library without kernels, in one line.
//!
//! graphsafe's build script builds the Rust crate without kernels when it must (docs.rs, or
//! `GRAPHSAFE_OFFLINE=1` with no CUDA toolkit): its documentation is still worth having. A C
//! library without them is not: every C++ program linking it would fail on the missing `gs_*`
//! kernel glue, far from the cause. graphsafe tells its dependents which archs it built
//! (`cargo::metadata=kernels=…`, `links = "graphsafe"`), so the refusal happens here, at once.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_GRAPHSAFE_KERNELS");
    let kernels = std::env::var("DEP_GRAPHSAFE_KERNELS").unwrap_or_default();
    if let Some(why) = kernels.strip_prefix("none: ") {
        println!("cargo::error=graphsafe: the C library (libgraphsafe.a, libgraphsafe.so) needs the CUDA kernels, and this build has none: {why} (README.md, Environment)");
    } else if kernels.is_empty() {
        println!("cargo::error=graphsafe: the C library needs graphsafe's build to report its kernels (DEP_GRAPHSAFE_KERNELS is unset)");
    }
}

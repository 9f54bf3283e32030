//! Handle ids are unique in the process across loads of the library: a C++ engine that `dlclose`s
//! `libgraphsafe.so` (and really unloads it) and opens it again must not be handed ids the first
//! load already handed out, or a stale id kept from the first load would name (and destroy) an
//! object of the second. Each load's ids carry a load epoch, unique in the process.
//!
//! The test opens the C library's cdylib (libgraphsafe.so of the graphsafe-clib package) twice, on
//! the stand-in driver (tests/standin), creating a context in each load and leaving it alive across
//! the unload.

mod standin;

use graphsafe::capi::{GraphsafeContext, GRAPHSAFE_ERROR_INVALID_HANDLE, GRAPHSAFE_OK};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::c_int;
use std::path::PathBuf;

/// glibc's `RTLD_NOLOAD` (dlfcn.h): open only if already loaded.
const RTLD_NOLOAD: c_int = 0x4;

type Create = unsafe extern "C" fn(c_int, *mut GraphsafeContext) -> c_int;
type Destroy = unsafe extern "C" fn(GraphsafeContext) -> c_int;

/// The C library's shared object, built from this checkout by cargo in a target folder of its own
/// (`cargo test` builds only the Rust library; the C library is the graphsafe-clib package, and a
/// nested cargo on the outer one's target folder would wait on its lock).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<exe> -> target/capi-reload
    let target = exe.ancestors().nth(3).expect("the target folder").join("capi-reload");
    let out = std::process::Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "graphsafe-clib", "--target-dir"])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo to build the C library");
    assert!(out.status.success(), "cargo build -p graphsafe-clib failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let so = target.join("debug").join("libgraphsafe.so");
    assert!(so.is_file(), "no {} after building the C library", so.display());
    so
}

#[test]
fn handle_ids_are_unique_across_loads_of_the_library() {
    standin::standin(); // the loaded copies open the stand-in driver too (GRAPHSAFE_CUDA_DRIVER)
    let path = cdylib();
    let mut kept = Vec::new();
    for load in 0..3 {
        // SAFETY: graphsafe's library; its initialisers are Rust's (none that run code of ours).
        let lib = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }.expect("opening libgraphsafe.so");
        // SAFETY: the C ABI's signatures (include/graphsafe.h).
        let (create, destroy) = unsafe { (*lib.get::<Create>(b"graphsafe_context_create\0").unwrap(), *lib.get::<Destroy>(b"graphsafe_context_destroy\0").unwrap()) };
        let mut c = GraphsafeContext::default();
        // SAFETY: out-pointer to a local.
        assert_eq!(unsafe { create(0, &mut c) }, GRAPHSAFE_OK, "load {load}: graphsafe_context_create");
        assert!(!kept.iter().any(|k: &GraphsafeContext| k.id == c.id), "load {load} handed out id {:#x} again", c.id);
        if load < 2 {
            kept.push(c); // alive across the unload, as an engine's would be
            drop(lib);
            // SAFETY: only asks whether the library is still loaded.
            let still = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_NOLOAD) };
            assert!(still.is_err(), "load {load}: dlclose did not unload libgraphsafe.so, so this test proves nothing");
            continue;
        }
        // The last load (a failing call records its error text in a thread-local, which keeps
        // the library loaded until the thread exits: so only here).
        for old in &kept {
            // SAFETY: any id is checked.
            assert_eq!(unsafe { destroy(*old) }, GRAPHSAFE_ERROR_INVALID_HANDLE, "an id {:#x} of an earlier load named an object of this one", old.id);
        }
        // SAFETY: made by this load.
        assert_eq!(unsafe { destroy(c) }, GRAPHSAFE_OK, "this load's own handle");
    }
}

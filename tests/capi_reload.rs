//! Handle ids are unique in the process across loads of the library: a C++ engine that `dlclose`s
//! `libgraphsafe.so` (and really unloads it) and opens it again must not be handed ids the first
//! load already handed out, or a stale id kept from the first load would name (and destroy) an
//! object of the second. Each load's ids carry a load epoch, unique in the process.
//!
//! The test opens the cdylib cargo built beside this test executable twice, on the stand-in driver
//! (tests/standin), creating a context in each load and leaving it alive across the unload.

mod standin;

use graphsafe::capi::{GraphsafeContext, GRAPHSAFE_ERROR_INVALID_HANDLE, GRAPHSAFE_OK};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::c_int;
use std::path::PathBuf;

/// glibc's `RTLD_NOLOAD` (dlfcn.h): open only if already loaded.
const RTLD_NOLOAD: c_int = 0x4;

type Create = unsafe extern "C" fn(c_int, *mut GraphsafeContext) -> c_int;
type Destroy = unsafe extern "C" fn(GraphsafeContext) -> c_int;

/// The shared library cargo built with this test (the lib's `cdylib` crate type), beside it in
/// `deps/`, or in the profile's folder above.
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("its folder").to_path_buf();
    [deps.join("libgraphsafe.so"), deps.parent().map(|p| p.join("libgraphsafe.so")).unwrap_or_default()]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no libgraphsafe.so beside {} (the cdylib cargo builds with the tests)", exe.display()))
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

//! The stand-in CUDA driver (`tests/standin/cuda_standin.c` and the other C files beside it) for
//! CPU tests, shared by the test files that use it (`mod standin;`).
//!
//! [`standin()`] compiles the C files with gcc once per test binary, points
//! `GRAPHSAFE_CUDA_DRIVER` at the library before graphsafe opens a driver, and wraps the library's
//! control API (fail/delay knobs, violation and allocation counters). graphsafe and this harness
//! open the same path, so they share one copy of the stand-in's state.
//!
//! Tests in one binary share that state (knobs, counters), so each test that looks at it holds
//! [`exclusive()`] for its whole body. gcc is required: without it the tests fail, they do not skip.
#![allow(dead_code)]
// `c_long` is `i64` on LP64 Linux but not on every target: the casts are deliberate.
#![allow(clippy::unnecessary_cast)]

use graphsafe::sys::cuda::CUresult;
use std::ffi::{c_char, c_int, c_long, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The C sources (name, text), embedded at build time: the tests may run from a copy of the built
/// executables on another machine, where the source tree is not. Every `.c` here is compiled into
/// the one library (as `.ci/run` does with `tests/standin/*.c`).
const SOURCES: &[(&str, &str)] = &[
    ("standin.h", include_str!("standin.h")),
    ("cuda_standin.c", include_str!("cuda_standin.c")),
    ("standin_state.c", include_str!("standin_state.c")),
    ("standin_exec.c", include_str!("standin_exec.c")),
    ("standin_devices.c", include_str!("standin_devices.c")),
    ("standin_memory.c", include_str!("standin_memory.c")),
    ("standin_streams.c", include_str!("standin_streams.c")),
    ("standin_graphs.c", include_str!("standin_graphs.c")),
    ("standin_control.c", include_str!("standin_control.c")),
];

/// Devices the stand-in shows: two, so tests can use "another device".
pub const DEVICES: usize = 2;

type FailRepeatFn = unsafe extern "C" fn(*const c_char, c_int, c_int, c_int) -> c_int;
type DelayFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type CallsFn = unsafe extern "C" fn(*const c_char) -> c_long;
type CountFn = unsafe extern "C" fn() -> c_long;
type LastViolationFn = unsafe extern "C" fn(*mut c_char, c_int) -> c_int;
type ResetFn = unsafe extern "C" fn();
type EngineContextFn = unsafe extern "C" fn(c_int) -> *mut std::ffi::c_void;
type AsyncHtodFn = unsafe extern "C" fn(c_int);

/// The loaded stand-in and its control API.
pub struct Standin {
    /// The shared library graphsafe opened through `GRAPHSAFE_CUDA_DRIVER`.
    pub path: PathBuf,
    // Keeps the library (and so the function pointers below) loaded.
    _lib: libloading::Library,
    fail_repeat: FailRepeatFn,
    delay: DelayFn,
    calls: CallsFn,
    violations: CountFn,
    live_allocations: CountFn,
    stat: CallsFn,
    last_violation: LastViolationFn,
    last_invalidation: LastViolationFn,
    last_recorded: LastViolationFn,
    reset: ResetFn,
    engine_context: EngineContextFn,
    async_htod: AsyncHtodFn,
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("entry names have no NUL")
}

impl Standin {
    /// The call after the next `after_calls` calls of `entry` fails with `result`, once.
    pub fn fail(&self, entry: &str, after_calls: i32, result: CUresult) {
        self.fail_repeat(entry, after_calls, 1, result);
    }

    /// As [`Standin::fail`] for `times` consecutive calls (negative: every call from then on).
    pub fn fail_repeat(&self, entry: &str, after_calls: i32, times: i32, result: CUresult) {
        let e = cstr(entry);
        // SAFETY: a NUL-terminated name; the function only reads it.
        let r = unsafe { (self.fail_repeat)(e.as_ptr(), after_calls, times, result.0 as c_int) };
        assert_eq!(r, 0, "standin_fail: {entry:?} is not a driver entry point of the stand-in");
    }

    /// Every later call of `entry` sleeps `usec` µs before taking the stand-in's lock (0 cancels).
    pub fn delay(&self, entry: &str, usec: i32) {
        let e = cstr(entry);
        // SAFETY: as in fail_repeat.
        let r = unsafe { (self.delay)(e.as_ptr(), usec) };
        assert_eq!(r, 0, "standin_delay: {entry:?} is not a driver entry point of the stand-in");
    }

    /// Calls of `entry` since the last reset.
    pub fn calls(&self, entry: &str) -> i64 {
        let e = cstr(entry);
        // SAFETY: as in fail_repeat.
        let n = unsafe { (self.calls)(e.as_ptr()) };
        assert!(n >= 0, "standin_calls: {entry:?} is not a driver entry point of the stand-in");
        n as i64
    }

    /// Memory-safety violations counted since the last reset.
    pub fn violations(&self) -> i64 {
        // SAFETY: no arguments.
        unsafe { (self.violations)() as i64 }
    }

    /// The text of the last violation ("" if none).
    pub fn last_violation(&self) -> String {
        let mut buf = vec![0 as c_char; 1024];
        // SAFETY: the buffer holds the length passed; the function NUL-terminates within it.
        unsafe { (self.last_violation)(buf.as_mut_ptr(), buf.len() as c_int) };
        // SAFETY: NUL-terminated above.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// The last node recorded into a capture: which call, and whether from the capturing thread.
    pub fn last_recorded(&self) -> String {
        let mut buf = vec![0 as c_char; 1024];
        // SAFETY: as in last_violation.
        unsafe { (self.last_recorded)(buf.as_mut_ptr(), buf.len() as c_int) };
        // SAFETY: NUL-terminated above.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// Which call invalidated the last capture the stand-in invalidated, from which thread ("" if none).
    pub fn last_invalidation(&self) -> String {
        let mut buf = vec![0 as c_char; 1024];
        // SAFETY: as in last_violation.
        unsafe { (self.last_invalidation)(buf.as_mut_ptr(), buf.len() as c_int) };
        // SAFETY: NUL-terminated above.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// Device allocations not freed.
    pub fn live_allocations(&self) -> i64 {
        // SAFETY: no arguments.
        unsafe { (self.live_allocations)() as i64 }
    }

    /// One of the stand-in's counters or gauges (names: the top of cuda_standin.c).
    pub fn stat(&self, name: &str) -> i64 {
        let e = cstr(name);
        // SAFETY: as in fail_repeat.
        let n = unsafe { (self.stat)(e.as_ptr()) };
        assert!(n >= 0, "standin_stat: unknown counter {name:?}");
        n as i64
    }

    /// A context of `device` that is not its primary one, as an engine's own (for
    /// `Context::adopt`); valid for the life of the process once the driver is initialised.
    pub fn engine_context(&self, device: i32) -> graphsafe::sys::cuda::CUcontext {
        // SAFETY: an int argument; the function returns a pointer or null.
        let c = unsafe { (self.engine_context)(device) };
        assert!(!c.is_null(), "standin_engine_context({device}): no such device, or before cuInit");
        c.cast()
    }

    /// Host-to-device copies on streams that are not capturing read their source late, as from
    /// page-locked memory: at the next operation ordered after them (until [`Standin::reset`]).
    pub fn async_htod(&self, on: bool) {
        // SAFETY: no arguments beyond the flag.
        unsafe { (self.async_htod)(on as c_int) }
    }

    /// Cancels every knob and zeroes the counters (live objects stay).
    pub fn reset(&self) {
        // SAFETY: no arguments.
        unsafe { (self.reset)() }
    }
}

fn build_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is a path on the build machine; a copied executable uses the temp folder.
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if d.is_dir() {
        d.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn compile() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    SOURCES.hash(&mut h);
    let tag = format!("{:016x}", h.finish());
    let dir = build_dir().join("standin");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let so = dir.join(format!("libcuda_standin-{tag}.so"));
    // Per process, then renamed: test binaries may build it at the same time.
    let pid = std::process::id();
    let tmp_src = dir.join(format!(".cuda_standin-{tag}.{pid}"));
    let tmp_so = dir.join(format!(".libcuda_standin-{tag}.{pid}.so"));
    std::fs::create_dir_all(&tmp_src).unwrap_or_else(|e| panic!("creating {}: {e}", tmp_src.display()));
    let mut units = Vec::new();
    for (name, text) in SOURCES {
        let path = tmp_src.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        if name.ends_with(".c") {
            units.push(path);
        }
    }
    let out = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-Wall", "-o"])
        .arg(&tmp_so)
        .args(&units)
        .arg("-lm")
        .output()
        .unwrap_or_else(|e| panic!("the stand-in driver needs gcc, which could not be run: {e}"));
    assert!(out.status.success(), "gcc failed on the stand-in driver:\n{}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp_so, &so).expect("renaming the stand-in library");
    // The sources stay beside the library they built (for a debugger); another process may have
    // put them there first, with the same content.
    let src = dir.join(format!("cuda_standin-{tag}"));
    if std::fs::rename(&tmp_src, &src).is_err() {
        let _ = std::fs::remove_dir_all(&tmp_src);
    }
    so
}

/// The stand-in, built and installed as graphsafe's driver on first use. Panics (failing the
/// test) if it cannot be built, or if graphsafe already opened another driver in this process.
pub fn standin() -> &'static Standin {
    static S: OnceLock<Standin> = OnceLock::new();
    S.get_or_init(|| {
        let path = compile();
        // Set before graphsafe's first driver call (the OnceLock makes every test wait for this).
        std::env::set_var(graphsafe::sys::driver::DRIVER_LIBRARY_VAR, &path);
        std::env::set_var("STANDIN_DEVICES", DEVICES.to_string());
        // The CUDA units' runtime (cudart, linked into the glue) opens the system's driver, not
        // graphsafe's: on a machine with a GPU it finds the real device and is handed the
        // stand-in's streams and pointers (seen there: standin_context's well-formed decode
        // refused as an invalid argument instead of GRAPHSAFE_ERROR_CUDA_RUNTIME, standin_soundness
        // ending in a segmentation fault). With the devices hidden it answers as on CI's machine,
        // which has none.
        std::env::set_var("CUDA_VISIBLE_DEVICES", "");
        match graphsafe::sys::driver::api() {
            Ok(api) => assert_eq!(api.library, "$GRAPHSAFE_CUDA_DRIVER", "graphsafe opened another driver first"),
            Err(e) => panic!("graphsafe could not open the stand-in driver: {e}"),
        }
        // SAFETY: the stand-in runs no initialiser; graphsafe has the same file open already.
        let lib = unsafe { libloading::Library::new(&path) }.expect("opening the stand-in");
        macro_rules! sym {
            ($name:literal, $t:ty) => {
                // SAFETY: the stand-in exports this name with this C signature (cuda_standin.c).
                *unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }.expect($name)
            };
        }
        Standin {
            fail_repeat: sym!("standin_fail_repeat", FailRepeatFn),
            delay: sym!("standin_delay", DelayFn),
            calls: sym!("standin_calls", CallsFn),
            violations: sym!("standin_violations", CountFn),
            live_allocations: sym!("standin_live_allocations", CountFn),
            stat: sym!("standin_stat", CallsFn),
            last_violation: sym!("standin_last_violation", LastViolationFn),
            last_invalidation: sym!("standin_last_invalidation", LastViolationFn),
            last_recorded: sym!("standin_last_recorded", LastViolationFn),
            reset: sym!("standin_reset", ResetFn),
            engine_context: sym!("standin_engine_context", EngineContextFn),
            async_htod: sym!("standin_async_htod", AsyncHtodFn),
            path,
            _lib: lib,
        }
    })
}

/// Whether this machine also has a real CUDA driver (the GPU machine runs every test executable).
/// The kernel glue's CUDA runtime opens `libcuda.so.1` by itself, not graphsafe's driver: there, a
/// glue call would hand the stand-in's stream handles to the real driver, so tests leave the
/// glue-backed ops (MLA, NVFP4) out and say so.
pub fn real_driver_present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    // SAFETY: opening the NVIDIA driver runs its initialisers, as the CUDA runtime would.
    *P.get_or_init(|| unsafe { libloading::Library::new("libcuda.so.1") }.is_ok())
}

/// Serializes the tests of one binary that use the stand-in's shared knobs and counters, and
/// resets them; hold the guard for the whole test.
pub fn exclusive() -> (MutexGuard<'static, ()>, &'static Standin) {
    static LOCK: Mutex<()> = Mutex::new(());
    let s = standin();
    let g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    s.reset();
    (g, s)
}

/// What an engine does to its own streams behind graphsafe's back, through the driver directly
/// (the stand-in's): make a stream, capture on it, destroy it. Each asserts the driver's success
/// except [`engine::end_capture`], which returns the status for the test to judge.
pub mod engine {
    use graphsafe::driver::Context;
    use graphsafe::sys::cuda as c;

    fn api() -> &'static graphsafe::sys::driver::Api {
        graphsafe::sys::driver::api().unwrap()
    }

    /// A new non-blocking stream of `ctx`, made with cuStreamCreate.
    pub fn create_stream(ctx: &Context) -> c::CUstream {
        ctx.with_current(|| {
            let mut raw: c::CUstream = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; flags 1 (non-blocking).
            assert_eq!(unsafe { (api().cuStreamCreate().unwrap().f)(&mut raw, 1) }, c::CUresult::CUDA_SUCCESS);
            raw
        }).unwrap()
    }

    /// cuStreamBeginCapture in relaxed mode.
    ///
    /// # Safety
    /// `raw` is a live stream of `ctx`.
    pub unsafe fn begin_capture(ctx: &Context, raw: c::CUstream) {
        ctx.with_current(|| {
            // SAFETY: a live stream (the caller's contract); the mode is a valid enum value.
            let r = unsafe { (api().cuStreamBeginCapture().unwrap().f)(raw, c::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) };
            assert_eq!(r, c::CUresult::CUDA_SUCCESS);
        }).unwrap()
    }

    /// cuStreamEndCapture, destroying the graph it returns; the end's status.
    ///
    /// # Safety
    /// `raw` is a live stream of `ctx` with a capture begun on it.
    pub unsafe fn end_capture(ctx: &Context, raw: c::CUstream) -> c::CUresult {
        ctx.with_current(|| {
            let mut g = std::ptr::null_mut();
            // SAFETY: the caller's contract; out-pointer to a local.
            let r = unsafe { (api().cuStreamEndCapture().unwrap().f)(raw, &mut g) };
            if !g.is_null() {
                // SAFETY: the graph the end returned.
                unsafe { (api().cuGraphDestroy().unwrap().f)(g) };
            }
            r
        }).unwrap()
    }

    /// cuStreamDestroy.
    ///
    /// # Safety
    /// `raw` is a live stream of `ctx` that no graphsafe `Stream` wraps any more.
    pub unsafe fn destroy_stream(ctx: &Context, raw: c::CUstream) {
        ctx.with_current(|| {
            // SAFETY: the caller's contract.
            assert_eq!(unsafe { (api().cuStreamDestroy().unwrap().f)(raw) }, c::CUresult::CUDA_SUCCESS);
        }).unwrap()
    }
}

/// Device memory an engine allocates itself (cuMemAlloc in `ctx`), and frees (cuMemFree).
pub mod engine_memory {
    use graphsafe::driver::Context;

    fn api() -> &'static graphsafe::sys::driver::Api {
        graphsafe::sys::driver::api().unwrap()
    }

    /// `bytes` of `ctx`'s device memory that graphsafe did not allocate.
    pub fn alloc(ctx: &Context, bytes: usize) -> u64 {
        ctx.with_current(|| {
            let mut p = 0;
            // SAFETY: out-pointer to a local.
            assert_eq!(unsafe { (api().cuMemAlloc().unwrap().f)(&mut p, bytes) }, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
            p
        }).unwrap()
    }

    /// Frees what [`alloc`] returned.
    ///
    /// # Safety
    /// `p` came from [`alloc`] and nothing still uses it.
    pub unsafe fn free(ctx: &Context, p: u64) {
        ctx.with_current(|| {
            // SAFETY: the caller's contract.
            assert_eq!(unsafe { (api().cuMemFree().unwrap().f)(p) }, graphsafe::sys::cuda::CUresult::CUDA_SUCCESS);
        }).unwrap()
    }
}

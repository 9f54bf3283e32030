//! `libcudnn.so.9`, opened at run time, once, with every entry point resolved lazily on first use.
//!
//! Like the driver (`sys/driver.rs`), cuDNN is never linked: the crate builds and its CPU tests run
//! where it is absent, and a missing cuDNN is an [`Error::CudnnNotFound`](crate::Error::CudnnNotFound) value listing every place
//! looked at, never a load-time failure or a panic.
//!
//! Search order (docs/ARCHITECTURE.md), first library that opens *and* reports version ≥ 9.0 wins:
//!
//! 1. `GRAPHSAFE_CUDNN_LIB`: the library file, or a folder holding `libcudnn.so.9`;
//! 2. the dynamic loader's path (`LD_LIBRARY_PATH`, `ldconfig`'s cache, RUNPATH): `libcudnn.so.9`;
//! 3. the `nvidia/cudnn/lib` folder of a Python environment's `nvidia-cudnn-cu12/13` wheel:
//!    `$VIRTUAL_ENV`, `$CONDA_PREFIX`, each `$PYTHONPATH` entry, `~/.local`, `/usr/local` and `/usr`
//!    (`lib/python3.*/{site,dist}-packages`, and Debian's `/usr/lib/python3/dist-packages`).
//!
//! The wheel's `libcudnn.so.9` is a small dispatcher with `RPATH=$ORIGIN`: it finds its
//! sub-libraries (`libcudnn_graph.so.9`, the engine libraries) beside itself when opened by path.
//!
//! Entry points are bindgen's `PFN_` typedefs, made from the header's own declarations
//! (`scripts/regen-cudnn-bindings`), so no signature is transcribed by hand.
#![allow(non_snake_case)] // entry points keep their C names

/// bindgen output for cuDNN 9's `cudnn_graph.h` (checked in; `scripts/regen-cudnn-bindings`):
/// the backend API's types and enums, and a `PFN_` typedef per entry point. Nothing is linked.
#[path = "../cudnn_bindings.rs"]
#[allow(missing_docs, unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::all)] // generated
pub mod ffi;

/// Safe RAII types over the backend graph API, and execute (the ops' only way into cuDNN).
pub(crate) mod backend;
pub use backend::Source;

use self::ffi as c;
use super::driver::OptionInner;
use crate::error::{Error, Result};
use once_cell::sync::OnceCell;
use std::path::{Path, PathBuf};

/// The environment variable naming the library (file or folder) to try first.
pub const ENV_VAR: &str = "GRAPHSAFE_CUDNN_LIB";
/// The library's file name (soname) for the cuDNN 9 ABI.
pub const LIBRARY: &str = "libcudnn.so.9";
/// Oldest cuDNN accepted (as `cudnnGetVersion` encodes it: major·10000 + minor·100 + patch).
pub const MIN_VERSION: u64 = 9_00_00;

/// A cuDNN version, decoded from `cudnnGetVersion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Version {
    /// Major (9).
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl Version {
    /// Decodes cuDNN 9's `major*10000 + minor*100 + patch`.
    pub fn from_raw(v: u64) -> Version {
        Version { major: (v / 10_000) as u32, minor: ((v % 10_000) / 100) as u32, patch: (v % 100) as u32 }
    }
    /// `major.minor.patch` as a number comparable with [`Version::from_raw`]'s input.
    pub fn raw(&self) -> u64 {
        self.major as u64 * 10_000 + self.minor as u64 * 100 + self.patch as u64
    }
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version { major, minor, patch }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The resolved function pointer of one entry point, with its exported name.
pub struct Entry<F> {
    /// The function pointer.
    pub f: F,
    /// The exported name (used in error messages).
    pub name: &'static str,
}

macro_rules! cudnn_api {
    ($( $field:ident : $pfn:ident ;)*) => {
        /// The cuDNN library and its lazily resolved entry points.
        pub struct Api {
            lib: libloading::Library,
            /// Where the library was opened from (a path, or the soname for the loader's path).
            pub location: String,
            /// The version it reports.
            pub version: Version,
            $( $field: OnceCell<std::result::Result<usize, Error>>, )*
        }

        impl Api {
            fn new(lib: libloading::Library, location: String) -> Self {
                Api { lib, location, version: Version::new(0, 0, 0), $( $field: OnceCell::new(), )* }
            }

            $(
                #[doc = concat!("`", stringify!($field), "`")]
                pub fn $field(&self) -> Result<Entry<<c::$pfn as OptionInner>::Inner>> {
                    let addr = self.$field.get_or_init(|| self.lookup(stringify!($field))).clone()?;
                    // SAFETY: `addr` is the non-null address of the exported cuDNN function whose C
                    // declaration bindgen turned into `$pfn` (__typeof__ of that declaration).
                    let f = unsafe { std::mem::transmute_copy::<usize, <c::$pfn as OptionInner>::Inner>(&addr) };
                    Ok(Entry { f, name: stringify!($field) })
                }
            )*
        }
    };
}

cudnn_api! {
    cudnnGetVersion: PFN_cudnnGetVersion;
    cudnnGetCudartVersion: PFN_cudnnGetCudartVersion;
    cudnnGetErrorString: PFN_cudnnGetErrorString;
    cudnnGetLastErrorString: PFN_cudnnGetLastErrorString;
    cudnnCreate: PFN_cudnnCreate;
    cudnnDestroy: PFN_cudnnDestroy;
    cudnnSetStream: PFN_cudnnSetStream;
    cudnnGetStream: PFN_cudnnGetStream;
    cudnnBackendCreateDescriptor: PFN_cudnnBackendCreateDescriptor;
    cudnnBackendDestroyDescriptor: PFN_cudnnBackendDestroyDescriptor;
    cudnnBackendFinalize: PFN_cudnnBackendFinalize;
    cudnnBackendSetAttribute: PFN_cudnnBackendSetAttribute;
    cudnnBackendGetAttribute: PFN_cudnnBackendGetAttribute;
    cudnnBackendExecute: PFN_cudnnBackendExecute;
}

// SAFETY: the library handle and the resolved addresses are immutable after loading; cuDNN's
// global functions may be called from any thread.
unsafe impl Send for Api {}
// SAFETY: as for Send.
unsafe impl Sync for Api {}

impl Api {
    fn lookup(&self, name: &str) -> std::result::Result<usize, Error> {
        let cname = format!("{name}\0");
        // SAFETY: we only read the symbol's address; it is called through its bindgen type later.
        if let Ok(sym) = unsafe { self.lib.get::<*const ()>(cname.as_bytes()) } {
            let addr = *sym as usize;
            if addr != 0 {
                return Ok(addr);
            }
        }
        Err(Error::MissingSymbol { name: name.to_string(), library: self.location.clone(), tried: vec![name.to_string()] })
    }

    /// cuDNN's name for a status, e.g. `CUDNN_STATUS_NOT_SUPPORTED` (`"?"` if it has none).
    pub fn status_string(&self, status: c::cudnnStatus_t) -> String {
        match self.cudnnGetErrorString() {
            Ok(f) => {
                // SAFETY: returns a static NUL-terminated string for any value.
                let p = unsafe { (f.f)(status) };
                if p.is_null() {
                    "?".into()
                } else {
                    // SAFETY: as above.
                    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            }
            Err(_) => "?".into(),
        }
    }

    /// cuDNN's description of the last error on this thread (its error log), possibly empty.
    pub fn last_error_string(&self) -> String {
        let Ok(f) = self.cudnnGetLastErrorString() else { return String::new() };
        let mut buf = vec![0 as std::os::raw::c_char; 4096];
        // SAFETY: the buffer holds buf.len() bytes, as passed; cuDNN NUL-terminates within it.
        unsafe { (f.f)(buf.as_mut_ptr(), buf.len() as _) };
        // SAFETY: NUL-terminated (the last byte is never overwritten past the size given).
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().trim().to_string()
    }
}

/// Turns a `cudnnStatus_t` into a `Result`; failures are logged (at debug level) with cuDNN's own
/// name for the status and its last-error text, and returned as [`Error::Cudnn`].
pub fn check(api: &Api, status: c::cudnnStatus_t, call: &'static str) -> Result<()> {
    if status == c::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    crate::logging::debug(|| format!("graphsafe: cuDNN {call}: {} ({})", api.status_string(status), api.last_error_string()));
    Err(Error::Cudnn { call, status: status.0 as i32 })
}

/// One place the loader looks, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Why it is on the list (`GRAPHSAFE_CUDNN_LIB`, `loader path`, `python env`).
    pub source: &'static str,
    /// A file path, or the bare soname for the loader's own search.
    pub target: String,
}

/// Every place [`api`] looks for cuDNN, in order, from the environment of this process.
pub fn candidates() -> Vec<Candidate> {
    candidates_with(std::env::var_os(ENV_VAR).filter(|p| !p.is_empty()).map(PathBuf::from))
}

/// [`candidates`] with `GRAPHSAFE_CUDNN_LIB` given explicitly (`None`: unset).
pub fn candidates_with(lib: Option<PathBuf>) -> Vec<Candidate> {
    let mut v = Vec::new();
    if let Some(p) = lib {
        let target = if p.is_dir() { p.join(LIBRARY) } else { p };
        v.push(Candidate { source: ENV_VAR, target: target.to_string_lossy().into_owned() });
    }
    v.push(Candidate { source: "loader path", target: LIBRARY.to_string() });
    for dir in python_lib_dirs() {
        let target = dir.join(LIBRARY).to_string_lossy().into_owned();
        if !v.iter().any(|c| c.target == target) {
            v.push(Candidate { source: "python env", target });
        }
    }
    v
}

/// `nvidia/cudnn/lib` folders of the Python environments this process can see (existing ones only).
fn python_lib_dirs() -> Vec<PathBuf> {
    let mut site: Vec<PathBuf> = Vec::new();
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            prefixes.push(PathBuf::from(p));
        }
    }
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        site.extend(std::env::split_paths(&pp).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.push(PathBuf::from("/usr/local"));
    prefixes.push(PathBuf::from("/usr"));
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
            .collect();
        pythons.sort();
        for py in pythons.into_iter().rev() {
            site.push(py.join("site-packages"));
            site.push(py.join("dist-packages"));
        }
    }
    site.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    site.into_iter().map(|s| s.join("nvidia/cudnn/lib")).filter(|d| d.join(LIBRARY).is_file()).collect()
}

/// Opens the first candidate that loads and reports cuDNN ≥ 9.0; otherwise
/// [`Error::CudnnNotFound`] with one line per candidate saying why it was passed over.
///
/// # Safety
/// Each candidate that loads must be cuDNN (or a library whose initialisers are safe to run and
/// whose `cudnnGetVersion`, if any, is cuDNN's function `size_t cudnnGetVersion(void)`): the file
/// is loaded, which runs its initialisers, and that symbol is called with cuDNN's signature. A
/// candidate that does not exist or fails to load is only passed over. [`candidates`] lists what
/// [`api`] opens: the file `GRAPHSAFE_CUDNN_LIB` names, then cuDNN by its soname.
pub unsafe fn open_from(candidates: &[Candidate]) -> Result<Api> {
    let mut tried = Vec::new();
    for cand in candidates {
        // SAFETY: the caller promises that a candidate that loads is cuDNN, whose initialisers
        // are safe to run (what every cuDNN program does); nothing in it is called until a symbol
        // is resolved.
        let lib = match unsafe { libloading::Library::new(&cand.target) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{} ({}): {e}", cand.target, cand.source));
                continue;
            }
        };
        let mut api = Api::new(lib, cand.target.clone());
        let raw = match api.cudnnGetVersion() {
            #[allow(clippy::unnecessary_cast)] // c_ulong is not u64 everywhere
            // SAFETY: cuDNN's cudnnGetVersion (the caller's promise on what loaded): no
            // arguments; returns a number.
            Ok(f) => (unsafe { (f.f)() }) as u64,
            Err(e) => {
                tried.push(format!("{} ({}): {e}", cand.target, cand.source));
                continue;
            }
        };
        if raw < MIN_VERSION {
            tried.push(format!("{} ({}): version {} is older than 9.0", cand.target, cand.source, Version::from_raw(raw)));
            continue;
        }
        api.version = Version::from_raw(raw);
        return Ok(api);
    }
    Err(Error::CudnnNotFound { tried })
}

static API: OnceCell<std::result::Result<Api, Error>> = OnceCell::new();

/// cuDNN, opened on first use from [`candidates`]. Later calls return the same answer, error included.
pub fn api() -> Result<&'static Api> {
    // SAFETY: the documented search, the same trust as any program that opens cuDNN: the file the
    // user named in GRAPHSAFE_CUDNN_LIB, the loader's libcudnn.so.9, Python environments' cuDNN.
    API.get_or_init(|| unsafe { open_from(&candidates()) }).as_ref().map_err(Clone::clone)
}

/// The version of the cuDNN [`api`] finds, without touching a GPU.
pub fn version() -> Result<Version> {
    Ok(api()?.version)
}

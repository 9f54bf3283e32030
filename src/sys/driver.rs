//! `libcuda.so.1`, opened at run time, once, with every symbol resolved lazily on first use.
//!
//! Why not link it: the crate must build, and its CPU tests run, on machines without an NVIDIA
//! driver; a missing driver is an [`Error::DriverNotFound`] value, never a load-time failure.
//!
//! Each entry point lists its exported names newest first; the first one the library has wins
//! (`cuMemAlloc_v2` → `cuMemAlloc`). Only names that share one C signature are listed together;
//! the Rust type of each entry is bindgen's `PFN_…` typedef for that signature. A driver that has
//! none of them gives [`Error::MissingSymbol`] naming all that were tried.
#![allow(non_snake_case)] // entry points keep their C names

use super::cuda as c;
use crate::error::{Error, Result};
use once_cell::sync::OnceCell;

/// Library names tried, in order, after `GRAPHSAFE_CUDA_DRIVER`.
pub const DRIVER_LIBRARIES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// A driver library to open instead of the system's (a file path): the stand-in driver of the
/// CPU tests (`tests/standin/`), or a particular driver build. Read once, at first use.
pub const DRIVER_LIBRARY_VAR: &str = "GRAPHSAFE_CUDA_DRIVER";

/// The resolved function pointer of one entry point, with the name it was found under.
pub struct Entry<F> {
    /// The function pointer.
    pub f: F,
    /// The exported name it resolved to (used in error messages).
    pub name: &'static str,
}

macro_rules! driver_api {
    ($( $(#[$doc:meta])* $field:ident : $pfn:ident = [$($name:literal),+ $(,)?] ;)*) => {
        /// The driver library and its lazily resolved entry points.
        pub struct Api {
            lib: libloading::Library,
            /// The file name the library was opened under.
            pub library: &'static str,
            $( $field: OnceCell<std::result::Result<(usize, &'static str), Error>>, )*
        }

        impl Api {
            fn new(lib: libloading::Library, library: &'static str) -> Self {
                Api { lib, library, $( $field: OnceCell::new(), )* }
            }

            $(
                $(#[$doc])*
                #[allow(non_snake_case)]
                pub fn $field(&self) -> Result<Entry<<c::$pfn as OptionInner>::Inner>> {
                    let (addr, name) = self.$field
                        .get_or_init(|| self.lookup(&[$($name),+], stringify!($field)))
                        .clone()?;
                    // SAFETY: `addr` is the non-null address of an exported driver function whose C
                    // signature is the one bindgen generated `$pfn` from.
                    let f = unsafe { std::mem::transmute_copy::<usize, <c::$pfn as OptionInner>::Inner>(&addr) };
                    Ok(Entry { f, name })
                }
            )*
        }
    };
}

/// `Option<fn>` → `fn`: bindgen's PFN typedefs are nullable function pointers.
pub trait OptionInner {
    /// The function pointer type inside the `Option`.
    type Inner;
}
impl<F> OptionInner for Option<F> {
    type Inner = F;
}

impl Api {
    fn lookup(&self, names: &[&'static str], base: &str) -> std::result::Result<(usize, &'static str), Error> {
        for &name in names {
            let cname = format!("{name}\0");
            // SAFETY: we only read the symbol's address; it is called through the right type later.
            if let Ok(sym) = unsafe { self.lib.get::<*const ()>(cname.as_bytes()) } {
                let addr = *sym as usize;
                if addr != 0 {
                    return Ok((addr, name));
                }
            }
        }
        Err(Error::MissingSymbol {
            name: base.to_string(),
            library: self.library.to_string(),
            tried: names.iter().map(|s| s.to_string()).collect(),
        })
    }
}

driver_api! {
    /// cuInit
    cuInit: PFN_cuInit_v2000 = ["cuInit"];
    /// cuDriverGetVersion
    cuDriverGetVersion: PFN_cuDriverGetVersion_v2020 = ["cuDriverGetVersion"];
    /// cuGetErrorName
    cuGetErrorName: PFN_cuGetErrorName_v6000 = ["cuGetErrorName"];
    /// cuGetErrorString
    cuGetErrorString: PFN_cuGetErrorString_v6000 = ["cuGetErrorString"];
    /// cuDeviceGetCount
    cuDeviceGetCount: PFN_cuDeviceGetCount_v2000 = ["cuDeviceGetCount"];
    /// cuDeviceGet
    cuDeviceGet: PFN_cuDeviceGet_v2000 = ["cuDeviceGet"];
    /// cuDeviceGetName
    cuDeviceGetName: PFN_cuDeviceGetName_v2000 = ["cuDeviceGetName"];
    /// cuDeviceGetAttribute
    cuDeviceGetAttribute: PFN_cuDeviceGetAttribute_v2000 = ["cuDeviceGetAttribute"];
    /// cuDeviceTotalMem
    cuDeviceTotalMem: PFN_cuDeviceTotalMem_v3020 = ["cuDeviceTotalMem_v2"];
    /// cuDevicePrimaryCtxRetain
    cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain_v7000 = ["cuDevicePrimaryCtxRetain"];
    /// cuDevicePrimaryCtxRelease
    cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease_v11000 = ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"];
    /// cuCtxSetCurrent
    cuCtxSetCurrent: PFN_cuCtxSetCurrent_v4000 = ["cuCtxSetCurrent"];
    /// cuCtxGetCurrent
    cuCtxGetCurrent: PFN_cuCtxGetCurrent_v4000 = ["cuCtxGetCurrent"];
    /// cuCtxGetDevice (of the current context)
    cuCtxGetDevice: PFN_cuCtxGetDevice_v2000 = ["cuCtxGetDevice"];
    /// cuCtxSynchronize
    cuCtxSynchronize: PFN_cuCtxSynchronize_v2000 = ["cuCtxSynchronize"];
    /// cuMemAlloc
    cuMemAlloc: PFN_cuMemAlloc_v3020 = ["cuMemAlloc_v2"];
    /// cuMemFree
    cuMemFree: PFN_cuMemFree_v3020 = ["cuMemFree_v2"];
    /// cuMemGetInfo
    cuMemGetInfo: PFN_cuMemGetInfo_v3020 = ["cuMemGetInfo_v2"];
    /// cuMemsetD8Async
    cuMemsetD8Async: PFN_cuMemsetD8Async_v3020 = ["cuMemsetD8Async"];
    /// cuMemsetD32Async
    cuMemsetD32Async: PFN_cuMemsetD32Async_v3020 = ["cuMemsetD32Async"];
    /// cuMemcpyHtoDAsync
    cuMemcpyHtoDAsync: PFN_cuMemcpyHtoDAsync_v3020 = ["cuMemcpyHtoDAsync_v2"];
    /// cuMemcpyDtoHAsync
    cuMemcpyDtoHAsync: PFN_cuMemcpyDtoHAsync_v3020 = ["cuMemcpyDtoHAsync_v2"];
    /// cuMemcpyDtoDAsync
    cuMemcpyDtoDAsync: PFN_cuMemcpyDtoDAsync_v3020 = ["cuMemcpyDtoDAsync_v2"];
    /// cuStreamCreate
    cuStreamCreate: PFN_cuStreamCreate_v2000 = ["cuStreamCreate"];
    /// cuStreamDestroy
    cuStreamDestroy: PFN_cuStreamDestroy_v4000 = ["cuStreamDestroy_v2", "cuStreamDestroy"];
    /// cuStreamSynchronize
    cuStreamSynchronize: PFN_cuStreamSynchronize_v2000 = ["cuStreamSynchronize"];
    /// cuStreamQuery
    cuStreamQuery: PFN_cuStreamQuery_v2000 = ["cuStreamQuery"];
    /// cuStreamWaitEvent
    cuStreamWaitEvent: PFN_cuStreamWaitEvent_v3020 = ["cuStreamWaitEvent"];
    /// cuEventCreate
    cuEventCreate: PFN_cuEventCreate_v2000 = ["cuEventCreate"];
    /// cuEventRecord
    cuEventRecord: PFN_cuEventRecord_v2000 = ["cuEventRecord"];
    /// cuEventSynchronize
    cuEventSynchronize: PFN_cuEventSynchronize_v2000 = ["cuEventSynchronize"];
    /// cuEventElapsedTime (`_v2` since CUDA 12.8, same signature)
    cuEventElapsedTime: PFN_cuEventElapsedTime_v12080 = ["cuEventElapsedTime_v2", "cuEventElapsedTime"];
    /// cuEventDestroy
    cuEventDestroy: PFN_cuEventDestroy_v4000 = ["cuEventDestroy_v2", "cuEventDestroy"];
    /// cuModuleLoadData
    cuModuleLoadData: PFN_cuModuleLoadData_v2000 = ["cuModuleLoadData"];
    /// cuModuleGetFunction
    cuModuleGetFunction: PFN_cuModuleGetFunction_v2000 = ["cuModuleGetFunction"];
    /// cuModuleUnload
    cuModuleUnload: PFN_cuModuleUnload_v2000 = ["cuModuleUnload"];
    /// cuFuncSetAttribute
    cuFuncSetAttribute: PFN_cuFuncSetAttribute_v9000 = ["cuFuncSetAttribute"];
    /// cuLaunchKernel
    cuLaunchKernel: PFN_cuLaunchKernel_v4000 = ["cuLaunchKernel"];
    /// cuLaunchKernelEx (cluster dimensions)
    cuLaunchKernelEx: PFN_cuLaunchKernelEx_v11060 = ["cuLaunchKernelEx"];
    /// cuStreamBeginCapture with a mode (`_v2`)
    cuStreamBeginCapture: PFN_cuStreamBeginCapture_v10010 = ["cuStreamBeginCapture_v2"];
    /// cuStreamEndCapture
    cuStreamEndCapture: PFN_cuStreamEndCapture_v10000 = ["cuStreamEndCapture"];
    /// cuStreamIsCapturing
    cuStreamIsCapturing: PFN_cuStreamIsCapturing_v10000 = ["cuStreamIsCapturing"];
    /// cuStreamGetCtx (the context an adopted stream belongs to)
    cuStreamGetCtx: PFN_cuStreamGetCtx_v9020 = ["cuStreamGetCtx"];
    /// cuThreadExchangeStreamCaptureMode
    cuThreadExchangeStreamCaptureMode: PFN_cuThreadExchangeStreamCaptureMode_v10010 = ["cuThreadExchangeStreamCaptureMode"];
    /// cuGraphInstantiateWithFlags
    cuGraphInstantiateWithFlags: PFN_cuGraphInstantiateWithFlags_v11040 = ["cuGraphInstantiateWithFlags"];
    /// cuGraphLaunch
    cuGraphLaunch: PFN_cuGraphLaunch_v10000 = ["cuGraphLaunch"];
    /// cuGraphUpload
    cuGraphUpload: PFN_cuGraphUpload_v11010 = ["cuGraphUpload"];
    /// cuGraphDestroy
    cuGraphDestroy: PFN_cuGraphDestroy_v10000 = ["cuGraphDestroy"];
    /// cuGraphExecDestroy
    cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000 = ["cuGraphExecDestroy"];
    /// cuGraphGetNodes
    cuGraphGetNodes: PFN_cuGraphGetNodes_v10000 = ["cuGraphGetNodes"];
    /// cuGraphNodeGetType
    cuGraphNodeGetType: PFN_cuGraphNodeGetType_v10000 = ["cuGraphNodeGetType"];
    /// cuPointerGetAttribute
    cuPointerGetAttribute: PFN_cuPointerGetAttribute_v4000 = ["cuPointerGetAttribute"];
}

static API: OnceCell<std::result::Result<Api, Error>> = OnceCell::new();

/// The driver library, opened on first use. Later calls return the same answer, error included.
pub fn api() -> Result<&'static Api> {
    API.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> std::result::Result<Api, Error> {
    let mut tried = Vec::new();
    if let Some(path) = std::env::var_os(DRIVER_LIBRARY_VAR).filter(|v| !v.is_empty()) {
        // An explicit choice is the only one tried: falling back to the system driver would hide
        // the mistake (and a test meant for the stand-in would touch a real GPU).
        // SAFETY: as below; the variable names a driver (or a stand-in with the same exports).
        return match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => Ok(Api::new(lib, "$GRAPHSAFE_CUDA_DRIVER")),
            Err(e) => Err(Error::DriverNotFound { tried: vec![format!("{DRIVER_LIBRARY_VAR}={}: {e}", path.to_string_lossy())] }),
        };
    }
    for &name in DRIVER_LIBRARIES {
        // SAFETY: loading the NVIDIA driver runs its initialisers, which is what every CUDA
        // program does; we call nothing in it until a symbol is resolved.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok(Api::new(lib, name)),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(Error::DriverNotFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resolution against a library that is not the driver (libc, present on every Linux): the
    /// fallback order and the MissingSymbol report, without needing an NVIDIA driver.
    fn libc_as_driver() -> Api {
        // SAFETY: libc is already loaded in this process; opening it again runs no initialiser.
        let lib = unsafe { libloading::Library::new("libc.so.6") }.expect("libc.so.6");
        Api::new(lib, "libc.so.6")
    }

    #[test]
    fn the_first_name_the_library_has_wins() {
        let api = libc_as_driver();
        assert_eq!(api.lookup(&["graphsafe_no_such_symbol_v2", "malloc"], "malloc").unwrap().1, "malloc");
        assert_eq!(api.lookup(&["free", "malloc"], "x").unwrap().1, "free");
    }

    #[test]
    fn a_missing_entry_point_is_missing_symbol_naming_every_name_tried() {
        let api = libc_as_driver();
        match api.cuMemAlloc() {
            Err(Error::MissingSymbol { name, library, tried }) => {
                assert_eq!((name.as_str(), library.as_str()), ("cuMemAlloc", "libc.so.6"));
                assert_eq!(tried, vec!["cuMemAlloc_v2".to_string()]);
            }
            other => panic!("expected MissingSymbol, got {:?}", other.map(|e| e.name)),
        }
        match api.cuEventElapsedTime() {
            Err(Error::MissingSymbol { tried, .. }) => assert_eq!(tried, ["cuEventElapsedTime_v2", "cuEventElapsedTime"]),
            other => panic!("expected MissingSymbol, got {:?}", other.map(|e| e.name)),
        }
        // The answer is cached: asking again gives the same error, not a second lookup's result.
        assert!(matches!(api.cuMemAlloc(), Err(Error::MissingSymbol { .. })));
    }
}

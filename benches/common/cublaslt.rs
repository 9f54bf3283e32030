//! cuBLASLt, opened at run time, for the benchmarks' baselines (the crate never depends on it):
//! one bf16 GEMM `D[M,N] = X[M,K] · W[N,K]ᵀ` (row-major; cuBLASLt's "TN"), fp32 compute, its first
//! heuristic algorithm with a 32 MiB workspace. Shared by benches/cudnn.rs and benches/nvfp4.rs.
#![allow(dead_code)]

use graphsafe::driver::{DeviceBuffer, Stream};
use std::ffi::c_void;


type Handle = *mut c_void;
#[repr(C)]
#[derive(Clone, Copy)]
struct Algo {
    data: [u64; 8],
}
#[repr(C)]
#[derive(Clone, Copy)]
struct HeurResult {
    algo: Algo,
    workspace_size: usize,
    state: i32,
    waves: f32,
    reserved: [i32; 4],
}

pub struct Lt {
    _lib: libloading::Library,
    handle: Handle,
    matmul: unsafe extern "C" fn(Handle, Handle, *const c_void, *const c_void, Handle, *const c_void, Handle, *const c_void, *const c_void, Handle, *mut c_void, Handle, *const Algo, *mut c_void, usize, *mut c_void) -> i32,
    desc_create: unsafe extern "C" fn(*mut Handle, i32, i32) -> i32,
    desc_set: unsafe extern "C" fn(Handle, i32, *const c_void, usize) -> i32,
    layout_create: unsafe extern "C" fn(*mut Handle, i32, u64, u64, i64) -> i32,
    pref_create: unsafe extern "C" fn(*mut Handle) -> i32,
    pref_set: unsafe extern "C" fn(Handle, i32, *const c_void, usize) -> i32,
    heuristic: unsafe extern "C" fn(Handle, Handle, Handle, Handle, Handle, Handle, Handle, i32, *mut HeurResult, *mut i32) -> i32,
}

const CUBLAS_COMPUTE_32F: i32 = 68;
const CUDA_R_32F: i32 = 0;
const CUDA_R_16BF: i32 = 14;
const DESC_TRANSA: i32 = 3;
const OP_T: i32 = 1;
const PREF_MAX_WORKSPACE: i32 = 1;

pub fn ok(r: i32, what: &str) {
    assert_eq!(r, 0, "{what} failed with status {r}");
}

impl Lt {
    pub fn open() -> Result<Lt, String> {
        let mut errs = Vec::new();
        for name in ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"] {
            // SAFETY: loading cuBLASLt runs its initialisers only.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => unsafe {
                    macro_rules! sym {
                        ($n:literal) => {
                            *lib.get($n).map_err(|e| format!("{}: {e}", String::from_utf8_lossy($n)))?
                        };
                    }
                    let create: unsafe extern "C" fn(*mut Handle) -> i32 = sym!(b"cublasLtCreate\0");
                    let mut handle = std::ptr::null_mut();
                    ok(create(&mut handle), "cublasLtCreate");
                    return Ok(Lt {
                        handle,
                        matmul: sym!(b"cublasLtMatmul\0"),
                        desc_create: sym!(b"cublasLtMatmulDescCreate\0"),
                        desc_set: sym!(b"cublasLtMatmulDescSetAttribute\0"),
                        layout_create: sym!(b"cublasLtMatrixLayoutCreate\0"),
                        pref_create: sym!(b"cublasLtMatmulPreferenceCreate\0"),
                        pref_set: sym!(b"cublasLtMatmulPreferenceSetAttribute\0"),
                        heuristic: sym!(b"cublasLtMatmulAlgoGetHeuristic\0"),
                        _lib: lib,
                    });
                },
                Err(e) => errs.push(format!("{name}: {e}")),
            }
        }
        Err(errs.join("; "))
    }
}

/// One cuBLASLt GEMM set up for D[M,N] (row-major) = X[M,K] · W[N,K]ᵀ.
pub struct LtGemm<'a> {
    lt: &'a Lt,
    desc: Handle,
    a: Handle,
    b: Handle,
    c: Handle,
    algo: Algo,
    ws: DeviceBuffer,
    ws_bytes: usize,
}

impl<'a> LtGemm<'a> {
    pub fn new(lt: &'a Lt, m: usize, n: usize, k: usize, stream: &Stream) -> LtGemm<'a> {
        // Column-major view: D'[N, M] = op(W')[N, K] · X'[K, M], W' = W as [K, N] (ld K) transposed.
        unsafe {
            let mut desc = std::ptr::null_mut();
            ok((lt.desc_create)(&mut desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
            ok((lt.desc_set)(desc, DESC_TRANSA, (&OP_T as *const i32).cast(), 4), "TRANSA");
            let (mut a, mut b, mut c) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
            ok((lt.layout_create)(&mut a, CUDA_R_16BF, k as u64, n as u64, k as i64), "layout A");
            ok((lt.layout_create)(&mut b, CUDA_R_16BF, k as u64, m as u64, k as i64), "layout B");
            ok((lt.layout_create)(&mut c, CUDA_R_16BF, n as u64, m as u64, n as i64), "layout C");
            let mut pref = std::ptr::null_mut();
            ok((lt.pref_create)(&mut pref), "preference");
            let ws_bytes: u64 = 32 << 20;
            ok((lt.pref_set)(pref, PREF_MAX_WORKSPACE, (&ws_bytes as *const u64).cast(), 8), "max workspace");
            let mut res: HeurResult = std::mem::zeroed();
            let mut n = 0;
            ok((lt.heuristic)(lt.handle, desc, a, b, c, c, pref, 1, &mut res, &mut n), "cublasLtMatmulAlgoGetHeuristic");
            assert!(n >= 1, "cuBLASLt has no algorithm for M={m}");
            LtGemm { lt, desc, a, b, c, algo: res.algo, ws: DeviceBuffer::alloc_zeroed(stream, ws_bytes as usize).unwrap(), ws_bytes: ws_bytes as usize }
        }
    }

    pub fn run(&self, x: &DeviceBuffer, w: &DeviceBuffer, d: &DeviceBuffer, stream: &Stream) {
        self.run_raw(x, w, d, stream.raw());
    }

    /// As [`LtGemm::run`], on a raw stream handle (a capturing stream, for graph-timed baselines).
    pub fn run_raw(&self, x: &DeviceBuffer, w: &DeviceBuffer, d: &DeviceBuffer, stream: graphsafe::sys::cuda::CUstream) {
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: all buffers are live and sized for the layouts; the stream is live.
        let r = unsafe {
            (self.lt.matmul)(
                self.lt.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                w.device_ptr() as usize as *const c_void,
                self.a,
                x.device_ptr() as usize as *const c_void,
                self.b,
                (&beta as *const f32).cast(),
                d.device_ptr() as usize as *const c_void,
                self.c,
                d.device_ptr() as usize as *mut c_void,
                self.c,
                &self.algo,
                self.ws.device_ptr() as usize as *mut c_void,
                self.ws_bytes,
                stream.cast(),
            )
        };
        ok(r, "cublasLtMatmul");
    }
}


//! Shared by the GPU tests: find a GPU or skip with a reason; with GRAPHSAFE_REQUIRE_GPU=1 a
//! missing driver or GPU fails instead.
#![allow(dead_code)]

pub mod mla;

use graphsafe::arch::{self, Backend, Target};
use graphsafe::driver::{Context, DeviceBuffer, DevicePtr, LaunchTarget, Stream};
use graphsafe::graph::{Capture, CaptureMode, CapturedBuffer, CapturedWorkspace, GraphExec};
use graphsafe::ops::mla::MlaDecodePlan;
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::workspace::Workspace;
use graphsafe::ops::tensor::DeviceMemory;
use graphsafe::sys::cuda as c;
use std::sync::Arc;

/// The first GPU's context and a fresh stream, or `None` (with the reason printed) when there is
/// no driver or GPU and GRAPHSAFE_REQUIRE_GPU is not 1.
pub fn gpu() -> Option<(Arc<Context>, Stream)> {
    let require = std::env::var("GRAPHSAFE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let got = graphsafe::driver::device_count().and_then(|n| {
        if n == 0 {
            return Err(graphsafe::Error::invalid("GPU", "at least one", 0));
        }
        let ctx = Context::new(0)?;
        let stream = Stream::new(&ctx)?;
        Ok((ctx, stream))
    });
    match got {
        Ok(v) => Some(v),
        Err(e) if require => panic!("GRAPHSAFE_REQUIRE_GPU=1 but no usable GPU: {e}"),
        Err(e) => {
            eprintln!("SKIP: no usable GPU ({e})");
            None
        }
    }
}

/// Whether the arch table's row for compute capability `cc` runs every back-end in `needs`; else
/// `false`, with why `what` skips printed, naming the GPUs that run them. Asking the table, not
/// naming a GPU, lets a GPU added on an existing back-end run that back-end's tests.
pub fn runs_backends(cc: (i32, i32), needs: &[Backend], what: &str) -> bool {
    let has_all = |t: &Target| needs.iter().all(|b| t.backends.contains(b));
    let row = arch::target_for_cc(cc);
    if row.is_some_and(has_all) {
        return true;
    }
    let rows: Vec<String> = arch::TARGETS.iter().filter(|t| has_all(t)).map(Target::describe).collect();
    let this = row.map_or_else(|| arch::cc_name(cc), |t| format!("{} ({})", arch::cc_name(cc), t.gpus));
    eprintln!("SKIP: {what}: needs {}; this GPU is {this}", rows.join(" or "));
    false
}

/// Deterministic pseudo-random f32s in [-1, 1).
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `A·x` on the host in the kernel's order (per split, then splits in order), for reference.
pub fn gemv_reference(a: &[f32], x: &[f32], m: usize, k: usize, splits: usize) -> Vec<f32> {
    let chunk = k.div_ceil(splits);
    (0..m)
        .map(|r| {
            let mut sum = 0f32;
            for s in 0..splits {
                let mut acc = 0f32;
                for i in (s * chunk)..((s + 1) * chunk).min(k) {
                    acc = a[r * k + i].mul_add(x[i], acc);
                }
                sum += acc;
            }
            sum
        })
        .collect()
}

/// A split-K GEMV problem on the device: `a` (m x k) and `x` random, `y` zeroed, and `expected`,
/// the host reference of `y` in the kernel's order.
pub struct SplitKProblem {
    pub a: DeviceBuffer,
    pub x: DeviceBuffer,
    pub y: DeviceBuffer,
    pub expected: Vec<f32>,
}

/// `shape`'s problem from `seed` (`a` from `seed`, `x` from `seed + 1`).
pub fn split_k_problem(stream: &Stream, shape: SplitKShape, seed: u64) -> SplitKProblem {
    let (m, k) = (shape.m as usize, shape.k as usize);
    let a_host = random_f32(m * k, seed);
    let x_host = random_f32(k, seed + 1);
    SplitKProblem {
        a: DeviceBuffer::from_host(stream, &a_host).unwrap(),
        x: DeviceBuffer::from_host(stream, &x_host).unwrap(),
        y: DeviceBuffer::alloc_zeroed(stream, m * 4).unwrap(),
        expected: gemv_reference(&a_host, &x_host, m, k, shape.splits as usize),
    }
}

/// `shape`'s split-K GEMV launched unguarded on `target` (a stream, or an open capture):
/// the raw addresses are neither checked, nor bound to a capture, nor kept alive, and the counters
/// are not zeroed first. The path graphsafe exists to replace, for the tests that show the guarded
/// one prevents what it does.
///
/// # Safety
/// Every address is valid for the shape for as long as the launch (or any graph that captured
/// it) can run.
pub unsafe fn split_k_gemv_raw<T: LaunchTarget + ?Sized>(k: &TestKernels, a: DevicePtr, x: DevicePtr, y: DevicePtr, shape: SplitKShape, ws: DevicePtr, target: &T) -> graphsafe::Result<()> {
    let (counters, _) = shape.counters_range()?;
    let (mut ptrs, mut sizes) = ([a, x, y, ws, ws + counters], [shape.m as i32, shape.k as i32, shape.splits as i32]);
    let [pa, px, py, pw, pc] = ptrs.each_mut().map(|p| (p as *mut DevicePtr).cast::<std::ffi::c_void>());
    let [m, kk, splits] = sizes.each_mut().map(|v| (v as *mut i32).cast::<std::ffi::c_void>());
    let mut params = [pa, px, py, pw, pc, m, kk, splits];
    // SAFETY: gs_splitk_gemv's parameters, in order and of its C types, each pointing to a local
    // that outlives the call; the caller's contract covers every address.
    unsafe { k.split_k_function().launch(&shape.launch_config(), target, &mut params) }
}

/// Allocates `rounds` buffers of each of `sizes` and dirties them, so that the allocator has
/// certainly handed out freed blocks again: a graph still pointing at one would read someone
/// else's bytes (or, on the stand-in, touch unallocated memory). Keep them alive while replaying.
pub fn churn(stream: &Stream, sizes: &[usize], rounds: usize) -> Vec<DeviceBuffer> {
    let mut held = Vec::new();
    for _ in 0..rounds {
        for &n in sizes {
            let b = DeviceBuffer::alloc(stream.context(), n.next_multiple_of(4)).unwrap();
            b.memset_u32(0xDEAD_BEEF, stream).unwrap();
            held.push(b);
        }
    }
    stream.synchronize().unwrap();
    held
}

/// A stand-in for device memory in CPU validation tests: an address, a size and a context tag.
#[derive(Clone, Copy, Debug)]
pub struct Fake {
    pub ptr: DevicePtr,
    pub len: usize,
    pub ctx: usize,
}

impl DeviceMemory for Fake {
    fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context_raw(&self) -> c::CUcontext {
        self.ctx as c::CUcontext
    }
}

/// `p`'s buffers and `extra` bound to `cap` (the graph keeps them alive): `[a, x, y, extra]`.
pub fn bind_split_k<'id>(cap: &mut Capture<'_, 'id>, p: &SplitKProblem, extra: &DeviceBuffer) -> [CapturedBuffer<'id>; 4] {
    [&p.a, &p.x, &p.y, extra].map(|b| cap.bind_buffer(b).unwrap())
}

/// One split-K GEMV of `p` over `ws`, captured (thread-local) on `stream` and instantiated: the
/// graph keeps `p`'s buffers and `ws`'s current buffer, and its replays use `ws`'s use order.
pub fn captured_split_k(k: &TestKernels, stream: &mut Stream, p: &SplitKProblem, shape: SplitKShape, ws: &mut Workspace) -> GraphExec {
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let w = cap.bind_workspace(ws).unwrap();
    let (a, x, y) = (cap.bind_buffer(&p.a).unwrap(), cap.bind_buffer(&p.x).unwrap(), cap.bind_buffer(&p.y).unwrap());
    k.split_k_gemv_captured(&a, &x, &y, shape, &w, &cap).unwrap();
    cap.end().unwrap().instantiate().unwrap()
}

/// A decode captured into a workspace 256 bytes short of the `needed` its plan answered is
/// refused with `WorkspaceTooSmall` naming both sizes, and nothing is captured. `decode` binds the
/// decode's buffers to the capture and runs it against the bound workspace.
pub fn capture_with_too_small_a_workspace_is_refused<F>(stream: &mut Stream, needed: u64, decode: F)
where
    F: for<'s, 'c> FnOnce(&mut Capture<'s, 'c>, &CapturedWorkspace<'c>) -> graphsafe::Result<MlaDecodePlan>,
{
    assert!(needed > 0, "the shape must need a workspace");
    let mut ws = Workspace::new(stream, needed - 256).unwrap();
    let mut cap = stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let w = cap.bind_workspace(&mut ws).unwrap();
    match decode(&mut cap, &w) {
        Err(graphsafe::Error::WorkspaceTooSmall { needed: n, capacity }) => assert_eq!((n, capacity), (needed, needed - 256)),
        other => panic!("expected WorkspaceTooSmall, got {other:?}"),
    }
    assert!(cap.end().unwrap().node_kinds().unwrap().is_empty(), "a refused decode captured something");
}

//! Engine memory adopted from Rust (`DeviceBuffer::adopt`), on the stand-in driver: a graph that
//! captured it keeps the engine's owner (and so the memory) until the graph is gone, and what the
//! driver can tell is not the context's memory is refused, the owner given back at once.

mod common;
mod standin;

use common::{gemv_reference, random_f32};
use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::testing::{SplitKShape, TestKernels};
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use standin::{engine_memory, exclusive};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An engine's block of device memory: dropping it frees the block (`cuMemFree`, as the engine's
/// allocator would give it back) and counts the drop.
struct EngineBlock {
    ctx: Arc<Context>,
    ptr: u64,
    dropped: Arc<AtomicUsize>,
}

impl Drop for EngineBlock {
    fn drop(&mut self) {
        // SAFETY: the engine allocated `ptr` in `ctx` and gave it to graphsafe only through this
        // block, which graphsafe drops after its last use.
        unsafe { engine_memory::free(&self.ctx, self.ptr) };
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// `bytes` the engine allocates in `ctx` and hands to graphsafe, owned by an [`EngineBlock`].
fn adopt_engine_block(ctx: &Arc<Context>, bytes: usize, dropped: &Arc<AtomicUsize>) -> DeviceBuffer {
    let ptr = engine_memory::alloc(ctx, bytes);
    let block = EngineBlock { ctx: ctx.clone(), ptr, dropped: dropped.clone() };
    // SAFETY: `ptr` is `bytes` of `ctx`'s memory, freed only when the block drops.
    unsafe { DeviceBuffer::adopt(ctx, ptr, bytes, block) }.expect("the engine's memory is adoptable")
}

#[test]
fn a_graph_that_captured_adopted_memory_keeps_its_owner_until_the_graph_drops() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let kernels = TestKernels::load(&ctx).unwrap();
    let shape = SplitKShape { m: 64, k: 256, splits: 4 };
    let (m, k) = (shape.m as usize, shape.k as usize);
    let (a_host, x_host) = (random_f32(m * k, 7), random_f32(k, 8));
    let expected = gemv_reference(&a_host, &x_host, m, k, shape.splits as usize);

    let dropped = Arc::new(AtomicUsize::new(0));
    let a = adopt_engine_block(&ctx, m * k * 4, &dropped);
    let x = adopt_engine_block(&ctx, k * 4, &dropped);
    let y = adopt_engine_block(&ctx, m * 4, &dropped);
    a.copy_from_host(&a_host, &stream).unwrap();
    x.copy_from_host(&x_host, &stream).unwrap();
    let mut ws = Workspace::new(&stream, shape.workspace_bytes().unwrap()).unwrap();
    let exec = {
        let (graph, ()) = stream
            .capture(CaptureMode::ThreadLocal, |cap| {
                let w = cap.bind_workspace(&mut ws)?;
                let (ca, cx, cy) = (cap.bind_buffer(&a)?, cap.bind_buffer(&x)?, cap.bind_buffer(&y)?);
                cap.memset_u8(&cy, 0)?;
                kernels.split_k_gemv_captured(&ca, &cx, &cy, shape, &w, cap)
            })
            .unwrap();
        assert_eq!(graph.kept_alive(), 4, "the workspace and the three adopted buffers");
        graph.instantiate().unwrap()
        // The graph itself is dropped here: the executable holds what it captured.
    };

    // The engine drops its handles of A and x (y it keeps, to read the result): the graph still
    // holds their owners, so their memory stays allocated.
    drop(a);
    drop(x);
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "an owner was dropped while a graph still used its memory");
    for _ in 0..10 {
        y.memset_u8(0xff, &stream).unwrap();
        exec.launch(&stream).unwrap();
        assert_eq!(y.to_host_vec::<f32>(&stream).unwrap(), expected);
    }
    assert_eq!(s.violations(), 0, "a replay touched freed memory: {}", s.last_violation());

    // The last holders of A and x go with the executable: their owners are dropped (freeing the
    // engine's blocks), y's is not.
    let live = s.live_allocations();
    drop(exec);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
    assert_eq!(s.live_allocations(), live - 2, "A's and x's blocks were given back");
    let y2 = y.clone();
    drop(y);
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "a clone still holds y");
    drop(y2);
    assert_eq!(dropped.load(Ordering::SeqCst), 3, "each owner is dropped exactly once");
    assert_eq!(s.live_allocations(), live - 3);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

/// An owner that only counts its drop.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn adoption_refuses_memory_the_driver_says_is_not_the_contexts_and_gives_the_owner_back() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let ctx1 = Context::new(1).expect("the stand-in's device 1");
    // SAFETY: the stand-in's engine context of device 0 lives as long as the library.
    let engine_ctx = unsafe { Context::adopt(s.engine_context(0)) }.unwrap();
    let on0 = engine_memory::alloc(&ctx, 4096);
    let on1 = engine_memory::alloc(&ctx1, 4096);
    let in_engine_ctx = engine_memory::alloc(&engine_ctx, 4096);
    let ours = DeviceBuffer::alloc(&ctx, 4096).unwrap();

    let refused = |ptr: u64, bytes: usize, what: &str, needle: &str| {
        let dropped = Arc::new(AtomicUsize::new(0));
        // SAFETY: never adopted: every case is refused before anything is kept (asserted below);
        // were one accepted, the memory would stay allocated until the end of the test.
        let r = unsafe { DeviceBuffer::adopt(&ctx, ptr, bytes, Counted(dropped.clone())) };
        match r {
            Err(Error::InvalidArgument { what: w, expected, got }) => {
                assert_eq!(w, what, "{ptr:#x} + {bytes}: {expected}, got {got}");
                let text = format!("{expected} {got}");
                assert!(text.contains(needle), "{ptr:#x} + {bytes}: {text:?} does not say {needle:?}");
            }
            other => panic!("{ptr:#x} + {bytes} ({what}): expected a refusal, got {other:?}"),
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "{what}: the owner of a refused adoption is dropped at once");
    };
    refused(on0, 0, "bytes", "at least 1");
    refused(0, 64, "ptr", "null");
    refused(u64::MAX - 8, 64, "bytes", "address space");
    // An address no allocation holds.
    refused(16, 64, "ptr", "does not know");
    refused(on1, 64, "ptr.device", "device 1");
    refused(in_engine_ctx, 64, "ptr.context", "another context");
    refused(on0, 4097, "bytes", "at most 4096");
    // From an address inside the block, what is left of it.
    refused(on0 + 4000, 200, "bytes", "at most 96");
    refused(ours.device_ptr() + 64, 64, "ptr", "graphsafe buffer");

    // A sub-range, adopted twice (two engine handles of one block): each adoption keeps its owner.
    let dropped = Arc::new(AtomicUsize::new(0));
    let first = {
        // SAFETY: `on0` is freed below, after both buffers (and their owners) are gone.
        unsafe { DeviceBuffer::adopt(&ctx, on0 + 64, 128, Counted(dropped.clone())) }.unwrap()
    };
    // SAFETY: as above.
    let second = unsafe { DeviceBuffer::adopt(&ctx, on0 + 64, 128, Counted(dropped.clone())) }.unwrap();
    assert_eq!((first.device_ptr(), first.len()), (on0 + 64, 128));
    drop(first);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    drop(second);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);

    // SAFETY: allocated above, no graphsafe holder left.
    unsafe {
        engine_memory::free(&ctx, on0);
        engine_memory::free(&ctx1, on1);
        engine_memory::free(&engine_ctx, in_engine_ctx);
    }
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

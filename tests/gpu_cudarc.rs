//! cudarc interop on the GPU (feature `cudarc`): one driver and one context for both crates; an
//! MLA decode and a W4A16 GEMM over cudarc-owned memory captured through graphsafe and replayed
//! after the engine dropped every cudarc handle to that memory and the allocator was churned; and
//! the contrast with cudarc's own graphs, which keep only the stream alive.
//!
//! Every test asks graphsafe for a GPU first (and skips without one): cudarc panics when it finds
//! no driver library, so it is touched only once graphsafe found one.
#![cfg(feature = "cudarc")]

mod common;

use common::random_f32;
use cudarc::driver::{sys as cusys, CudaContext, CudaSlice, CudaStream, DevicePtr};
use graphsafe::arch::{Backend, MlaArch, Nvfp4Arch};
use graphsafe::driver::{cudarc::shares_driver, Context, DeviceBuffer, DevicePtr as Addr, MemInfo, Stream};
use graphsafe::graph::CaptureMode;
use graphsafe::ops::mla::reference::{cpu_decode, HostProblem};
use graphsafe::ops::mla::{decode, decode_captured, MlaDecodeArgs};
use graphsafe::ops::nvfp4::{self, reference as r, Nvfp4Matrix, W4a16GemmArgs};
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::workspace::Workspace;
use graphsafe::Error;
use half::bf16;
use std::sync::Arc;

/// The tests watch one allocator (the device's default memory pool, which cudarc allocates from):
/// they run one at a time, whatever the harness's thread count.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A GPU according to graphsafe (or `None`, with the skip printed), then cudarc's view of device 0:
/// its context and a new stream (which puts cudarc in multi-stream mode: event tracking on).
fn engine() -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    common::gpu()?;
    let ctx = CudaContext::new(0).expect("cudarc: CudaContext::new(0)");
    let stream = ctx.new_stream().expect("cudarc: new_stream");
    Some((ctx, stream))
}

fn hopper(ctx: &Context) -> bool {
    let cc = ctx.compute_capability();
    common::runs_backends(cc, &[Backend::Mla(MlaArch::Sm90), Backend::Nvfp4(Nvfp4Arch::Sm90)], "the sm90 MLA and W4A16 kernels")
}

fn addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> Addr {
    let (p, _record) = s.device_ptr(stream);
    p
}

fn bf16_bits(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    v.iter().map(|&x| { let h = bf16::from_f32(x); (h.to_bits(), h.to_f32()) }).unzip()
}

fn expect_invalid<T: std::fmt::Debug>(r: graphsafe::Result<T>, mentions: &str) {
    match r {
        Err(Error::InvalidArgument { what, expected, got }) => {
            let text = format!("{what} {expected} {got}");
            assert!(text.contains(mentions), "refusal should mention {mentions:?}: {text}");
        }
        other => panic!("expected InvalidArgument mentioning {mentions:?}, got {other:?}"),
    }
}

#[test]
fn asking_whether_the_crates_share_a_driver_never_panics() {
    // Without a driver graphsafe's error comes back (cudarc, which would panic, is not touched);
    // with one, both crates resolve to it.
    match graphsafe::sys::driver::api() {
        Err(_) => assert!(matches!(shares_driver(), Err(Error::DriverNotFound { .. })), "{:?}", shares_driver()),
        Ok(_) => assert!(shares_driver().unwrap()),
    }
}

#[test]
fn both_crates_share_one_driver_one_context_and_the_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((cctx, cs)) = engine() else { return };
    // One loaded driver: graphsafe's entry points and cudarc's resolve to the same addresses.
    assert!(shares_driver().unwrap(), "graphsafe and cudarc resolve the driver differently");
    let ours = graphsafe::sys::driver::api().unwrap().cuMemAlloc().unwrap().f as usize;
    // SAFETY: the driver is present (graphsafe opened it); the address is only compared.
    let theirs = unsafe { cusys::culib().get::<*const ()>("cuMemAlloc_v2") }.map(|s| *s as usize).unwrap();
    assert_eq!(ours, theirs, "cuMemAlloc_v2 resolves to two addresses: two copies of the driver");

    // One primary context: graphsafe's retained one is cudarc's.
    let primary = Context::new(0).unwrap();
    assert_eq!(primary.raw() as usize, cctx.cu_ctx() as usize);
    let ctx = Context::from_cudarc(&cctx).unwrap();
    assert_eq!(ctx.raw(), primary.raw());
    assert_eq!(ctx.compute_capability(), cctx.compute_capability().unwrap());

    // The caller's current context survives graphsafe calls, whoever made it current (invariant 12
    // across the crates): cudarc made its context current; clear it and graphsafe leaves it clear.
    // SAFETY: null unbinds the thread's context.
    unsafe { cudarc::driver::result::ctx::set_current(std::ptr::null_mut()) }.unwrap();
    let free = MemInfo::query(&ctx).unwrap();
    assert!(free.free > 0 && free.total >= free.free);
    assert_eq!(cudarc::driver::result::ctx::get_current().unwrap(), None, "graphsafe left a context current");
    cctx.bind_to_thread().unwrap();

    // Memory crosses both ways on one stream: cudarc writes, graphsafe reads; graphsafe writes,
    // cudarc reads (after graphsafe's work, by stream order).
    // SAFETY: this test issues no cudarc work to `cs` while a graphsafe capture is open on it.
    let stream = unsafe { Stream::from_cudarc(&ctx, &cs) }.unwrap();
    assert_eq!(stream.raw() as usize, cs.cu_stream() as usize);
    let data: Vec<u32> = (0..4096u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let slice = Arc::new(cs.clone_htod(&data).unwrap());
    let buf = DeviceBuffer::from_cudarc(&ctx, slice.clone()).unwrap();
    assert_eq!((buf.device_ptr(), buf.len()), (addr(&slice, &cs), 4096 * 4));
    assert_eq!(buf.to_host_vec::<u32>(&stream).unwrap(), data);
    buf.memset_u32(0x0102_0304, &stream).unwrap();
    assert_eq!(cs.clone_dtoh(&*slice).unwrap(), vec![0x0102_0304u32; 4096]);

    // Refusals: cudarc's legacy stream, and objects of another context.
    // SAFETY: refused before anything is adopted.
    expect_invalid(unsafe { Stream::from_cudarc(&ctx, &cctx.default_stream()) }, "legacy");
    let other = CudaContext::new_non_primary(0, 0).unwrap();
    let other_stream = other.new_stream().unwrap();
    let foreign = other_stream.alloc_zeros::<u8>(64).unwrap();
    // SAFETY: refused before anything is adopted.
    expect_invalid(unsafe { Stream::from_cudarc(&ctx, &other_stream) }, "another context");
    expect_invalid(DeviceBuffer::from_cudarc(&ctx, foreign), "another context");
    cctx.bind_to_thread().unwrap();
}

/// One decode step's engine-owned data, on the host: an MLA batch and an NVFP4 weight.
struct Step {
    batch: usize,
    heads: usize,
    page: usize,
    pages: usize,
    max_pages: usize,
    max_seq: usize,
    seq_lens: Vec<i32>,
    page_table: Vec<i32>,
    q_nope: (Vec<u16>, Vec<f32>),
    q_pe: (Vec<u16>, Vec<f32>),
    kv: (Vec<u16>, Vec<f32>),
    n: usize,
    w_packed: Vec<u8>,
    w_scales: Vec<u8>,
    w_gs: f32,
    w_dequantized: Vec<f32>,
    sm_scale: f32,
}

fn step(heads: usize, page: usize, seq_lens: Vec<i32>, n: usize, seed: u64) -> Step {
    let batch = seq_lens.len();
    let max_seq = *seq_lens.iter().max().unwrap() as usize;
    let max_pages = max_seq.div_ceil(page) + 1;
    let used: usize = seq_lens.iter().map(|&l| (l as usize).div_ceil(page)).sum();
    let pages = used + 2;
    // Pages handed out in a scrambled order, as a paged KV cache does.
    let order: Vec<i32> = (0..pages as i32).map(|i| (i * 37 + 11) % pages as i32).collect();
    let mut page_table = vec![order[pages - 1]; batch * max_pages];
    let mut next = 0;
    for b in 0..batch {
        for p in 0..(seq_lens[b] as usize).div_ceil(page) {
            page_table[b * max_pages + p] = order[next];
            next += 1;
        }
    }
    // The GEMM projects the attention output: [batch * heads, 512] · Wᵀ, W of [n, 512].
    let (_, wf) = bf16_bits(&random_f32(n * 512, seed + 4));
    let w_gs = r::global_scale(&wf);
    let (w_packed, w_scales) = r::quantize(&wf, n, 512, w_gs).unwrap();
    let w_dequantized = r::dequantize(&w_packed, &w_scales, n, 512, w_gs).unwrap();
    Step {
        batch,
        heads,
        page,
        pages,
        max_pages,
        max_seq,
        q_nope: bf16_bits(&random_f32(batch * heads * 512, seed + 1)),
        q_pe: bf16_bits(&random_f32(batch * heads * 64, seed + 2)),
        kv: bf16_bits(&random_f32(pages * page * 576, seed + 3)),
        seq_lens,
        page_table,
        n,
        w_packed,
        w_scales,
        w_gs,
        w_dequantized,
        sm_scale: 1.0 / (192f32).sqrt(),
    }
}

/// The engine's memory: every tensor of the step is a cudarc slice the engine allocated.
struct EngineMemory {
    q_nope: Arc<CudaSlice<u16>>,
    q_pe: Arc<CudaSlice<u16>>,
    kv_cache: Arc<CudaSlice<u16>>,
    seq_lens: Arc<CudaSlice<i32>>,
    page_table: Arc<CudaSlice<i32>>,
    out: Arc<CudaSlice<u16>>,
    lse: Arc<CudaSlice<f32>>,
    w_packed: Arc<CudaSlice<u8>>,
    w_scales: Arc<CudaSlice<u8>>,
    w_gs: Arc<CudaSlice<f32>>,
    alpha: Arc<CudaSlice<f32>>,
    d: Arc<CudaSlice<u16>>,
}

impl EngineMemory {
    fn upload(s: &Step, cs: &Arc<CudaStream>) -> EngineMemory {
        let up = |v: &[u16]| Arc::new(cs.clone_htod(v).unwrap());
        EngineMemory {
            q_nope: up(&s.q_nope.0),
            q_pe: up(&s.q_pe.0),
            kv_cache: up(&s.kv.0),
            seq_lens: Arc::new(cs.clone_htod(&s.seq_lens).unwrap()),
            page_table: Arc::new(cs.clone_htod(&s.page_table).unwrap()),
            out: Arc::new(cs.alloc_zeros::<u16>(s.batch * s.heads * 512).unwrap()),
            lse: Arc::new(cs.alloc_zeros::<f32>(s.batch * s.heads).unwrap()),
            w_packed: Arc::new(cs.clone_htod(&s.w_packed).unwrap()),
            w_scales: Arc::new(cs.clone_htod(&s.w_scales).unwrap()),
            w_gs: Arc::new(cs.clone_htod(&[s.w_gs]).unwrap()),
            alpha: Arc::new(cs.clone_htod(&[1.0f32]).unwrap()),
            d: Arc::new(cs.alloc_zeros::<u16>(s.batch * s.heads * s.n).unwrap()),
        }
    }
}

/// The same memory handed to graphsafe (each buffer holds a share of its slice).
struct Adopted {
    q_nope: DeviceBuffer,
    q_pe: DeviceBuffer,
    kv_cache: DeviceBuffer,
    seq_lens: DeviceBuffer,
    page_table: DeviceBuffer,
    out: DeviceBuffer,
    lse: DeviceBuffer,
    w_packed: DeviceBuffer,
    w_scales: DeviceBuffer,
    w_gs: DeviceBuffer,
    alpha: DeviceBuffer,
    d: DeviceBuffer,
}

impl Adopted {
    fn new(ctx: &Arc<Context>, e: &EngineMemory) -> Adopted {
        Adopted {
            q_nope: DeviceBuffer::from_cudarc(ctx, e.q_nope.clone()).unwrap(),
            q_pe: DeviceBuffer::from_cudarc(ctx, e.q_pe.clone()).unwrap(),
            kv_cache: DeviceBuffer::from_cudarc(ctx, e.kv_cache.clone()).unwrap(),
            seq_lens: DeviceBuffer::from_cudarc(ctx, e.seq_lens.clone()).unwrap(),
            page_table: DeviceBuffer::from_cudarc(ctx, e.page_table.clone()).unwrap(),
            out: DeviceBuffer::from_cudarc(ctx, e.out.clone()).unwrap(),
            lse: DeviceBuffer::from_cudarc(ctx, e.lse.clone()).unwrap(),
            w_packed: DeviceBuffer::from_cudarc(ctx, e.w_packed.clone()).unwrap(),
            w_scales: DeviceBuffer::from_cudarc(ctx, e.w_scales.clone()).unwrap(),
            w_gs: DeviceBuffer::from_cudarc(ctx, e.w_gs.clone()).unwrap(),
            alpha: DeviceBuffer::from_cudarc(ctx, e.alpha.clone()).unwrap(),
            d: DeviceBuffer::from_cudarc(ctx, e.d.clone()).unwrap(),
        }
    }

    /// The slices the captured step bakes in (the weight's go into the prepared weight instead).
    fn captured(&self) -> [&DeviceBuffer; 9] {
        [&self.q_nope, &self.q_pe, &self.kv_cache, &self.seq_lens, &self.page_table, &self.out, &self.lse, &self.alpha, &self.d]
    }

    fn mla_args(&self, s: &Step) -> MlaDecodeArgs<&DeviceBuffer> {
        let (b, h) = (s.batch, s.heads);
        MlaDecodeArgs::new(
            Tensor::contiguous(&self.q_nope, DType::Bf16, &[b, h, 512]),
            Tensor::contiguous(&self.q_pe, DType::Bf16, &[b, h, 64]),
            Tensor::contiguous(&self.kv_cache, DType::Bf16, &[s.pages, s.page, 576]),
            Tensor::contiguous(&self.seq_lens, DType::I32, &[b]),
            Tensor::contiguous(&self.page_table, DType::I32, &[b, s.max_pages]),
            Tensor::contiguous(&self.out, DType::Bf16, &[b, h, 512]),
        )
        .with_lse(Tensor::contiguous(&self.lse, DType::F32, &[b, h]))
        .with_sm_scale(s.sm_scale)
        .with_max_seq_len(s.max_seq as u32)
    }
}

fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs())).max(1e-9);
    got.iter().zip(want).fold(0f64, |e, (&g, &w)| e.max((g as f64 - w).abs())) / scale
}

#[test]
fn a_captured_mla_decode_and_w4a16_over_cudarc_memory_replay_after_the_engine_drops_its_handles() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((cctx, cs)) = engine() else { return };
    let ctx = Context::from_cudarc(&cctx).unwrap();
    if !hopper(&ctx) {
        return;
    }
    // SAFETY: this test issues no cudarc work to `cs` while a graphsafe capture is open on it.
    let mut stream = unsafe { Stream::from_cudarc(&ctx, &cs) }.unwrap();
    let s = step(16, 64, vec![1000, 1, 333, 2048], 1024, 7);
    let (m, n) = (s.batch * s.heads, s.n);

    let engine = EngineMemory::upload(&s, &cs);
    let bufs = Adopted::new(&ctx, &engine);
    let weight = nvfp4::prepare_weight(
        &Nvfp4Matrix::new(&bufs.w_packed, &bufs.w_scales, &bufs.w_gs, n, 512),
        &stream,
    )
    .unwrap();
    let mut ws = Workspace::new(&stream, 0).unwrap();

    // Eager: attention, then the projection of its output.
    let args = bufs.mla_args(&s);
    let mla_plan = decode(&args, &mut ws, &stream).unwrap();
    let a = Tensor::contiguous(&bufs.out, DType::Bf16, &[m, 512]);
    let d = Tensor::contiguous(&bufs.d, DType::Bf16, &[m, n]);
    let gemm_plan = nvfp4::w4a16_gemm(&W4a16GemmArgs::new(a.clone(), &weight, &bufs.alpha, d.clone()), &mut ws, &stream).unwrap();
    let eager_out = bufs.out.to_host_vec::<u16>(&stream).unwrap();
    let eager_lse = bufs.lse.to_host_vec::<u32>(&stream).unwrap();
    let eager_d = bufs.d.to_host_vec::<u16>(&stream).unwrap();
    // The engine sees graphsafe's results through cudarc on the same stream.
    assert_eq!(cs.clone_dtoh(&*engine.out).unwrap(), eager_out);
    assert_eq!(cs.clone_dtoh(&*engine.d).unwrap(), eager_d);

    // The eager results are right: MLA against the f64 CPU reference, the GEMM against its f64
    // reference over the kernel's own (bf16) attention output.
    let (ref_out, _) = cpu_decode(&HostProblem {
        q_nope: &s.q_nope.1,
        q_pe: &s.q_pe.1,
        kv: &s.kv.1,
        seq_lens: &s.seq_lens,
        page_table: &s.page_table,
        page_table_stride: s.max_pages,
        page_size: s.page,
        num_heads: s.heads,
        s_q: 1,
        causal: false,
        sm_scale: s.sm_scale,
    })
    .unwrap();
    let out_f: Vec<f32> = eager_out.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let ref_out64: Vec<f64> = ref_out.iter().map(|&v| v as f64).collect();
    let e_mla = max_rel_err(&out_f, &ref_out64);
    let ref_d: Vec<f64> = (0..m * n)
        .map(|i| (0..512).map(|t| out_f[(i / n) * 512 + t] as f64 * s.w_dequantized[(i % n) * 512 + t] as f64).sum())
        .collect();
    let d_f: Vec<f32> = eager_d.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let e_gemm = max_rel_err(&d_f, &ref_d);
    eprintln!("eager: MLA normalized error {e_mla:.2e} ({mla_plan:?}), W4A16 {e_gemm:.2e} (workspace {})", gemm_plan.workspace_bytes);
    assert!(e_mla < 2e-2 && e_gemm < 1e-2, "eager errors: MLA {e_mla:.3e}, W4A16 {e_gemm:.3e}");

    // Capture the step into one graph: clear the outputs, attention, projection, then copy the
    // outputs into read-back buffers graphsafe owns (so every cudarc slice is reachable only
    // through the graph afterwards).
    let rb_out = DeviceBuffer::alloc(&ctx, bufs.out.len()).unwrap();
    let rb_lse = DeviceBuffer::alloc(&ctx, bufs.lse.len()).unwrap();
    let rb_d = DeviceBuffer::alloc(&ctx, bufs.d.len()).unwrap();
    let (graph, kept) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let w = cap.bind_workspace(&mut ws)?;
            let cargs = args.bind(cap)?;
            let mut bind = |b: &DeviceBuffer| cap.bind_buffer(b);
            let (out, lse, dd) = (bind(&bufs.out)?, bind(&bufs.lse)?, bind(&bufs.d)?);
            let alpha = bind(&bufs.alpha)?;
            let (rb_out, rb_lse, rb_d) = (bind(&rb_out)?, bind(&rb_lse)?, bind(&rb_d)?);
            cap.memset_u8(&out, 0)?;
            cap.memset_u8(&lse, 0)?;
            cap.memset_u8(&dd, 0)?;
            assert_eq!(decode_captured(&cargs, &w, cap)?, mla_plan);
            let cw = weight.bind(cap)?;
            let a = Tensor::contiguous(out.clone(), DType::Bf16, &[m, 512]);
            let d = Tensor::contiguous(dd.clone(), DType::Bf16, &[m, n]);
            assert_eq!(nvfp4::w4a16_gemm_captured(&W4a16GemmArgs::new(a.clone(), cw.clone(), alpha.clone(), d.clone()), &w, cap)?, gemm_plan);
            cap.copy(&rb_out, &out)?;
            cap.copy(&rb_lse, &lse)?;
            cap.copy(&rb_d, &dd)?;
            Ok(cap.kept_alive())
        })
        .unwrap();
    let exec = graph.instantiate().unwrap();
    // Each once: the 9 cudarc slices the step reads or writes (the NVFP4 weight's three went into
    // the prepared weight), the 3 read-back buffers, the prepared weight and the workspace (the
    // split MLA decode's; the W4A16 plan of this shape may need none).
    assert!(mla_plan.workspace_bytes > 0, "the MLA plan ({mla_plan:?}) uses the workspace");
    assert_eq!(exec.kept_alive(), 9 + 3 + 1 + 1, "the graph keeps {} allocations ({kept} bindings)", exec.kept_alive());
    drop(graph);

    // The engine lets go: every graphsafe handle and every cudarc handle to the step's memory, the
    // prepared weight and the workspace. Only the executable holds them now.
    let held: Vec<(Addr, usize)> = bufs.captured().iter().map(|b| (b.device_ptr(), b.len())).collect();
    drop((args, a, d));
    drop((bufs, engine, weight, ws));

    // Churn cudarc's allocator (the pool the freed slices would go back to) with the same sizes,
    // filled with garbage, and graphsafe's with blocks of every size: none lands on held memory.
    let mut churn: Vec<CudaSlice<u8>> = Vec::new();
    for _ in 0..3 {
        for &(_, len) in &held {
            churn.push(cs.clone_htod(&vec![0xA5u8; len]).unwrap());
        }
    }
    let mut churn_gs = Vec::new();
    for &(_, len) in &held {
        let b = DeviceBuffer::alloc(&ctx, len.next_multiple_of(4)).unwrap();
        b.memset_u32(0xDEAD_BEEF, &stream).unwrap();
        churn_gs.push(b);
    }
    for c in &churn {
        let (p, len) = (addr(c, &cs), c.len() as u64);
        for &(h, hl) in &held {
            assert!(p + len <= h || h + hl as u64 <= p, "a churn slice at {p:#x} overlaps held memory at {h:#x}");
        }
    }

    // Replay: every run recomputes from the (cudarc-owned) inputs, bit-identical to eager.
    for i in 0..120 {
        for b in [&rb_out, &rb_lse, &rb_d] {
            b.memset_u8(0xFF, &stream).unwrap();
        }
        exec.launch(&stream).unwrap();
        assert_eq!(rb_out.to_host_vec::<u16>(&stream).unwrap(), eager_out, "replay {i}: attention output");
        assert_eq!(rb_lse.to_host_vec::<u32>(&stream).unwrap(), eager_lse, "replay {i}: lse");
        assert_eq!(rb_d.to_host_vec::<u16>(&stream).unwrap(), eager_d, "replay {i}: projection");
    }
    eprintln!("120 replays bit-identical to eager after the engine dropped its handles; {} churn slices", churn.len());
    drop(churn);
    drop(exec);
    stream.synchronize().unwrap();
}

#[test]
fn cudarcs_own_graphs_keep_only_the_stream_alive_graphsafes_keep_the_slices() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((cctx, _)) = engine() else { return };
    // A context object of its own with event tracking off: cudarc's capture must not wait on
    // events recorded outside it (cudarc's own graph tests do the same).
    let cctx2 = CudaContext::new(0).unwrap();
    // SAFETY: every slice of this context is used on the one stream below only, so cudarc's
    // cross-stream events are not needed.
    unsafe { cctx2.disable_event_tracking() };
    let cs = cctx2.new_stream().unwrap();
    drop(cctx);
    const N: usize = 1 << 20; // 4 MiB of u32
    let ctx = Context::from_cudarc(&cctx2).unwrap();
    // The pool hands a freed block of the same size back on the same stream: look for it.
    let reused = |target: Addr| -> bool {
        let probes: Vec<CudaSlice<u32>> = (0..8).map(|_| cs.alloc_zeros::<u32>(N).unwrap()).collect();
        probes.iter().any(|p| addr(p, &cs) == target)
    };
    // Freed: reused as above, or (should the pool pick other blocks) its bytes come back to the
    // device when the pool trims at a synchronize (release threshold 0, the default).
    let freed = |target: Addr, free_while_held: u64| -> bool {
        if reused(target) {
            return true;
        }
        cs.synchronize().unwrap();
        MemInfo::query(&ctx).unwrap().free >= free_while_held + (N * 4) as u64
    };
    let free_now = || {
        cs.synchronize().unwrap();
        MemInfo::query(&ctx).unwrap().free
    };

    // cudarc: capture a memset of x, then drop x. The graph holds the stream (one more strong
    // count) but not x: x's memory is freed while the graph, which bakes in its address, lives.
    // (The graph is never launched: that would write into whatever holds the address now.)
    let mut x = cs.alloc_zeros::<u32>(N).unwrap();
    let x_addr = addr(&x, &cs);
    let before = Arc::strong_count(&cs);
    cs.begin_capture(cusys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    cs.memset_zeros(&mut x).unwrap();
    let cudarc_graph = cs.end_capture(cusys::CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    assert_eq!(Arc::strong_count(&cs), before + 1, "cudarc's graph holds its stream");
    let held = free_now();
    drop(x);
    assert!(freed(x_addr, held), "x's memory was not freed while cudarc's graph lives");
    drop(cudarc_graph);

    // graphsafe, same allocator and sizes: capture a memset of a slice handed over, drop every
    // handle; the executable holds the slice, so no allocation can get its address.
    // SAFETY: this test issues no cudarc work to `cs` while a graphsafe capture is open on it.
    let mut stream = unsafe { Stream::from_cudarc(&ctx, &cs) }.unwrap();
    let z = cs.alloc_zeros::<u32>(N).unwrap();
    let z_addr = addr(&z, &cs);
    let zb = DeviceBuffer::from_cudarc(&ctx, z).unwrap();
    let (graph, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let b = cap.bind_buffer(&zb)?;
            cap.memset_u8(&b, 0x5A)
        })
        .unwrap();
    let exec = graph.instantiate().unwrap();
    drop((graph, zb));
    assert!(!reused(z_addr), "graphsafe's executable let its slice go");
    // Replaying is sound: the memory is still the slice's.
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    // The executable was what held it: once it goes, the memory is freed.
    let held = free_now();
    drop(exec);
    assert!(freed(z_addr, held), "the slice was not freed after the last executable went");
    stream.synchronize().unwrap();
}

/// Handing a cudarc slice over while a graphsafe capture of the context is open on another thread
/// is refused (`StreamCapturing`), as documented: the context-wide wait that makes the slice's
/// pending cudarc uses (on any stream) finished would invalidate that capture, and waiting only
/// for graphsafe's streams would leave the engine's stream still writing the slice. Once the
/// capture has ended, the same slice is handed over.
#[test]
fn a_slice_is_not_handed_over_while_a_capture_of_the_context_is_open_on_another_thread() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((cctx, cs)) = engine() else { return };
    let ctx = Context::from_cudarc(&cctx).unwrap();
    let slice = cs.alloc_zeros::<u32>(1 << 20).unwrap();
    let (opened, open) = std::sync::mpsc::channel::<()>();
    let (close, closed) = std::sync::mpsc::channel::<()>();
    let capturing = {
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            let mut s = Stream::new(&ctx).unwrap();
            let cap = s.begin_capture(CaptureMode::Relaxed).unwrap();
            opened.send(()).unwrap();
            closed.recv().unwrap();
            cap.end().unwrap()
        })
    };
    open.recv().unwrap();
    let slice = Arc::new(slice);
    match DeviceBuffer::from_cudarc(&ctx, slice.clone()) {
        Err(Error::StreamCapturing { detail }) => assert!(detail.contains("another thread"), "{detail}"),
        other => panic!("expected StreamCapturing while another thread captures, got {:?}", other.map(|b| b.len())),
    }
    close.send(()).unwrap();
    let graph = capturing.join().unwrap();
    assert!(graph.node_kinds().unwrap().is_empty(), "the refusal recorded nothing in the open capture");
    let buf = DeviceBuffer::from_cudarc(&ctx, slice).expect("handed over once the capture ended");
    assert_eq!(buf.len(), 4 << 20);
}

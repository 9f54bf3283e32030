//! The ops' `bind` methods on the stand-in driver: each binds every buffer of its arguments to the
//! capture (so the graph keeps them alive), keeps the views as they were, and refuses memory of
//! another device.

mod standin;

use graphsafe::driver::{Context, DeviceBuffer, Stream};
use graphsafe::graph::{CaptureMode, CapturedBuffer};
use graphsafe::ops::cudnn::{MatmulArgs, Nvfp4MatmulArgs, Nvfp4Problem};
use graphsafe::ops::nvfp4::Nvfp4Matrix;
use graphsafe::ops::tensor::{DType, Tensor};
use graphsafe::Error;
use standin::exclusive;

/// The fields of a tensor that `bind` must keep, with its memory's address.
fn view<M: graphsafe::ops::tensor::DeviceMemory>(t: &Tensor<M>) -> (u64, usize, DType, Vec<usize>, Vec<usize>) {
    (t.mem.device_ptr(), t.offset, t.dtype, t.shape.clone(), t.strides.clone())
}

#[test]
fn bind_binds_every_buffer_of_an_ops_arguments_and_the_graph_keeps_them() {
    let (_g, s) = exclusive();
    let ctx = Context::new(0).expect("the stand-in's device 0");
    let mut stream = Stream::new(&ctx).unwrap();
    let other_ctx = Context::new(1).unwrap();
    let other = DeviceBuffer::alloc_zeroed(&Stream::new(&other_ctx).unwrap(), 4096).unwrap();
    let bufs: Vec<DeviceBuffer> = (0..8).map(|_| DeviceBuffer::alloc_zeroed(&stream, 1 << 16).unwrap()).collect();

    let t = Tensor::strided(&bufs[0], 256, DType::Bf16, &[4, 8], &[16, 1]);
    let m = Nvfp4Matrix::new(&bufs[1], &bufs[2], &bufs[3], 128, 64);
    let mm = MatmulArgs::new(
        Tensor::contiguous(&bufs[4], DType::Bf16, &[16, 32]),
        Tensor::strided(&bufs[5], 0, DType::Bf16, &[32, 64], &[1, 32]),
        Tensor::contiguous(&bufs[4], DType::F32, &[16, 64]),
    );
    let nv = Nvfp4MatmulArgs::new(
        Nvfp4Problem::new(128, 128, 64, DType::Bf16),
        &bufs[6],
        &bufs[7],
        &bufs[6],
        &bufs[7],
        &bufs[3],
        Tensor::contiguous(&bufs[0], DType::Bf16, &[128, 128]),
    );

    let (graph, ()) = stream
        .capture(CaptureMode::ThreadLocal, |cap| {
            let own = |b: &CapturedBuffer<'_>, of: &DeviceBuffer| {
                assert_eq!((b.device_ptr(), b.len()), (of.device_ptr(), of.len()));
            };
            let tc = t.bind(cap)?;
            assert_eq!(view(&tc), view(&t));
            assert_eq!(tc.mem.capture_id(), cap.id());

            let mc = m.bind(cap)?;
            own(&mc.packed, &bufs[1]);
            own(&mc.scales, &bufs[2]);
            own(&mc.global_scale, &bufs[3]);
            assert_eq!((mc.rows, mc.k), (128, 64));

            let mmc = mm.bind(cap)?;
            assert_eq!((view(&mmc.a), view(&mmc.b), view(&mmc.c)), (view(&mm.a), view(&mm.b), view(&mm.c)));

            let nvc = nv.bind(cap)?;
            assert_eq!(nvc.problem, nv.problem);
            for (b, of) in [(&nvc.a, &bufs[6]), (&nvc.a_scale, &bufs[7]), (&nvc.b, &bufs[6]), (&nvc.b_scale, &bufs[7]), (&nvc.alpha, &bufs[3])] {
                own(b, of);
            }
            assert_eq!(view(&nvc.c), view(&nv.c));

            let elsewhere = Tensor::contiguous(&other, DType::Bf16, &[8]);
            assert!(matches!(elsewhere.bind(cap), Err(Error::InvalidArgument { .. })), "memory of another device was bound");
            Ok(())
        })
        .unwrap();
    assert_eq!(graph.kept_alive(), 8, "each buffer once, however many arguments name it");

    // The graph holds what was bound: dropping every handle frees nothing until the graph goes.
    let live = s.live_allocations();
    drop((t, m, mm, nv));
    drop(bufs);
    assert_eq!(s.live_allocations(), live, "a bound buffer was freed while its graph lived");
    drop(graph);
    assert_eq!(s.live_allocations(), live - 8);
    assert_eq!(s.violations(), 0, "{}", s.last_violation());
}

//! NVFP4 planning and argument validation on the CPU: the Blackwell tile choice, CUTLASS's
//! workspace sizes, the Hopper kernel's plan, and every validation rule of an NVFP4 operand.

use graphsafe::ops::nvfp4::{self, Nvfp4Arch, Nvfp4Matrix, Tile};
use graphsafe::ops::tensor::DType;
use graphsafe::sys::cuda as c;
use graphsafe::Error;

mod common;
use common::Fake;

fn tile(m: u32, n: u32, k: u32, cm: u32) -> Tile {
    Tile { m, n, k, cluster_m: cm, cluster_n: 1 }
}

#[test]
fn blackwell_tiles_follow_the_production_rule() {
    for (m, t) in [(1, tile(128, 128, 256, 1)), (16, tile(128, 128, 256, 1)), (17, tile(256, 128, 256, 2)), (256, tile(256, 128, 256, 2)), (257, tile(256, 256, 256, 2)), (4096, tile(256, 256, 256, 2))] {
        assert_eq!(nvfp4::gemm_tile(Nvfp4Arch::Sm100, m).unwrap(), t, "sm100 m={m}");
    }
    for (m, t) in [(1, tile(128, 128, 128, 1)), (256, tile(128, 128, 128, 1)), (257, tile(256, 128, 128, 1)), (4096, tile(256, 128, 128, 1))] {
        assert_eq!(nvfp4::gemm_tile(Nvfp4Arch::Sm120, m).unwrap(), t, "sm120 m={m}");
    }
    assert!(matches!(nvfp4::gemm_tile(Nvfp4Arch::Sm90, 1), Err(Error::InvalidArgument { .. })));
}

#[test]
fn blackwell_workspace_is_cutlasss_and_plans_carry_the_tile() {
    // CUTLASS's get_workspace_size for these kernels (persistent data-parallel scheduler, no
    // split-K, no epilogue reduction) is 0 bytes; the plan forwards exactly that.
    for arch in [Nvfp4Arch::Sm100, Nvfp4Arch::Sm120] {
        for m in [1i64, 16, 256, 4096] {
            for (n, k) in [(8192i64, 8192i64), (28672, 8192), (8192, 28672), (32, 32)] {
                for out in [DType::Bf16, DType::Fp16] {
                    let p = nvfp4::plan(arch, m, n, k, out, 148).unwrap();
                    assert_eq!(p.workspace_bytes, 0, "{arch:?} {m} {n} {k}");
                    assert_eq!(p.tile, Some(nvfp4::gemm_tile(arch, m).unwrap()));
                    assert_eq!(p.prepared_weight_bytes, None);
                }
            }
        }
    }
}

#[test]
fn hopper_plans_size_the_prepared_weight_and_workspace() {
    for m in [1i64, 4, 16, 64, 256, 4096] {
        for (n, k) in [(8192i64, 8192i64), (28672, 8192), (8192, 28672)] {
            let p = nvfp4::plan(Nvfp4Arch::Sm90, m, n, k, DType::Bf16, 132).unwrap();
            assert!(p.tile.is_none());
            let prepared = p.prepared_weight_bytes.unwrap();
            // At least the packed values and one scale per 16 elements.
            assert!(prepared >= (n * k / 2 + n * k / 16) as u64, "{m} {n} {k}: {prepared}");
        }
    }
    assert!(matches!(nvfp4::plan(Nvfp4Arch::Sm90, 1, 8192, 8192, DType::Fp16, 132), Err(Error::InvalidArgument { .. })));
}

#[test]
fn shape_rules() {
    for (m, n, k, what) in [(0i64, 64i64, 64i64, "m"), (-1, 64, 64, "m"), (1, 48, 64, "n"), (1, 64, 48, "k"), (1, 64, 0, "k")] {
        for arch in [Nvfp4Arch::Sm90, Nvfp4Arch::Sm100, Nvfp4Arch::Sm120] {
            match nvfp4::plan(arch, m, n, k, DType::Bf16, 132) {
                Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what, "{arch:?} ({m}, {n}, {k})"),
                other => panic!("{arch:?} ({m}, {n}, {k}): {other:?}"),
            }
        }
    }
    assert!(matches!(nvfp4::plan(Nvfp4Arch::Sm100, 1, 64, 64, DType::F32, 148), Err(Error::InvalidArgument { .. })));
    assert_eq!(nvfp4::scale_bytes(300, 96).unwrap(), 384 * 8);
    assert!(matches!(nvfp4::scale_bytes(0, 96), Err(Error::InvalidArgument { .. })));
    assert_eq!("sm_120".parse::<Nvfp4Arch>().unwrap(), Nvfp4Arch::Sm120);
    assert!("sm_80".parse::<Nvfp4Arch>().is_err());
    assert!(matches!(Nvfp4Arch::for_compute_capability((8, 9)), Err(Error::ArchUnsupported { .. })));
}


fn matrix(rows: usize, k: usize) -> Nvfp4Matrix<Fake> {
    Nvfp4Matrix {
        packed: Fake { ptr: 0x1000_0000, len: rows * k / 2, ctx: 1 },
        scales: Fake { ptr: 0x2000_0000, len: nvfp4::scale_bytes(rows as i64, k as i64).unwrap() as usize, ctx: 1 },
        global_scale: Fake { ptr: 0x3000_0000, len: 4, ctx: 1 },
        rows,
        k,
    }
}

#[track_caller]
fn rejects(m: &Nvfp4Matrix<Fake>, what: &str) {
    match m.validate("w", 1 as c::CUcontext) {
        Err(Error::InvalidArgument { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected InvalidArgument {what}, got {other:?}"),
    }
}

#[test]
fn operand_validation() {
    matrix(300, 96).validate("w", 1 as c::CUcontext).unwrap();
    let mut m = matrix(300, 96);
    m.packed.len -= 1;
    rejects(&m, "w.packed");
    let mut m = matrix(300, 96);
    m.scales.len = 300 * 6; // unpadded: the swizzled layout needs round_up(300,128) x round_up(6,4)
    rejects(&m, "w.scales");
    let mut m = matrix(300, 96);
    m.global_scale.len = 2;
    rejects(&m, "w.global_scale");
    let mut m = matrix(300, 96);
    m.packed.ptr += 8;
    rejects(&m, "w.packed.address");
    let mut m = matrix(300, 96);
    m.scales.ptr += 4;
    rejects(&m, "w.scales.address");
    let mut m = matrix(300, 96);
    m.global_scale.ctx = 2;
    rejects(&m, "w.global_scale.device");
    let mut m = matrix(300, 96);
    m.k = 80;
    rejects(&m, "w.k");
    let mut m = matrix(300, 96);
    m.rows = 0;
    rejects(&m, "w.rows");
}

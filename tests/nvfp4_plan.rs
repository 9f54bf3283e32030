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
    // A GPU no row runs on, from the table: a literal one stops being refused the day its row is added.
    let no_row = graphsafe::arch::cc_without_row();
    assert!(graphsafe::arch::cc_name(no_row).parse::<Nvfp4Arch>().is_err());
    assert!(matches!(Nvfp4Arch::for_compute_capability(no_row), Err(Error::ArchUnsupported { .. })));
}


fn matrix(rows: usize, k: usize) -> Nvfp4Matrix<Fake> {
    Nvfp4Matrix::new(
        Fake { ptr: 0x1000_0000, len: rows * k / 2, ctx: 1 },
        Fake { ptr: 0x2000_0000, len: nvfp4::scale_bytes(rows as i64, k as i64).unwrap() as usize, ctx: 1 },
        Fake { ptr: 0x3000_0000, len: 4, ctx: 1 },
        rows,
        k,
    )
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

/// The front door over the M values an engine captures: the worst case is the plan of the first
/// M that needs the most, computed here from `plan` of each M; it covers every M's workspace.
#[test]
fn the_worst_case_over_the_captured_ms_is_the_largest_plan() {
    use nvfp4::Nvfp4Limits;
    let ms: Vec<u32> = vec![512, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256];
    let mut hopper_needs_a_workspace = false;
    for (arch, sms, outs) in [(Nvfp4Arch::Sm90, 132, &[DType::Bf16][..]), (Nvfp4Arch::Sm100, 148, &[DType::Bf16, DType::Fp16]), (Nvfp4Arch::Sm120, 170, &[DType::Bf16, DType::Fp16])] {
        for (n, k) in [(8192u32, 8192u32), (28672, 8192), (8192, 28672), (2048, 7168)] {
            for &out in outs {
                let plans: Vec<_> = ms.iter().map(|&m| nvfp4::plan(arch, m.into(), n.into(), k.into(), out, sms).unwrap()).collect();
                let most = plans.iter().map(|p| p.workspace_bytes).max().unwrap();
                let first = plans.iter().find(|p| p.workspace_bytes == most).unwrap();
                let worst = nvfp4::worst_case(arch, &Nvfp4Limits::new(ms.clone(), n, k, sms as u32).with_out(out)).unwrap();
                assert_eq!(&worst, first, "{arch:?} n {n} k {k} {out}");
                hopper_needs_a_workspace |= arch == Nvfp4Arch::Sm90 && most > 0;
            }
        }
    }
    assert!(hopper_needs_a_workspace, "the Hopper split-K shapes need a workspace: the worst case is not trivially 0");
    // One M: the plan of that M.
    let one = nvfp4::worst_case(Nvfp4Arch::Sm90, &Nvfp4Limits::new([16], 8192, 8192, 132)).unwrap();
    assert_eq!(one, nvfp4::plan(Nvfp4Arch::Sm90, 16, 8192, 8192, DType::Bf16, 132).unwrap());
}

#[test]
fn the_worst_case_refuses_what_plan_refuses_naming_the_limits_field() {
    use nvfp4::Nvfp4Limits;
    let what = |arch: Nvfp4Arch, l: Nvfp4Limits| match nvfp4::worst_case(arch, &l) {
        Err(Error::InvalidArgument { what, .. }) => what,
        other => panic!("{l:?}: {other:?}"),
    };
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new(Vec::new(), 8192, 8192, 148)), "m");
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new([1, 0], 8192, 8192, 148)), "m");
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new([1], 8192, 48, 148)), "k");
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new([1], 100, 64, 148)), "n");
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new([1], 8192, 64, 0)), "sm_count");
    assert_eq!(what(Nvfp4Arch::Sm90, Nvfp4Limits::new([1], 8192, 64, 132).with_out(DType::Fp16)), "out");
    assert_eq!(what(Nvfp4Arch::Sm100, Nvfp4Limits::new([1], 8192, 64, 148).with_out(DType::F32)), "out");
}

/// The C ABI's front door answers what the Rust one does, and names the M.
#[test]
fn the_c_worst_case_is_the_rust_one() {
    use graphsafe::capi::*;
    let ms = [1i32, 4, 16, 64, 256];
    let limits = nvfp4::Nvfp4Limits::new(ms.map(|m| m as u32), 8192, 8192, 132);
    let rust = nvfp4::worst_case(Nvfp4Arch::Sm90, &limits).unwrap();
    let mut plan = GraphsafeNvfp4Plan::default();
    let mut worst_m = -1;
    // SAFETY: a live array of `ms.len()` ints and live out-values.
    let r = unsafe { graphsafe_nvfp4_worst_case(GRAPHSAFE_ARCH_SM90, ms.as_ptr(), ms.len(), 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &mut plan, &mut worst_m) };
    assert_eq!(r, GRAPHSAFE_OK);
    assert_eq!((plan.workspace_bytes, plan.prepared_weight_bytes, worst_m), (rust.workspace_bytes, rust.prepared_weight_bytes.unwrap(), rust.m as i32));
    // SAFETY: as above; zero M values and a null array are refused.
    let r = unsafe { graphsafe_nvfp4_worst_case(GRAPHSAFE_ARCH_SM90, ms.as_ptr(), 0, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &mut plan, std::ptr::null_mut()) };
    assert_eq!(r, GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    // SAFETY: as above.
    let r = unsafe { graphsafe_nvfp4_worst_case(GRAPHSAFE_ARCH_SM90, std::ptr::null(), 1, 8192, 8192, GRAPHSAFE_DTYPE_BF16, 132, &mut plan, std::ptr::null_mut()) };
    assert_eq!(r, GRAPHSAFE_ERROR_NULL_POINTER);
    let mut sms = 0;
    // SAFETY: NUL-terminated names and a live out-value.
    assert_eq!(unsafe { graphsafe_gpu_sm_count(c"RTX 5090".as_ptr(), &mut sms) }, GRAPHSAFE_OK);
    assert_eq!(sms, 170);
    // SAFETY: as above.
    assert_eq!(unsafe { graphsafe_gpu_sm_count(c"H300".as_ptr(), &mut sms) }, GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    // SAFETY: graphsafe_last_error's text is valid until this thread's next failing call.
    let text = unsafe { std::ffi::CStr::from_ptr(graphsafe_last_error()) }.to_string_lossy().into_owned();
    assert!(text.contains("H300") && text.contains("B200"), "{text}");
}

//! cuDNN on the CPU: loading (absent → error listing where it looked, never a panic), the plan
//! cache key (every field that changes the plan changes the key), argument validation (each error
//! names the argument), and the NVFP4 arch/version gate. No GPU and no cuDNN needed.

use graphsafe::driver::DevicePtr;
use graphsafe::ops::cudnn::nvfp4::check_support;
use graphsafe::ops::cudnn::{MatmulArgs, MatmulProblem, Nvfp4Problem, OpKey, PlanKey, Version};
use graphsafe::ops::tensor::{DType, DeviceMemory, Tensor};
use graphsafe::sys::cudnn::{self as sys, Candidate};
use graphsafe::Error;
use std::collections::HashSet;
use std::path::PathBuf;

#[test]
fn cudnn_absent_is_an_error_listing_every_place_looked() {
    let cands = [
        Candidate { source: "test", target: "/nonexistent/graphsafe/libcudnn.so.9".into() },
        Candidate { source: "test", target: "libcudnn_graphsafe_does_not_exist.so.9".into() },
    ];
    // SAFETY: neither candidate exists, so nothing is loaded.
    match unsafe { sys::open_from(&cands) } {
        Err(Error::CudnnNotFound { tried }) => {
            assert_eq!(tried.len(), 2, "{tried:?}");
            assert!(tried[0].contains("/nonexistent/graphsafe/libcudnn.so.9"), "{tried:?}");
            assert!(tried[1].contains("libcudnn_graphsafe_does_not_exist.so.9"), "{tried:?}");
            let msg = Error::CudnnNotFound { tried }.to_string();
            assert!(msg.starts_with("cuDNN not found (tried: "), "{msg}");
        }
        Err(e) => panic!("expected CudnnNotFound, got {e}"),
        Ok(_) => panic!("a library that does not exist was opened"),
    }
    // SAFETY: no candidate, nothing is loaded.
    assert!(matches!(unsafe { sys::open_from(&[]) }, Err(Error::CudnnNotFound { tried }) if tried.is_empty()));
}

#[test]
fn the_process_wide_loader_answers_without_panicking() {
    // On CI there is no cuDNN: CudnnNotFound. Where there is one, its version is at least 9.0.
    match sys::api() {
        Ok(api) => {
            assert!(api.version >= Version::new(9, 0, 0), "{}", api.version);
            eprintln!("cuDNN {} at {}", api.version, api.location);
        }
        Err(Error::CudnnNotFound { tried }) => {
            assert!(tried.iter().any(|t| t.contains("libcudnn.so.9")), "{tried:?}");
            eprintln!("no cuDNN here (expected on CI): {tried:?}");
        }
        Err(e) => panic!("unexpected error {e}"),
    }
    // Later calls answer from the first (opened once): the very same `Api`, or an equal error. And
    // that answer is the one a fresh search of the documented candidates() gives.
    // SAFETY: the documented search, what api() opens itself.
    let fresh = unsafe { sys::open_from(&sys::candidates()) };
    match (sys::api(), sys::api(), &fresh) {
        (Ok(a), Ok(b), Ok(f)) => {
            assert!(std::ptr::eq(a, b), "a second api() call opened cuDNN again");
            assert_eq!((&a.location, a.version), (&f.location, f.version), "api() did not open what candidates() finds first");
        }
        (Err(a), Err(b), Err(f)) => {
            assert_eq!(a, b, "a second api() call answered differently");
            assert_eq!(&a, f, "api() did not search candidates(), in order");
        }
        (a, b, f) => panic!("api() twice and a fresh search disagree: {:?}, {:?}, {:?}", a.err(), b.err(), f.as_ref().err()),
    }
}

#[test]
fn search_order_is_env_then_loader_path_then_python_envs() {
    let dir = std::env::temp_dir().join("graphsafe-cudnn-search-test");
    std::fs::create_dir_all(&dir).unwrap();
    let c = sys::candidates_with(Some(dir.clone()));
    assert_eq!(c[0], Candidate { source: sys::ENV_VAR, target: dir.join("libcudnn.so.9").to_string_lossy().into_owned() });
    assert_eq!(c[1], Candidate { source: "loader path", target: "libcudnn.so.9".into() });
    assert!(c[2..].iter().all(|c| c.source == "python env" && c.target.ends_with("nvidia/cudnn/lib/libcudnn.so.9")), "{c:?}");
    // A file path is taken as given.
    let f = PathBuf::from("/opt/cudnn/lib/libcudnn.so.9.14.0");
    assert_eq!(sys::candidates_with(Some(f.clone()))[0].target, f.to_string_lossy());
    // Unset: the loader path first.
    assert_eq!(sys::candidates_with(None)[0].source, "loader path");
}

#[test]
fn versions_decode_and_compare() {
    let v = Version::from_raw(91400);
    assert_eq!((v.major, v.minor, v.patch), (9, 14, 0));
    assert_eq!(v.to_string(), "9.14.0");
    assert_eq!(v.raw(), 91400);
    assert!(Version::from_raw(90700) < Version::from_raw(91000));
    assert!(Version::from_raw(92801) > Version::new(9, 7, 0));
}

// ---- plan keys -------------------------------------------------------------------------------

fn base() -> MatmulProblem {
    MatmulProblem::new(16, 4096, 7168, DType::Bf16, DType::Bf16).with_b_col_major()
}

#[test]
fn plan_keys_distinguish_every_field_that_changes_the_plan() {
    let key = |p: &MatmulProblem| PlanKey::matmul(0, (9, 0), p);
    let b = base();
    // The base with one field changed, nothing else (its operands' strides included).
    let changed = |f: fn(&mut MatmulProblem)| {
        let mut p = b;
        f(&mut p);
        key(&p)
    };
    assert_eq!(key(&b), key(&base()), "equal problems share a plan");
    let mut variants: Vec<(&str, PlanKey)> = vec![
        ("m", changed(|p| p.m = 17)),
        ("n", changed(|p| p.n = 4097)),
        ("k", changed(|p| p.k = 7169)),
        ("batch", key(&b.with_batch(2))),
        ("broadcast b", key(&b.with_batch(2).with_broadcast_b())),
        ("input dtype", key(&MatmulProblem::new(16, 4096, 7168, DType::Fp16, DType::Bf16).with_b_col_major())),
        ("output dtype", key(&MatmulProblem::new(16, 4096, 7168, DType::Bf16, DType::Fp16).with_b_col_major())),
        ("output f32", key(&MatmulProblem::new(16, 4096, 7168, DType::Bf16, DType::F32).with_b_col_major())),
        ("fp8 input", key(&MatmulProblem::new(16, 4096, 7168, DType::Fp8E4m3, DType::Bf16).with_b_col_major())),
        ("b row-major", key(&MatmulProblem::new(16, 4096, 7168, DType::Bf16, DType::Bf16))),
        ("a col-major", key(&b.with_a_col_major())),
        ("c col-major", key(&b.with_c_col_major())),
        ("device", PlanKey::matmul(1, (9, 0), &b)),
        ("compute capability", PlanKey::matmul(0, (10, 0), &b)),
        ("op kind", PlanKey::nvfp4(0, (9, 0), &Nvfp4Problem::new(16, 4096, 7168, DType::Bf16))),
    ];
    // Leading-dimension padding of each operand.
    for which in 0..3 {
        let mut p = b;
        match which {
            0 => p.a.strides[1] += 64,
            1 => p.b.strides[2] += 64,
            _ => p.c.strides[1] += 8,
        }
        variants.push(("leading dimension", key(&p)));
    }
    // Batch strides of batched operands.
    let mut p = b.with_batch(3);
    p.a.strides[0] += 8;
    variants.push(("batch stride", key(&p)));
    let mut seen = HashSet::new();
    seen.insert(key(&b));
    for (what, k) in &variants {
        assert_ne!(*k, key(&b), "changing {what} must change the key");
        assert!(seen.insert(k.clone()), "changing {what} collides with another variant");
    }
}

#[test]
fn nvfp4_plan_keys_distinguish_every_field() {
    let b = Nvfp4Problem::new(128, 256, 512, DType::Bf16);
    let key = |p: &Nvfp4Problem| PlanKey::nvfp4(0, (10, 0), p);
    let changed = |f: fn(&mut Nvfp4Problem)| {
        let mut p = b;
        f(&mut p);
        key(&p)
    };
    let variants = [
        changed(|p| p.m = 129),
        changed(|p| p.n = 257),
        changed(|p| p.k = 528),
        key(&b.with_batch(2)),
        changed(|p| p.out = DType::Fp16),
        changed(|p| p.out = DType::F32),
        PlanKey::nvfp4(1, (10, 0), &b),
        PlanKey::nvfp4(0, (12, 0), &b),
    ];
    let mut seen: HashSet<PlanKey> = HashSet::from([key(&b)]);
    for k in variants {
        assert!(seen.insert(k.clone()), "{k:?} collides");
    }
    assert!(matches!(key(&b).op, OpKey::Nvfp4Matmul(_)));
}

// ---- validation ------------------------------------------------------------------------------

/// Memory that exists only on paper: validation never dereferences it.
#[derive(Clone, Copy, Debug)]
struct Fake {
    ptr: DevicePtr,
    len: usize,
}

impl DeviceMemory for Fake {
    fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context_raw(&self) -> graphsafe::sys::cuda::CUcontext {
        std::ptr::null_mut()
    }
}

fn mem(i: u64, len: usize) -> Fake {
    Fake { ptr: 0x7f00_0000_0000 + i * (1 << 32), len }
}

fn args(m: usize, n: usize, k: usize) -> MatmulArgs<Fake> {
    MatmulArgs::new(
        Tensor::contiguous(mem(0, m * k * 2), DType::Bf16, &[m, k]),
        // A weight stored [N, K] row-major, viewed as B = Wᵀ [K, N] column-major.
        Tensor::strided(mem(1, n * k * 2), 0, DType::Bf16, &[k, n], &[1, k]),
        Tensor::contiguous(mem(2, m * n * 2), DType::Bf16, &[m, n]),
    )
}

fn what(r: graphsafe::Result<MatmulProblem>) -> String {
    match r {
        Err(Error::InvalidArgument { what, .. }) => what,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn args_derive_the_same_problem_the_planner_is_given() {
    let null = std::ptr::null_mut();
    let p = args(16, 4096, 7168).problem(null).unwrap();
    assert_eq!(p, base());
    assert_eq!(PlanKey::matmul(0, (9, 0), &p), PlanKey::matmul(0, (9, 0), &base()));
    // [M, K] and [1, M, K] are the same problem.
    let mut a3 = args(16, 4096, 7168);
    a3.a = Tensor::strided(mem(0, 16 * 7168 * 2), 0, DType::Bf16, &[1, 16, 7168], &[999, 7168, 1]);
    a3.c = Tensor::contiguous(mem(2, 16 * 4096 * 2), DType::Bf16, &[1, 16, 4096]);
    assert_eq!(a3.problem(null).unwrap(), base());
    // Batched with a shared (rank-2) B: broadcast.
    let mut bt = args(8, 256, 512);
    bt.a = Tensor::contiguous(mem(0, 4 * 8 * 512 * 2), DType::Bf16, &[4, 8, 512]);
    bt.c = Tensor::contiguous(mem(2, 4 * 8 * 256 * 2), DType::Bf16, &[4, 8, 256]);
    let p = bt.problem(null).unwrap();
    assert_eq!(p, MatmulProblem::new(8, 256, 512, DType::Bf16, DType::Bf16).with_b_col_major().with_batch(4).with_broadcast_b());
    assert!(p.label().contains("(broadcast)"), "{}", p.label());
}

#[test]
fn every_bad_argument_is_named() {
    let null = std::ptr::null_mut();
    let (m, n, k) = (16, 256, 512);
    let mut a = args(m, n, k);
    a.b = Tensor::strided(mem(1, n * k * 2), 0, DType::Bf16, &[k + 1, n], &[1, k + 1]);
    assert_eq!(what(a.problem(null)), "b.shape[-2] (K)");
    let mut a = args(m, n, k);
    a.c = Tensor::contiguous(mem(2, 1 << 20), DType::Bf16, &[m + 1, n]);
    assert_eq!(what(a.problem(null)), "c.shape[-2] (M)");
    let mut a = args(m, n, k);
    a.c = Tensor::contiguous(mem(2, 1 << 20), DType::Bf16, &[m, n + 1]);
    assert_eq!(what(a.problem(null)), "c.shape[-1] (N)");
    let mut a = args(m, n, k);
    a.a = Tensor::contiguous(mem(0, 1 << 20), DType::Bf16, &[2, 3, m, k]);
    assert_eq!(what(a.problem(null)), "a.shape");
    let mut a = args(m, n, k);
    a.a = Tensor::contiguous(mem(0, 1 << 22), DType::Bf16, &[3, m, k]);
    a.c = Tensor::contiguous(mem(2, 1 << 22), DType::Bf16, &[2, m, n]);
    assert_eq!(what(a.problem(null)), "c.shape[0] (batch)");
    let mut a = args(m, n, k);
    a.a.dtype = DType::F32;
    assert_eq!(what(a.problem(null)), "a.dtype");
    let mut a = args(m, n, k);
    a.b.dtype = DType::Fp16;
    assert_eq!(what(a.problem(null)), "b.dtype");
    let mut a = args(m, n, k);
    a.c.dtype = DType::Fp8E4m3;
    assert_eq!(what(a.problem(null)), "c.dtype");
    let mut a = args(m, n, k);
    a.a.strides = vec![2 * k, 2];
    assert_eq!(what(a.problem(null)), "a.strides");
    let mut a = args(m, n, k);
    a.a.offset = 2;
    assert_eq!(what(a.problem(null)), "a.address");
    let mut a = args(m, n, k);
    a.c.mem.len -= 1;
    assert_eq!(what(a.problem(null)), "c.extent");
    let mut a = args(m, n, k);
    a.c = Tensor::contiguous(a.a.mem, DType::Bf16, &[m, n]);
    a.a.mem.len = 1 << 20;
    a.c.mem.len = 1 << 20;
    assert_eq!(what(a.problem(null)), "c");
    let a = args(0, n, k);
    assert_eq!(what(a.problem(null)), "m");
    // An output whose elements share addresses: batches overlapping by M - 1 rows, or rows one
    // element apart. Different threads would write the same bytes.
    let mut a = args(m, n, k);
    a.a = Tensor::contiguous(mem(0, 2 * m * k * 2), DType::Bf16, &[2, m, k]);
    a.c = Tensor::strided(mem(2, 1 << 20), 0, DType::Bf16, &[2, m, n], &[n, n, 1]);
    assert_eq!(what(a.problem(null)), "c.strides");
    let mut a = args(m, n, k);
    a.c = Tensor::strided(mem(2, 1 << 20), 0, DType::Bf16, &[m, n], &[8, 1]);
    assert_eq!(what(a.problem(null)), "c.strides");
    let mut p = base();
    p.c.strides = [0, 1, 1];
    assert!(matches!(p.validate(), Err(Error::InvalidArgument { what, .. }) if what == "c.strides"), "{:?}", p.validate());
    // Problems built by hand are checked the same way.
    let mut p = base();
    p.a.strides = [p.m * p.k, 3, 5];
    assert!(matches!(p.validate(), Err(Error::InvalidArgument { what, .. }) if what == "a.strides"));
    let p = base().with_batch(4);
    let mut q = p;
    q.b.batch = 3;
    assert!(matches!(q.validate(), Err(Error::InvalidArgument { what, .. }) if what == "b.batch"));
}

#[test]
fn nvfp4_needs_blackwell_then_cudnn_9_7_and_says_so() {
    match check_support((9, 0), Version::new(9, 14, 0)) {
        Err(Error::ArchUnsupported { need, have, .. }) => {
            assert!(need.contains("Blackwell") && need.contains("sm_100"), "{need}");
            assert_eq!(have, "sm_90");
        }
        other => panic!("expected ArchUnsupported, got {other:?}"),
    }
    match check_support((10, 0), Version::new(9, 6, 0)) {
        Err(Error::ArchUnsupported { need, have, .. }) => {
            assert!(need.contains("cuDNN >= 9.7.0"), "{need}");
            assert_eq!(have, "cuDNN 9.6.0");
        }
        other => panic!("expected a version error, got {other:?}"),
    }
    assert!(check_support((10, 0), Version::new(9, 14, 0)).is_ok());
    assert!(check_support((12, 0), Version::new(9, 7, 0)).is_ok());

    let p = Nvfp4Problem::new(1, 4096, 7168, DType::Bf16);
    assert!(p.validate().is_ok());
    assert_eq!(p.a_bytes(), 7168 / 2);
    assert_eq!(p.a_scale_bytes(), 128 * 448); // ⌈1/128⌉·128 rows × ⌈448/4⌉·4 blocks
    assert_eq!(p.b_scale_bytes(), 4096 * 448);
    assert!(matches!(Nvfp4Problem::new(1, 16, 40, DType::Bf16).validate(), Err(Error::InvalidArgument { what, .. }) if what == "k"));
    assert!(matches!(Nvfp4Problem::new(1, 16, 64, DType::Fp8E4m3).validate(), Err(Error::InvalidArgument { what, .. }) if what == "c.dtype"));
}

/// The NVFP4 matmul's output may not overlap an operand it reads (the packed values, their
/// scales, alpha): the execute would read what it is writing, a race whose result depends on
/// timing. Refused naming `c`, as the bf16/fp8 matmul already refused C over A or B.
#[test]
fn the_nvfp4_output_may_not_overlap_what_it_reads() {
    use graphsafe::ops::cudnn::Nvfp4MatmulArgs;
    let p = Nvfp4Problem::new(128, 256, 256, DType::Bf16);
    let c_bytes = 128 * 256 * 2;
    let good = Nvfp4MatmulArgs::new(
        p,
        mem(0, p.a_bytes()),
        mem(1, p.a_scale_bytes()),
        mem(2, p.b_bytes()),
        mem(3, p.b_scale_bytes()),
        mem(4, 4),
        Tensor::contiguous(mem(5, c_bytes), DType::Bf16, &[128, 256]),
    );
    good.validate(std::ptr::null_mut()).expect("disjoint operands");
    // C laid over each operand in turn (C's memory starting at the operand's address).
    let over = |at: Fake| {
        let mut args = good.clone();
        args.c = Tensor::contiguous(Fake { ptr: at.ptr, len: c_bytes }, DType::Bf16, &[128, 256]);
        args
    };
    for (name, args) in [("a", over(good.a)), ("a_scale", over(good.a_scale)), ("b", over(good.b)), ("b_scale", over(good.b_scale)), ("alpha", over(good.alpha))] {
        match args.validate(std::ptr::null_mut()) {
            Err(Error::InvalidArgument { what, expected, .. }) => assert!(what == "c" && expected.ends_with(name), "{name}: {what} / {expected}"),
            other => panic!("C over {name}: expected InvalidArgument, got {other:?}"),
        }
    }
}

//! The fp8 KV caches' rules: the per-tensor and DeepSeek V3.2 formats plan like bf16, refuse what
//! their kernels cannot run, and take their scale as one f32 in bounds; the formats' names.

use super::*;

/// Good arguments over an fp8 cache: bf16 q, `heads` heads, page 64.
fn good_fp8(kind: KvFormatKind, heads: usize) -> MlaDecodeArgs<Fake> {
    let mut a = good(MlaArch::Sm90, heads, 64, DType::Bf16);
    let (dt, row) = match kind {
        KvFormatKind::Fp8PerTensor => (DType::Fp8E4m3, 576),
        _ => (DType::U8, DS_MLA_TOKEN_BYTES),
    };
    a.kv_cache = Tensor::contiguous(mem(PAGES * 64 * row, 2), dt, &[PAGES, 64, row]);
    a.kv_format = match kind {
        KvFormatKind::Fp8PerTensor => KvFormat::Fp8PerTensor { scale: Tensor::contiguous(mem(4, 7), DType::F32, &[1]) },
        _ => KvFormat::Fp8DsMla,
    };
    a
}

#[test]
fn fp8_caches_plan_like_bf16_at_every_head_count() {
    for kind in [KvFormatKind::Fp8PerTensor, KvFormatKind::Fp8DsMla] {
        for heads in [16, 32, 48, 64, 96, 128] {
            let p = plan(&good_fp8(kind, heads), MlaArch::Sm90).unwrap();
            let bf16 = plan(&good(MlaArch::Sm90, heads, 64, DType::Bf16), MlaArch::Sm90).unwrap();
            assert_eq!(p.kv_format, kind);
            assert_eq!((p.num_splits, p.workspace_bytes, p.dtype), (bf16.num_splits, bf16.workspace_bytes, bf16.dtype), "{kind} {heads}");
        }
    }
    assert_eq!(plan(&good(MlaArch::Sm90, 16, 64, DType::Bf16), MlaArch::Sm90).unwrap().kv_format, KvFormatKind::Native);
}

#[test]
fn fp8_caches_refuse_what_their_kernel_cannot_run() {
    for kind in [KvFormatKind::Fp8PerTensor, KvFormatKind::Fp8DsMla] {
        // sm_100's fp8 path is fp8 q over an fp8 cache (dtype Fp8E4m3, KvFormat::Native).
        let mut a = good(MlaArch::Sm100, 128, 128, DType::Bf16);
        a.kv_format = good_fp8(kind, 16).kv_format;
        rejects(&a, MlaArch::Sm100, "kv_format");
        // bf16 queries only.
        let mut a = good_fp8(kind, 16);
        let f16 = good(MlaArch::Sm90, 16, 64, DType::Fp16);
        (a.q_nope, a.q_pe, a.out) = (f16.q_nope, f16.q_pe, f16.out);
        rejects(&a, MlaArch::Sm90, "q_nope.dtype");
        // The cache in the format's element type and token size.
        let mut a = good_fp8(kind, 16);
        a.kv_cache.dtype = DType::Bf16;
        rejects(&a, MlaArch::Sm90, "kv_cache.dtype");
        let mut a = good_fp8(kind, 16);
        a.kv_cache.shape[2] = if kind == KvFormatKind::Fp8DsMla { 576 } else { DS_MLA_TOKEN_BYTES };
        rejects(&a, MlaArch::Sm90, "kv_cache.shape");
        let mut a = good_fp8(kind, 16);
        a.kv_cache.mem.ptr += 8;
        rejects(&a, MlaArch::Sm90, "kv_cache.address");
        let mut a = good_fp8(kind, 16);
        a.kv_cache.mem.len -= 1;
        rejects(&a, MlaArch::Sm90, "kv_cache");
    }
    // A bf16 cache cannot be called fp8, nor an fp8 cache native.
    let mut a = good(MlaArch::Sm90, 16, 64, DType::Bf16);
    a.kv_format = KvFormat::Fp8DsMla;
    rejects(&a, MlaArch::Sm90, "kv_cache.dtype");
    let mut a = good_fp8(KvFormatKind::Fp8PerTensor, 16);
    a.kv_format = KvFormat::Native;
    rejects(&a, MlaArch::Sm90, "kv_cache.dtype");
}

#[test]
fn the_per_tensor_scale_is_one_f32_in_bounds_aligned_and_never_written_over() {
    let with_scale = |f: &dyn Fn(&mut Tensor<Fake>)| {
        let mut a = good_fp8(KvFormatKind::Fp8PerTensor, 32);
        if let KvFormat::Fp8PerTensor { scale } = &mut a.kv_format {
            f(scale);
        }
        a
    };
    rejects(&with_scale(&|s| s.dtype = DType::Bf16), MlaArch::Sm90, "kv_format.scale.dtype");
    rejects(&with_scale(&|s| { s.shape = vec![2]; s.mem.len = 8; }), MlaArch::Sm90, "kv_format.scale.shape");
    rejects(&with_scale(&|s| s.mem.len = 3), MlaArch::Sm90, "kv_format.scale");
    rejects(&with_scale(&|s| s.mem.ptr += 2), MlaArch::Sm90, "kv_format.scale.address");
    rejects(&with_scale(&|s| s.mem.ctx = CTX + 1), MlaArch::Sm90, "kv_format.scale");
    // The output (or the LSE) over the scale: every score would depend on the write's timing.
    let mut a = good_fp8(KvFormatKind::Fp8PerTensor, 32);
    let out = a.out.mem;
    a.kv_format = KvFormat::Fp8PerTensor { scale: Tensor::contiguous(Fake { ptr: out.ptr + 64, len: 4, ctx: CTX }, DType::F32, &[1]) };
    assert!(matches!(plan(&a, MlaArch::Sm90), Err(Error::InvalidArgument { .. })), "{:?}", plan(&a, MlaArch::Sm90));
    let mut a = good_fp8(KvFormatKind::Fp8PerTensor, 32);
    let lse = a.lse.as_ref().unwrap().mem;
    a.kv_format = KvFormat::Fp8PerTensor { scale: Tensor::contiguous(Fake { ptr: lse.ptr, len: 4, ctx: CTX }, DType::F32, &[1]) };
    assert!(matches!(plan(&a, MlaArch::Sm90), Err(Error::InvalidArgument { .. })));
}

#[test]
fn kv_format_names_parse_and_print() {
    for k in KvFormatKind::ALL {
        assert_eq!(k.to_string().parse::<KvFormatKind>().unwrap(), k);
    }
    assert_eq!("fp8_ds_mla".parse::<KvFormatKind>().unwrap(), KvFormatKind::Fp8DsMla);
    assert!("int4".parse::<KvFormatKind>().is_err());
    assert_eq!(KvFormatKind::Fp8DsMla.token_bytes(DType::Bf16), 656);
    assert_eq!(KvFormatKind::Native.token_bytes(DType::Bf16), 1152);
}

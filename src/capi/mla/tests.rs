//! The C ABI's MLA checks on the CPU: what is refused before any handle is looked up, named by
//! the C arguments.

use super::*;

/// A one-request decode of `heads` heads over one 64-token page, every tensor at its own
/// address (planning: the addresses are never dereferenced).
fn args(dtype: c_int, heads: c_int) -> GraphsafeMlaDecodeArgs {
    let h = heads as i64;
    GraphsafeMlaDecodeArgs {
        dtype,
        batch: 1,
        num_heads: heads,
        s_q: 1,
        q_nope: 1 << 20,
        q_nope_stride_batch: h * 512,
        q_nope_stride_token: h * 512,
        q_nope_stride_head: 512,
        q_pe: 2 << 20,
        q_pe_stride_batch: h * 64,
        q_pe_stride_token: h * 64,
        q_pe_stride_head: 64,
        kv_cache: 3 << 20,
        num_pages: 1,
        page_size: 64,
        seq_lens: 4 << 20,
        page_table: 5 << 20,
        max_pages: 1,
        out: 6 << 20,
        out_stride_batch: h * 512,
        out_stride_token: h * 512,
        out_stride_head: 512,
        lse: 7 << 20,
        sm_scale: 0.0721,
        max_seq_len: 64,
        ..Default::default()
    }
}

fn kv(format: c_int) -> GraphsafeMlaKvCache {
    GraphsafeMlaKvCache { kv_format: format, kv_scale: if format == GRAPHSAFE_MLA_KV_FP8_PER_TENSOR { 8 << 20 } else { 0 } }
}

/// The C layer's early refusal (check_kv_format) is the op's rule exactly: for every back-end,
/// q dtype and head count the op accepts with a native cache, the op accepts each fp8 format
/// (over the tensors to_args builds for it) iff check_kv_format does; and graphsafe_mla_plan_kv
/// answers the op's splits and workspace.
#[test]
fn the_early_kv_format_checks_are_the_ops_rule() {
    let mut accepted = 0;
    for arch in [MlaArch::Sm90, MlaArch::Sm100] {
        for dtype in [GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_DTYPE_FP16, GRAPHSAFE_DTYPE_FP8_E4M3] {
            for heads in [16, 32, 48, 64, 128] {
                let a = args(dtype, heads);
                let op = |format: c_int| {
                    let kv = Kv::of(&kv(format)).unwrap();
                    to_args(&a, kv, CallerMemory::planning(std::ptr::null_mut())).unwrap().plan(arch, 132, std::ptr::null_mut())
                };
                let Ok(native) = op(GRAPHSAFE_MLA_KV_NATIVE) else { continue };
                for format in [GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, GRAPHSAFE_MLA_KV_FP8_DS_MLA] {
                    let kind = format_of(format).unwrap();
                    let ours = check_kv_format(Some(arch), kind, dtype);
                    let theirs = op(format);
                    assert_eq!(ours.is_ok(), theirs.is_ok(), "{arch:?} dtype {dtype} heads {heads} {kind}: C {:?}, op {theirs:?}", ours.err().map(|f| f.1));
                    // What every back-end refuses is refused before the back-end is known.
                    if check_kv_format(None, kind, dtype).is_err() {
                        assert!(ours.is_err());
                    }
                    let cc = match arch {
                        MlaArch::Sm90 => GRAPHSAFE_ARCH_SM90,
                        MlaArch::Sm100 => GRAPHSAFE_ARCH_SM100,
                    };
                    let mut p = GraphsafeMlaPlan::default();
                    // SAFETY: `p` is a writable plan.
                    let st = unsafe { graphsafe_mla_plan_kv(cc, dtype, format, heads, 1, 64, 64, 132, 0, &mut p) };
                    assert_eq!(st == crate::capi::GRAPHSAFE_OK, theirs.is_ok(), "{arch:?} dtype {dtype} heads {heads} {kind}");
                    if let Ok(t) = theirs {
                        accepted += 1;
                        assert_eq!((t.kv_format, t.num_splits, t.workspace_bytes), (kind, native.num_splits, native.workspace_bytes));
                        assert_eq!((p.num_splits as u32, p.workspace_bytes), (t.num_splits, t.workspace_bytes));
                    }
                }
            }
        }
    }
    // sm_90, bf16, every head count (16, 32, 48, 64, 128), both formats.
    assert_eq!(accepted, 10);
}

#[test]
fn a_kv_cache_description_is_checked_before_anything_else() {
    assert!(matches!(Kv::of(&kv(GRAPHSAFE_MLA_KV_NATIVE)), Ok(Kv { format: KvFormatKind::Native, scale: 0 })));
    let Err(Fail(code, text)) = Kv::of(&GraphsafeMlaKvCache { kv_format: 7, kv_scale: 0 }) else { panic!("format 7 accepted") };
    assert_eq!(code, crate::capi::GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    assert!(text.contains("kv_format"), "{text}");
    let Err(Fail(code, text)) = Kv::of(&GraphsafeMlaKvCache { kv_format: GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, kv_scale: 0 }) else { panic!("no scale accepted") };
    assert_eq!(code, crate::capi::GRAPHSAFE_ERROR_NULL_POINTER);
    assert!(text.contains("kv_scale"), "{text}");
    let Err(Fail(code, text)) = Kv::of(&GraphsafeMlaKvCache { kv_format: GRAPHSAFE_MLA_KV_FP8_DS_MLA, kv_scale: 0x1000 }) else { panic!("a stray scale accepted") };
    assert_eq!(code, crate::capi::GRAPHSAFE_ERROR_INVALID_ARGUMENT);
    assert!(text.contains("kv_scale"), "{text}");
}

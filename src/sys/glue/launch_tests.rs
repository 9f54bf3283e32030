//! The wrappers' own checks, on the CPU: each refusal below happens before the glue is called, so
//! the fake addresses are never dereferenced. (On a GPU machine a check that stopped refusing
//! would launch on them and fault the test.)

use super::mla::{self, Backend, Decode, KvLayout, Rows};
use super::nvfp4::{self, Fp4Matrix, W4a16};
use super::{DeviceSpan, GlueDtype};
use crate::error::Error;

const BIG: u64 = 1 << 40;

fn span(ptr: u64, len: u64) -> DeviceSpan {
    DeviceSpan::vouched(ptr, len)
}

fn matrix(rows: i32, k: i32) -> Fp4Matrix {
    Fp4Matrix { packed: span(0x10_0000, BIG), scales: span(0x20_0000, BIG), global_scale: span(0x30_0000, 4), rows, k }
}

fn null_stream() -> super::RawStream {
    std::ptr::null_mut()
}

#[test]
fn quantize_refuses_an_input_one_row_short() {
    let dst = matrix(4, 64);
    // [4, 64] bf16 with a row stride of 64 is 512 bytes; give it 511.
    let e = nvfp4::quantize(span(0x40_0000, 511), GlueDtype::Bf16, 64, span(0x50_0000, 4), &dst, null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "x"), "{e}");
    let short_scales = Fp4Matrix { scales: span(0x20_0000, nvfp4::scale_bytes(4, 64).unwrap() - 1), ..dst };
    let e = nvfp4::quantize(span(0x40_0000, BIG), GlueDtype::Bf16, 64, span(0x50_0000, 4), &short_scales, null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "out.scales"), "{e}");
    let e = nvfp4::quantize(span(0x40_0000, BIG), GlueDtype::Fp8E4m3, 64, span(0x50_0000, 4), &dst, null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "dtype"), "{e}");
}

#[test]
fn a_stream_k_w4a16_names_the_planners_workspace_and_the_capacity() {
    // m = 1 over 5 x 64 weight chunks on 1 SM (4 CTA slots): the stream-K schedule, with partial
    // tiles (4 CTAs do not divide 5 tiles).
    let (m, n, k, sm) = (1, 640, 4096, 1);
    let needed = nvfp4::w4a16_workspace_bytes(m, n, k, sm).unwrap();
    assert!(needed > 0);
    let g = W4a16 {
        a: span(0x10_0000, BIG),
        lda: k as i64,
        weight: span(0x20_0000, BIG),
        alpha: span(0x30_0000, 4),
        d: span(0x40_0000, BIG),
        ldd: n as i64,
        m,
        n,
        k,
        sm_count: sm,
    };
    let small = span(0x50_0000, needed - 1);
    assert_eq!(nvfp4::w4a16_gemm(&g, small, null_stream()), Err(Error::WorkspaceTooSmall { needed, capacity: needed - 1 }));
    let short_weight = W4a16 { weight: span(0x20_0000, nvfp4::w4a16_prepared_bytes(n, k).unwrap() - 1), ..g };
    let e = nvfp4::w4a16_gemm(&short_weight, span(0x50_0000, needed), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "weight"), "{e}");
}

fn decode(batch: i32, max_seq_len: i32, page_size: i32) -> Decode {
    let rows = |ptr| Rows { span: span(ptr, BIG), stride_batch: 128 * 512, stride_token: 128 * 512, stride_head: 512 };
    Decode {
        dtype: GlueDtype::Bf16,
        batch,
        num_heads: 128,
        s_q: 1,
        causal: false,
        max_seq_len,
        num_splits: 1,
        sm_count: 132,
        device: 0,
        q_nope: rows(0x10_0000),
        q_pe: Rows { span: span(0x20_0000, BIG), stride_batch: 128 * 64, stride_token: 128 * 64, stride_head: 64 },
        kv_cache: span(0x30_0000, BIG),
        kv_layout: KvLayout::Native,
        num_pages: 64,
        page_size,
        seq_lens: span(0x40_0000, 4 * batch as u64),
        page_table: span(0x50_0000, BIG),
        page_table_stride: (max_seq_len + page_size - 1) / page_size,
        out: rows(0x60_0000),
        lse: None,
        sm_scale: 0.1,
    }
}

#[test]
fn decode_refuses_a_page_table_one_column_short_and_a_short_workspace() {
    let d = decode(3, 1000, 64);
    // 3 rows of 16 columns: (2 * 16 + 16) * 4 bytes.
    let table = Decode { page_table: span(0x50_0000, (2 * 16 + 16) * 4 - 1), ..d };
    let e = mla::decode(Backend::Sm90, &table, span(0x70_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "page_table"), "{e}");
    let e = mla::decode(Backend::Sm90, &Decode { seq_lens: span(0x40_0000, 11), ..d }, span(0x70_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "seq_lens"), "{e}");
    let e = mla::decode(Backend::Sm90, &Decode { out: Rows { stride_head: -1, ..d.out }, ..d }, span(0x70_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { .. }), "{e}");
    // sm100: the workspace always holds the sanitize region; the error names the planner's size.
    let needed = mla::sm100_workspace_bytes(GlueDtype::Bf16, 3, 1000, 64, 132, 1).unwrap();
    let e = mla::decode(Backend::Sm100, &d, span(0x70_0000, needed - 1), null_stream());
    assert_eq!(e, Err(Error::WorkspaceTooSmall { needed, capacity: needed - 1 }));
}

/// sm100 builds its Q and O tensor maps from the strides: a stride that is not a multiple of 16
/// bytes (a batch-1 tensor's unused batch stride of 1, say) or reaches 2^40 bytes would run the
/// kernel on a zeroed map (CUTLASS's check of the encode compiles out). Refused by name. (The op
/// passes dense strides for dimensions of size 1: ops::mla::decode.)
#[test]
fn sm100_refuses_q_and_out_strides_its_tensor_maps_cannot_take() {
    let d = decode(1, 1000, 64);
    let needed = mla::sm100_workspace_bytes(GlueDtype::Bf16, 1, 1000, 64, 132, 1).unwrap();
    let ws = span(0x70_0000, needed.max(16));
    let cases = [
        ("q_nope.stride_batch", Decode { q_nope: Rows { stride_batch: 1, ..d.q_nope }, ..d }),
        ("q_pe.stride_head", Decode { q_pe: Rows { stride_head: 68, ..d.q_pe }, ..d }),
        ("out.stride_batch", Decode { out: Rows { stride_batch: 1 << 40, ..d.out }, ..d }),
    ];
    for (what, bad) in cases {
        let e = mla::decode(Backend::Sm100, &bad, ws, null_stream()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { what: w, .. } if w == what), "{what}: {e}");
    }
}

#[test]
fn decode_checks_an_fp8_cache_by_its_own_token_size_and_its_scale() {
    let d = Decode { num_heads: 16, ..decode(1, 64, 64) };
    // 64 pages of 64 tokens: 576 bytes a token for the per-tensor format, 656 for DeepSeek's.
    let scale = span(0x80_0000, 4);
    for (layout, token) in [(KvLayout::Fp8PerTensor { scale }, 576), (KvLayout::Fp8DsMla, 656)] {
        let short = Decode { kv_cache: span(0x30_0000, 64 * 64 * token - 1), kv_layout: layout, ..d };
        let e = mla::decode(Backend::Sm90, &short, span(0x70_0000, BIG), null_stream()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "kv_cache"), "{layout:?}: {e}");
    }
    let no_scale = Decode { kv_layout: KvLayout::Fp8PerTensor { scale: span(0x80_0000, 3) }, ..d };
    let e = mla::decode(Backend::Sm90, &no_scale, span(0x70_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "kv_scale"), "{e}");
    let odd = Decode { kv_layout: KvLayout::Fp8PerTensor { scale: span(0x80_0002, 4) }, ..d };
    let e = mla::decode(Backend::Sm90, &odd, span(0x70_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "kv_scale.address"), "{e}");
}

/// The sm90 kernel's own validation, the last line behind the op's: an fp8 layout with fp16
/// queries (neither kernel has that instantiation) is refused before anything is launched, for
/// both kernels' head counts.
#[cfg(graphsafe_mla = "sm90")]
#[test]
fn the_sm90_kernel_refuses_fp8_layouts_it_cannot_run() {
    let scale = span(0x80_0000, 4);
    for layout in [KvLayout::Fp8PerTensor { scale }, KvLayout::Fp8DsMla] {
        let token = if layout == KvLayout::Fp8DsMla { 656 } else { 576 };
        let base = Decode { kv_cache: span(0x30_0000, 64 * 64 * token), kv_layout: layout, ..decode(1, 64, 64) };
        for bad in [Decode { num_heads: 16, dtype: GlueDtype::Fp16, ..base }, Decode { num_heads: 128, dtype: GlueDtype::Fp16, ..base }] {
            let e = mla::decode(Backend::Sm90, &bad, span(0x70_0000, BIG), null_stream()).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "mla::decode"), "{layout:?} {} heads: {e}", bad.num_heads);
        }
    }
}

#[test]
fn sanitize_passes_check_their_regions() {
    let layout = mla::sanitize_layout(2, 300, 64, 1).unwrap();
    let e = mla::sanitize(span(0x10_0000, 8), span(0x20_0000, BIG), 5, (2, 300, 64, 10, 1), span(0x30_0000, layout.bytes - 1), null_stream());
    assert_eq!(e.err(), Some(Error::WorkspaceTooSmall { needed: layout.bytes, capacity: layout.bytes - 1 }));
    let out = Rows { span: span(0x40_0000, 2 * (128 * 512 * 2) - 2), stride_batch: 128 * 512, stride_token: 128 * 512, stride_head: 512 };
    let e = mla::sanitize_finish(span(0x50_0000, 8), 2, out, None, null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "out"), "{e}");
}

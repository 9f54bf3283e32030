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

/// The block-scaled GEMM's host functions take a `GsNvfp4Backend` as int32_t: each enumerator is
/// planned, and anything else (the old arch numbers 100 and 120 included) is an invalid argument,
/// not a value the C++ side converts to its enum.
#[test]
fn the_block_scaled_planners_refuse_an_unknown_backend() {
    use crate::arch::Nvfp4Arch;
    use crate::sys::kernels as k;
    let invalid = k::GsStatus::GS_ERR_INVALID_ARGUMENT.0 as i32;
    let tile = |backend: i32| {
        let mut t = k::GsNvfp4Tile::default();
        // SAFETY: host function; the out-pointer is a live local.
        (unsafe { k::gs_nvfp4_gemm_tile(backend, 16, &mut t) }, t)
    };
    let ws = |backend: i32| {
        let mut b = 0u64;
        // SAFETY: host function; the out-pointer is a live local.
        unsafe { k::gs_nvfp4_gemm_workspace_bytes(backend, 16, 4096, 4096, GlueDtype::Bf16.code(), 148, &mut b) }
    };
    for known in [k::GsNvfp4Backend::GS_NVFP4_BACKEND_SM100, k::GsNvfp4Backend::GS_NVFP4_BACKEND_SM120] {
        let code = known.0 as i32;
        assert_eq!(tile(code).0, 0, "{known:?}");
        assert_eq!(ws(code), 0, "{known:?}");
    }
    for unknown in [0, 3, 100, 120, -1, i32::MIN, i32::MAX] {
        assert_eq!(tile(unknown).0, invalid, "{unknown}");
        assert_eq!(ws(unknown), invalid, "{unknown}");
    }
    // The Rust side passes each back-end's own enumerator: sm100's tile for m = 16 has a K of
    // 256, sm120's 128.
    assert_eq!(nvfp4::gemm_tile(Nvfp4Arch::Sm100, 16).unwrap().tile_k, 256);
    assert_eq!(nvfp4::gemm_tile(Nvfp4Arch::Sm120, 16).unwrap().tile_k, 128);
    assert!(matches!(nvfp4::gemm_tile(Nvfp4Arch::Sm90, 16), Err(Error::InvalidArgument { .. })));
}

fn decode(batch: i32, max_seq_len: i32, page_size: i32) -> Decode {
    let rows = |ptr| Rows { span: span(ptr, BIG), stride_batch: 128 * 512, stride_token: 128 * 512, stride_head: 512 };
    Decode {
        batch,
        num_heads: 128,
        s_q: 1,
        max_seq_len,
        num_splits: 1,
        sm_count: 132,
        q_nope: rows(0x10_0000),
        q_pe: Rows { span: span(0x20_0000, BIG), stride_batch: 128 * 64, stride_token: 128 * 64, stride_head: 64 },
        kv_cache: span(0x30_0000, BIG),
        num_pages: 64,
        page_size,
        seq_lens: span(0x40_0000, 4 * batch as u64),
        page_table: span(0x50_0000, BIG),
        page_table_stride: (max_seq_len + page_size - 1) / page_size,
        out: rows(0x60_0000),
        sm_scale: 0.1,
        // bf16, not causal, device 0, a native cache, no lse: the C struct zero-initialised.
        ..Default::default()
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
    let needed = mla::sm100_workspace_bytes(&d.sm100_shape()).unwrap();
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
    let needed = mla::sm100_workspace_bytes(&d.sm100_shape()).unwrap();
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
    let d = decode(2, 300, 64);
    let layout = mla::sanitize_layout(&d.sm100_shape()).unwrap();
    let e = mla::sanitize(span(0x10_0000, 8), span(0x20_0000, BIG), 5, (2, 300, 64, 10, 1), span(0x30_0000, layout.bytes - 1), null_stream());
    assert_eq!(e.err(), Some(Error::WorkspaceTooSmall { needed: layout.bytes, capacity: layout.bytes - 1 }));
    let out = Rows { span: span(0x40_0000, 2 * (128 * 512 * 2) - 2), stride_batch: 128 * 512, stride_token: 128 * 512, stride_head: 512 };
    let e = mla::sanitize_finish(span(0x50_0000, layout.bytes), &layout, 2, out, None, null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "out"), "{e}");
    // The adapted passes: the region holds the staging too, and q and out are [B, s_q, H, D].
    let a = Decode { num_heads: 16, s_q: 2, ..d };
    let adapted = mla::sanitize_layout(&a.sm100_shape()).unwrap();
    assert!(adapted.adapted == 1 && adapted.bytes > layout.bytes);
    for pass in [mla::sm100_pre_pass, mla::sm100_post_pass] {
        let e = pass(&a, span(0x30_0000, adapted.bytes - 1), null_stream());
        assert_eq!(e.err(), Some(Error::WorkspaceTooSmall { needed: adapted.bytes, capacity: adapted.bytes - 1 }));
    }
    // [2, 2, 16, 64] rope with the strides above ([.., 128 heads ..]) needs (2 * 64 * 128 + 64 * 15 + 64) * 2 bytes.
    let short = Decode { q_pe: Rows { span: span(0x20_0000, (128 * 64 + 64 * 128 + 64 * 15 + 64) * 2 - 2), ..a.q_pe }, ..a };
    let e = mla::sm100_pre_pass(&short, span(0x30_0000, BIG), null_stream()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "q_pe"), "{e}");
}

// ---- what CUTLASS's sm100 kernel is given (gs_mla_sm100_kernel_args, host-only) ------------------

const WS: u64 = 0x7000_0000;

fn region_at(needed_cutlass: u64) -> u64 {
    WS + needed_cutlass.div_ceil(256) * 256
}

/// A direct decode (one token of 128 heads) gives CUTLASS the caller's tensors, B' = batch, and
/// the region's sanitized lengths and page table; with splits and no lse, the LSE scratch.
#[test]
fn a_direct_sm100_decode_gives_cutlass_the_callers_tensors() {
    let d = Decode { lse: Some(span(0x80_0000, 4 * 3 * 128)), ..decode(3, 1000, 64) };
    let ws = span(WS, mla::sm100_workspace_bytes(&d.sm100_shape()).unwrap());
    let k = mla::sm100_kernel_args(&d, ws).unwrap();
    let l = mla::sanitize_layout(&d.sm100_shape()).unwrap();
    assert_eq!((k.batch, k.adapted, k.num_splits, k.max_seq_len, k.page_size, k.page_count, k.sm_count), (3, 0, 1, 1000, 64, 64, 132));
    assert_eq!((k.q_latent as u64, k.q_latent_stride_head, k.q_latent_stride_batch), (0x10_0000, 512, 128 * 512));
    assert_eq!((k.q_rope as u64, k.q_rope_stride_head, k.q_rope_stride_batch), (0x20_0000, 64, 128 * 64));
    assert_eq!((k.out as u64, k.out_stride_head, k.out_stride_batch), (0x60_0000, 512, 128 * 512));
    assert_eq!((k.lse as u64, k.lse_stride_batch), (0x80_0000, 128));
    assert_eq!(k.cutlass_bytes, 0, "one split: CUTLASS needs no workspace");
    assert_eq!(k.region as u64, WS);
    assert_eq!((k.seq_lens as u64, k.page_table as u64), (WS + l.kernel_lens_offset, WS + l.page_table_offset));
    assert_eq!((k.page_table_stride, l.columns), (16, 16), "ceil(1000 / 128) tiles of 2 pages");
    assert_eq!((k.layout.kernel_batch, k.layout.adapted, k.layout.bytes), (3, 0, l.bytes));
    assert_eq!((l.lse_offset, l.q_offset, l.out_offset), (l.bytes, l.bytes, l.bytes), "no staging");

    // Batch 1, 8 splits, no lse: CUTLASS's split-KV part first, the scratch for its per-split LSE.
    let s = Decode { num_splits: 8, lse: None, ..decode(1, 4096, 128) };
    let needed = mla::sm100_workspace_bytes(&s.sm100_shape()).unwrap();
    let k = mla::sm100_kernel_args(&s, span(WS, needed)).unwrap();
    let c = (4 * 512 + 4) * 128 * 8;
    assert_eq!(k.cutlass_bytes, c);
    assert_eq!(k.region as u64, region_at(c));
    assert_eq!(k.lse as u64, region_at(c) + k.layout.lse_offset);
    assert!(k.layout.lse_offset < k.layout.bytes && k.layout.q_offset == k.layout.bytes);
    assert_eq!((k.out as u64, k.out_stride_head), (0x60_0000, 512));
    assert_eq!(needed, region_at(c) - WS + k.layout.bytes);
}

/// Fewer heads or more tokens: CUTLASS runs B' = batch x s_q requests of 128 heads over the
/// region's staging (q: latent then rope in one [B', 128, 576] buffer; out [B', 128, 512]; lse
/// [B', 128]), whatever the caller's strides; the split rule sees B'.
#[test]
fn an_adapted_sm100_decode_gives_cutlass_the_staging_and_expanded_requests() {
    for (dtype, elem) in [(GlueDtype::Bf16, 2u64), (GlueDtype::Fp8E4m3, 1)] {
        for (batch, heads, s_q) in [(3, 16, 2), (1, 1, 1), (1, 64, 16), (5, 128, 4), (1, 127, 1)] {
            // Odd caller strides (not multiples of 16 bytes): the direct path would refuse them.
            let rows = |ptr, dim: i64| Rows { span: span(ptr, BIG), stride_batch: 7 * 1000 + dim, stride_token: 1000 + dim, stride_head: dim + 3 };
            let d = Decode {
                dtype,
                num_heads: heads,
                s_q,
                causal: true,
                q_nope: rows(0x10_0000, 512),
                q_pe: rows(0x20_0000, 64),
                out: rows(0x60_0000, 512),
                ..decode(batch, 5000, 32)
            };
            let ctx = format!("{dtype:?} batch {batch} heads {heads} s_q {s_q}");
            let needed = mla::sm100_workspace_bytes(&d.sm100_shape()).unwrap();
            let k = mla::sm100_kernel_args(&d, span(WS, needed)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let l = k.layout;
            let kb = batch * s_q;
            assert_eq!((k.batch, k.adapted, l.kernel_batch, l.adapted), (kb, 1, kb, 1), "{ctx}");
            assert_eq!(k.num_splits, 1, "{ctx}");
            let region = region_at(k.cutlass_bytes);
            assert_eq!(k.region as u64, region, "{ctx}");
            let q = region + l.q_offset;
            assert_eq!((k.q_latent as u64, k.q_latent_stride_head, k.q_latent_stride_batch), (q, 576, 128 * 576), "{ctx}");
            assert_eq!((k.q_rope as u64, k.q_rope_stride_head, k.q_rope_stride_batch), (q + 512 * elem, 576, 128 * 576), "{ctx}");
            assert_eq!((k.out as u64, k.out_stride_head, k.out_stride_batch), (region + l.out_offset, 512, 128 * 512), "{ctx}");
            assert_eq!((k.lse as u64, k.lse_stride_batch), (region + l.lse_offset, 128), "{ctx}: always given, whether the caller wants lse or not");
            assert_eq!((k.seq_lens as u64, k.page_table as u64), (region + l.kernel_lens_offset, region + l.page_table_offset), "{ctx}");
            // The parts, in order, each 256-aligned and exactly as large as documented.
            let r = |x: u64| x.div_ceil(256) * 256;
            let (kb, cols) = (kb as u64, 40 * 4);
            assert_eq!(l.columns as u64, cols, "{ctx}: ceil(5000 / 128) tiles of 4 pages");
            assert_eq!(
                [l.lens_offset, l.kernel_lens_offset, l.page_table_offset, l.lse_offset, l.q_offset, l.out_offset, l.bytes],
                {
                    let mut at = [0u64; 7];
                    let sizes = [4 * kb, 4 * kb, 4 * kb * cols, 4 * 128 * kb, 128 * 576 * elem * kb, 128 * 512 * 2 * kb];
                    for i in 0..6 {
                        at[i + 1] = at[i] + r(sizes[i]);
                    }
                    at
                },
                "{ctx}"
            );
            // 16-byte aligned bases and strides for every tensor map CUTLASS builds.
            for (addr, stride_bytes) in [(k.q_latent as u64, 576 * elem), (k.q_rope as u64, 576 * elem), (k.out as u64, 1024)] {
                assert!(addr % 16 == 0 && stride_bytes % 16 == 0, "{ctx}");
            }
            assert_eq!(needed, region - WS + l.bytes, "{ctx}");
            assert_eq!(mla::sm100_kernel_args(&d, span(WS, needed - 1)).err(), Some(Error::WorkspaceTooSmall { needed, capacity: needed - 1 }), "{ctx}");
        }
    }
    // One request of one token of fewer heads may still split (B' = 1); its out staging is dense,
    // so CUTLASS's split reduction writes it whatever the caller's strides.
    let d = Decode { num_heads: 8, num_splits: 16, out: Rows { stride_head: 515, ..decode(1, 5000, 32).out }, ..decode(1, 5000, 32) };
    let needed = mla::sm100_workspace_bytes(&d.sm100_shape()).unwrap();
    let k = mla::sm100_kernel_args(&d, span(WS, needed)).unwrap();
    assert_eq!((k.batch, k.num_splits, k.cutlass_bytes), (1, 16, (4 * 512 + 4) * 128 * 16));
    assert_eq!(k.out as u64, region_at(k.cutlass_bytes) + k.layout.out_offset);
    // Two tokens: two kernel requests, so the split rule allows one split only.
    let two = Decode { s_q: 2, ..d };
    let e = mla::sm100_workspace_bytes(&two.sm100_shape()).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "num_splits"), "{e}");
}

/// The glue refuses what CUTLASS cannot run or the expansion cannot express, before anything else.
#[test]
fn sm100_kernel_args_refuse_what_cutlass_cannot_run() {
    let d = decode(2, 1000, 64);
    let ws = span(WS, BIG);
    // 32768 requests of 2 tokens: B' = 65536 is past a grid dimension.
    let big = Decode { batch: 32_768, s_q: 2, seq_lens: span(0x40_0000, 4 * 32_768), ..d };
    assert!(matches!(mla::sm100_kernel_args(&big, ws), Err(Error::InvalidArgument { .. })));
    let ok = Decode { batch: 32_767, s_q: 2, num_heads: 4, seq_lens: span(0x40_0000, 4 * 32_767), ..d };
    assert_eq!(mla::sm100_kernel_args(&ok, ws).unwrap().batch, 65_534);
    // Direct decodes keep the tensor-map rules; an adapted one with the same strides is fine.
    let odd = Decode { out: Rows { stride_head: 520 + 4, ..d.out }, ..d };
    let e = mla::sm100_kernel_args(&odd, ws).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "out.stride_head"), "{e}");
    assert!(mla::sm100_kernel_args(&Decode { num_heads: 127, ..odd }, ws).is_ok());
    // A split direct decode needs a dense out (CUTLASS's reduction ignores strides): the glue
    // refuses it itself (the op names it first).
    let split = Decode { batch: 1, num_splits: 4, out: Rows { stride_head: 1024, ..d.out }, ..decode(1, 1000, 64) };
    let e = mla::sm100_kernel_args(&split, ws).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "mla::decode"), "{e}");
    assert!(mla::sm100_kernel_args(&Decode { s_q: 1, num_heads: 64, ..split }, ws).is_ok());
    // Splits beyond the rule: refused for any B' > 1.
    let e = mla::sm100_kernel_args(&Decode { num_splits: 2, ..d }, ws).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument { what, .. } if what == "num_splits"), "{e}");
}

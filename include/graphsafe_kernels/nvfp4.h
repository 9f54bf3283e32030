/* graphsafe kernel glue: NVFP4 quantize/dequantize, CUTLASS block-scaled GEMM (sm_100f, sm_120f),
 * and graphsafe's weight-only FP4 GEMM for Hopper (sm_90a). See ../graphsafe_kernels.h for the rules. */
#ifndef GRAPHSAFE_KERNELS_NVFP4_H
#define GRAPHSAFE_KERNELS_NVFP4_H

#include <stddef.h>
#include <stdint.h>
#include "graphsafe_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Elements along K that share one fp8-e4m3 scale factor. */
#define GS_NVFP4_BLOCK 16

/*
 * The NVFP4 format and quantization algorithm (bit-exact with the Rust reference in
 * src/ops/nvfp4/reference.rs; every operation in fp32 with IEEE round-to-nearest-even):
 *
 *   For each row m and each block b of 16 consecutive elements along K:
 *     amax = max |x| over the block (NaN ignored; 0 if every element is NaN or zero; Inf counts)
 *     sf   = fp8_e4m3(amax / 6.0f * global_scale)     round to nearest even, saturate to +-448,
 *                                                      subnormals kept (cuda_fp8's __NV_SATFINITE)
 *     inv  = (sf == 0) ? 0.0f : global_scale / (float)sf
 *     q_i  = e2m1(x_i * inv)                            nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} with
 *            ties to the even code; |v| > 6 saturates to 6; NaN -> +0; results that round to zero
 *            are +0 (code 0x0); sign in bit 3.
 *   Packing: element 2j in the low nibble, element 2j+1 in the high nibble of byte j of the row.
 *   Dequantized value: e2m1(q) * (float)sf / global_scale.
 *   global_scale is usually 448 * 6 / amax(tensor) (gs_nvfp4_global_scale computes it on device).
 *
 *   Scale factors are stored in CUTLASS's Sm1xxBlkScaledConfig<16> layout (K-major 128x4 atoms):
 *     offset(m, b) = (m / 128) * (KB4 * 512) + (b / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (b % 4)
 *     with KB4 = ceil(ceil(K / 16) / 4); total bytes = round_up(M, 128) * round_up(K / 16, 4);
 *     padding bytes (rows >= M, blocks >= K/16) are written as 0.
 */

/**
 * Bytes of the swizzled scale-factor tensor of an [rows, k] NVFP4 operand (k a multiple of 16),
 * round_up(rows, 128) * round_up(k / 16, 4), computed in 64 bits (every int32 input fits).
 */
int gs_nvfp4_scale_bytes(int32_t rows, int32_t k, uint64_t* out_bytes);

/**
 * Byte offset of scale factor (row, block) in the swizzled layout, computed with CUTLASS's own
 * Sm1xxBlkScaledConfig<16>::tile_atom_to_shape_SFA (host-only; the Rust reference is tested
 * against it). GS_ERR_INVALID_ARGUMENT when the scales of [rows, k] exceed INT32_MAX bytes:
 * CUTLASS's layout computes offsets with int32 strides.
 */
int gs_nvfp4_cutlass_scale_offset(int32_t rows, int32_t k, int32_t row, int32_t block, uint64_t* out_offset);

/**
 * global_scale[0] = 448 * 6 / amax(|x|) over n elements of x (bf16 or fp16), on `stream`;
 * 1.0 when amax is 0 or not finite. x needs 16-byte alignment. Every arch that was built.
 */
int gs_nvfp4_global_scale(const void* x, int32_t dtype, int64_t n, float* global_scale, void* stream);

/**
 * Quantizes x [m, k] (bf16 or fp16, row stride ld_x elements, 16-byte aligned rows) with the
 * device scalar global_scale[0] into packed [m, k/2] bytes (row stride k/2) and the swizzled
 * scales (gs_nvfp4_scale_bytes bytes, padding zeroed). k must be a multiple of 32; packed and
 * scales at least 4-byte aligned (the op layer requires 16). On `stream`.
 */
int gs_nvfp4_quantize(const void* x, int32_t dtype, int32_t m, int32_t k, int64_t ld_x, const float* global_scale,
                      uint8_t* packed, uint8_t* scales, void* stream);

/** The inverse: out [m, k] (bf16 or fp16 per out_dtype, row stride ld_out) from packed + scales. */
int gs_nvfp4_dequantize(const uint8_t* packed, const uint8_t* scales, const float* global_scale, int32_t m,
                        int32_t k, int32_t out_dtype, void* out, int64_t ld_out, void* stream);

/* ---- Hopper (sm_90a): weight-only NVFP4 GEMM, D[M,N] = A[M,K] (bf16) x W[N,K]^T (NVFP4) ------- */

/** Bytes of the prepared (repacked) weight for an [n, k] NVFP4 weight. Host-only. */
int gs_nvfp4_w4a16_prepared_bytes(int32_t n, int32_t k, uint64_t* out_bytes);

/**
 * Repacks an [n, k] NVFP4 weight (packed [n, k/2], swizzled scales, device global scale) into
 * the layout the sm90 GEMM reads, once, outside capture. n and k multiples of 32 (the kernel may
 * add stricter ones: it returns GS_ERR_INVALID_ARGUMENT naming none, the op layer checks first
 * with gs_nvfp4_w4a16_check_shape).
 */
int gs_nvfp4_w4a16_prepare(const uint8_t* packed, const uint8_t* scales, const float* global_scale, int32_t n,
                           int32_t k, void* prepared, uint64_t prepared_bytes, void* stream);

/**
 * Whether (m, n, k) is supported by the sm90 W4A16 GEMM (host-only): GS_OK or
 * GS_ERR_INVALID_ARGUMENT. Supported: m in 1..=2^22, n and k multiples of 32 up to 2^24. The GEMM
 * also needs `a` 16-byte aligned with ld_a % 8 == 0, and the prepared weight and workspace 16-byte
 * aligned. A NaN weight scale is treated as 0 by the GEMM (dequantize gives NaN).
 */
int gs_nvfp4_w4a16_check_shape(int32_t m, int32_t n, int32_t k);

/**
 * Workspace bytes the sm90 W4A16 GEMM needs for (m, n, k) on sm_count SMs; host-only. Non-zero only
 * for the stream-K schedule (m <= 32 with many weight chunks), whose partial tiles it holds; the
 * GEMM writes every byte it later reads in the same call, so the workspace may be shared and dirty.
 */
int gs_nvfp4_w4a16_workspace_bytes(int32_t m, int32_t n, int32_t k, int32_t sm_count, uint64_t* out_bytes);

/**
 * The schedule the sm90 W4A16 GEMM plans for one shape (gs_nvfp4_w4a16_schedule). Stream-K's
 * second (fixup) kernel runs exactly when gs_nvfp4_w4a16_workspace_bytes is non-zero.
 */
typedef struct GsW4a16Schedule {
  int64_t ctas;           /* CTAs launched: tiles x splits, or the stream-K grid */
  int32_t rows_per_cta;   /* activation rows per CTA tile (8, 16, 32, 64, 128, 192 or 256) */
  int32_t ctas_per_sm;    /* the occupancy that tile is built for */
  int32_t stream_k;       /* 1: stream-K over the weight chunks; 0: a grid of tiles */
  int32_t splits;         /* tile grid: split-K ways, one cluster per tile (at most: the launcher
                             lowers it where the device cannot hold that many clusters at once) */
} GsW4a16Schedule;

/**
 * The schedule of (m, n, k) on sm_count SMs (host-only): GS_ERR_INVALID_ARGUMENT where
 * gs_nvfp4_w4a16_check_shape refuses the shape or sm_count <= 0.
 */
int gs_nvfp4_w4a16_schedule(int32_t m, int32_t n, int32_t k, int32_t sm_count, GsW4a16Schedule* out);

/**
 * D[m, n] (bf16, row stride ld_d) = alpha[0] * A[m, k] (bf16, row stride ld_a) x W^T, W prepared by
 * gs_nvfp4_w4a16_prepare. alpha is a device fp32 scalar (it may change between graph replays).
 * GS_ERR_WORKSPACE_TOO_SMALL (nothing launched) when workspace_bytes is too small. One or two
 * kernel launches on `stream` (the second, for stream-K, reduces shared tiles), both with
 * programmatic stream serialization: they wait for the previous kernel's results before reading
 * anything, and their prologue (barrier set-up, an L2 prefetch of the weight) may overlap its end.
 */
int gs_nvfp4_w4a16_gemm(const void* a, int64_t ld_a, const void* prepared, const float* alpha, void* d, int64_t ld_d,
                        int32_t m, int32_t n, int32_t k, int32_t sm_count, void* workspace, uint64_t workspace_bytes,
                        void* stream);

/* ---- Blackwell: CUTLASS block-scaled GEMM, D[M,N] = alpha[0] * A[M,K] x B[N,K]^T, A and B NVFP4 ---- */

/**
 * The back-ends of the block-scaled GEMM, the `backend` argument of its host functions. They take
 * it as int32_t, not as the enum type (as GsMlaDecodeArgs::kv_format does): a value outside the
 * enum held in a C++ enum parameter would be undefined behaviour, an unknown int32_t is
 * GS_ERR_INVALID_ARGUMENT. 0 names no back-end, so a zeroed argument is refused too.
 */
typedef enum GsNvfp4Backend {
  /** Data-center Blackwell (sm_100f: B200, B300, GB200, GB300). */
  GS_NVFP4_BACKEND_SM100 = 1,
  /** GeForce and workstation Blackwell (sm_120f: RTX 50, RTX PRO Blackwell, DGX Spark). */
  GS_NVFP4_BACKEND_SM120 = 2,
} GsNvfp4Backend;

/** A CUTLASS tile configuration. */
typedef struct GsNvfp4Tile {
  int32_t tile_m;
  int32_t tile_n;
  int32_t tile_k;
  int32_t cluster_m;
  int32_t cluster_n;
} GsNvfp4Tile;

/**
 * The tile the GEMM uses for m on `backend` (a GsNvfp4Backend; host-only). sm100: m <= 16 ->
 * 128x128x256 cluster 1x1; m <= 256 -> 256x128x256 cluster 2x1; else 256x256x256 cluster 2x1.
 * sm120 (GeForce): m <= 256 -> 128x128x128; else 256x128x128; cluster 1x1, ping-pong.
 * GS_ERR_INVALID_ARGUMENT for an unknown backend or m <= 0.
 */
int gs_nvfp4_gemm_tile(int32_t backend, int32_t m, GsNvfp4Tile* out_tile);

/**
 * Workspace bytes of the GEMM on `backend` (a GsNvfp4Backend): CUTLASS's get_workspace_size for
 * the chosen tile; host-only. GS_ERR_INVALID_ARGUMENT for an unknown backend, when k is not a
 * multiple of 16 or the scales of A [m, k] or B [n, k] exceed INT32_MAX bytes (CUTLASS indexes
 * scale factors with int32 strides), so the GEMM refuses such shapes before it launches.
 */
int gs_nvfp4_gemm_workspace_bytes(int32_t backend, int32_t m, int32_t n, int32_t k, int32_t out_dtype,
                                  int32_t sm_count, uint64_t* out_bytes);

/**
 * Runs the GEMM on `stream`: a/b packed [m|n, k/2], a_scales/b_scales swizzled, alpha device fp32,
 * d [m, n] row-major bf16 or fp16 (out_dtype). Only present in builds with the sm100 NVFP4 back-end (sm_100f).
 */
int gs_nvfp4_gemm_sm100(const uint8_t* a, const uint8_t* a_scales, const uint8_t* b, const uint8_t* b_scales,
                        const float* alpha, void* d, int32_t out_dtype, int32_t m, int32_t n, int32_t k, int32_t sm_count,
                        void* workspace, uint64_t workspace_bytes, void* stream);
/** As gs_nvfp4_gemm_sm100, for the sm120 back-end (sm_120f: RTX 50, RTX PRO Blackwell, DGX Spark). */
int gs_nvfp4_gemm_sm120(const uint8_t* a, const uint8_t* a_scales, const uint8_t* b, const uint8_t* b_scales,
                        const float* alpha, void* d, int32_t out_dtype, int32_t m, int32_t n, int32_t k, int32_t sm_count,
                        void* workspace, uint64_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHSAFE_KERNELS_NVFP4_H */

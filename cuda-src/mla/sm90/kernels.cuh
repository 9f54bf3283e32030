// graphsafe's Hopper (sm_90a) MLA decode: the split kernels (one per head-count regime) and the
// combine kernel. Written for this crate; see decode.cu for the launcher and the design notes.
//
// Shared memory layout of a KV tile (and of Q): nine 64-column blocks, each block `rows` x 128 B,
// 128-byte swizzled (16-byte chunk c of row r stored at chunk c ^ (r % 8)). This is exactly what a
// TMA box of 64 x 64 elements with SWIZZLE_128B writes, and what wgmma reads through a 128-byte
// swizzle descriptor, K-major (rows = tokens or heads, K = the 576 dims) or MN-major (V as the
// [dims x tokens] operand of P.V: the same bytes read the other way round).
//
// The kernels, one file each, in the order they are defined in decode.cu's translation unit:
//   schedule.cuh    a batch's work items and their order (the schedule kernel, before the split kernels)
//   split.cuh       what both split kernels share (tile range, Q staging, producer, prologue, stores)
//   fp8.cuh         the fp8 conversions and the seesaw kernel's fp8 feed
//   kernel_seesaw.cuh  "seesaw": more than 32 query rows, heads as the MMA's M, two warpgroups over
//                   pairs of tiles (bf16/fp16, or fp8 converted into bf16 stages)
//   kernel_n.cuh    "N": heads as the MMA's N, 16 or 32 heads
//   kernel_n_fp8.cuh  "N8": the same shape over either fp8 cache, converted in the math warps
//   kernel_seesaw_rs.cuh  "seesaw RS": more than 32 query rows over the per-tensor fp8 cache, the N8
//                   kernel's register-sourced operands under the seesaw kernel's schedule
//   combine.cuh     the combine kernel of splits > 1
#pragma once

#include "mla/sm90/schedule.cuh"
#include "mla/sm90/split.cuh"
#include "mla/sm90/kernel_seesaw.cuh"
#include "mla/sm90/kernel_n.cuh"
#include "mla/sm90/kernel_n_fp8.cuh"
#include "mla/sm90/kernel_seesaw_rs.cuh"
#include "mla/sm90/combine.cuh"

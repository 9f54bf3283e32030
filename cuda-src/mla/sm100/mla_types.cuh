// The CUTLASS 4.2 sm100 MLA instantiations graphsafe uses, by element type and scheduler.
// Headers come from the provisioned CUTLASS (include/ and examples/77_blackwell_fmha); nothing is
// copied from it. Shape: 128 heads, latent 512 + rope 64, tile 128 (heads) x 128 (KV), fp32
// accumulators and LSE; TMA loads (page size 128) or cp.async loads (power-of-two pages <= 128).
#pragma once

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/numeric_types.h"
#include "device/sm100_mla.hpp"
#include "kernel/sm100_mla_tile_scheduler.hpp"
#include "graphsafe_kernels/mla.h"

namespace graphsafe::mla_sm100 {

using TileShape = cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_512, cute::_64>>;

template <class Element, class ElementOut, bool Persistent, bool CpAsync = false>
struct Config {
  using Scheduler = std::conditional_t<Persistent, cutlass::fmha::kernel::Sm100MlaPersistentTileScheduler,
                                       cutlass::fmha::kernel::Sm100MlaIndividualTileScheduler>;
  using Kernel = cutlass::fmha::kernel::Sm100FmhaMlaKernelTmaWarpspecialized<TileShape, Element, float, ElementOut,
                                                                             float, Scheduler, CpAsync>;
  using Op = cutlass::fmha::device::MLA<Kernel>;
};

// Element type -> output type: bf16 -> bf16, fp16 -> fp16, fp8-e4m3 -> bf16.
template <class Element> struct OutputOf { using type = cutlass::bfloat16_t; };
template <> struct OutputOf<cutlass::half_t> { using type = cutlass::half_t; };

// The problem shape CUTLASS sizes the workspace from: (heads, max_seq_len, (512, 64), batch).
template <class Op>
typename Op::Arguments planning_arguments(int batch, int max_seq_len, int sm_count, int num_splits) {
  typename Op::Arguments a{};
  a.problem_shape = cute::make_shape(cute::_128{}, max_seq_len, cute::make_shape(cute::_512{}, cute::_64{}), batch);
  a.hw_info.sm_count = sm_count;
  a.split_kv = num_splits;
  a.is_fused_reduction = false;  // the fused path memsets on the legacy stream; we never use it
  return a;
}

}  // namespace graphsafe::mla_sm100

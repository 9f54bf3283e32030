// CUTLASS block-scaled NVFP4 GEMMs (sm_100a, sm_120a): D[M,N] = alpha[0] * A[M,K] x B[N,K]^T with
// A and B NVFP4 (e2m1 + fp8-e4m3 scales per 16 along K, in CUTLASS's swizzled layout), D bf16 or
// fp16, no C operand. alpha is read from device memory at run time, so it may change between
// graph replays. Everything is instantiated from the provisioned CUTLASS's collective builders;
// nothing here allocates or touches the legacy stream.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "common/status.cuh"
#include "graphsafe_kernels/nvfp4.h"

namespace graphsafe::nvfp4 {

using namespace cute;

template <class Arch, class Tile, class Cluster, class MainloopSchedule, class ElementD>
struct Gemm {
  using ElementA = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using ElementB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  static constexpr int kAlignAB = 32;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
      float, float, void, cutlass::layout::RowMajor, kAlignD, ElementD, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElementA, cutlass::layout::RowMajor, kAlignAB, ElementB,
      cutlass::layout::ColumnMajor, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Config = typename Mainloop::Sm1xxBlkScaledConfig;

  static typename Device::Arguments arguments(const uint8_t* a, const uint8_t* sfa, const uint8_t* b, const uint8_t* sfb,
                                              const float* alpha, void* d, int m, int n, int k, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    auto sa = cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1});
    auto sb = cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1});
    auto sd = cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1});
    auto lsfa = Config::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    auto lsfb = Config::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {reinterpret_cast<typename ElementA::DataType const*>(a), sa, reinterpret_cast<typename ElementB::DataType const*>(b), sb,
         reinterpret_cast<typename ElementA::ScaleFactorType const*>(sfa), lsfa,
         reinterpret_cast<typename ElementB::ScaleFactorType const*>(sfb), lsfb},
        {{}, nullptr, sd, static_cast<ElementD*>(d), sd}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.alpha_ptr = alpha;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static uint64_t workspace_bytes(int m, int n, int k, int sm_count) {
    return Device::get_workspace_size(arguments(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, m, n, k, sm_count));
  }

#ifndef GRAPHSAFE_HOST_ONLY
  static int run(const uint8_t* a, const uint8_t* sfa, const uint8_t* b, const uint8_t* sfb, const float* alpha, void* d,
                 int m, int n, int k, int sm_count, void* workspace, uint64_t workspace_bytes, cudaStream_t stream) {
    auto args = arguments(a, sfa, b, sfb, alpha, d, m, n, k, sm_count);
    Device op;
    if (op.can_implement(args) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_CANNOT_IMPLEMENT;
    if (Device::get_workspace_size(args) > workspace_bytes) return GS_ERR_WORKSPACE_TOO_SMALL;
    if (op.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return GS_ERR_CUTLASS_INTERNAL;
    if (op.run(stream) != cutlass::Status::kSuccess) {
      cudaError_t e = cudaGetLastError();
      return e != cudaSuccess ? cuda_failed(e) : GS_ERR_CUTLASS_INTERNAL;
    }
    return GS_OK;
  }
#endif
};

// The production tile choices (graphsafe_kernels/nvfp4.h documents them).
namespace sm100 {
using Small = Shape<_128, _128, _256>;   // m <= 16, cluster 1x1x1
using Medium = Shape<_256, _128, _256>;  // m <= 256, cluster 2x1x1
using Large = Shape<_256, _256, _256>;   // larger, cluster 2x1x1
using C1 = Shape<_1, _1, _1>;
using C2 = Shape<_2, _1, _1>;
template <class D> using GemmSmall = Gemm<cutlass::arch::Sm100, Small, C1, cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100, D>;
template <class D> using GemmMedium = Gemm<cutlass::arch::Sm100, Medium, C2, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100, D>;
template <class D> using GemmLarge = Gemm<cutlass::arch::Sm100, Large, C2, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100, D>;
}  // namespace sm100

namespace sm120 {
using Small = Shape<_128, _128, _128>;  // m <= 256
using Large = Shape<_256, _128, _128>;  // larger
using C1 = Shape<_1, _1, _1>;
template <class D> using GemmSmall = Gemm<cutlass::arch::Sm120, Small, C1, cutlass::gemm::KernelTmaWarpSpecializedPingpongNvf4Sm120, D>;
template <class D> using GemmLarge = Gemm<cutlass::arch::Sm120, Large, C1, cutlass::gemm::KernelTmaWarpSpecializedPingpongNvf4Sm120, D>;
}  // namespace sm120

}  // namespace graphsafe::nvfp4

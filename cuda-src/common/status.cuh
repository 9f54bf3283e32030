// Shared helpers of the glue: status plumbing from CUDA/CUTLASS to GsStatus.
#pragma once
#include <cuda_runtime_api.h>
#include "graphsafe_kernels/common.h"

namespace graphsafe {

// The cudaError_t of the last GS_ERR_CUDA on this thread (read by gs_last_cuda_error()).
void set_last_cuda_error(cudaError_t e);

// Records a failed CUDA runtime call, clears the runtime's sticky-free last error, returns GS_ERR_CUDA.
inline int cuda_failed(cudaError_t e) {
  set_last_cuda_error(e);
  (void)cudaGetLastError();
  return GS_ERR_CUDA;
}

}  // namespace graphsafe

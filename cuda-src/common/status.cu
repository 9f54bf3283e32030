// graphsafe-build: archs=host kind=object mem_mib=600
// Thread-local CUDA error slot behind gs_last_cuda_error(); host code only, built on every build.
#include "common/status.cuh"

namespace graphsafe {
namespace {
thread_local int last_cuda_error = 0;
}
void set_last_cuda_error(cudaError_t e) { last_cuda_error = static_cast<int>(e); }
}  // namespace graphsafe

extern "C" int gs_last_cuda_error(void) { return graphsafe::last_cuda_error; }

// graphsafe-build: archs=all kind=fatbin mem_mib=600
// Kernels that exist to prove graph safety on real memory (loaded by the driver layer as a fatbin).
//
// gs_splitk_gemv is shaped like the kernels that hang or corrupt on a dirty or moved workspace:
// split-K partial sums and a per-row-block completion counter (a semaphore) live in the workspace.
// The last CTA of a row block to arrive reduces the partials in a fixed order (so results are
// bit-identical run to run) and resets the counter to zero for the next launch or replay. A
// counter that is not zero at launch (dirty memory, or a block freed and reused by someone else)
// makes no CTA, or the wrong one, reduce: the output is then stale or wrong.

#include <stdint.h>

#define GS_SPLITK_ROWS 128  // threads per block = rows per block

extern "C" __global__ void __launch_bounds__(GS_SPLITK_ROWS)
gs_splitk_gemv(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y,
               float* partials, unsigned int* counters, int m, int k, int splits) {
  const int row = blockIdx.x * GS_SPLITK_ROWS + threadIdx.x;
  const int split = blockIdx.y;
  const int chunk = (k + splits - 1) / splits;
  const int k0 = split * chunk;
  const int k1 = min(k, k0 + chunk);
  if (row < m) {
    float acc = 0.f;
    for (int i = k0; i < k1; ++i) acc = fmaf(a[(int64_t)row * k + i], x[i], acc);
    partials[(int64_t)split * m + row] = acc;
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned)(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (row < m) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += ((volatile float*)partials)[(int64_t)s * m + row];
    y[row] = sum;
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;
}

// An empty kernel: the launch-overhead benchmark's unit of work.
extern "C" __global__ void gs_empty(void) {}

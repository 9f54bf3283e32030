// Kernel launches with programmatic stream serialization (PDL), shared by the glue (MLA's N kernel
// and combine, the NVFP4 quantize, the W4A16 GEMM and its fixup): one place that sets the attribute.
//
// With the attribute the grid may be scheduled while the kernel before it on the stream drains (once
// that one triggers griddepcontrol.launch_dependents, or as its CTAs exit); under stream capture it
// becomes a programmatic graph edge. The contract is the kernel's, not the launcher's: a kernel
// launched this way executes griddepcontrol.wait before its first access to memory that the previous
// grid may write (or read: this grid's writes must not overtake the previous grid's reads), and
// reads such data through L2 (ld.global.cg, TMA), never through a non-coherent L1 path filled before
// the wait. ARCHITECTURE.md, invariant 13, and the tests named there check it on the H200.
#pragma once
#include <cuda_runtime.h>

namespace graphsafe {

// Launch `kernel`, programmatically dependent on the previous work in `stream` when `pdl`, and in
// thread-block clusters of `cluster` when that is more than one block. Returns the runtime's
// launch error (cudaSuccess also when a fault shows only later, as for any launch).
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      dim3 cluster, Args... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  lc.attrs = attr;
  lc.numAttrs = n;
  return cudaLaunchKernelEx(&lc, kernel, static_cast<KArgs>(args)...);
}

// Launch `kernel` programmatically dependent on the previous work in `stream`. cluster_z > 1 also
// makes the grid's z dimension thread-block clusters of (1, 1, cluster_z).
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               unsigned cluster_z, Args... args) {
  return launch_ex(kernel, grid, block, smem, stream, true, dim3(1, 1, cluster_z), args...);
}

// The same without clusters.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args... args) {
  return launch_pdl_cluster(kernel, grid, block, smem, stream, 1u, args...);
}

}  // namespace graphsafe

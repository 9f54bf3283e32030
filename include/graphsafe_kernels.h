/*
 * graphsafe kernel glue: the plain C surface of the CUDA/CUTLASS code in cuda-src/.
 *
 * This header is the bindgen input for src/sys/kernels_bindings.rs. It is internal to the crate
 * (C/C++ users include graphsafe.h, the exported C ABI). Rules every function here follows:
 *   - returns a GsStatus (0 = ok), never throws, never aborts;
 *   - never allocates device memory: the workspace pointer and its size come from the caller;
 *   - never touches the legacy stream: all device work goes to the stream passed in;
 *   - workspace-size and split queries are host-only and run without a GPU.
 */
#ifndef GRAPHSAFE_KERNELS_H
#define GRAPHSAFE_KERNELS_H

/* One header per op, so that changing one op's contract recompiles only that op's units. */
#include "graphsafe_kernels/common.h"
#include "graphsafe_kernels/mla.h"
#include "graphsafe_kernels/nvfp4.h"

#endif /* GRAPHSAFE_KERNELS_H */

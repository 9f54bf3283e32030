/* graphsafe kernel glue: status codes and element types shared by every op (see ../graphsafe_kernels.h). */
#ifndef GRAPHSAFE_KERNELS_COMMON_H
#define GRAPHSAFE_KERNELS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Status codes of the glue functions. */
typedef enum GsStatus {
  GS_OK = 0,
  /** An argument is out of range (zero or negative sizes, null pointers, bad dtype). */
  GS_ERR_INVALID_ARGUMENT = 1,
  /** An explicit split count breaks the split-KV safety rule (see gs_mla_sm100_num_splits). */
  GS_ERR_UNSAFE_SPLIT = 2,
  /** CUTLASS's can_implement() refused the arguments. */
  GS_ERR_CUTLASS_CANNOT_IMPLEMENT = 3,
  /** CUTLASS returned an internal error (e.g. a failed launch). */
  GS_ERR_CUTLASS_INTERNAL = 4,
  /** A CUDA runtime call failed; gs_last_cuda_error() has the cudaError_t. */
  GS_ERR_CUDA = 5,
  /** The workspace passed in is smaller than the kernel needs. Nothing was launched. */
  GS_ERR_WORKSPACE_TOO_SMALL = 6,
} GsStatus;

/** Element types of kernel inputs. */
typedef enum GsDtype {
  GS_DTYPE_BF16 = 0,
  GS_DTYPE_FP16 = 1,
  GS_DTYPE_FP8_E4M3 = 2,
} GsDtype;

/** The cudaError_t of the last GS_ERR_CUDA on this thread (0 if none). */
int gs_last_cuda_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GRAPHSAFE_KERNELS_COMMON_H */

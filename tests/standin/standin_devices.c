/*
 * standin_devices.c — the stand-in CUDA driver (see cuda_standin.c): initialisation, versions,
 * error names and texts, devices, primary and current contexts.
 */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Initialisation, versions, errors                                                             */
/* ------------------------------------------------------------------------------------------ */

EXPORT CUresult cuInit(unsigned int flags) {
  ENTER(cuInit);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  lock();
  if (!g_inited) {
    const char* d = getenv("STANDIN_DEVICES");
    int n = d && *d ? atoi(d) : 1;
    g_ndev = n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
    const char* cc = getenv("STANDIN_COMPUTE_CAPABILITY");
    int major = 9, minor = 0;
    for (int i = 0; i < g_ndev; ++i) {
      if (cc && *cc) {
        int a, b;
        if (sscanf(cc, "%d.%d", &a, &b) == 2) major = a, minor = b;
        const char* comma = strchr(cc, ',');
        cc = comma ? comma + 1 : NULL;
      }
      g_cc[i][0] = major;
      g_cc[i][1] = minor;
      g_ctx[i].device = i;
      g_engine_ctx[i].device = i;
      g_engine_ctx[i].refs = 1; /* always active: nobody retains or releases it */
    }
    g_inited = 1;
  }
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  ENTER(cuDriverGetVersion);
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = 13000;
  return CUDA_SUCCESS;
}

#ifdef STANDIN_WITH_CUDA_H
/* The values CU_RESULTS gives the stand-in's own CUresult are cuda.h's. */
#define CHECK_RESULT(code, value, text) _Static_assert(code == value, #code " differs from cuda.h");
CU_RESULTS(CHECK_RESULT)
#undef CHECK_RESULT
#endif

static const struct {
  CUresult code;
  const char* name;
  const char* text;
} errors[] = {
#define AS_ERROR_ROW(code, value, text) {code, #code, text},
    CU_RESULTS(AS_ERROR_ROW)
#undef AS_ERROR_ROW
};

static CUresult error_text(CUresult e, const char** p, int name) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; ++i) {
    if (errors[i].code == e) {
      *p = name ? errors[i].name : errors[i].text;
      return CUDA_SUCCESS;
    }
  }
  *p = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char** p) {
  ENTER(cuGetErrorName);
  return error_text(e, p, 1);
}

EXPORT CUresult cuGetErrorString(CUresult e, const char** p) {
  ENTER(cuGetErrorString);
  return error_text(e, p, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Devices and contexts                                                                         */
/* ------------------------------------------------------------------------------------------ */

EXPORT CUresult cuDeviceGetCount(int* n) {
  ENTER(cuDeviceGetCount);
  lock();
  NEED_INIT();
  if (!n) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  *n = g_ndev;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  ENTER(cuDeviceGet);
  lock();
  NEED_INIT();
  if (!d) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  *d = ordinal;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  ENTER(cuDeviceGetName);
  lock();
  NEED_INIT();
  if (!name || len <= 0) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (d < 0 || d >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  snprintf(name, (size_t)len, "graphsafe stand-in");
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute attr, CUdevice d) {
  ENTER(cuDeviceGetAttribute);
  lock();
  NEED_INIT();
  if (!v || (int)attr <= 0 || (int)attr > 200) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (d < 0 || d >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  int r = 0;
  switch ((int)attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: r = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: r = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: r = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: r = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: r = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: r = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: r = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: r = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: r = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: r = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: r = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: r = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: r = 132; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: r = 50331648; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: r = 2048; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: r = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: r = g_cc[d][0]; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: r = g_cc[d][1]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: r = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: r = 232448; break;
    default: r = 0; break;
  }
  *v = r;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  ENTER(cuDeviceTotalMem);
  lock();
  NEED_INIT();
  if (!bytes) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (d < 0 || d >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  *bytes = (size_t)DEVICE_MEMORY;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice d) {
  ENTER(cuDevicePrimaryCtxRetain);
  lock();
  NEED_INIT();
  if (!pctx) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (d < 0 || d >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  ++g_ctx[d].refs;
  *pctx = &g_ctx[d];
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  ENTER(cuDevicePrimaryCtxRelease);
  lock();
  NEED_INIT();
  if (d < 0 || d >= g_ndev) return unlock_ret(CUDA_ERROR_INVALID_DEVICE);
  struct CUctx_st* c = &g_ctx[d];
  if (c->refs <= 0) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (--c->refs == 0) {
    /* The real driver resets the context here, freeing everything in it: anything the caller still
     * holds would dangle (allocations whose free was refused are not held by anyone). */
    size_t allocs = 0, streams = 0, first = 0;
    for (size_t i = 0; i < g_nallocs; ++i) {
      if (g_allocs[i].ctx == c && !g_allocs[i].orphaned && !allocs++) first = i;
    }
    for (size_t i = 0; i < g_obj_cap; ++i)
      if (g_objs[i].kind == K_STREAM) streams += ((struct CUstream_st*)g_objs[i].key)->ctx == c;
    if (allocs || streams)
      violation("the primary context of device %d was released while %zu allocations (the first: %zu bytes at 0x%llx) and %zu streams in it live",
                d, allocs, allocs ? g_allocs[first].size : 0, allocs ? (unsigned long long)g_allocs[first].base : 0ull, streams);
  }
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  ENTER(cuCtxSetCurrent);
  lock();
  NEED_INIT();
  if (c && !ctx_valid(c)) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  t_current = c;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* pc) {
  ENTER(cuCtxGetCurrent);
  lock();
  NEED_INIT();
  if (!pc) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  *pc = t_current;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  ENTER(cuCtxGetDevice);
  lock();
  NEED_INIT();
  if (!d) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  *d = c->device;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxSynchronize(void) {
  ENTER(cuCtxSynchronize);
  lock();
  NEED_INIT();
  htod_flush();
  if (!current_ctx()) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (unsafe_call_refused("cuCtxSynchronize")) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  return unlock_ret(CUDA_SUCCESS);
}

/* The older exported name of the same entry point (the driver_api! table lists it as a fallback).
 * Left out when checking against cuda.h, whose macros turn the name into the _v2 one. */
#ifndef STANDIN_WITH_CUDA_H
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) __attribute__((alias("cuDevicePrimaryCtxRelease_v2")));
#endif

/*
 * standin_memory.c — the stand-in CUDA driver (see cuda_standin.c): device memory (allocation,
 * free and quarantine), memsets, copies, pointer attributes.
 */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                       */
/* ------------------------------------------------------------------------------------------ */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  ENTER(cuMemAlloc);
  lock();
  NEED_INIT();
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (!dptr || bytes == 0) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (unsafe_call_refused("cuMemAlloc")) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (bytes > DEVICE_MEMORY - g_used[c->device]) return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
  size_t rounded = (bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN;
  void* p = aligned_alloc(ALLOC_ALIGN, rounded);
  if (!p) return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
  memset(p, FRESH_BYTE, rounded);
  if (g_nallocs == g_cap_allocs) {
    g_cap_allocs = g_cap_allocs ? g_cap_allocs * 2 : 256;
    alloc_t* na = realloc(g_allocs, g_cap_allocs * sizeof *na);
    if (!na) {
      free(p);
      return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
    }
    g_allocs = na;
  }
  size_t i = alloc_upper((uintptr_t)p);
  memmove(&g_allocs[i + 1], &g_allocs[i], (g_nallocs - i) * sizeof *g_allocs);
  g_allocs[i].base = (uintptr_t)p;
  g_allocs[i].size = bytes;
  g_allocs[i].ctx = c;
  g_allocs[i].orphaned = 0;
  ++g_nallocs;
  g_used[c->device] += bytes;
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  ENTER(cuMemFree);
  lock();
  NEED_INIT();
  htod_flush();
  alloc_t* a = alloc_containing((uintptr_t)ptr);
  if (!a || a->base != (uintptr_t)ptr) {
    violation("cuMemFree(0x%llx): not the start of a live allocation (double free?)", (unsigned long long)ptr);
    return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  }
  if (unsafe_call_refused("cuMemFree")) {
    ++g_refused_frees;
    a->orphaned = 1;
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  size_t i = (size_t)(a - g_allocs);
  size_t size = a->size;
  g_used[a->ctx->device] -= size;
  memmove(&g_allocs[i], &g_allocs[i + 1], (g_nallocs - i - 1) * sizeof *g_allocs);
  --g_nallocs;
  memset((void*)(uintptr_t)ptr, POISON_BYTE, size);
  quarantine_push((void*)(uintptr_t)ptr, size);
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  ENTER(cuMemGetInfo);
  lock();
  NEED_INIT();
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (!free_bytes || !total) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  *total = (size_t)DEVICE_MEMORY;
  *free_bytes = (size_t)(DEVICE_MEMORY - g_used[c->device]);
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult memset_common(CUdeviceptr dst, unsigned value, unsigned elem, size_t n, CUstream h, const char* what) {
  lock();
  NEED_INIT();
  if (elem == 4 && dst % 4) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS) return unlock_ret(r);
  if (t == RECORD) {
    /* The real driver checks the destination when the node is created. */
    if (!range_ok((uintptr_t)dst, (unsigned long long)n * elem, NULL, what)) return unlock_ret(CUDA_ERROR_ILLEGAL_ADDRESS);
    struct CUgraphNode_st* node = xcalloc(1, sizeof *node);
    node->type = CU_GRAPH_NODE_TYPE_MEMSET;
    node->dst = (uintptr_t)dst;
    node->value = value;
    node->elem = elem;
    node->count = n;
    record(&s, node, what);
    return unlock_ret(CUDA_SUCCESS);
  }
  return unlock_ret(run_memset(s.ctx, (uintptr_t)dst, value, elem, n, what));
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream h) {
  ENTER(cuMemsetD8Async);
  return memset_common(dst, value, 1, n, h, "cuMemsetD8Async");
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream h) {
  ENTER(cuMemsetD32Async);
  return memset_common(dst, value, 4, n, h, "cuMemsetD32Async");
}

static CUresult copy_common(int kind, uintptr_t dst, uintptr_t src, void* host, size_t bytes, CUstream h, const char* what) {
  lock();
  NEED_INIT();
  if ((kind == COPY_HTOD || kind == COPY_DTOH) && !host && bytes) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS) return unlock_ret(r);
  if (t == RECORD) {
    int ok = 1;
    if (kind != COPY_DTOH) ok &= range_ok(dst, bytes, NULL, what);
    if (kind != COPY_HTOD) ok &= range_ok(src, bytes, NULL, what);
    if (!ok) return unlock_ret(CUDA_ERROR_ILLEGAL_ADDRESS);
    struct CUgraphNode_st* node = xcalloc(1, sizeof *node);
    node->type = CU_GRAPH_NODE_TYPE_MEMCPY;
    node->copy = kind;
    node->dst = dst;
    node->src = src;
    node->count = bytes;
    if (kind == COPY_HTOD) {
      /* Pageable host memory: the driver stages the bytes at capture. */
      node->host = xmalloc(bytes);
      memcpy(node->host, host, bytes);
    } else {
      node->host = host;
    }
    record(&s, node, what);
    return unlock_ret(CUDA_SUCCESS);
  }
  if (kind == COPY_HTOD && g_async_htod) {
    /* Page-locked source: the call returns before the bytes are read (see htod_defer). */
    if (!range_ok(dst, bytes, NULL, what)) return unlock_ret(CUDA_ERROR_ILLEGAL_ADDRESS);
    htod_defer(dst, host, bytes);
    return unlock_ret(CUDA_SUCCESS);
  }
  return unlock_ret(run_copy(kind, dst, src, host, bytes, what));
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream h) {
  ENTER(cuMemcpyHtoDAsync);
  return copy_common(COPY_HTOD, (uintptr_t)dst, 0, (void*)src, bytes, h, "cuMemcpyHtoDAsync");
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream h) {
  ENTER(cuMemcpyDtoHAsync);
  return copy_common(COPY_DTOH, 0, (uintptr_t)src, dst, bytes, h, "cuMemcpyDtoHAsync");
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream h) {
  ENTER(cuMemcpyDtoDAsync);
  return copy_common(COPY_DTOD, (uintptr_t)dst, (uintptr_t)src, NULL, bytes, h, "cuMemcpyDtoDAsync");
}

EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  ENTER(cuPointerGetAttribute);
  lock();
  NEED_INIT();
  if (!data) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  alloc_t* a = alloc_containing((uintptr_t)ptr);
  if (!a) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  switch ((int)attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = a->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned*)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = a->ctx->device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr*)data = (CUdeviceptr)a->base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t*)data = a->size; break;
    default: return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  }
  return unlock_ret(CUDA_SUCCESS);
}

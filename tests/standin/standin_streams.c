/*
 * standin_streams.c — the stand-in CUDA driver (see cuda_standin.c): streams, events, modules and
 * kernel launches.
 */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Streams and events                                                                           */
/* ------------------------------------------------------------------------------------------ */

EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  ENTER(cuStreamCreate);
  lock();
  NEED_INIT();
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  struct CUstream_st* s = xcalloc(1, sizeof *s);
  s->ctx = c;
  s->flags = flags;
  obj_add(s, K_STREAM);
  *ph = s;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
  ENTER(cuStreamDestroy);
  lock();
  NEED_INIT();
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (h->cap && h->cap->stream == h) {
    /* Destroying a capturing stream ends its capture; the graph is lost. */
    capture_remove(h->cap);
    capture_release_joined(h->cap);
    graph_free(h->cap->graph, 0);
    free(h->cap);
  }
  capture_forget_joined(h);
  obj_del(h);
  free(h);
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult sync_common(CUstream h, const char* what) {
  lock();
  NEED_INIT();
  htod_flush();
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    return unlock_ret(current_ctx() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT);
  }
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (h->cap) {
    invalidate(h->cap, what);
    ++g_refused_unsafe;
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamSynchronize(CUstream h) {
  ENTER(cuStreamSynchronize);
  return sync_common(h, "cuStreamSynchronize of the capturing stream");
}

EXPORT CUresult cuStreamQuery(CUstream h) {
  ENTER(cuStreamQuery);
  return sync_common(h, "cuStreamQuery of the capturing stream");
}

/* Waiting on an event whose last record was a node of an open capture is CUDA's fork: a stream
 * that is not capturing joins that capture (its later work goes into the graph), and the capture
 * cannot end until the origin stream waited on an event recorded on it (the join). A stream of
 * another capture waiting on it merges two captures: refused and both invalidated. */
EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  ENTER(cuStreamWaitEvent);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EVENT)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (flags != 0 && flags != 1) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS || !s.s) return unlock_ret(r);
  capture_t* c = NULL;
  if (e->cap_id)
    for (capture_t* x = g_captures; x; x = x->next)
      if (x->id == e->cap_id) c = x;
  if (c) {
    if (t == RUN_NOW) {
      if (c->njoined == MAX_JOINED) {
        invalidate(c, "too many streams forked into one capture");
        return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
      }
      c->joined[c->njoined] = s.s;
      c->rejoined[c->njoined] = 0;
      ++c->njoined;
      s.s->cap = c;
    } else if (s.s->cap != c) {
      invalidate(s.s->cap, "a wait on an event of another capture");
      invalidate(c, "another capture waited on one of its events");
      return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_MERGE);
    } else if (s.s == c->stream) {
      for (int i = 0; i < c->njoined; ++i)
        if (c->joined[i] == e->rec_stream) c->rejoined[i] = 1;
    }
  }
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuEventCreate(CUevent* pe, unsigned int flags) {
  ENTER(cuEventCreate);
  lock();
  NEED_INIT();
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (!pe || (flags & ~0xFu)) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  struct CUevent_st* e = xcalloc(1, sizeof *e);
  e->ctx = c;
  e->flags = flags;
  obj_add(e, K_EVENT);
  *pe = e;
  return unlock_ret(CUDA_SUCCESS);
}

/* The last timestamp handed out (under g_mu). */
static unsigned long long g_last_ns;

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  unsigned long long t = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
  /* Strictly increasing, at least 1 µs apart: elapsed times between records are positive. */
  if (t <= g_last_ns + 1000) t = g_last_ns + 1000;
  g_last_ns = t;
  return t;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream h) {
  ENTER(cuEventRecord);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EVENT)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS) return unlock_ret(r);
  e->rec_stream = s.s;
  if (t == RECORD) {
    e->cap_id = s.s->cap->id; /* a capture-internal dependency, no node; a wait on it forks */
    return unlock_ret(CUDA_SUCCESS);
  }
  e->cap_id = 0;
  e->recorded = 1;
  e->t_ns = now_ns();
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
  ENTER(cuEventSynchronize);
  lock();
  NEED_INIT();
  htod_flush();
  return unlock_ret(obj_is(e, K_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  ENTER(cuEventElapsedTime);
  lock();
  NEED_INIT();
  if (!ms) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(start, K_EVENT) || !obj_is(end, K_EVENT)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (!start->recorded || !end->recorded) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  *ms = (float)(((double)end->t_ns - (double)start->t_ns) / 1e6);
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  ENTER(cuEventDestroy);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EVENT)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  obj_del(e);
  free(e);
  return unlock_ret(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------------------------------ */
/* Modules and launches                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Module ids are never reused: a graph node names its module by id (standin_exec.c). */
static unsigned long long g_next_module_id = 1;

EXPORT CUresult cuModuleLoadData(CUmodule* pm, const void* image) {
  ENTER(cuModuleLoadData);
  lock();
  NEED_INIT();
  struct CUctx_st* c = current_ctx();
  if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (!pm || !image) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  struct CUmod_st* m = xcalloc(1, sizeof *m);
  m->ctx = c;
  m->id = g_next_module_id++;
  obj_add(m, K_MODULE);
  *pm = m;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuModuleGetFunction(CUfunction* pf, CUmodule m, const char* name) {
  ENTER(cuModuleGetFunction);
  lock();
  NEED_INIT();
  if (!pf || !name) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(m, K_MODULE)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  for (struct CUfunc_st* f = m->funcs; f; f = f->next) {
    if (strcmp(f->name, name) == 0) {
      *pf = f;
      return unlock_ret(CUDA_SUCCESS);
    }
  }
  struct CUfunc_st* f = xcalloc(1, sizeof *f);
  f->mod = m;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->kind = strcmp(name, "gs_splitk_gemv") == 0 ? KERNEL_SPLITK : strcmp(name, "gs_empty") == 0 ? KERNEL_EMPTY : KERNEL_OTHER;
  f->next = m->funcs;
  m->funcs = f;
  obj_add(f, K_FUNC);
  *pf = f;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuModuleUnload(CUmodule m) {
  ENTER(cuModuleUnload);
  lock();
  NEED_INIT();
  if (!obj_is(m, K_MODULE)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  for (struct CUfunc_st* f = m->funcs; f;) {
    struct CUfunc_st* next = f->next;
    obj_del(f);
    free(f);
    f = next;
  }
  obj_del(m);
  free(m);
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value) {
  ENTER(cuFuncSetAttribute);
  (void)attr;
  (void)value;
  lock();
  NEED_INIT();
  return unlock_ret(obj_is(f, K_FUNC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

/* Called with the lock held; `grid`/`block` already validated. */
static CUresult launch_common(struct CUfunc_st* f, const unsigned grid[3], const unsigned block[3], unsigned smem,
                              CUstream h, void** params) {
  if (!obj_is(f, K_FUNC)) return CUDA_ERROR_INVALID_HANDLE;
  if (smem > 232448) return CUDA_ERROR_INVALID_VALUE;
  if ((unsigned long long)block[0] * block[1] * block[2] > 1024) return CUDA_ERROR_INVALID_VALUE;
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS) return r;
  if (f->mod->ctx != s.ctx) return CUDA_ERROR_INVALID_HANDLE; /* a function of another context */
  launch_t l;
  memset(&l, 0, sizeof l);
  memcpy(l.grid, grid, sizeof l.grid);
  memcpy(l.block, block, sizeof l.block);
  if (f->kind == KERNEL_SPLITK) {
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < SPLITK_PARAMS; ++i)
      if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < 5; ++i) memcpy(&l.ptr[i], params[i], sizeof(CUdeviceptr));
    memcpy(&l.m, params[5], sizeof(int));
    memcpy(&l.k, params[6], sizeof(int));
    memcpy(&l.splits, params[7], sizeof(int));
  }
  if (t == RECORD) {
    struct CUgraphNode_st* node = xcalloc(1, sizeof *node);
    node->type = CU_GRAPH_NODE_TYPE_KERNEL;
    node->kernel = f->kind;
    node->module_id = f->mod->id;
    snprintf(node->name, sizeof node->name, "%s", f->name);
    node->launch = l;
    record(&s, node, f->name);
    return CUDA_SUCCESS;
  }
  return run_kernel(s.ctx, f->kind, &l);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int smem, CUstream h, void** params,
                               void** extra) {
  ENTER(cuLaunchKernel);
  (void)extra;
  lock();
  NEED_INIT();
  if (!gx || !gy || !gz || !bx || !by || !bz) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return unlock_ret(launch_common(f, grid, block, smem, h, params));
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  ENTER(cuLaunchKernelEx);
  (void)extra;
  lock();
  NEED_INIT();
  if (!config) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  if (!grid[0] || !grid[1] || !grid[2] || !block[0] || !block[1] || !block[2]) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (config->numAttrs && !config->attrs) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute* a = &config->attrs[i];
    if ((int)a->id != CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) continue;
    unsigned cx = a->value.clusterDim.x, cy = a->value.clusterDim.y, cz = a->value.clusterDim.z;
    if (!cx || !cy || !cz || grid[0] % cx || grid[1] % cy || grid[2] % cz || (unsigned long long)cx * cy * cz > 16)
      return unlock_ret(CUDA_ERROR_INVALID_CLUSTER_SIZE);
  }
  return unlock_ret(launch_common(f, grid, block, config->sharedMemBytes, config->hStream, params));
}

/* Older exported names of the same entry points (the driver_api! table lists them as fallbacks).
 * Left out when checking against cuda.h, whose macros turn these names into the _v2 ones. */
#ifndef STANDIN_WITH_CUDA_H
EXPORT CUresult cuStreamDestroy(CUstream h) __attribute__((alias("cuStreamDestroy_v2")));
EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) __attribute__((alias("cuEventElapsedTime_v2")));
EXPORT CUresult cuEventDestroy(CUevent e) __attribute__((alias("cuEventDestroy_v2")));
#endif

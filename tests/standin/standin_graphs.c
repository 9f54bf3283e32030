/* standin_graphs.c — the stand-in CUDA driver (see cuda_standin.c): stream capture and graphs. */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Capture and graphs                                                                           */
/* ------------------------------------------------------------------------------------------ */

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
  ENTER(cuStreamBeginCapture);
  lock();
  NEED_INIT();
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if ((int)mode < 0 || (int)mode > 2) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (h->cap) return unlock_ret(CUDA_ERROR_ILLEGAL_STATE);
  capture_t* c = xcalloc(1, sizeof *c);
  c->mode = mode;
  c->thread = pthread_self();
  c->graph = graph_new();
  c->graph->family = ++g_next_family;
  c->id = c->graph->family;
  c->stream = h;
  c->next = g_captures;
  g_captures = c;
  h->cap = c;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph* pg) {
  ENTER(cuStreamEndCapture);
  lock();
  NEED_INIT();
  if (!pg) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  capture_t* c = h->cap;
  if (!c) return unlock_ret(CUDA_ERROR_ILLEGAL_STATE);
  if (c->stream != h) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED); /* a joined stream */
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  int unjoined = 0;
  for (int i = 0; i < c->njoined; ++i) unjoined += !c->rejoined[i];
  capture_remove(c);
  capture_release_joined(c);
  h->cap = NULL;
  if (unjoined) {
    /* Work forked into the capture on another stream was never joined back: the capture is over
     * and its graph lost (what driver 580 did on the H200). */
    violation("a capture ended with %d stream(s) forked into it and never joined back", unjoined);
    graph_free(c->graph, 0);
    free(c);
    *pg = NULL;
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  }
  if (c->invalidated) {
    graph_free(c->graph, 0);
    free(c);
    *pg = NULL;
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  struct CUgraph_st* g = c->graph;
  free(c);
  obj_add(g, K_GRAPH);
  for (size_t i = 0; i < g->n; ++i) obj_add(g->nodes[i], K_NODE);
  *pg = g;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  ENTER(cuStreamGetCtx);
  lock();
  NEED_INIT();
  if (!pctx) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st* c = current_ctx();
    if (!c) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
    *pctx = c;
    return unlock_ret(CUDA_SUCCESS);
  }
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  *pctx = h->ctx;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  ENTER(cuStreamIsCapturing);
  lock();
  NEED_INIT();
  if (!status) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return unlock_ret(CUDA_SUCCESS);
  }
  if (!obj_is(h, K_STREAM)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  *status = !h->cap ? CU_STREAM_CAPTURE_STATUS_NONE
            : h->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  ENTER(cuThreadExchangeStreamCaptureMode);
  if (!mode || (int)*mode < 0 || (int)*mode > 2) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

static CUresult cuGraphGetNodes_impl(CUgraph g, CUgraphNode* nodes, size_t* n) {
  ENTER(cuGraphGetNodes);
  lock();
  NEED_INIT();
  if (!n) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(g, K_GRAPH)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (nodes) {
    for (size_t i = 0; i < *n; ++i) nodes[i] = i < g->n ? g->nodes[i] : NULL;
  }
  *n = g->n;
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) {
  ENTER(cuGraphNodeGetType);
  lock();
  NEED_INIT();
  if (!type) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(node, K_NODE)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  *type = node->type;
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult cuGraphDestroy_impl(CUgraph g) {
  ENTER(cuGraphDestroy);
  lock();
  NEED_INIT();
  if (!obj_is(g, K_GRAPH)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  busy_release_before_free();
  graph_free(g, 1);
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult cuGraphInstantiateWithFlags_impl(CUgraphExec* pe, CUgraph g, unsigned long long flags) {
  ENTER(cuGraphInstantiateWithFlags);
  (void)flags;
  lock();
  NEED_INIT();
  if (!pe) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  if (!obj_is(g, K_GRAPH)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  struct CUgraphExec_st* e = xcalloc(1, sizeof *e);
  e->g = graph_copy(g); /* an executable does not depend on its graph's nodes */
  e->family = g->family;
  obj_add(e, K_EXEC);
  *pe = e;
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult cuGraphUpload_impl(CUgraphExec e, CUstream h) {
  ENTER(cuGraphUpload);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EXEC)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  stream_ref s;
  enum target t;
  return unlock_ret(resolve_stream(h, &s, &t));
}

static CUresult cuGraphLaunch_impl(CUgraphExec e, CUstream h) {
  ENTER(cuGraphLaunch);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EXEC)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  if (r != CUDA_SUCCESS) return unlock_ret(r);
  if (t == RECORD) {
    struct CUgraphNode_st* node = xcalloc(1, sizeof *node);
    node->type = CU_GRAPH_NODE_TYPE_GRAPH;
    node->child = graph_copy(e->g);
    record(&s, node, "cuGraphLaunch");
    return unlock_ret(CUDA_SUCCESS);
  }
  ++g_graph_launches;
  return unlock_ret(run_graph(e->g, s.ctx));
}

static CUresult cuGraphExecDestroy_impl(CUgraphExec e) {
  ENTER(cuGraphExecDestroy);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EXEC)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  busy_release_before_free();
  graph_free(e->g, 0);
  obj_del(e);
  free(e);
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* n) {
  int slot = busy_enter(g, "cuGraphGetNodes");
  CUresult r = cuGraphGetNodes_impl(g, nodes, n);
  busy_exit(slot);
  return r;
}

uint64_t g_next_family;

uint64_t graph_family(const void* h, int is_exec) {
  lock();
  uint64_t f = 0;
  if (is_exec && obj_is(h, K_EXEC)) f = ((const struct CUgraphExec_st*)h)->family;
  if (!is_exec && obj_is(h, K_GRAPH)) f = ((const struct CUgraph_st*)h)->family;
  pthread_mutex_unlock(&g_mu);
  return f;
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
  int slot = busy_enter(g, "cuGraphDestroy");
  int fam = busy_enter_family(graph_family(g, 0), "cuGraphDestroy");
  CUresult r = cuGraphDestroy_impl(g);
  busy_exit_family(fam);
  busy_exit(slot);
  return r;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* pe, CUgraph g, unsigned long long flags) {
  int slot = busy_enter(g, "cuGraphInstantiateWithFlags");
  int fam = busy_enter_family(graph_family(g, 0), "cuGraphInstantiateWithFlags");
  CUresult r = cuGraphInstantiateWithFlags_impl(pe, g, flags);
  busy_exit_family(fam);
  busy_exit(slot);
  return r;
}

EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream h) {
  int slot = busy_enter(e, "cuGraphUpload");
  CUresult r = cuGraphUpload_impl(e, h);
  busy_exit(slot);
  return r;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream h) {
  int slot = busy_enter(e, "cuGraphLaunch");
  CUresult r = cuGraphLaunch_impl(e, h);
  busy_exit(slot);
  return r;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  int slot = busy_enter(e, "cuGraphExecDestroy");
  int fam = busy_enter_family(graph_family(e, 1), "cuGraphExecDestroy");
  CUresult r = cuGraphExecDestroy_impl(e);
  busy_exit_family(fam);
  busy_exit(slot);
  return r;
}

/*
 * standin_exec.c — the stand-in CUDA driver (see cuda_standin.c): graphs (nodes, copies, frees,
 * recording into a capture), and running memsets, copies, kernels and graphs on host memory.
 */
#include "standin.h"

/* ---- graphs ---- */

struct CUgraph_st* graph_new(void) { return xcalloc(1, sizeof(struct CUgraph_st)); }

static void graph_append(struct CUgraph_st* g, struct CUgraphNode_st* n) {
  if (g->n == g->cap) {
    g->cap = g->cap ? g->cap * 2 : 8;
    struct CUgraphNode_st** nn = realloc(g->nodes, g->cap * sizeof *nn);
    if (!nn) {
      fprintf(stderr, "standin: out of host memory\n");
      abort();
    }
    g->nodes = nn;
  }
  g->nodes[g->n++] = n;
}

static struct CUgraphNode_st* node_copy(const struct CUgraphNode_st* n);

static struct CUgraphNode_st* node_copy(const struct CUgraphNode_st* n) {
  struct CUgraphNode_st* c = xmalloc(sizeof *c);
  *c = *n;
  if (n->type == CU_GRAPH_NODE_TYPE_MEMCPY && n->copy == COPY_HTOD) {
    c->host = xmalloc(n->count);
    memcpy(c->host, n->host, n->count);
  }
  if (n->child) c->child = graph_copy(n->child);
  return c;
}

struct CUgraph_st* graph_copy(const struct CUgraph_st* g) {
  struct CUgraph_st* c = graph_new();
  for (size_t i = 0; i < g->n; ++i) graph_append(c, node_copy(g->nodes[i]));
  return c;
}

static void node_free(struct CUgraphNode_st* n) {
  if (n->type == CU_GRAPH_NODE_TYPE_MEMCPY && n->copy == COPY_HTOD) free(n->host);
  if (n->child) graph_free(n->child, 0);
  free(n);
}

/* registered: the graph and its nodes are in the handle set (graphs the user holds). */
void graph_free(struct CUgraph_st* g, int registered) {
  for (size_t i = 0; i < g->n; ++i) {
    if (registered) obj_del(g->nodes[i]);
    node_free(g->nodes[i]);
  }
  if (registered) obj_del(g);
  free(g->nodes);
  free(g);
}

void record(stream_ref* s, struct CUgraphNode_st* n, const char* call) {
  n->ctx = s->ctx;
  snprintf(g_last_recorded, sizeof g_last_recorded, "%s into a capture (mode %d) %s the thread that began it", call,
           (int)s->s->cap->mode, pthread_equal(s->s->cap->thread, pthread_self()) ? "from" : "NOT from");
  graph_append(s->s->cap->graph, n);
  ++g_nodes_recorded;
}

/* ---- execution on host memory ---- */

CUresult run_memset(struct CUctx_st* ctx, uintptr_t dst, unsigned value, unsigned elem, size_t count,
                           const char* what) {
  (void)ctx;
  unsigned long long bytes = (unsigned long long)count * elem;
  if (!range_ok(dst, bytes, NULL, what)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (elem == 1) {
    memset((void*)dst, (int)(value & 0xFF), count);
  } else {
    uint32_t v = value;
    for (size_t i = 0; i < count; ++i) memcpy((char*)dst + 4 * i, &v, 4);
  }
  return CUDA_SUCCESS;
}

CUresult run_copy(int kind, uintptr_t dst, uintptr_t src, void* host, size_t bytes, const char* what) {
  switch (kind) {
    case COPY_HTOD:
      if (!range_ok(dst, bytes, NULL, what)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memcpy((void*)dst, host, bytes);
      break;
    case COPY_DTOH:
      if (!range_ok(src, bytes, NULL, what)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memcpy(host, (void*)src, bytes);
      break;
    default:
      if (!range_ok(dst, bytes, NULL, what) || !range_ok(src, bytes, NULL, what)) return CUDA_ERROR_ILLEGAL_ADDRESS;
      memmove((void*)dst, (void*)src, bytes);
      break;
  }
  return CUDA_SUCCESS;
}

static int module_live(unsigned long long id) {
  if (!g_obj_cap) return 0;
  for (size_t i = 0; i < g_obj_cap; ++i)
    if (g_objs[i].kind == K_MODULE && ((struct CUmod_st*)g_objs[i].key)->id == id) return 1;
  return 0;
}

/* gs_splitk_gemv of cuda-src/testing/graph_safety.cu, one CTA after another. */
static CUresult run_splitk(struct CUctx_st* ctx, const launch_t* l) {
  const int m = l->m, k = l->k, splits = l->splits;
  if (m <= 0 || k <= 0 || splits <= 0) {
    /* The kernel divides by splits and indexes with m and k: nothing graphsafe may launch. */
    violation("gs_splitk_gemv: m=%d k=%d splits=%d", m, k, splits);
    return CUDA_ERROR_LAUNCH_FAILED;
  }
  const unsigned rows_per_cta = l->block[0], row_blocks = l->grid[0], ctas_y = l->grid[1];
  const unsigned long long mm = (unsigned)m, kk = (unsigned)k;
  const unsigned long long part_rows = ctas_y > (unsigned)splits ? ctas_y : (unsigned)splits;
  for (int i = 0; i < 5; ++i) {
    if (l->ptr[i] % 4) {
      violation("gs_splitk_gemv: parameter %d (0x%llx) is not 4-byte aligned", i, (unsigned long long)l->ptr[i]);
      return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
  }
  if (!range_ok(l->ptr[0], mm * kk * 4, ctx, "gs_splitk_gemv a") || !range_ok(l->ptr[1], kk * 4, ctx, "gs_splitk_gemv x") ||
      !range_ok(l->ptr[2], mm * 4, ctx, "gs_splitk_gemv y") ||
      !range_ok(l->ptr[3], part_rows * mm * 4, ctx, "gs_splitk_gemv partials") ||
      !range_ok(l->ptr[4], (unsigned long long)row_blocks * 4, ctx, "gs_splitk_gemv counters"))
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  const float* a = (const float*)l->ptr[0];
  const float* x = (const float*)l->ptr[1];
  float* y = (float*)l->ptr[2];
  float* partials = (float*)l->ptr[3];
  unsigned* counters = (unsigned*)l->ptr[4];
  const int chunk = (k + splits - 1) / splits;
  for (unsigned bx = 0; bx < row_blocks; ++bx) {
    for (unsigned split = 0; split < ctas_y; ++split) {
      const long long k0 = (long long)split * chunk;
      const long long k1 = k < k0 + chunk ? k : k0 + chunk;
      for (unsigned t = 0; t < rows_per_cta; ++t) {
        const long long row = (long long)bx * rows_per_cta + t;
        if (row >= m) continue;
        float acc = 0.f;
        for (long long i = k0; i < k1; ++i) acc = fmaf(a[row * k + i], x[i], acc);
        partials[(long long)split * m + row] = acc;
      }
      const unsigned old = counters[bx]++;
      if (old != (unsigned)(splits - 1)) continue;
      for (unsigned t = 0; t < rows_per_cta; ++t) {
        const long long row = (long long)bx * rows_per_cta + t;
        if (row >= m) continue;
        float sum = 0.f;
        for (int s = 0; s < splits; ++s) sum += partials[(long long)s * m + row];
        y[row] = sum;
      }
      counters[bx] = 0u;
    }
  }
  return CUDA_SUCCESS;
}

CUresult run_kernel(struct CUctx_st* ctx, int kernel, const launch_t* l) {
  ++g_kernels_run;
  switch (kernel) {
    case KERNEL_SPLITK:
      return run_splitk(ctx, l);
    default:
      return CUDA_SUCCESS; /* gs_empty, and kernels whose parameters we cannot know */
  }
}

static CUresult run_node(const struct CUgraphNode_st* n, struct CUctx_st* ctx) {
  switch (n->type) {
    case CU_GRAPH_NODE_TYPE_MEMSET:
      return run_memset(ctx, n->dst, n->value, n->elem, n->count, "graph memset node");
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return run_copy(n->copy, n->dst, n->src, n->host, n->count, "graph memcpy node");
    case CU_GRAPH_NODE_TYPE_KERNEL:
      if (n->kernel != KERNEL_OTHER && !module_live(n->module_id)) {
        violation("graph kernel node %s: its module was unloaded", n->name);
        return CUDA_ERROR_LAUNCH_FAILED;
      }
      return run_kernel(n->ctx, n->kernel, &n->launch);
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return run_graph(n->child, ctx);
    default:
      return CUDA_SUCCESS;
  }
}

CUresult run_graph(const struct CUgraph_st* g, struct CUctx_st* ctx) {
  CUresult first = CUDA_SUCCESS;
  for (size_t i = 0; i < g->n; ++i) {
    CUresult r = run_node(g->nodes[i], ctx);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  }
  return first;
}

/* ---- page-locked host memory: host-to-device copies that read their source late ---- */

int g_async_htod;
typedef struct {
  uintptr_t dst;
  const void* host;
  size_t bytes;
} pending_htod;
static pending_htod* g_pending;
static size_t g_npending, g_cap_pending;

void htod_defer(uintptr_t dst, const void* host, size_t bytes) {
  if (g_npending == g_cap_pending) {
    g_cap_pending = g_cap_pending ? 2 * g_cap_pending : 16;
    pending_htod* p = realloc(g_pending, g_cap_pending * sizeof *p);
    if (!p) {
      fprintf(stderr, "standin: out of host memory\n");
      abort();
    }
    g_pending = p;
  }
  g_pending[g_npending++] = (pending_htod){dst, host, bytes};
}

void htod_flush(void) {
  for (size_t i = 0; i < g_npending; ++i)
    (void)run_copy(COPY_HTOD, g_pending[i].dst, 0, (void*)g_pending[i].host, g_pending[i].bytes, "a deferred cuMemcpyHtoDAsync");
  g_npending = 0;
}

/*
 * standin_state.c — the stand-in CUDA driver (see cuda_standin.c): the set of live handles, live
 * allocations and range checks, contexts, captures and CUDA's capture rules, graph-object tracking.
 */
#include "standin.h"

/* ---- the set of live handles (open addressing on the pointer) ---- */

static size_t obj_hash(uintptr_t k, size_t cap) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (size_t)k & (cap - 1);
}

static void obj_rehash(size_t cap) {
  slot_t* old = g_objs;
  size_t oldcap = g_obj_cap;
  g_objs = xcalloc(cap, sizeof(slot_t));
  g_obj_cap = cap;
  g_obj_used = 0;
  for (size_t i = 0; i < oldcap; ++i) {
    if (old[i].kind != K_FREE && old[i].kind != K_TOMB) {
      size_t j = obj_hash(old[i].key, cap);
      while (g_objs[j].kind != K_FREE) j = (j + 1) & (cap - 1);
      g_objs[j] = old[i];
      ++g_obj_used;
    }
  }
  free(old);
}

void obj_add(const void* p, int kind) {
  if ((g_obj_used + 1) * 2 > g_obj_cap) {
    size_t live = 0;
    for (int k = K_STREAM; k < K_TOMB; ++k) live += (size_t)g_live[k];
    size_t cap = 64;
    while (cap < (live + 1) * 4) cap *= 2;
    obj_rehash(cap);
  }
  size_t j = obj_hash((uintptr_t)p, g_obj_cap);
  while (g_objs[j].kind != K_FREE && g_objs[j].kind != K_TOMB) j = (j + 1) & (g_obj_cap - 1);
  if (g_objs[j].kind == K_FREE) ++g_obj_used;
  g_objs[j].key = (uintptr_t)p;
  g_objs[j].kind = kind;
  ++g_live[kind];
}

static slot_t* obj_find(const void* p) {
  if (!g_obj_cap || !p) return NULL;
  size_t j = obj_hash((uintptr_t)p, g_obj_cap);
  while (g_objs[j].kind != K_FREE) {
    if (g_objs[j].kind != K_TOMB && g_objs[j].key == (uintptr_t)p) return &g_objs[j];
    j = (j + 1) & (g_obj_cap - 1);
  }
  return NULL;
}

int obj_is(const void* p, int kind) {
  slot_t* s = obj_find(p);
  return s && s->kind == kind;
}

void obj_del(const void* p) {
  slot_t* s = obj_find(p);
  if (s) {
    --g_live[s->kind];
    s->kind = K_TOMB;
  }
}

/* ---- allocations: a sorted array of live ranges ---- */

size_t alloc_upper(uintptr_t p) { /* first index whose base > p */
  size_t lo = 0, hi = g_nallocs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_allocs[mid].base <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

alloc_t* alloc_containing(uintptr_t p) {
  size_t i = alloc_upper(p);
  if (i == 0) return NULL;
  alloc_t* a = &g_allocs[i - 1];
  return p - a->base < a->size ? a : NULL;
}

/* Whether [p, p + n) lies inside one live allocation (of `ctx`, unless NULL). n == 0 is allowed. */
int range_ok(uintptr_t p, unsigned long long n, struct CUctx_st* ctx, const char* what) {
  if (n == 0) return 1;
  alloc_t* a = alloc_containing(p);
  if (!a) {
    violation("%s: address 0x%llx (%llu bytes) is not in any live allocation", what, (unsigned long long)p, n);
    return 0;
  }
  if (n > a->size - (p - a->base)) {
    violation("%s: [0x%llx, +%llu) runs past the end of its allocation [0x%llx, +%zu)", what, (unsigned long long)p, n,
              (unsigned long long)a->base, a->size);
    return 0;
  }
  if (ctx && a->ctx != ctx) {
    violation("%s: address 0x%llx belongs to device %d, the launch runs on device %d", what, (unsigned long long)p,
              a->ctx->device, ctx->device);
    return 0;
  }
  return 1;
}

/* Freed blocks, poisoned, kept from malloc for a while (a ring of QUARANTINE_COUNT). */
static struct {
  void* p;
  size_t size;
}* g_quarantine;
static size_t g_q_head, g_q_len;
static unsigned long long g_q_bytes;

void quarantine_push(void* p, size_t size) {
  if (!g_quarantine) g_quarantine = xcalloc(QUARANTINE_COUNT, sizeof *g_quarantine);
  while (g_q_len == QUARANTINE_COUNT || (g_q_len && g_q_bytes + size > QUARANTINE_BYTES)) {
    free(g_quarantine[g_q_head].p);
    g_q_bytes -= g_quarantine[g_q_head].size;
    g_q_head = (g_q_head + 1) % QUARANTINE_COUNT;
    --g_q_len;
  }
  g_quarantine[(g_q_head + g_q_len) % QUARANTINE_COUNT].p = p;
  g_quarantine[(g_q_head + g_q_len) % QUARANTINE_COUNT].size = size;
  ++g_q_len;
  g_q_bytes += size;
}

/* ---- contexts and captures ---- */

int ctx_valid(struct CUctx_st* c) {
  return (c >= &g_ctx[0] && c < &g_ctx[g_ndev]) || (c >= &g_engine_ctx[0] && c < &g_engine_ctx[g_ndev]);
}

/* The current context if it is usable, else NULL. */
struct CUctx_st* current_ctx(void) {
  struct CUctx_st* c = t_current;
  return c && ctx_valid(c) && c->refs > 0 ? c : NULL;
}

void invalidate(capture_t* c, const char* why) {
  if (!c->invalidated) {
    c->invalidated = 1;
    ++g_invalidated;
    snprintf(g_last_invalidation, sizeof g_last_invalidation, "%s (capture mode %d; %s the thread that began it)", why,
             (int)c->mode, pthread_equal(c->thread, pthread_self()) ? "on" : "not on");
  }
}

/* CUDA's rule for "potentially unsafe" calls during capture. Returns 1 (and invalidates the
 * captures that forbid it) when the calling thread may not make one now. */
int unsafe_call_refused(const char* call) {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
  int refused = 0;
  for (capture_t* c = g_captures; c; c = c->next) {
    if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
    int own = pthread_equal(c->thread, pthread_self());
    if (own || (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      invalidate(c, call);
      refused = 1;
    }
  }
  if (refused) ++g_refused_unsafe;
  return refused;
}

void capture_release_joined(capture_t* cap) {
  for (int i = 0; i < cap->njoined; ++i)
    if (cap->joined[i] && cap->joined[i]->cap == cap) cap->joined[i]->cap = NULL;
  cap->njoined = 0;
}

void capture_forget_joined(struct CUstream_st* s) {
  for (capture_t* c = g_captures; c; c = c->next)
    for (int i = 0; i < c->njoined; ++i)
      if (c->joined[i] == s) {
        c->joined[i] = NULL;
        c->rejoined[i] = 1;
      }
}

void capture_remove(capture_t* cap) {
  for (capture_t** pp = &g_captures; *pp; pp = &(*pp)->next) {
    if (*pp == cap) {
      *pp = cap->next;
      break;
    }
  }
}

CUresult resolve_stream(CUstream h, stream_ref* out, enum target* t) {
  htod_flush(); /* earlier deferred copies happen before anything enqueued after them */
  *t = RUN_NOW;
  out->s = NULL;
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    struct CUctx_st* c = current_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    out->ctx = c;
    ++g_legacy_ops;
    if (h != CU_STREAM_PER_THREAD) {
      /* The legacy stream synchronizes with every blocking stream of its context: a capture on
       * one of them cannot be joined, so CUDA invalidates it. */
      int hit = 0;
      for (capture_t* cap = g_captures; cap; cap = cap->next) {
        if (cap->stream->ctx == c && !(cap->stream->flags & CU_STREAM_NON_BLOCKING)) {
          invalidate(cap, "work on the legacy stream");
          hit = 1;
        }
      }
      if (hit) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    return CUDA_SUCCESS;
  }
  if (!obj_is(h, K_STREAM)) return CUDA_ERROR_INVALID_HANDLE;
  out->s = h;
  out->ctx = h->ctx;
  if (h->cap) {
    if (h->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    *t = RECORD;
  }
  return CUDA_SUCCESS;
}

/* CUDA: "Graph objects are not internally synchronized and must not be accessed concurrently from
 * multiple threads" — executable graphs included (cuGraphLaunch's page says the same). The driver
 * lock below would hide such a race, so calls on one graph or executable are tracked here, around
 * the injected delay too, and a second call on an object already in use is a violation. */
#define BUSY_SLOTS 256
static pthread_mutex_t g_busy_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const void* obj;
  const char* call;
} g_busy[BUSY_SLOTS];

/* The slot of the graph call this thread is in: a destroy releases it before the memory can be
 * reused for a new object that another thread may then use (not a race). */
static __thread int t_busy_slot = -1;

static int busy_claim(const void* obj, const char* call) {
  const char* other = NULL;
  int slot = -1;
  pthread_mutex_lock(&g_busy_mu);
  for (int i = 0; i < BUSY_SLOTS; ++i) {
    if (g_busy[i].obj == obj && obj) other = g_busy[i].call;
    if (!g_busy[i].obj && slot < 0) slot = i;
  }
  if (!other && slot >= 0 && obj) {
    g_busy[slot].obj = obj;
    g_busy[slot].call = call;
  } else {
    slot = -1;
  }
  pthread_mutex_unlock(&g_busy_mu);
  if (other) {
    lock();
    if ((uintptr_t)obj & 1)
      violation("%s while another thread is in %s on the same graph family (a graph and the executables instantiated "
                "from it: driver 580 crashes in cuGraphExecDestroy when they overlap)", call, other);
    else
      violation("%s(%p) while another thread is in %s on the same graph object (CUDA graphs are not thread-safe)", call,
                obj, other);
    pthread_mutex_unlock(&g_mu);
  }
  return slot;
}

int busy_enter(const void* obj, const char* call) {
  int slot = busy_claim(obj, call);
  t_busy_slot = slot;
  return slot;
}

int busy_enter_family(uint64_t family, const char* call) { return busy_claim(family_key(family), call); }

void busy_exit_family(int slot) {
  if (slot < 0) return;
  pthread_mutex_lock(&g_busy_mu);
  g_busy[slot].obj = NULL;
  pthread_mutex_unlock(&g_busy_mu);
}

/* Called by a destroy, with g_mu held, just before the object is freed. */
void busy_release_before_free(void) {
  busy_exit(t_busy_slot);
  t_busy_slot = -1;
}

void busy_exit(int slot) {
  if (slot < 0 || slot != t_busy_slot) return; /* already released by a destroy */
  pthread_mutex_lock(&g_busy_mu);
  g_busy[slot].obj = NULL;
  pthread_mutex_unlock(&g_busy_mu);
  t_busy_slot = -1;
}


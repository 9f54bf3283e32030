/*
 * standin_control.c — the stand-in CUDA driver (see cuda_standin.c): the control API for tests
 * (fail/delay knobs, call counts, counters and gauges, reset).
 */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Control API for tests                                                                        */
/* ------------------------------------------------------------------------------------------ */

EXPORT int standin_fail_repeat(const char* entry, int after_calls, int times, int cuda_result) {
  int i = entry_index(entry);
  if (i < 0 || after_calls < 0) return -1;
  pthread_mutex_lock(&g_knob_mu);
  knob_t* k = &g_knobs[i];
  if (cuda_result == 0 || times == 0) {
    k->fail_at = 0;
  } else {
    k->fail_at = k->calls + after_calls + 1;
    k->fail_times = times;
    k->fail_result = (CUresult)cuda_result;
  }
  pthread_mutex_unlock(&g_knob_mu);
  return 0;
}

EXPORT int standin_fail(const char* entry, int after_calls, int cuda_result) {
  return standin_fail_repeat(entry, after_calls, 1, cuda_result);
}

EXPORT int standin_delay(const char* entry, int usec) {
  int i = entry_index(entry);
  if (i < 0 || usec < 0) return -1;
  pthread_mutex_lock(&g_knob_mu);
  g_knobs[i].delay_us = usec;
  pthread_mutex_unlock(&g_knob_mu);
  return 0;
}

EXPORT long standin_calls(const char* entry) {
  int i = entry_index(entry);
  if (i < 0) return -1;
  pthread_mutex_lock(&g_knob_mu);
  long n = g_knobs[i].calls;
  pthread_mutex_unlock(&g_knob_mu);
  return n;
}

EXPORT long standin_violations(void) {
  lock();
  long n = g_violations;
  pthread_mutex_unlock(&g_mu);
  return n;
}

EXPORT int standin_last_violation(char* buf, int len) {
  lock();
  int n = g_violations ? (int)strlen(g_last_violation) : 0;
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", g_violations ? g_last_violation : "");
  pthread_mutex_unlock(&g_mu);
  return n;
}

EXPORT int standin_last_invalidation(char* buf, int len) {
  lock();
  int n = (int)strlen(g_last_invalidation);
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", g_last_invalidation);
  pthread_mutex_unlock(&g_mu);
  return n;
}

EXPORT int standin_last_recorded(char* buf, int len) {
  lock();
  int n = (int)strlen(g_last_recorded);
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", g_last_recorded);
  pthread_mutex_unlock(&g_mu);
  return n;
}

EXPORT long standin_live_allocations(void) {
  lock();
  long n = (long)g_nallocs;
  pthread_mutex_unlock(&g_mu);
  return n;
}

EXPORT long standin_stat(const char* name) {
  if (!name) return -1;
  long r = -1;
  lock();
  if (!strcmp(name, "violations")) r = g_violations;
  else if (!strcmp(name, "live_allocations")) r = (long)g_nallocs;
  else if (!strcmp(name, "orphaned_allocations")) {
    r = 0;
    for (size_t i = 0; i < g_nallocs; ++i) r += g_allocs[i].orphaned;
  }
  else if (!strcmp(name, "live_bytes")) {
    unsigned long long b = 0;
    for (int i = 0; i < g_ndev; ++i) b += g_used[i];
    r = (long)b;
  } else if (!strcmp(name, "live_streams")) r = g_live[K_STREAM];
  else if (!strcmp(name, "live_events")) r = g_live[K_EVENT];
  else if (!strcmp(name, "live_modules")) r = g_live[K_MODULE];
  else if (!strcmp(name, "live_graphs")) r = g_live[K_GRAPH];
  else if (!strcmp(name, "live_execs")) r = g_live[K_EXEC];
  else if (!strcmp(name, "open_captures")) {
    r = 0;
    for (capture_t* c = g_captures; c; c = c->next) ++r;
  } else if (!strcmp(name, "primary_ctx_refs")) {
    r = 0;
    for (int i = 0; i < g_ndev; ++i) r += g_ctx[i].refs;
  } else if (!strcmp(name, "nodes_recorded")) r = g_nodes_recorded;
  else if (!strcmp(name, "invalidated_captures")) r = g_invalidated;
  else if (!strcmp(name, "legacy_stream_ops")) r = g_legacy_ops;
  else if (!strcmp(name, "refused_unsafe_calls")) r = g_refused_unsafe;
  else if (!strcmp(name, "refused_frees")) r = g_refused_frees;
  else if (!strcmp(name, "kernels_run")) r = g_kernels_run;
  else if (!strcmp(name, "graph_launches")) r = g_graph_launches;
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* A context of `device` that is not its primary one (an engine's own, for Context::adopt), or
 * NULL for a device that does not exist or before cuInit. */
EXPORT void* standin_engine_context(int device) {
  lock();
  void* c = g_inited && device >= 0 && device < g_ndev ? &g_engine_ctx[device] : NULL;
  pthread_mutex_unlock(&g_mu);
  return c;
}

/* on != 0: host-to-device copies read their source late, as from page-locked memory (htod_defer). */
EXPORT void standin_async_htod(int on) {
  lock();
  htod_flush();
  g_async_htod = on != 0;
  pthread_mutex_unlock(&g_mu);
}

EXPORT void standin_reset(void) {
  pthread_mutex_lock(&g_knob_mu);
  memset(g_knobs, 0, sizeof g_knobs);
  pthread_mutex_unlock(&g_knob_mu);
  lock();
  htod_flush();
  g_async_htod = 0;
  g_violations = g_nodes_recorded = g_invalidated = g_legacy_ops = g_refused_unsafe = g_refused_frees = g_kernels_run =
      g_graph_launches = 0;
  g_violations_printed = 0;
  g_last_violation[0] = '\0';
  g_last_invalidation[0] = '\0';
  g_last_recorded[0] = '\0';
  pthread_mutex_unlock(&g_mu);
}

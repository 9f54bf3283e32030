/*
 * cuda_standin.c — a stand-in CUDA driver for graphsafe's CPU tests.
 *
 * It exports (C ABI, cuda.h's signatures) every entry point of the `driver_api!` table in
 * src/sys/driver.rs under every name listed there, so that `GRAPHSAFE_CUDA_DRIVER=/path/to/it.so`
 * lets the Rust API and the C ABI run with *valid* handles on a machine without a GPU. Host memory
 * plays device memory; everything executes synchronously, in call order, on the calling thread.
 *
 * The sources: this file (the shared state, knobs, violations), standin.h (what the files share),
 * standin_state.c (handles, allocations, contexts, captures), standin_exec.c (graphs, running work
 * on host memory), standin_devices.c, standin_memory.c, standin_streams.c (with modules and
 * launches), standin_graphs.c (capture and graphs), standin_control.c (the control API below).
 * Build (every .c file of tests/standin, as .ci/run does):
 *          gcc -shared -fPIC -O1 -pthread tests/standin/[all .c files] -o libcuda_standin.so -lm
 * Check the signatures against the real header (any mismatch is a compile error):
 *          gcc -fsyntax-only -DSTANDIN_WITH_CUDA_H -I$CUDA/include tests/standin/[all .c files]
 * The library deliberately has no SONAME: the CUDA runtime inside the kernel glue dlopens
 * "libcuda.so.1", and a stand-in answering to that name would be handed to it.
 *
 * What it models (as close to the real driver as graphsafe's paths need):
 *   - Devices: STANDIN_DEVICES (1..8, default 1), compute capability STANDIN_COMPUTE_CAPABILITY ("9.0", or one per
 *     device: "9.0,10.0"; default 9.0), 132 SMs, name "graphsafe stand-in", 16 GiB each.
 *     Primary contexts with a retain count; a per-thread current context (NULL allowed). Calls that
 *     need a context fail with CUDA_ERROR_INVALID_CONTEXT when none (or a released one) is current.
 *     Everything but cuInit, cuDriverGetVersion and cuGetError* needs cuInit first.
 *   - Memory: cuMemAlloc is a 256-byte aligned host allocation (device pointer = host address),
 *     filled with 0xA5 (device memory is never zero on allocation: invariant 3 is testable).
 *     Live allocations are tracked; a freed block is poisoned with 0xDD and quarantined (not given
 *     back to malloc until 256 MiB or 16384 later frees have passed), so a stale address stays
 *     detectable. cuMemFree of anything but the base of a live allocation: a violation and
 *     CUDA_ERROR_INVALID_VALUE.
 *   - Every memset/memcpy/kernel range is checked to lie inside ONE live allocation (kernels: of the
 *     launch's context). Otherwise a violation is counted and the call (or replayed node) returns
 *     CUDA_ERROR_ILLEGAL_ADDRESS without touching memory (not sticky, unlike a real GPU).
 *   - Streams (flags kept), events (timestamps; elapsed time is a small positive number), the legacy
 *     stream (NULL / CU_STREAM_LEGACY: work on it while a *blocking* stream of the same context
 *     captures invalidates that capture with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, as the real one).
 *   - Stream capture: modes GLOBAL/THREAD_LOCAL/RELAXED, the beginning thread recorded;
 *     cuStreamEndCapture from another thread (non-relaxed) → CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
 *     with the capture still open. Memset/memcpy/launch/graph-launch on a capturing stream are
 *     recorded as nodes (MEMSET/MEMCPY/KERNEL/GRAPH) instead of executed; host-to-device copies
 *     record a copy of the host bytes. "Potentially unsafe" calls (cuMemAlloc, cuMemFree,
 *     cuCtxSynchronize) follow CUDA's rule — prohibited for a thread (per its
 *     cuThreadExchangeStreamCaptureMode mode, default GLOBAL) that has its own non-relaxed capture
 *     open, or, in GLOBAL mode, while any GLOBAL capture is open — and return
 *     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating those captures. cuStreamSynchronize /
 *     cuStreamQuery of a capturing stream do the same to its capture. An invalidated capture takes
 *     no more work (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) and its EndCapture returns that code.
 *   - Graphs: cuGraphGetNodes/NodeGetType/Destroy; cuGraphInstantiateWithFlags copies the graph;
 *     cuGraphLaunch replays the nodes in order, validating every range at replay time (a node that
 *     touches memory that is no longer allocated is skipped: violation, CUDA_ERROR_ILLEGAL_ADDRESS);
 *     a kernel node whose module was unloaded is a violation too. Graph launch into a capturing
 *     stream records a GRAPH node.
 *   - Modules: any image loads; any function name resolves. Two kernels of
 *     cuda-src/testing/graph_safety.cu are emulated on the host: gs_splitk_gemv (partials and
 *     per-row-block counters in the workspace, fmaf per split then splits summed in order: the
 *     same fp32 operations as the kernel and as tests/common's gemv_reference; the CTA that sees
 *     the counter reach splits-1 reduces and resets it, CTAs run in (row block, split) order, so a
 *     dirty counter gives the wrong-answer behaviour a GPU shows) and gs_empty. Any other kernel is
 *     a no-op (its parameters cannot be known). cuLaunchKernelEx checks cluster dimensions.
 *   - Thread-safe: one global mutex around the state; injected delays happen outside it. CUDA's
 *     graphs are not: two threads in calls on one graph or executable at once (cuGraphGetNodes,
 *     cuGraphInstantiateWithFlags, cuGraphDestroy, cuGraphLaunch, cuGraphUpload,
 *     cuGraphExecDestroy) are a violation, as on a real driver they are undefined behaviour.
 *
 * Control API for tests (exported from this library; resolve with dlsym / libloading). `entry` is
 * a driver entry point's name, with or without its version suffix ("cuMemAlloc" or
 * "cuMemAlloc_v2"); functions taking one return -1 for a name that is not an entry point.
 *   int  standin_fail(const char* entry, int after_calls, int cuda_result)
 *          the call after the next `after_calls` calls of `entry` returns `cuda_result` (once),
 *          without doing anything; cuda_result 0 cancels.
 *   int  standin_fail_repeat(const char* entry, int after_calls, int times, int cuda_result)
 *          as standin_fail, for `times` consecutive calls (times < 0: every call from then on).
 *   int  standin_delay(const char* entry, int usec)
 *          every later call of `entry` sleeps `usec` microseconds before taking the driver lock
 *          (0 cancels): widens race windows in the callers without serializing other threads.
 *   long standin_calls(const char* entry)          calls of `entry` so far (since the last reset).
 *   long standin_violations(void)                  memory-safety violations counted so far.
 *   int  standin_last_violation(char* buf, int len) copies the last violation's text (NUL-terminated);
 *                                                  returns its length (0: none).
 *   int  standin_last_invalidation(char* buf, int len) the same for the last capture the stand-in
 *                                                  invalidated: which call did it, from which thread.
 *   int  standin_last_recorded(char* buf, int len) the same for the last node recorded into a capture:
 *                                                  which call, and whether from the capturing thread.
 *   long standin_live_allocations(void)            allocations not freed.
 *   long standin_stat(const char* name)            one counter or gauge, -1 for an unknown name:
 *          "violations", "live_allocations", "orphaned_allocations" (live, but their cuMemFree was
 *          refused during a capture: nobody holds them any more), "live_bytes", "live_streams", "live_events",
 *          "live_modules", "live_graphs", "live_execs", "open_captures", "primary_ctx_refs"
 *          (sum over devices), "nodes_recorded", "invalidated_captures", "legacy_stream_ops",
 *          "refused_unsafe_calls", "refused_frees" (cuMemFree refused during a capture: leaked),
 *          "kernels_run", "graph_launches".
 *   void standin_reset(void)
 *          cancels every fail/delay knob and zeroes the call counts and the counters (violations,
 *          nodes_recorded, ...); live objects stay live and the gauges stay true.
 * Every violation is also printed to stderr ("standin: violation: ...", first 50; STANDIN_QUIET=1
 * silences them).
 */
#include "standin.h"

/* ------------------------------------------------------------------------------------------ */
/* Entry points, fail/delay knobs, call counts                                                  */
/* ------------------------------------------------------------------------------------------ */

#define AS_NAME(n) #n,
static const char* const entry_names[E_COUNT] = {ENTRIES(AS_NAME)};

pthread_mutex_t g_knob_mu = PTHREAD_MUTEX_INITIALIZER;
knob_t g_knobs[E_COUNT];

int entry_index(const char* name) {
  if (!name) return -1;
  size_t n = strlen(name);
  /* "cuMemAlloc_v2" names the same entry as "cuMemAlloc". */
  if (n > 3 && name[n - 3] == '_' && name[n - 2] == 'v' && name[n - 1] >= '2' && name[n - 1] <= '9') n -= 3;
  for (int i = 0; i < E_COUNT; ++i)
    if (strlen(entry_names[i]) == n && strncmp(entry_names[i], name, n) == 0) return i;
  return -1;
}

/* Counts the call, sleeps if asked (outside every lock), and returns an injected failure or 0. */
CUresult knob_enter(enum entry e) {
  pthread_mutex_lock(&g_knob_mu);
  knob_t* k = &g_knobs[e];
  long n = ++k->calls;
  int delay = k->delay_us;
  CUresult r = CUDA_SUCCESS;
  if (k->fail_at && n >= k->fail_at && (k->fail_times < 0 || n < k->fail_at + k->fail_times)) r = k->fail_result;
  pthread_mutex_unlock(&g_knob_mu);
  if (delay > 0) {
    struct timespec ts = {delay / 1000000, (long)(delay % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  return r;
}

/* ------------------------------------------------------------------------------------------ */
/* Global state                                                                                 */
/* ------------------------------------------------------------------------------------------ */

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_inited;
int g_ndev = 1;
int g_cc[MAX_DEVICES][2];
struct CUctx_st g_ctx[MAX_DEVICES];
struct CUctx_st g_engine_ctx[MAX_DEVICES];
unsigned long long g_used[MAX_DEVICES];

alloc_t* g_allocs;
size_t g_nallocs, g_cap_allocs;
slot_t* g_objs;
size_t g_obj_cap, g_obj_used; /* used: live + tombstones */
long g_live[K_TOMB];

capture_t* g_captures;

long g_violations, g_nodes_recorded, g_invalidated, g_legacy_ops, g_refused_unsafe, g_refused_frees,
    g_kernels_run, g_graph_launches;
char g_last_violation[512];
char g_last_invalidation[256];
char g_last_recorded[256];
long g_violations_printed;

__thread struct CUctx_st* t_current;
__thread CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

void lock(void) { pthread_mutex_lock(&g_mu); }
CUresult unlock_ret(CUresult r) {
  pthread_mutex_unlock(&g_mu);
  return r;
}

void violation(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_violation, sizeof g_last_violation, fmt, ap);
  va_end(ap);
  ++g_violations;
  const char* quiet = getenv("STANDIN_QUIET");
  if ((!quiet || strcmp(quiet, "1") != 0) && g_violations_printed < 50) {
    ++g_violations_printed;
    fprintf(stderr, "standin: violation: %s\n", g_last_violation);
  }
}

/* Called with g_mu held: tests may create and destroy millions of objects, so no allocation
 * failure here may crash; an out-of-memory test harness is not a case worth handling. */
void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "standin: out of host memory\n");
    abort();
  }
  return p;
}
void* xcalloc(size_t n, size_t s) {
  void* p = calloc(n ? n : 1, s ? s : 1);
  if (!p) {
    fprintf(stderr, "standin: out of host memory\n");
    abort();
  }
  return p;
}

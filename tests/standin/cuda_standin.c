/*
 * cuda_standin.c — a stand-in CUDA driver for graphsafe's CPU tests.
 *
 * It exports (C ABI, cuda.h's signatures) every entry point of the `driver_api!` table in
 * src/sys/driver.rs under every name listed there, so that `GRAPHSAFE_CUDA_DRIVER=/path/to/it.so`
 * lets the Rust API and the C ABI run with *valid* handles on a machine without a GPU. Host memory
 * plays device memory; everything executes synchronously, in call order, on the calling thread.
 *
 * Build:   gcc -shared -fPIC -O1 -pthread tests/standin/cuda_standin.c -o libcuda_standin.so -lm
 * Check the signatures against the real header (any mismatch is a compile error):
 *          gcc -fsyntax-only -DSTANDIN_WITH_CUDA_H -I$CUDA/include tests/standin/cuda_standin.c
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
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef STANDIN_WITH_CUDA_H
#include <cuda.h>
#else
/* The subset of cuda.h (CUDA 13.0) this file needs: same names, values and layouts. */
typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
  CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
  CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
  CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_CAPTURED_EVENT = 907,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
  CUDA_ERROR_UNKNOWN = 999
} CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphNode_st* CUgraphNode;
typedef struct CUgraphExec_st* CUgraphExec;
typedef enum CUdevice_attribute_enum {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
  CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_DEVICE_ATTRIBUTE_MAX = 148
} CUdevice_attribute;
typedef enum CUfunction_attribute_enum { CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0 } CUfunction_attribute;
typedef enum CUstreamCaptureMode_enum {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;
typedef enum CUstreamCaptureStatus_enum {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum CUgraphNodeType_enum {
  CU_GRAPH_NODE_TYPE_KERNEL = 0,
  CU_GRAPH_NODE_TYPE_MEMCPY = 1,
  CU_GRAPH_NODE_TYPE_MEMSET = 2,
  CU_GRAPH_NODE_TYPE_HOST = 3,
  CU_GRAPH_NODE_TYPE_GRAPH = 4,
  CU_GRAPH_NODE_TYPE_EMPTY = 5
} CUgraphNodeType;
typedef enum CUpointer_attribute_enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
} CUpointer_attribute;
typedef enum CUmemorytype_enum { CU_MEMORYTYPE_DEVICE = 2 } CUmemorytype;
typedef enum CUlaunchAttributeID_enum { CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4 } CUlaunchAttributeID;
typedef union CUlaunchAttributeValue_union {
  char pad[64];
  void* align_as_the_real_union; /* it holds pointers: 8-byte aligned */
  struct {
    unsigned int x, y, z;
  } clusterDim;
} CUlaunchAttributeValue;
typedef struct CUlaunchAttribute_st {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#endif

#define EXPORT __attribute__((visibility("default")))
#define SPLITK_PARAMS 8

/* ------------------------------------------------------------------------------------------ */
/* Entry points, fail/delay knobs, call counts                                                  */
/* ------------------------------------------------------------------------------------------ */

#define ENTRIES(X)                                                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount)        \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem)                     \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent)   \
  X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo)                 \
  X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)                 \
  X(cuMemcpyDtoDAsync) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) \
  X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize)                     \
  X(cuEventElapsedTime) X(cuEventDestroy) X(cuModuleLoadData) X(cuModuleGetFunction)               \
  X(cuModuleUnload) X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)                    \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                             \
  X(cuThreadExchangeStreamCaptureMode) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch)             \
  X(cuGraphUpload) X(cuGraphDestroy) X(cuGraphExecDestroy) X(cuGraphGetNodes)                      \
  X(cuGraphNodeGetType) X(cuPointerGetAttribute)

#define AS_ENUM(n) E_##n,
enum entry { ENTRIES(AS_ENUM) E_COUNT };
#define AS_NAME(n) #n,
static const char* const entry_names[E_COUNT] = {ENTRIES(AS_NAME)};

typedef struct {
  long calls;
  long fail_at;    /* the call number (1-based) at which failures start; 0: none */
  long fail_times; /* how many consecutive calls fail; < 0: all */
  CUresult fail_result;
  int delay_us;
} knob_t;

static pthread_mutex_t g_knob_mu = PTHREAD_MUTEX_INITIALIZER;
static knob_t g_knobs[E_COUNT];

static int entry_index(const char* name) {
  if (!name) return -1;
  size_t n = strlen(name);
  /* "cuMemAlloc_v2" names the same entry as "cuMemAlloc". */
  if (n > 3 && name[n - 3] == '_' && name[n - 2] == 'v' && name[n - 1] >= '2' && name[n - 1] <= '9') n -= 3;
  for (int i = 0; i < E_COUNT; ++i)
    if (strlen(entry_names[i]) == n && strncmp(entry_names[i], name, n) == 0) return i;
  return -1;
}

/* Counts the call, sleeps if asked (outside every lock), and returns an injected failure or 0. */
static CUresult knob_enter(enum entry e) {
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

#define ENTER(name)                                   \
  do {                                                \
    CUresult injected_ = knob_enter(E_##name);        \
    if (injected_ != CUDA_SUCCESS) return injected_;  \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Global state                                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define MAX_DEVICES 8
#define DEVICE_MEMORY (16ull << 30)
#define ALLOC_ALIGN 256
#define FRESH_BYTE 0xA5
#define POISON_BYTE 0xDD
#define QUARANTINE_BYTES (256ull << 20)
#define QUARANTINE_COUNT 16384

struct CUctx_st {
  int device;
  long refs; /* primary context retain count; 0: inactive */
};

typedef struct {
  uintptr_t base;
  size_t size;
  struct CUctx_st* ctx;
  int orphaned; /* its cuMemFree was refused during a capture: the caller has let go of it */
} alloc_t;

enum kind { K_FREE = 0, K_STREAM, K_EVENT, K_MODULE, K_FUNC, K_GRAPH, K_NODE, K_EXEC, K_TOMB };

typedef struct {
  uintptr_t key;
  int kind;
} slot_t;

typedef struct capture {
  CUstreamCaptureMode mode;
  pthread_t thread;
  int invalidated;
  struct CUgraph_st* graph;
  struct CUstream_st* stream;
  struct capture* next;
} capture_t;

struct CUstream_st {
  struct CUctx_st* ctx;
  unsigned flags;
  capture_t* cap;
};

struct CUevent_st {
  struct CUctx_st* ctx;
  unsigned flags;
  int recorded;
  unsigned long long t_ns;
};

enum kernel_kind { KERNEL_OTHER = 0, KERNEL_SPLITK, KERNEL_EMPTY };

struct CUfunc_st {
  struct CUmod_st* mod;
  int kind;
  char name[128];
  struct CUfunc_st* next;
};

struct CUmod_st {
  struct CUctx_st* ctx;
  unsigned long long id;
  struct CUfunc_st* funcs;
};

enum copy_kind { COPY_HTOD = 0, COPY_DTOH, COPY_DTOD };

typedef struct {
  unsigned int grid[3], block[3];
  uintptr_t ptr[5]; /* gs_splitk_gemv: a, x, y, partials, counters */
  int m, k, splits;
} launch_t;

struct CUgraphNode_st {
  CUgraphNodeType type;
  struct CUctx_st* ctx; /* the capturing stream's context */
  /* memset */
  uintptr_t dst;
  size_t count;
  unsigned elem;
  unsigned value;
  /* memcpy */
  int copy;
  uintptr_t src;
  void* host; /* HtoD: our copy of the bytes; DtoH: the caller's destination */
  /* kernel */
  int kernel;
  unsigned long long module_id;
  char name[128];
  launch_t launch;
  /* child graph */
  struct CUgraph_st* child;
};

struct CUgraph_st {
  struct CUgraphNode_st** nodes;
  size_t n, cap;
};

struct CUgraphExec_st {
  struct CUgraph_st* g;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static int g_ndev = 1;
static int g_cc[MAX_DEVICES][2];
static struct CUctx_st g_ctx[MAX_DEVICES];
static unsigned long long g_used[MAX_DEVICES];

static alloc_t* g_allocs;
static size_t g_nallocs, g_cap_allocs;
static struct {
  void* p;
  size_t size;
}* g_quarantine;
static size_t g_q_head, g_q_len;
static unsigned long long g_q_bytes;

static slot_t* g_objs;
static size_t g_obj_cap, g_obj_used; /* used: live + tombstones */
static long g_live[K_TOMB];

static capture_t* g_captures;
static unsigned long long g_next_module_id = 1;
static unsigned long long g_last_ns;

static long g_violations, g_nodes_recorded, g_invalidated, g_legacy_ops, g_refused_unsafe, g_refused_frees,
    g_kernels_run, g_graph_launches;
static char g_last_violation[512];
static char g_last_invalidation[256];
static char g_last_recorded[256];
static long g_violations_printed;

static __thread struct CUctx_st* t_current;
static __thread CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static void lock(void) { pthread_mutex_lock(&g_mu); }
static CUresult unlock_ret(CUresult r) {
  pthread_mutex_unlock(&g_mu);
  return r;
}

static void violation(const char* fmt, ...) {
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
static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "standin: out of host memory\n");
    abort();
  }
  return p;
}
static void* xcalloc(size_t n, size_t s) {
  void* p = calloc(n ? n : 1, s ? s : 1);
  if (!p) {
    fprintf(stderr, "standin: out of host memory\n");
    abort();
  }
  return p;
}

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

static void obj_add(const void* p, int kind) {
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

static int obj_is(const void* p, int kind) {
  slot_t* s = obj_find(p);
  return s && s->kind == kind;
}

static void obj_del(const void* p) {
  slot_t* s = obj_find(p);
  if (s) {
    --g_live[s->kind];
    s->kind = K_TOMB;
  }
}

/* ---- allocations: a sorted array of live ranges ---- */

static size_t alloc_upper(uintptr_t p) { /* first index whose base > p */
  size_t lo = 0, hi = g_nallocs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_allocs[mid].base <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static alloc_t* alloc_containing(uintptr_t p) {
  size_t i = alloc_upper(p);
  if (i == 0) return NULL;
  alloc_t* a = &g_allocs[i - 1];
  return p - a->base < a->size ? a : NULL;
}

/* Whether [p, p + n) lies inside one live allocation (of `ctx`, unless NULL). n == 0 is allowed. */
static int range_ok(uintptr_t p, unsigned long long n, struct CUctx_st* ctx, const char* what) {
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

static void quarantine_push(void* p, size_t size) {
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

static int ctx_valid(struct CUctx_st* c) { return c >= &g_ctx[0] && c < &g_ctx[g_ndev]; }

/* The current context if it is usable, else NULL. */
static struct CUctx_st* current_ctx(void) {
  struct CUctx_st* c = t_current;
  return c && ctx_valid(c) && c->refs > 0 ? c : NULL;
}

static void invalidate(capture_t* c, const char* why) {
  if (!c->invalidated) {
    c->invalidated = 1;
    ++g_invalidated;
    snprintf(g_last_invalidation, sizeof g_last_invalidation, "%s (capture mode %d; %s the thread that began it)", why,
             (int)c->mode, pthread_equal(c->thread, pthread_self()) ? "on" : "not on");
  }
}

/* CUDA's rule for "potentially unsafe" calls during capture. Returns 1 (and invalidates the
 * captures that forbid it) when the calling thread may not make one now. */
static int unsafe_call_refused(const char* call) {
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

static void graph_free(struct CUgraph_st* g, int registered);

static void capture_remove(capture_t* cap) {
  for (capture_t** pp = &g_captures; *pp; pp = &(*pp)->next) {
    if (*pp == cap) {
      *pp = cap->next;
      break;
    }
  }
}

/* Where work issued to `h` goes. */
enum target { RUN_NOW, RECORD };
typedef struct {
  struct CUctx_st* ctx;
  struct CUstream_st* s; /* NULL for the legacy / per-thread streams */
} stream_ref;

static CUresult resolve_stream(CUstream h, stream_ref* out, enum target* t) {
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

static void busy_exit(int slot);

static int busy_enter(const void* obj, const char* call) {
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
    violation("%s(%p) while another thread is in %s on the same graph object (CUDA graphs are not thread-safe)", call,
              obj, other);
    pthread_mutex_unlock(&g_mu);
  }
  t_busy_slot = slot;
  return slot;
}

/* Called by a destroy, with g_mu held, just before the object is freed. */
static void busy_release_before_free(void) {
  busy_exit(t_busy_slot);
  t_busy_slot = -1;
}

static void busy_exit(int slot) {
  if (slot < 0 || slot != t_busy_slot) return; /* already released by a destroy */
  pthread_mutex_lock(&g_busy_mu);
  g_busy[slot].obj = NULL;
  pthread_mutex_unlock(&g_busy_mu);
  t_busy_slot = -1;
}

/* ---- graphs ---- */

static struct CUgraph_st* graph_new(void) { return xcalloc(1, sizeof(struct CUgraph_st)); }

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

static struct CUgraph_st* graph_copy(const struct CUgraph_st* g);

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

static struct CUgraph_st* graph_copy(const struct CUgraph_st* g) {
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
static void graph_free(struct CUgraph_st* g, int registered) {
  for (size_t i = 0; i < g->n; ++i) {
    if (registered) obj_del(g->nodes[i]);
    node_free(g->nodes[i]);
  }
  if (registered) obj_del(g);
  free(g->nodes);
  free(g);
}

static void record(stream_ref* s, struct CUgraphNode_st* n, const char* call) {
  n->ctx = s->ctx;
  snprintf(g_last_recorded, sizeof g_last_recorded, "%s into a capture (mode %d) %s the thread that began it", call,
           (int)s->s->cap->mode, pthread_equal(s->s->cap->thread, pthread_self()) ? "from" : "NOT from");
  graph_append(s->s->cap->graph, n);
  ++g_nodes_recorded;
}

/* ---- execution on host memory ---- */

static CUresult run_memset(struct CUctx_st* ctx, uintptr_t dst, unsigned value, unsigned elem, size_t count,
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

static CUresult run_copy(int kind, uintptr_t dst, uintptr_t src, void* host, size_t bytes, const char* what) {
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

static CUresult run_kernel(struct CUctx_st* ctx, int kernel, const launch_t* l) {
  ++g_kernels_run;
  switch (kernel) {
    case KERNEL_SPLITK:
      return run_splitk(ctx, l);
    default:
      return CUDA_SUCCESS; /* gs_empty, and kernels whose parameters we cannot know */
  }
}

static CUresult run_graph(const struct CUgraph_st* g, struct CUctx_st* ctx);

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

static CUresult run_graph(const struct CUgraph_st* g, struct CUctx_st* ctx) {
  CUresult first = CUDA_SUCCESS;
  for (size_t i = 0; i < g->n; ++i) {
    CUresult r = run_node(g->nodes[i], ctx);
    if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = r;
  }
  return first;
}

/* ------------------------------------------------------------------------------------------ */
/* Initialisation, versions, errors                                                             */
/* ------------------------------------------------------------------------------------------ */

#define NEED_INIT()                                             \
  do {                                                          \
    if (!g_inited) return unlock_ret(CUDA_ERROR_NOT_INITIALIZED); \
  } while (0)

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

static const struct {
  CUresult code;
  const char* name;
  const char* text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
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
  if (!current_ctx()) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
  if (unsafe_call_refused("cuCtxSynchronize")) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  return unlock_ret(CUDA_SUCCESS);
}

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
  if (h->cap) {
    /* Destroying a capturing stream ends its capture; the graph is lost. */
    capture_remove(h->cap);
    graph_free(h->cap->graph, 0);
    free(h->cap);
  }
  obj_del(h);
  free(h);
  return unlock_ret(CUDA_SUCCESS);
}

static CUresult sync_common(CUstream h, const char* what) {
  lock();
  NEED_INIT();
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

EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  ENTER(cuStreamWaitEvent);
  lock();
  NEED_INIT();
  if (!obj_is(e, K_EVENT)) return unlock_ret(CUDA_ERROR_INVALID_HANDLE);
  if (flags != 0 && flags != 1) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
  stream_ref s;
  enum target t;
  CUresult r = resolve_stream(h, &s, &t);
  return unlock_ret(r);
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
  if (t == RECORD) return unlock_ret(CUDA_SUCCESS); /* a capture-internal dependency, no node */
  e->recorded = 1;
  e->t_ns = now_ns();
  return unlock_ret(CUDA_SUCCESS);
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
  ENTER(cuEventSynchronize);
  lock();
  NEED_INIT();
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
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
    return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  capture_remove(c);
  h->cap = NULL;
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
  e->g = graph_copy(g); /* an executable does not depend on its graph */
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

EXPORT CUresult cuGraphDestroy(CUgraph g) {
  int slot = busy_enter(g, "cuGraphDestroy");
  CUresult r = cuGraphDestroy_impl(g);
  busy_exit(slot);
  return r;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* pe, CUgraph g, unsigned long long flags) {
  int slot = busy_enter(g, "cuGraphInstantiateWithFlags");
  CUresult r = cuGraphInstantiateWithFlags_impl(pe, g, flags);
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
  CUresult r = cuGraphExecDestroy_impl(e);
  busy_exit(slot);
  return r;
}

/* Older exported names of the same entry points (the driver_api! table lists them as fallbacks).
 * Left out when checking against cuda.h, whose macros turn these names into the _v2 ones. */
#ifndef STANDIN_WITH_CUDA_H
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) __attribute__((alias("cuDevicePrimaryCtxRelease_v2")));
EXPORT CUresult cuStreamDestroy(CUstream h) __attribute__((alias("cuStreamDestroy_v2")));
EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) __attribute__((alias("cuEventElapsedTime_v2")));
EXPORT CUresult cuEventDestroy(CUevent e) __attribute__((alias("cuEventDestroy_v2")));
#endif

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

EXPORT void standin_reset(void) {
  pthread_mutex_lock(&g_knob_mu);
  memset(g_knobs, 0, sizeof g_knobs);
  pthread_mutex_unlock(&g_knob_mu);
  lock();
  g_violations = g_nodes_recorded = g_invalidated = g_legacy_ops = g_refused_unsafe = g_refused_frees = g_kernels_run =
      g_graph_launches = 0;
  g_violations_printed = 0;
  g_last_violation[0] = '\0';
  g_last_invalidation[0] = '\0';
  g_last_recorded[0] = '\0';
  pthread_mutex_unlock(&g_mu);
}

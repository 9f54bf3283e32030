/*
 * standin.h — the stand-in CUDA driver's private header: what its source files (cuda_standin.c,
 * which describes the stand-in, and standin_*.c) share. They are compiled together into one
 * library; every name declared here is hidden (only the cu* entry points and the standin_* control
 * API are exported).
 */
#ifndef STANDIN_H
#define STANDIN_H

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

/* The CUresult codes the stand-in returns or names: X(code, value, cuGetErrorString's text). Without
 * cuda.h they define CUresult; with it, standin_devices.c checks their values against it. */
#define CU_RESULTS(X)                                                                                                        \
  X(CUDA_SUCCESS, 0, "no error")                                                                                             \
  X(CUDA_ERROR_INVALID_VALUE, 1, "invalid argument")                                                                         \
  X(CUDA_ERROR_OUT_OF_MEMORY, 2, "out of memory")                                                                            \
  X(CUDA_ERROR_NOT_INITIALIZED, 3, "initialization error")                                                                   \
  X(CUDA_ERROR_DEINITIALIZED, 4, "driver shutting down")                                                                     \
  X(CUDA_ERROR_NO_DEVICE, 100, "no CUDA-capable device is detected")                                                         \
  X(CUDA_ERROR_INVALID_DEVICE, 101, "invalid device ordinal")                                                                \
  X(CUDA_ERROR_INVALID_IMAGE, 200, "device kernel image is invalid")                                                         \
  X(CUDA_ERROR_INVALID_CONTEXT, 201, "invalid device context")                                                               \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209, "no kernel image is available for execution on the device")                           \
  X(CUDA_ERROR_INVALID_HANDLE, 400, "invalid resource handle")                                                               \
  X(CUDA_ERROR_ILLEGAL_STATE, 401, "the operation cannot be performed in the present state")                                 \
  X(CUDA_ERROR_NOT_FOUND, 500, "named symbol not found")                                                                     \
  X(CUDA_ERROR_NOT_READY, 600, "device not ready")                                                                           \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, 700, "an illegal memory access was encountered")                                             \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701, "too many resources requested for launch")                                      \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709, "context is destroyed")                                                            \
  X(CUDA_ERROR_MISALIGNED_ADDRESS, 716, "misaligned address")                                                                \
  X(CUDA_ERROR_LAUNCH_FAILED, 719, "unspecified launch failure")                                                             \
  X(CUDA_ERROR_NOT_PERMITTED, 800, "operation not permitted")                                                                \
  X(CUDA_ERROR_NOT_SUPPORTED, 801, "operation not supported")                                                                \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900, "operation not permitted when stream is capturing")                          \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901, "operation failed due to a previous error during capture")                   \
  X(CUDA_ERROR_STREAM_CAPTURE_MERGE, 902, "operation would result in a merge of separate capture sequences")                 \
  X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903, "capture was not ended in the same stream as it began")                        \
  X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904, "capturing stream has unjoined work")                                           \
  X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 905, "dependency created on uncaptured work in another stream")                     \
  X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906, "operation would make the legacy stream depend on a capturing blocking stream") \
  X(CUDA_ERROR_CAPTURED_EVENT, 907, "operation not permitted on an event last recorded in a capturing stream")               \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908, "attempt to terminate a thread-local capture sequence from another thread") \
  X(CUDA_ERROR_INVALID_CLUSTER_SIZE, 912, "invalid cluster size")                                                            \
  X(CUDA_ERROR_UNKNOWN, 999, "unknown error")

#ifdef STANDIN_WITH_CUDA_H
#include <cuda.h>
#else
/* The subset of cuda.h (CUDA 13.0) the stand-in needs: same names, values and layouts. */
#define AS_RESULT_ENUM(code, value, text) code = value,
typedef enum cudaError_enum { CU_RESULTS(AS_RESULT_ENUM) } CUresult;
#undef AS_RESULT_ENUM
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

#pragma GCC visibility push(hidden)

/* ---- entry points, fail/delay knobs, call counts ---- */

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
  X(cuGraphNodeGetType) X(cuPointerGetAttribute) X(cuStreamGetCtx)

#define AS_ENUM(n) E_##n,
enum entry { ENTRIES(AS_ENUM) E_COUNT };

typedef struct {
  long calls;
  long fail_at;    /* the call number (1-based) at which failures start; 0: none */
  long fail_times; /* how many consecutive calls fail; < 0: all */
  CUresult fail_result;
  int delay_us;
} knob_t;

/* The first statement of entry point `name`: counts the call, sleeps if asked (outside every lock)
 * and returns an injected failure. */
#define ENTER(name)                                   \
  do {                                                \
    CUresult injected_ = knob_enter(E_##name);        \
    if (injected_ != CUDA_SUCCESS) return injected_;  \
  } while (0)

/* ---- objects ---- */

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

#define MAX_JOINED 8
typedef struct capture {
  CUstreamCaptureMode mode;
  pthread_t thread;
  int invalidated;
  struct CUgraph_st* graph;
  struct CUstream_st* stream; /* the origin stream */
  uint64_t id;                /* unique (the graph's family number) */
  /* Streams that joined the capture by waiting on an event recorded in it (CUDA's fork), and
   * whether the origin has since waited on an event recorded on each (the join). Ending the
   * capture with one not joined back fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED. */
  struct CUstream_st* joined[MAX_JOINED];
  int rejoined[MAX_JOINED];
  int njoined;
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
  uint64_t cap_id;                 /* the capture its last record was a node of; 0: recorded eagerly */
  struct CUstream_st* rec_stream;  /* the stream of that record */
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

/* A graph and every executable instantiated from it form a family: the real driver (580, seen
 * on an H200) crashes in cuGraphExecDestroy when it runs concurrently with cuGraphInstantiate of
 * the source graph or another destroy of the family, so the stand-in treats the family as one
 * object that must not be used by two threads at once (busy_enter on `family_key`). */
struct CUgraph_st {
  struct CUgraphNode_st** nodes;
  size_t n, cap;
  uint64_t family; /* 0 for copies inside executables and child nodes */
};

struct CUgraphExec_st {
  struct CUgraph_st* g;
  uint64_t family; /* the source graph's */
};

/* The busy key of a family: odd, so it never equals an object's (aligned) address. */
static inline const void* family_key(uint64_t family) { return family ? (const void*)(uintptr_t)(family * 2 + 1) : NULL; }
extern uint64_t g_next_family; /* under the state lock */
/* The family of a graph or executable handle (0 for an invalid handle); takes the state lock. */
uint64_t graph_family(const void* graph_or_exec, int is_exec);

/* Where work issued to `h` goes. */
enum target { RUN_NOW, RECORD };
typedef struct {
  struct CUctx_st* ctx;
  struct CUstream_st* s; /* NULL for the legacy / per-thread streams */
} stream_ref;

/* ---- the shared state (defined in cuda_standin.c; g_mu guards it, g_knob_mu the knobs) ---- */
extern pthread_mutex_t g_knob_mu;
extern knob_t g_knobs[E_COUNT];

extern pthread_mutex_t g_mu;
extern int g_inited;
extern int g_ndev;
extern int g_cc[MAX_DEVICES][2];
extern struct CUctx_st g_ctx[MAX_DEVICES];
/* One non-primary context per device, as an engine's own (standin_engine_context): never retained
 * or released, valid from cuInit on. */
extern struct CUctx_st g_engine_ctx[MAX_DEVICES];
extern unsigned long long g_used[MAX_DEVICES];

extern alloc_t* g_allocs; /* sorted by base */
extern size_t g_nallocs, g_cap_allocs;

extern slot_t* g_objs; /* the set of live handles */
extern size_t g_obj_cap, g_obj_used; /* used: live + tombstones */
extern long g_live[K_TOMB];

extern capture_t* g_captures;

extern long g_violations, g_nodes_recorded, g_invalidated, g_legacy_ops, g_refused_unsafe, g_refused_frees,
    g_kernels_run, g_graph_launches;
extern char g_last_violation[512];
extern char g_last_invalidation[256];
extern char g_last_recorded[256];
extern long g_violations_printed;

extern __thread struct CUctx_st* t_current;
extern __thread CUstreamCaptureMode t_capture_mode;

/* ---- cuda_standin.c: knobs, the lock, violations, host memory ---- */
int entry_index(const char* name);
CUresult knob_enter(enum entry e);
void lock(void);
CUresult unlock_ret(CUresult r);
void violation(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void* xmalloc(size_t n);
void* xcalloc(size_t n, size_t s);

/* ---- standin_state.c: handles, allocations, contexts, captures, graph-object tracking ---- */
void obj_add(const void* p, int kind);
int obj_is(const void* p, int kind);
void obj_del(const void* p);
size_t alloc_upper(uintptr_t p);
alloc_t* alloc_containing(uintptr_t p);
int range_ok(uintptr_t p, unsigned long long n, struct CUctx_st* ctx, const char* what);
void quarantine_push(void* p, size_t size);
int ctx_valid(struct CUctx_st* c);
struct CUctx_st* current_ctx(void);
void invalidate(capture_t* c, const char* why);
int unsafe_call_refused(const char* call);
void capture_remove(capture_t* cap);
/* Streams joined to `cap` leave it (the capture is over); a joined stream going away leaves it. */
void capture_release_joined(capture_t* cap);
void capture_forget_joined(struct CUstream_st* s);
CUresult resolve_stream(CUstream h, stream_ref* out, enum target* t);
int busy_enter(const void* obj, const char* call);
/* The same for a graph family (its key is never reused, so no destroy releases it early). */
int busy_enter_family(uint64_t family, const char* call);
void busy_exit_family(int slot);
void busy_exit(int slot);
void busy_release_before_free(void);

/* ---- standin_exec.c: graphs, and running work on host memory ---- */
struct CUgraph_st* graph_new(void);
struct CUgraph_st* graph_copy(const struct CUgraph_st* g);
void graph_free(struct CUgraph_st* g, int registered);
void record(stream_ref* s, struct CUgraphNode_st* n, const char* call);
CUresult run_memset(struct CUctx_st* ctx, uintptr_t dst, unsigned value, unsigned elem, size_t count, const char* what);
CUresult run_copy(int kind, uintptr_t dst, uintptr_t src, void* host, size_t bytes, const char* what);
/* Page-locked host memory mode (standin_async_htod): host-to-device copies on a stream that is
 * not capturing return before reading the host bytes, as the real driver's do from pinned memory;
 * the copy runs at the next operation that orders after it (any stream work, a synchronize, an
 * event, a free). htod_defer queues one; htod_flush runs every queued copy, in order. Lock held. */
extern int g_async_htod;
void htod_defer(uintptr_t dst, const void* host, size_t bytes);
void htod_flush(void);
CUresult run_kernel(struct CUctx_st* ctx, int kernel, const launch_t* l);
CUresult run_graph(const struct CUgraph_st* g, struct CUctx_st* ctx);

/* After lock(), in the entry points that need cuInit first. */
#define NEED_INIT()                                             \
  do {                                                          \
    if (!g_inited) return unlock_ret(CUDA_ERROR_NOT_INITIALIZED); \
  } while (0)

#pragma GCC visibility pop

#endif /* STANDIN_H */

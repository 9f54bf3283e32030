// A C++ engine with a CUDA runtime of its own (another version than the one libgraphsafe.a
// bundles) linking graphsafe beside it: each keeps its own runtime.
//
// libgraphsafe.a carries the CUDA 13 runtime its kernels call, with every runtime symbol local
// (build/kernels.rs, `prelink`), so the engine's cudaXxx calls bind to the engine's libcudart and
// graphsafe's kernels to graphsafe's copy, whichever comes first on the link line (.ci/run links
// this program both ways).
//
// Without a GPU (CI): the engine's runtime answers as itself (cudaRuntimeGetVersion gives its own
// version, passed as the first argument, and the function lives in its libcudart.so), and
// graphsafe's planners answer exactly. With a GPU (the H200; GRAPHSAFE_REQUIRE_GPU=1 makes a
// missing one a failure): one decode step of the engine's own kernel (PTX it loads through its
// runtime) followed by a graphsafe MLA decode of what that kernel wrote, once graph-free and once
// captured (the engine's kernel in the engine's own CUDA graph, the decode in graphsafe's), the
// workspace grown after the capture, and 100 replays of the captured step compared bit for bit
// with the graph-free one.
//
// Build (the CUDA 12 runtime from PyPI's nvidia-cuda-runtime-cu12 wheel, as .ci/run does):
//   g++ -std=c++17 -Iinclude tests/capi/engine_runtime.cpp target/debug/libgraphsafe.a
//       $CU12/lib/libcudart.so.12 -Wl,-rpath,$CU12/lib -lstdc++ -ldl -lrt -lpthread -lm -o engine_runtime
// Run: engine_runtime 12080
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graphsafe.h"

// The part of the CUDA runtime API this engine calls, declared as cuda_runtime_api.h (CUDA 12.0 or
// newer) declares it: the wheel that brings the runtime ships that header without the crt/ headers
// it includes, and these C functions are the same in every 12.x and 13.x runtime.
extern "C" {
typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
typedef struct CUlib_st* cudaLibrary_t;
typedef struct CUkern_st* cudaKernel_t;
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeThreadLocal = 1 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76 };
enum cudaJitOption : int;
enum cudaLibraryOption : int;
const unsigned cudaStreamNonBlocking = 1;
const char* cudaGetErrorName(cudaError_t);
cudaError_t cudaRuntimeGetVersion(int*);
cudaError_t cudaGetDeviceCount(int*);
cudaError_t cudaSetDevice(int);
cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int);
cudaError_t cudaMalloc(void**, size_t);
cudaError_t cudaFree(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind);
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t*, unsigned);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t*);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, unsigned long long);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t);
cudaError_t cudaGraphDestroy(cudaGraph_t);
cudaError_t cudaLibraryLoadData(cudaLibrary_t*, const void*, cudaJitOption*, void**, unsigned, cudaLibraryOption*, void**, unsigned);
cudaError_t cudaLibraryGetKernel(cudaKernel_t*, cudaLibrary_t, const char*);
cudaError_t cudaLibraryUnload(cudaLibrary_t);
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t);
}

static int g_checks = 0, g_failures = 0;

#define CHECK(cond)                                                                                  \
  do {                                                                                               \
    ++g_checks;                                                                                      \
    if (!(cond)) {                                                                                   \
      ++g_failures;                                                                                  \
      std::fprintf(stderr, "FAILED %s:%d: %s (graphsafe: %s)\n", __FILE__, __LINE__, #cond,         \
                   graphsafe_last_error());                                                          \
    }                                                                                                \
  } while (0)

#define CUDA_OK(call)                                                                                \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    ++g_checks;                                                                                      \
    if (e_ != cudaSuccess) {                                                                         \
      ++g_failures;                                                                                  \
      std::fprintf(stderr, "FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
    }                                                                                                \
  } while (0)

#define GS_OK(call) CHECK((call) == GRAPHSAFE_OK)

// The engine's own kernel, in PTX its runtime hands to the driver: out[i] = bf16(h(i, seed)) with
// h = ((i * 0x9E3779B1 + seed) >> 16) * 2^-15 - 1, values in [-1, 1).
static const char* kEnginePtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry engine_fill_bf16(.param .u64 out, .param .u32 n, .param .u32 seed)
{
  .reg .pred p;
  .reg .b32 r<8>;
  .reg .b64 rd<4>;
  .reg .f32 f<3>;
  .reg .b16 h;
  mov.u32 r1, %ctaid.x;
  mov.u32 r2, %ntid.x;
  mov.u32 r3, %tid.x;
  mad.lo.u32 r4, r1, r2, r3;
  ld.param.u32 r5, [n];
  setp.ge.u32 p, r4, r5;
  @p bra DONE;
  ld.param.u32 r6, [seed];
  mad.lo.u32 r7, r4, -1640531535, r6;
  shr.u32 r7, r7, 16;
  cvt.rn.f32.u32 f1, r7;
  fma.rn.f32 f2, f1, 0f38000000, 0fBF800000;
  cvt.rn.bf16.f32 h, f2;
  ld.param.u64 rd1, [out];
  cvta.to.global.u64 rd1, rd1;
  mul.wide.u32 rd2, r4, 2;
  add.s64 rd3, rd1, rd2;
  st.global.b16 [rd3], h;
DONE:
  ret;
}
)";

// The host's bits of the kernel's value i (round to nearest even, as cvt.rn.bf16.f32).
static uint16_t engine_value(uint32_t i, uint32_t seed) {
  uint32_t h = (i * 0x9E3779B1u + seed) >> 16;
  float f = static_cast<float>(h) * (1.0f / 32768.0f) - 1.0f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Host-only: the engine's runtime is its own, and graphsafe's planners answer as documented.
static void runtime_and_planners(int expected_runtime) {
  int v = 0;
  CUDA_OK(cudaRuntimeGetVersion(&v));
  std::printf("the engine's CUDA runtime: %d (expected %d)\n", v, expected_runtime);
  CHECK(v == expected_runtime);
  // The function the engine called is its libcudart.so's, not a copy inside libgraphsafe.a.
  Dl_info info{};
  CHECK(dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) != 0 && info.dli_fname != nullptr &&
        std::strstr(info.dli_fname, "libcudart.so") != nullptr);
  std::printf("cudaRuntimeGetVersion lives in %s\n", info.dli_fname ? info.dli_fname : "?");

  GraphsafeMlaPlan p{};
  // CUTLASS's part (2052 * 128 * 16) and the sanitize region: lengths 256 + kernel lengths 256 +
  // page table 4 * 1024 + LSE scratch 512 (tests/capi/capi_test.cpp has the rest of the rules).
  GS_OK(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 1, 65536, 64, 148, 0, &p));
  CHECK(p.num_splits == 16 && p.workspace_bytes == 2052ull * 128 * 16 + 256 + 256 + 4 * 1024 + 512);
  GS_OK(graphsafe_mla_plan(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, 16, 1, 4096, 64, 132, 0, &p));
  CHECK(p.num_splits == 64);
  uint64_t scale_bytes = 0;
  GS_OK(graphsafe_nvfp4_scale_bytes(128, 512, &scale_bytes));
  CHECK(scale_bytes == 128 * 512 / 16);
  std::printf("graphsafe %s: planners answer (sm_100 batch 1 x 65536: %d splits)\n", graphsafe_version(), 16);
}

static void fill(cudaKernel_t k, void* out, int n, uint32_t seed, cudaStream_t s) {
  unsigned un = static_cast<unsigned>(n);
  void* args[] = {&out, &un, &seed};
  CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3((un + 255) / 256), dim3(256), args, 0, s));
}

// One decode step on the GPU: the engine's kernel writes the queries, graphsafe's MLA decode reads
// them; graph-free, then captured (two graphs, one each) and replayed after the workspace grew.
static bool gpu_step(bool require_gpu) {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  int gs_count = 0;
  int gs = graphsafe_device_count(&gs_count);
  if (e != cudaSuccess || devices == 0) {
    std::printf("no GPU for the engine's runtime (%s); graphsafe: %s\n", cudaGetErrorName(e),
                gs == GRAPHSAFE_OK ? "a device" : graphsafe_last_error());
    CHECK(gs != GRAPHSAFE_OK || gs_count == 0);  // one driver: graphsafe sees none either
    if (require_gpu) std::fprintf(stderr, "FAILED: GRAPHSAFE_REQUIRE_GPU=1 and no GPU\n");
    return !require_gpu;
  }
  CHECK(gs == GRAPHSAFE_OK && gs_count == devices);
  int major = 0, minor = 0, sms = 0;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (major != 9 || minor != 0) {
    std::printf("SKIP: the sm_90 MLA kernel needs an H100/H200; device 0 is sm_%d%d\n", major, minor);
    return !require_gpu;
  }
  CUDA_OK(cudaFree(nullptr));  // the runtime's primary context, which graphsafe retains too

  // The engine's kernel, through its runtime.
  cudaLibrary_t lib{};
  cudaKernel_t kfill{};
  CUDA_OK(cudaLibraryLoadData(&lib, kEnginePtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUDA_OK(cudaLibraryGetKernel(&kfill, lib, "engine_fill_bf16"));
  cudaStream_t s{};
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  GraphsafeContext ctx{};
  GraphsafeStream gstream{};
  GS_OK(graphsafe_context_create(0, &ctx));
  GS_OK(graphsafe_stream_adopt(ctx, reinterpret_cast<void*>(s), &gstream));

  // DeepSeek-V3 MLA shapes: 128 heads, 512 + 64; two requests over a paged bf16 cache.
  const int batch = 2, heads = 128, page = 64, max_seq = 2048, max_pages = max_seq / page;
  const int pages = batch * max_pages;
  const int nq = batch * heads * 512, npe = batch * heads * 64, nkv = pages * page * 576, nout = batch * heads * 512;
  void *q_nope, *q_pe, *kv, *seq_lens, *page_table, *out;
  CUDA_OK(cudaMalloc(&q_nope, nq * 2));
  CUDA_OK(cudaMalloc(&q_pe, npe * 2));
  CUDA_OK(cudaMalloc(&kv, size_t(nkv) * 2));
  CUDA_OK(cudaMalloc(&seq_lens, batch * 4));
  CUDA_OK(cudaMalloc(&page_table, pages * 4));
  CUDA_OK(cudaMalloc(&out, nout * 2));
  std::vector<int> lens = {2048, 700}, table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 7 + 3) % pages;
  CUDA_OK(cudaMemcpy(seq_lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(page_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
  fill(kfill, kv, nkv, 3, s);

  GraphsafeMlaPlan worst{};
  GS_OK(graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, heads, batch, max_seq, page,
                                 sms, &worst));
  GraphsafeWorkspace ws{};
  GS_OK(graphsafe_workspace_create(gstream, worst.workspace_bytes, &ws));

  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = batch;
  a.num_heads = heads;
  a.q_nope = reinterpret_cast<uint64_t>(q_nope);
  a.q_nope_stride_batch = heads * 512;
  a.q_nope_stride_head = 512;
  a.q_pe = reinterpret_cast<uint64_t>(q_pe);
  a.q_pe_stride_batch = heads * 64;
  a.q_pe_stride_head = 64;
  a.kv_cache = reinterpret_cast<uint64_t>(kv);
  a.num_pages = pages;
  a.page_size = page;
  a.seq_lens = reinterpret_cast<uint64_t>(seq_lens);
  a.page_table = reinterpret_cast<uint64_t>(page_table);
  a.max_pages = max_pages;
  a.out = reinterpret_cast<uint64_t>(out);
  a.out_stride_batch = heads * 512;
  a.out_stride_head = 512;
  a.sm_scale = 0.0416666f;  // 1 / sqrt(576)
  a.max_seq_len = max_seq;

  // 1. Graph-free: the engine's kernel, then graphsafe's decode, on one stream.
  const uint32_t seed = 11;
  fill(kfill, q_nope, nq, seed, s);
  fill(kfill, q_pe, npe, seed + 1, s);
  GS_OK(graphsafe_mla_decode(&a, ws, gstream, nullptr));
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<uint16_t> q_host(nq), eager(nout), replay(nout);
  CUDA_OK(cudaMemcpy(q_host.data(), q_nope, nq * 2, cudaMemcpyDeviceToHost));
  int q_wrong = 0;
  for (int i = 0; i < nq; ++i) q_wrong += q_host[i] != engine_value(i, seed);
  CHECK(q_wrong == 0);
  CUDA_OK(cudaMemcpy(eager.data(), out, nout * 2, cudaMemcpyDeviceToHost));
  int nonzero = 0;
  for (uint16_t b : eager) nonzero += (b & 0x7fff) != 0;
  CHECK(nonzero > nout / 2);
  std::printf("graph-free step: the engine's kernel wrote %d queries (%d wrong), graphsafe's decode %d outputs\n", nq, q_wrong, nout);

  // 2. Captured: the engine's kernel in its own graph (its runtime), the decode in graphsafe's.
  cudaGraph_t eg{};
  cudaGraphExec_t eexec{};
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  fill(kfill, q_nope, nq, seed, s);
  fill(kfill, q_pe, npe, seed + 1, s);
  CUDA_OK(cudaStreamEndCapture(s, &eg));
  CUDA_OK(cudaGraphInstantiate(&eexec, eg, 0));
  GraphsafeCapture cap{};
  GraphsafeGraph graph{};
  GraphsafeGraphExec exec{};
  GS_OK(graphsafe_capture_begin(gstream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
  GS_OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
  GS_OK(graphsafe_mla_decode_captured(&a, cap, ws, nullptr));
  GS_OK(graphsafe_capture_end(cap, &graph));
  GS_OK(graphsafe_graph_instantiate(graph, &exec));
  // The workspace grows after the capture: the graph keeps the buffer it baked in.
  int grew = 0;
  GS_OK(graphsafe_workspace_ensure_size(ws, worst.workspace_bytes * 4 + (64u << 20), gstream, &grew));
  CHECK(grew == 1);

  int differing = 0;
  const int replays = 100;
  for (int r = 0; r < replays; ++r) {
    // Stale inputs and outputs: only the replayed step can make them right again.
    CUDA_OK(cudaMemsetAsync(q_nope, 0xff, nq * 2, s));
    CUDA_OK(cudaMemsetAsync(out, 0, nout * 2, s));
    CUDA_OK(cudaGraphLaunch(eexec, s));
    GS_OK(graphsafe_graph_exec_launch(exec, gstream));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(replay.data(), out, nout * 2, cudaMemcpyDeviceToHost));
    differing += std::memcmp(replay.data(), eager.data(), nout * 2) != 0;
  }
  CHECK(differing == 0);
  std::printf("captured step: %d replays after the workspace grew, %d differing from the graph-free step\n", replays, differing);

  GS_OK(graphsafe_graph_exec_destroy(exec));
  GS_OK(graphsafe_graph_destroy(graph));
  CUDA_OK(cudaGraphExecDestroy(eexec));
  CUDA_OK(cudaGraphDestroy(eg));
  GS_OK(graphsafe_workspace_destroy(ws));
  GS_OK(graphsafe_stream_destroy(gstream));
  GS_OK(graphsafe_context_destroy(ctx));
  for (void* p : {q_nope, q_pe, kv, seq_lens, page_table, out}) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaLibraryUnload(lib));
  return true;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s EXPECTED_CUDART_VERSION (e.g. 12080)\n", argv[0]);
    return 2;
  }
  const char* req = std::getenv("GRAPHSAFE_REQUIRE_GPU");
  runtime_and_planners(std::atoi(argv[1]));
  if (!gpu_step(req != nullptr && std::strcmp(req, "1") == 0)) ++g_failures;
  std::printf("engine_runtime: %d passed, %d failed\n", g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}

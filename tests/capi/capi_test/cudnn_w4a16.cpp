// cuDNN's GEMM and the W4A16 NVFP4 GEMM through the C ABI, captured and replayed against eager.
#include "check.h"

void cudnn_and_w4a16(GraphsafeContext ctx, GraphsafeStream stream, const GraphsafeDeviceInfo& info) {
  const int M = 16, N = 256, K = 512;
  std::vector<uint16_t> a(size_t(M) * K), b(size_t(K) * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(float((i * 104729) % 997) / 498.f - 1.f);
  GraphsafeBuffer ba = upload(stream, a.data(), a.size() * 2), bb = upload(stream, b.data(), b.size() * 2);
  GraphsafeBuffer bc{};
  OK(graphsafe_buffer_create(stream, size_t(M) * N * 2, 1, &bc));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, 0, &ws));

  int ma = 0, mi = 0, pa = 0;
  if (graphsafe_cudnn_version(&ma, &mi, &pa) == GRAPHSAFE_OK) {
    GraphsafeCudnnMatmulArgs m{};
    m.input_dtype = GRAPHSAFE_DTYPE_BF16;
    m.output_dtype = GRAPHSAFE_DTYPE_BF16;
    m.batch = 1, m.m = M, m.n = N, m.k = K;
    m.a = addr(ba), m.a_batch = 1, m.a_strides[0] = int64_t(M) * K, m.a_strides[1] = K, m.a_strides[2] = 1;
    m.b = addr(bb), m.b_batch = 1, m.b_strides[0] = int64_t(K) * N, m.b_strides[1] = N, m.b_strides[2] = 1;
    m.c = addr(bc), m.c_strides[0] = int64_t(M) * N, m.c_strides[1] = N, m.c_strides[2] = 1;
    uint64_t need = 0;
    OK(graphsafe_cudnn_plan(ctx, &m, &need));
    OK(graphsafe_workspace_ensure_size(ws, need, stream, nullptr));
    capture_and_compare(stream, ws, bc, size_t(M) * N * 2, "cuDNN matmul",
                        [&] { return graphsafe_cudnn_matmul(ctx, &m, ws, stream); },
                        [&](GraphsafeCapture cap) { return graphsafe_cudnn_matmul_captured(ctx, &m, cap, ws); });
  } else {
    std::printf("SKIP: cuDNN part (%s)\n", graphsafe_last_error());
  }

  if (info.cc_major == 9) {
    // Quantize a [N, K] weight on the GPU, prepare it, run the W4A16 GEMM D[M, N] = A · Wᵀ.
    std::vector<uint16_t> w(size_t(N) * K);
    for (size_t i = 0; i < w.size(); ++i) w[i] = to_bf16(float((i * 31) % 211) / 105.f - 1.f);
    GraphsafeBuffer bw = upload(stream, w.data(), w.size() * 2);
    const float gs = 1.0f;
    GraphsafeBuffer bgs = upload(stream, &gs, 4), balpha = upload(stream, &gs, 4);
    uint64_t sb = 0;
    OK(graphsafe_nvfp4_scale_bytes(N, K, &sb));
    GraphsafeBuffer bp{}, bs{};
    OK(graphsafe_buffer_create(stream, size_t(N) * K / 2, 0, &bp));
    OK(graphsafe_buffer_create(stream, sb, 0, &bs));
    GraphsafeNvfp4Matrix q{addr(bp), addr(bs), addr(bgs), N, K};
    OK(graphsafe_nvfp4_quantize(addr(bw), GRAPHSAFE_DTYPE_BF16, N, K, K, &q, stream));
    GraphsafeBuffer prepared{};
    OK(graphsafe_nvfp4_prepare_weight(&q, stream, &prepared));
    GraphsafeW4a16Args g{addr(ba), K, prepared, N, K, addr(balpha), addr(bc), N, M};
    GraphsafeNvfp4Plan plan{};
    OK(graphsafe_nvfp4_plan(GRAPHSAFE_ARCH_SM90, M, N, K, GRAPHSAFE_DTYPE_BF16, info.sm_count, &plan));
    OK(graphsafe_workspace_ensure_size(ws, plan.workspace_bytes, stream, nullptr));
    capture_and_compare(stream, ws, bc, size_t(M) * N * 2, "NVFP4 W4A16 GEMM",
                        [&] { return graphsafe_nvfp4_w4a16_gemm(&g, ws, stream); },
                        [&](GraphsafeCapture cap) {
                          int s = graphsafe_capture_bind_buffer(cap, prepared, nullptr);
                          return s != GRAPHSAFE_OK ? s : graphsafe_nvfp4_w4a16_gemm_captured(&g, cap, ws);
                        });
    {
      // A captured op keeps what it bakes in alive by itself: the prepared weight is a graphsafe
      // buffer the capture never binds explicitly, destroyed right after the capture, its memory
      // churned; the replays still read the weight (before: a use-after-free).
      GraphsafeBuffer own{};
      OK(graphsafe_nvfp4_prepare_weight(&q, stream, &own));
      uint64_t own_bytes = 0;
      OK(graphsafe_buffer_info(own, nullptr, &own_bytes));
      GraphsafeW4a16Args g2 = g;
      g2.weight = own;
      const size_t out_bytes = size_t(M) * N * 2;
      std::vector<unsigned char> want(out_bytes), got(out_bytes), zeros(out_bytes, 0);
      OK(graphsafe_nvfp4_w4a16_gemm(&g2, ws, stream));
      OK(graphsafe_buffer_read(bc, 0, want.data(), out_bytes, stream));
      GraphsafeCapture cap{};
      OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
      OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
      OK(graphsafe_nvfp4_w4a16_gemm_captured(&g2, cap, ws));
      GraphsafeGraph gr{};
      OK(graphsafe_capture_end(cap, &gr));
      GraphsafeGraphExec ex{};
      OK(graphsafe_graph_instantiate(gr, &ex));
      OK(graphsafe_graph_destroy(gr));
      OK(graphsafe_buffer_destroy(own));
      std::vector<GraphsafeBuffer> churn;
      std::vector<unsigned char> junk(own_bytes, 0x7f);
      for (int i = 0; i < 8; ++i) churn.push_back(upload(stream, junk.data(), junk.size()));
      int same = 0;
      for (int i = 0; i < 10; ++i) {
        OK(graphsafe_buffer_write(bc, 0, zeros.data(), out_bytes, stream));
        OK(graphsafe_graph_exec_launch(ex, stream));
        OK(graphsafe_buffer_read(bc, 0, got.data(), out_bytes, stream));
        same += got == want;
      }
      CHECK(same == 10);
      std::printf("W4A16 weight kept by the graph it was never bound to: %d/10 replays identical after destroy + churn\n", same);
      OK(graphsafe_graph_exec_destroy(ex));
      for (GraphsafeBuffer x : churn) OK(graphsafe_buffer_destroy(x));
    }
    // The Blackwell GEMM is refused here by name.
    GraphsafeNvfp4GemmArgs bg{q, q, addr(balpha), addr(bc), GRAPHSAFE_DTYPE_BF16};
    CHECK_STATUS(graphsafe_nvfp4_gemm(&bg, ws, stream), GRAPHSAFE_ERROR_ARCH_UNSUPPORTED);
    for (GraphsafeBuffer x : {bw, bgs, balpha, bp, bs, prepared}) OK(graphsafe_buffer_destroy(x));
  }
  for (GraphsafeBuffer x : {ba, bb, bc}) OK(graphsafe_buffer_destroy(x));
  OK(graphsafe_workspace_destroy(ws));
}

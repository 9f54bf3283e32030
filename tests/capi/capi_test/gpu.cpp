// The C ABI on a GPU: an MLA decode captured, the workspace grown past it afterwards, replays against
// eager, double destroys and BUSY rules; then the fp8 KV caches (sm_90) and cuDNN / W4A16.
#include "check.h"

void gpu(int device_count) {
  GraphsafeContext ctx{};
  OK(graphsafe_context_create(0, &ctx));
  GraphsafeDeviceInfo info{};
  OK(graphsafe_device_info(0, &info));
  std::printf("GPU 0: %s, sm_%d%d, %d SMs (%d device(s))\n", info.name, info.cc_major, info.cc_minor, info.sm_count, device_count);
  GraphsafeStream stream{};
  OK(graphsafe_stream_create(ctx, &stream));

  const int B = 4, H = 128, PAGE = 64, MAX_SEQ = 1024, MAX_PAGES = MAX_SEQ / PAGE, PAGES = B * MAX_PAGES;
  const int seq_lens[B] = {1024, 1, 333, 700};
  std::vector<uint16_t> q(size_t(B) * H * 576), kv(size_t(PAGES) * PAGE * 576);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = to_bf16(float((i * 104729) % 997) / 498.f - 1.f);
  std::vector<int> pt(size_t(B) * MAX_PAGES);
  for (int i = 0; i < B * MAX_PAGES; ++i) pt[i] = (i % MAX_PAGES) * B + i / MAX_PAGES;  // interleaved pages

  GraphsafeBuffer bq{}, bkv{}, bsl{}, bpt{}, bout{};
  OK(graphsafe_buffer_create(stream, q.size() * 2, 0, &bq));
  OK(graphsafe_buffer_create(stream, kv.size() * 2, 0, &bkv));
  OK(graphsafe_buffer_create(stream, sizeof seq_lens, 0, &bsl));
  OK(graphsafe_buffer_create(stream, pt.size() * 4, 0, &bpt));
  OK(graphsafe_buffer_create(stream, size_t(B) * H * 512 * 2, 1, &bout));
  OK(graphsafe_buffer_write(bq, 0, q.data(), q.size() * 2, stream));
  OK(graphsafe_buffer_write(bkv, 0, kv.data(), kv.size() * 2, stream));
  OK(graphsafe_buffer_write(bsl, 0, seq_lens, sizeof seq_lens, stream));
  OK(graphsafe_buffer_write(bpt, 0, pt.data(), pt.size() * 4, stream));
  CHECK_STATUS(graphsafe_buffer_write(bq, 8, q.data(), q.size() * 2, stream), GRAPHSAFE_ERROR_INVALID_ARGUMENT);  // past the end

  uint64_t pq, pkv, psl, ppt, pout;
  OK(graphsafe_buffer_info(bq, &pq, nullptr));
  OK(graphsafe_buffer_info(bkv, &pkv, nullptr));
  OK(graphsafe_buffer_info(bsl, &psl, nullptr));
  OK(graphsafe_buffer_info(bpt, &ppt, nullptr));
  OK(graphsafe_buffer_info(bout, &pout, nullptr));
  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = B;
  a.num_heads = H;
  a.q_nope = pq;
  a.q_nope_stride_batch = H * 576;
  a.q_nope_stride_head = 576;
  a.q_pe = pq + 1024;  // rope part of each 576-wide q row
  a.q_pe_stride_batch = H * 576;
  a.q_pe_stride_head = 576;
  a.kv_cache = pkv;
  a.num_pages = PAGES;
  a.page_size = PAGE;
  a.seq_lens = psl;
  a.page_table = ppt;
  a.max_pages = MAX_PAGES;
  a.out = pout;
  a.out_stride_batch = H * 512;
  a.out_stride_head = 512;
  a.sm_scale = 1.f / std::sqrt(192.f);
  a.max_seq_len = MAX_SEQ;
  a.num_splits = 0;

  int arch = info.cc_major == 10 ? GRAPHSAFE_ARCH_SM100 : GRAPHSAFE_ARCH_SM90;
  GraphsafeMlaPlan plan{};
  OK(graphsafe_mla_plan(arch, GRAPHSAFE_DTYPE_BF16, H, B, MAX_SEQ, a.page_size, info.sm_count, 0, &plan));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, plan.workspace_bytes, &ws));

  // Eager reference result.
  GraphsafeMlaPlan ran{};
  int st = graphsafe_mla_decode(&a, ws, stream, &ran);
  if (st == GRAPHSAFE_ERROR_ARCH_UNSUPPORTED) {
    std::printf("SKIP: MLA decode has no kernel here (%s)\n", graphsafe_last_error());
    return;
  }
  CHECK_STATUS(st, GRAPHSAFE_OK);
  CHECK(ran.num_splits == plan.num_splits && ran.workspace_bytes == plan.workspace_bytes);
  std::vector<uint16_t> eager(size_t(B) * H * 512), got(eager.size());
  OK(graphsafe_buffer_read(bout, 0, eager.data(), eager.size() * 2, stream));
  size_t nonzero = 0;
  for (uint16_t v : eager) nonzero += v != 0;
  CHECK(nonzero > eager.size() / 2);

  // Capture through the C ABI.
  GraphsafeCapture cap{};
  OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
  CHECK_STATUS(graphsafe_stream_synchronize(stream), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_stream_destroy(stream), GRAPHSAFE_ERROR_BUSY);
  GraphsafeCapture cap2{};
  CHECK_STATUS(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap2), GRAPHSAFE_ERROR_BUSY);
  uint64_t wptr = 0, wcap = 0;
  OK(graphsafe_capture_bind_workspace(cap, ws, &wptr, &wcap));
  CHECK(wcap >= plan.workspace_bytes);
  for (GraphsafeBuffer b : {bq, bkv, bsl, bpt, bout}) OK(graphsafe_capture_bind_buffer(cap, b, nullptr));
  // The bound workspace can neither grow nor be destroyed; eager work on the stream is refused.
  CHECK_STATUS(graphsafe_workspace_ensure_size(ws, wcap * 4 + (1 << 20), stream, nullptr), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_workspace_destroy(ws), GRAPHSAFE_ERROR_BUSY);
  CHECK_STATUS(graphsafe_mla_decode(&a, ws, stream, nullptr), GRAPHSAFE_ERROR_BUSY);
  OK(graphsafe_mla_decode_captured(&a, cap, ws, nullptr));
  GraphsafeGraph graph{};
  OK(graphsafe_capture_end(cap, &graph));
  CHECK_STATUS(graphsafe_capture_end(cap, &graph), GRAPHSAFE_ERROR_INVALID_HANDLE);  // consumed
  uint64_t nodes = 0;
  OK(graphsafe_graph_node_count(graph, &nodes));
  CHECK(nodes >= 1);
  GraphsafeGraphExec exec{};
  OK(graphsafe_graph_instantiate(graph, &exec));
  OK(graphsafe_graph_destroy(graph));
  CHECK_STATUS(graphsafe_graph_destroy(graph), GRAPHSAFE_ERROR_INVALID_HANDLE);  // double destroy

  // An output given only by its raw address (read with graphsafe_buffer_info), never bound: the
  // address lies in a graphsafe buffer, so the capture keeps that buffer alive like a bound one.
  // The caller then destroys its handle; no new buffer may get that memory while the executable
  // lives, and the replay writes into it, not into whoever would have been given it.
  {
    GraphsafeBuffer bout2{};
    OK(graphsafe_buffer_create(stream, eager.size() * 2, 1, &bout2));
    uint64_t pout2 = 0, n2 = 0;
    OK(graphsafe_buffer_info(bout2, &pout2, &n2));
    GraphsafeMlaDecodeArgs a2 = a;
    a2.out = pout2;
    GraphsafeCapture c2{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &c2));
    OK(graphsafe_capture_bind_workspace(c2, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_captured(&a2, c2, ws, nullptr));
    GraphsafeGraph g2{};
    OK(graphsafe_capture_end(c2, &g2));
    GraphsafeGraphExec e2{};
    OK(graphsafe_graph_instantiate(g2, &e2));
    OK(graphsafe_graph_destroy(g2));
    OK(graphsafe_buffer_destroy(bout2));
    std::vector<GraphsafeBuffer> fresh(8);
    int overlapping = 0;
    for (auto& f : fresh) {
      OK(graphsafe_buffer_create(stream, n2, 0, &f));
      uint64_t p = 0;
      OK(graphsafe_buffer_info(f, &p, nullptr));
      overlapping += p < pout2 + n2 && pout2 < p + n2;
    }
    CHECK(overlapping == 0);
    OK(graphsafe_graph_exec_launch(e2, stream));
    OK(graphsafe_stream_synchronize(stream));
    for (auto f : fresh) OK(graphsafe_buffer_destroy(f));
    OK(graphsafe_graph_exec_destroy(e2));
    std::printf("an unbound raw output address inside a graphsafe buffer: kept by the executable (%d of 8 new buffers overlap it)\n", overlapping);
  }

  // Grow (retire) the workspace and drop graphsafe's handles to the inputs: the executable keeps
  // both alive. Then replay.
  int grew = 0;
  OK(graphsafe_workspace_ensure_size(ws, wcap * 4 + (64 << 20), stream, &grew));
  CHECK(grew == 1);
  OK(graphsafe_buffer_destroy(bq));
  OK(graphsafe_buffer_destroy(bkv));
  CHECK_STATUS(graphsafe_buffer_destroy(bkv), GRAPHSAFE_ERROR_INVALID_HANDLE);
  GraphsafeBuffer churn{};
  OK(graphsafe_buffer_create(stream, kv.size() * 2, 0, &churn));  // likely reuses a freed block if any
  int same = 0;
  for (int i = 0; i < 20; ++i) {
    std::vector<uint16_t> zeros(got.size(), 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), zeros.size() * 2, stream));
    OK(graphsafe_graph_exec_launch(exec, stream));
    OK(graphsafe_buffer_read(bout, 0, got.data(), got.size() * 2, stream));
    same += got == eager;
  }
  CHECK(same == 20);
  std::printf("capture/grow/replay through the C ABI: %d/20 replays identical to eager (%d splits, %llu workspace bytes)\n", same,
              plan.num_splits, (unsigned long long)plan.workspace_bytes);

  OK(graphsafe_graph_exec_destroy(exec));
  CHECK_STATUS(graphsafe_graph_exec_destroy(exec), GRAPHSAFE_ERROR_INVALID_HANDLE);
  if (info.cc_major == 9) {
    for (int heads : {16, 32, 128}) fp8_kv_caches(stream, info, heads);
  }
  cudnn_and_w4a16(ctx, stream, info);
  OK(graphsafe_buffer_destroy(churn));
  for (GraphsafeBuffer b : {bsl, bpt, bout}) OK(graphsafe_buffer_destroy(b));
  OK(graphsafe_workspace_destroy(ws));
  OK(graphsafe_stream_destroy(stream));
  OK(graphsafe_context_destroy(ctx));
  CHECK_STATUS(graphsafe_context_destroy(ctx), GRAPHSAFE_ERROR_INVALID_HANDLE);
}

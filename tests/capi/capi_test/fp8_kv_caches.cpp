#include "check.h"

// The e4m3 code of `v`, which must be exactly representable (the values below are k/32 .. k/4).
static uint8_t e4m3_code(float v) {
  for (int c = 0; c < 256; ++c) {
    int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) continue;  // NaN
    float mag = e == 0 ? m / 8.f * std::ldexp(1.f, -6) : (1.f + m / 8.f) * std::ldexp(1.f, e - 7);
    if ((c & 0x80 ? -mag : mag) == v) return uint8_t(c);
  }
  std::fprintf(stderr, "FAILED: %g has no e4m3 code\n", v);
  ++g_failures;
  return 0;
}

// sm_90's fp8 KV caches through graphsafe_mla_decode_kv (H: 16, 32 (the N8 kernel) or 128 heads (the seesaw RS kernel
// per-tensor, the seesaw kernel 656-byte, as its native counterpart)): the same K/V values stored as bf16
// (native), as per-tensor fp8 with scale 0.5 and as DeepSeek V3.2 tokens with group scales
// 0.25..2, all exact, give outputs within bf16 rounding of one another; the per-tensor decode
// captured and replayed after the workspace grew equals eager, and a replay reads the scale when
// it runs (a new scale written between replays gives the eager result for that scale).
void fp8_kv_caches(GraphsafeStream stream, const GraphsafeDeviceInfo& info, int H) {
  const int B = 2, PAGE = 64, MAX_SEQ = 512, MAX_PAGES = MAX_SEQ / PAGE, PAGES = B * MAX_PAGES;
  const size_t TOKENS = size_t(PAGES) * PAGE;
  const int seq_lens[B] = {512, 77};
  std::vector<uint16_t> q(size_t(B) * H * 576), kv_bf16(TOKENS * 576);
  std::vector<uint8_t> kv_fp8(TOKENS * 576), kv_ds(TOKENS * GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES);
  for (size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(float((i * 7919) % 2003) / 1001.f - 1.f);
  const float group_scales[4] = {0.25f, 0.5f, 1.f, 2.f};
  for (size_t t = 0; t < TOKENS; ++t) {
    uint8_t* tok = &kv_ds[t * GRAPHSAFE_MLA_DS_MLA_TOKEN_BYTES];
    float s[4];
    for (int g = 0; g < 4; ++g) s[g] = group_scales[(t + g) % 4];
    std::memcpy(tok + 512, s, 16);
    for (int d = 0; d < 576; ++d) {
      float v = float(int((t * 577 + d * 131) % 33) - 16) / 16.f;  // k/16, k in -16..16: exact in bf16 and e4m3
      kv_bf16[t * 576 + d] = to_bf16(v);
      kv_fp8[t * 576 + d] = e4m3_code(v / 0.5f);
      if (d < 512) {
        tok[d] = e4m3_code(v / s[d / 128]);
      } else {
        uint16_t r = to_bf16(v);
        std::memcpy(tok + 528 + 2 * (d - 512), &r, 2);
      }
    }
  }
  std::vector<int> pt(size_t(B) * MAX_PAGES);
  for (int i = 0; i < B * MAX_PAGES; ++i) pt[i] = (i % MAX_PAGES) * B + i / MAX_PAGES;
  const float half = 0.5f;
  GraphsafeBuffer bq = upload(stream, q.data(), q.size() * 2), bkv = upload(stream, kv_bf16.data(), kv_bf16.size() * 2);
  GraphsafeBuffer bfp8 = upload(stream, kv_fp8.data(), kv_fp8.size()), bds = upload(stream, kv_ds.data(), kv_ds.size());
  GraphsafeBuffer bsl = upload(stream, seq_lens, sizeof seq_lens), bpt = upload(stream, pt.data(), pt.size() * 4);
  GraphsafeBuffer bscale = upload(stream, &half, 4), bout{};
  const size_t out_bytes = size_t(B) * H * 512 * 2;
  OK(graphsafe_buffer_create(stream, out_bytes, 1, &bout));

  GraphsafeMlaDecodeArgs a{};
  a.dtype = GRAPHSAFE_DTYPE_BF16;
  a.batch = B;
  a.num_heads = H;
  a.q_nope = addr(bq);
  a.q_nope_stride_batch = H * 576;
  a.q_nope_stride_head = 576;
  a.q_pe = addr(bq) + 1024;
  a.q_pe_stride_batch = H * 576;
  a.q_pe_stride_head = 576;
  a.kv_cache = addr(bkv);
  a.num_pages = PAGES;
  a.page_size = PAGE;
  a.seq_lens = addr(bsl);
  a.page_table = addr(bpt);
  a.max_pages = MAX_PAGES;
  a.out = addr(bout);
  a.out_stride_batch = H * 512;
  a.out_stride_head = 512;
  a.sm_scale = 1.f / std::sqrt(192.f);
  a.max_seq_len = MAX_SEQ;
  GraphsafeMlaDecodeArgs a_fp8 = a, a_ds = a;
  a_fp8.kv_cache = addr(bfp8);
  a_ds.kv_cache = addr(bds);
  const GraphsafeMlaKvCache per_tensor{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, addr(bscale)}, ds_mla{GRAPHSAFE_MLA_KV_FP8_DS_MLA, 0};

  GraphsafeMlaPlan plan{};
  OK(graphsafe_mla_plan_kv(GRAPHSAFE_ARCH_SM90, GRAPHSAFE_DTYPE_BF16, GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, H, B, MAX_SEQ, PAGE, info.sm_count, 0, &plan));
  GraphsafeWorkspace ws{};
  OK(graphsafe_workspace_create(stream, plan.workspace_bytes, &ws));
  auto run = [&](const GraphsafeMlaDecodeArgs& args, const GraphsafeMlaKvCache* kv, std::vector<uint16_t>& out) {
    GraphsafeMlaPlan ran{};
    OK(graphsafe_mla_decode_kv(&args, kv, ws, stream, &ran));
    CHECK(ran.num_splits == plan.num_splits && ran.workspace_bytes == plan.workspace_bytes);
    out.assign(out_bytes / 2, 0);
    OK(graphsafe_buffer_read(bout, 0, out.data(), out_bytes, stream));
  };
  std::vector<uint16_t> native, fp8, ds;
  run(a, nullptr, native);
  run(a_fp8, &per_tensor, fp8);
  run(a_ds, &ds_mla, ds);
  float diff_fp8 = 0, diff_ds = 0;
  size_t nonzero = 0;
  for (size_t i = 0; i < native.size(); ++i) {
    diff_fp8 = std::fmax(diff_fp8, std::fabs(bf16_value(fp8[i]) - bf16_value(native[i])));
    diff_ds = std::fmax(diff_ds, std::fabs(bf16_value(ds[i]) - bf16_value(native[i])));
    nonzero += native[i] != 0;
  }
  CHECK(nonzero > native.size() / 2);
  CHECK(diff_fp8 <= 1.f / 64 && diff_ds <= 1.f / 64);
  std::printf("fp8 KV caches through the C ABI (%d heads): max |out - native bf16| %g (per-tensor), %g (DeepSeek V3.2 tokens)\n", H, diff_fp8,
              diff_ds);

  // The refusals the op adds on the GPU: a cache too small for its format (the bf16 cache's
  // buffer holds the fp8 one, so use the ds-mla args over the smaller fp8 buffer).
  GraphsafeMlaDecodeArgs small = a_ds;
  small.kv_cache = addr(bfp8);
  CHECK_STATUS(graphsafe_mla_decode_kv(&small, &ds_mla, ws, stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_cache"));
  const GraphsafeMlaKvCache unknown_scale{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, 0x1000};
  CHECK_STATUS(graphsafe_mla_decode_kv(&a_fp8, &unknown_scale, ws, stream, nullptr), GRAPHSAFE_ERROR_INVALID_ARGUMENT);
  CHECK(last_error_mentions("kv_scale"));

  capture_and_compare(stream, ws, bout, out_bytes, "per-tensor fp8 KV MLA decode", [&] { return graphsafe_mla_decode_kv(&a_fp8, &per_tensor, ws, stream, nullptr); },
                      [&](GraphsafeCapture cap) { return graphsafe_mla_decode_kv_captured(&a_fp8, &per_tensor, cap, ws, nullptr); });
  capture_and_compare(stream, ws, bout, out_bytes, "DeepSeek V3.2 fp8 KV MLA decode", [&] { return graphsafe_mla_decode_kv(&a_ds, &ds_mla, ws, stream, nullptr); },
                      [&](GraphsafeCapture cap) { return graphsafe_mla_decode_kv_captured(&a_ds, &ds_mla, cap, ws, nullptr); });

  // The scale is read when the graph runs.
  {
    GraphsafeCapture cap{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
    OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_kv_captured(&a_fp8, &per_tensor, cap, ws, nullptr));
    GraphsafeGraph g{};
    OK(graphsafe_capture_end(cap, &g));
    GraphsafeGraphExec e{};
    OK(graphsafe_graph_instantiate(g, &e));
    OK(graphsafe_graph_destroy(g));
    const float quarter = 0.25f;
    OK(graphsafe_buffer_write(bscale, 0, &quarter, 4, stream));
    std::vector<uint16_t> eager(out_bytes / 2), replayed(out_bytes / 2);
    OK(graphsafe_mla_decode_kv(&a_fp8, &per_tensor, ws, stream, nullptr));
    OK(graphsafe_buffer_read(bout, 0, eager.data(), out_bytes, stream));
    std::vector<uint16_t> zeros(out_bytes / 2, 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), out_bytes, stream));
    OK(graphsafe_graph_exec_launch(e, stream));
    OK(graphsafe_buffer_read(bout, 0, replayed.data(), out_bytes, stream));
    CHECK(replayed == eager && eager != fp8);
    std::printf("per-tensor fp8 scale changed between replays (%d heads): the replay %s the eager decode at the new scale\n", H,
                replayed == eager ? "equals" : "DIFFERS FROM");
    OK(graphsafe_graph_exec_destroy(e));
  }
  // A scale given only by its raw address, never bound: the capture keeps its buffer alive. The
  // caller destroys its handle; no new buffer may get that memory while the executable lives, and
  // the replay reads the value that was there (0.125 here), not whatever a new owner writes.
  {
    const float eighth = 0.125f;
    GraphsafeBuffer bscale2 = upload(stream, &eighth, 4);
    uint64_t p2 = 0, n2 = 0;
    OK(graphsafe_buffer_info(bscale2, &p2, &n2));
    const GraphsafeMlaKvCache kv2{GRAPHSAFE_MLA_KV_FP8_PER_TENSOR, p2};
    std::vector<uint16_t> eager(out_bytes / 2), replayed(out_bytes / 2);
    OK(graphsafe_mla_decode_kv(&a_fp8, &kv2, ws, stream, nullptr));
    OK(graphsafe_buffer_read(bout, 0, eager.data(), out_bytes, stream));
    GraphsafeCapture cap{};
    OK(graphsafe_capture_begin(stream, GRAPHSAFE_CAPTURE_THREAD_LOCAL, &cap));
    OK(graphsafe_capture_bind_workspace(cap, ws, nullptr, nullptr));
    OK(graphsafe_mla_decode_kv_captured(&a_fp8, &kv2, cap, ws, nullptr));
    GraphsafeGraph g{};
    OK(graphsafe_capture_end(cap, &g));
    GraphsafeGraphExec e{};
    OK(graphsafe_graph_instantiate(g, &e));
    OK(graphsafe_graph_destroy(g));
    OK(graphsafe_buffer_destroy(bscale2));
    std::vector<GraphsafeBuffer> fresh(8);
    int overlapping = 0;
    const float big = 1000.f;
    for (auto& f : fresh) {
      OK(graphsafe_buffer_create(stream, n2, 0, &f));
      uint64_t p = 0;
      OK(graphsafe_buffer_info(f, &p, nullptr));
      overlapping += p < p2 + n2 && p2 < p + n2;
      OK(graphsafe_buffer_write(f, 0, &big, 4, stream));
    }
    std::vector<uint16_t> zeros(out_bytes / 2, 0);
    OK(graphsafe_buffer_write(bout, 0, zeros.data(), out_bytes, stream));
    OK(graphsafe_graph_exec_launch(e, stream));
    OK(graphsafe_buffer_read(bout, 0, replayed.data(), out_bytes, stream));
    CHECK(overlapping == 0 && replayed == eager);
    std::printf("an unbound fp8 scale address: kept by the executable (%d of 8 new buffers overlap it), the replay %s eager\n",
                overlapping, replayed == eager ? "equals" : "DIFFERS FROM");
    for (auto f : fresh) OK(graphsafe_buffer_destroy(f));
    OK(graphsafe_graph_exec_destroy(e));
  }
  for (GraphsafeBuffer x : {bq, bkv, bfp8, bds, bsl, bpt, bscale, bout}) OK(graphsafe_buffer_destroy(x));
  OK(graphsafe_workspace_destroy(ws));
}

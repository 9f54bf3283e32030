// How a C++ engine sizes its MLA workspace before capturing, and (with a GPU) creates it.
#include <cstdio>

#include "graphsafe.h"

int main() {
  GraphsafeMlaPlan worst{};
  // DeepSeek-V3 decode on a B200: 128 heads, batches up to 256, contexts up to 163,840 tokens in
  // 64-token pages.
  if (graphsafe_mla_worst_case(GRAPHSAFE_ARCH_SM100, GRAPHSAFE_DTYPE_BF16, 128, 256, 163840, 64, 148, &worst) != GRAPHSAFE_OK) {
    std::fprintf(stderr, "planning failed: %s\n", graphsafe_last_error());
    return 1;
  }
  std::printf("pre-grow the MLA workspace to %llu bytes (worst: batch %d, seq len %d, %d splits)\n",
              (unsigned long long)worst.workspace_bytes, worst.worst_batch, worst.worst_seq_len, worst.num_splits);

  GraphsafeContext ctx{};
  if (graphsafe_context_create(0, &ctx) != GRAPHSAFE_OK) {
    std::printf("no GPU here (%s): planning only\n", graphsafe_last_error());
    return 0;
  }
  GraphsafeStream stream{};
  GraphsafeWorkspace ws{};
  int st = graphsafe_stream_create(ctx, &stream);
  if (st == GRAPHSAFE_OK) st = graphsafe_workspace_create(stream, worst.workspace_bytes, &ws);
  if (st != GRAPHSAFE_OK) {
    std::fprintf(stderr, "error: %s\n", graphsafe_last_error());
    return 1;
  }
  uint64_t capacity = 0;
  graphsafe_workspace_info(ws, &capacity, nullptr);
  std::printf("workspace of %llu bytes created, zero-filled\n", (unsigned long long)capacity);
  graphsafe_workspace_destroy(ws);
  graphsafe_stream_destroy(stream);
  graphsafe_context_destroy(ctx);
  return 0;
}

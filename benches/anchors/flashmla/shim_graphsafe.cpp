// Torch binding of graphsafe's sm90 MLA decode (cuda-src/mla/sm90, through its C glue in
// include/graphsafe_kernels/mla.h), for the FlashMLA anchor bench: bench.py builds this with
// cuda-src/mla/sm90/decode.cu, cuda-src/mla/sm90/plan.cu and cuda-src/common/status.cu, with the
// crate's own nvcc flags, into the extension `gs_anchor_graphsafe`. Everything enqueues on torch's
// current stream, so torch.cuda.CUDAGraph captures it.
#include <string>

#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "graphsafe_kernels/mla.h"

namespace {

void gs_check(int status, const char* what) {
  TORCH_CHECK(status == GS_OK, what, " returned graphsafe status ", status,
              status == GS_ERR_CUDA ? " (cudaError " + std::to_string(gs_last_cuda_error()) + ")" : std::string());
}

int64_t gs_sm90_num_splits(int64_t batch, int64_t heads, int64_t max_seq_len, int64_t sm_count, int64_t requested) {
  int32_t splits = 0;
  gs_check(gs_mla_sm90_num_splits(int32_t(batch), int32_t(heads), int32_t(max_seq_len), int32_t(sm_count),
                                  int32_t(requested), &splits),
           "gs_mla_sm90_num_splits");
  return splits;
}

int64_t gs_sm90_workspace_bytes(int64_t batch, int64_t heads, int64_t splits) {
  uint64_t bytes = 0;
  gs_check(gs_mla_sm90_workspace_bytes(int32_t(batch), int32_t(heads), int32_t(splits), &bytes),
           "gs_mla_sm90_workspace_bytes");
  return int64_t(bytes);
}

// q [batch, 1, heads, 576] (FlashMLA's layout: q_nope = q[..., :512], q_pe = q[..., 512:], views of
// the one tensor), kv [num_pages, page_size, 1, 576] contiguous (read as [num_pages * page_size, 576]),
// seq_lens int32 [batch], page_table int32 [batch, columns], out [batch, heads, 512] in q's dtype,
// workspace uint8 of at least gs_sm90_workspace_bytes(batch, heads, num_splits) bytes.
void gs_sm90_decode(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& seq_lens,
                    const at::Tensor& page_table, at::Tensor& out, at::Tensor& workspace, int64_t max_seq_len,
                    int64_t num_splits, double sm_scale) {
  TORCH_CHECK(q.is_cuda() && kv.is_cuda() && seq_lens.is_cuda() && page_table.is_cuda() && out.is_cuda() &&
                  workspace.is_cuda(),
              "every tensor on the GPU");
  TORCH_CHECK(q.dim() == 4 && q.size(1) == 1 && q.size(3) == 576 && q.stride(3) == 1, "q: [batch, 1, heads, 576]");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf, "q: bf16 or fp16");
  TORCH_CHECK(kv.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(), "q, kv, out: one dtype");
  TORCH_CHECK(kv.dim() == 4 && kv.size(2) == 1 && kv.size(3) == 576 && kv.is_contiguous(),
              "kv: contiguous [pages, page_size, 1, 576]");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens: int32 [batch]");
  TORCH_CHECK(page_table.scalar_type() == at::kInt && page_table.dim() == 2 && page_table.stride(1) == 1,
              "page_table: int32 [batch, columns]");
  TORCH_CHECK(out.dim() == 3 && out.size(2) == 512 && out.stride(2) == 1, "out: [batch, heads, 512]");
  TORCH_CHECK(workspace.scalar_type() == at::kByte && workspace.is_contiguous(), "workspace: uint8");
  const int64_t batch = q.size(0), heads = q.size(2);
  TORCH_CHECK(seq_lens.numel() == batch && page_table.size(0) == batch && out.size(0) == batch &&
                  out.size(1) == heads,
              "batch and heads agree");

  at::cuda::CUDAGuard guard{q.device()};
  GsMlaDecodeArgs a{};
  a.dtype = q.scalar_type() == at::kHalf ? GS_DTYPE_FP16 : GS_DTYPE_BF16;
  a.batch = int32_t(batch);
  a.num_heads = int32_t(heads);
  a.max_seq_len = int32_t(max_seq_len);
  a.num_splits = int32_t(num_splits);
  a.sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  a.device = q.get_device();
  const auto* qp = static_cast<const uint16_t*>(q.data_ptr());
  a.q_nope = qp;
  a.q_nope_stride_batch = q.stride(0);
  a.q_nope_stride_head = q.stride(2);
  a.q_pe = qp + 512;
  a.q_pe_stride_batch = q.stride(0);
  a.q_pe_stride_head = q.stride(2);
  a.kv_cache = kv.data_ptr();
  a.num_pages = int32_t(kv.size(0));
  a.page_size = int32_t(kv.size(1));
  a.seq_lens = seq_lens.data_ptr<int32_t>();
  a.page_table = page_table.data_ptr<int32_t>();
  a.page_table_stride = int32_t(page_table.stride(0));
  a.out = out.data_ptr();
  a.out_stride_batch = out.stride(0);
  a.out_stride_head = out.stride(1);
  a.lse = nullptr;
  a.sm_scale = float(sm_scale);
  void* ws = workspace.numel() > 0 ? workspace.data_ptr() : nullptr;
  gs_check(gs_mla_sm90_decode(&a, ws, uint64_t(workspace.numel()), at::cuda::getCurrentCUDAStream().stream()),
           "gs_mla_sm90_decode");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gs_sm90_num_splits", &gs_sm90_num_splits, "graphsafe's default (requested=0) or checked split count");
  m.def("gs_sm90_workspace_bytes", &gs_sm90_workspace_bytes, "workspace bytes of the sm90 decode");
  m.def("gs_sm90_decode", &gs_sm90_decode, "graphsafe's sm90 MLA decode on the current stream");
}

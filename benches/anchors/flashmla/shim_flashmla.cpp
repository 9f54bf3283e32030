// Torch binding of FlashMLA's own dense-decode interface (its csrc/api/dense_decode.h, unchanged,
// from the sources prepare.sh exports into .gpu/anchors/flashmla-src; none of it is in this
// repository). bench.py builds this with FlashMLA's dense sm90 bf16 kernel, its combine kernel and
// its scheduler-metadata kernel into the extension `gs_anchor_flashmla`.
//
//   flashmla_dense_decode(q, kcache, head_size_v, seqlens_k, block_table, softmax_scale, is_causal,
//                         tile_scheduler_metadata, num_splits) -> (out, lse, metadata, num_splits)
//
// is FlashMLA's flash_mla_cuda.dense_decode_fwd: the first call with metadata None computes the
// scheduler metadata on the current stream; later calls that pass it back run only the split kernel
// and the combine kernel (what FlashMLA's own tests and benchmark time).
#include "api/dense_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("flashmla_dense_decode", &dense_attn_decode_interface);
}

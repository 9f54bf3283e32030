"""A `flash_mla` module that forwards FlashMLA's dense-decode interface to graphsafe, so FlashMLA's
own tests run against graphsafe unmodified (benches/anchors/flashmla/test_suite.py puts this
folder first on sys.path). Same names, arguments and return values as FlashMLA's
flash_mla/flash_mla_interface.py at the pinned commit, for what its dense-decoding test calls:

  get_mla_metadata(*args, **kwargs) -> (FlashMLASchedMeta, None)
  flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                         num_splits=None, softmax_scale=None, causal=False, ...) -> (out, softmax_lse)

graphsafe needs no scheduler metadata (its split count is planned on the host from the shapes), so
the metadata object only records the first call's configuration and, as FlashMLA does, refuses a
later call on it with another one. Sparse attention, fp8 caches in FlashMLA's formats and attention
sinks are not forwarded (the dense test uses none of them): they raise NotImplementedError.
"""
import dataclasses
import os
import sys
from typing import Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from graphsafe_ctypes import Graphsafe, GraphsafeError  # noqa: E402

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache", "FlashMLASchedMeta", "GraphsafeError"]

_GS = None


def _graphsafe():
    global _GS
    if _GS is None:
        _GS = Graphsafe()
    return _GS


@dataclasses.dataclass
class FlashMLASchedMeta:
    """What FlashMLA's scheduler metadata checks: the configuration of its first call."""
    have_initialized: bool = False
    config: Optional[tuple] = None


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits=None,
                           softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None):
    meta = tile_scheduler_metadata
    assert isinstance(meta, FlashMLASchedMeta), "tile_scheduler_metadata must be of type FlashMLASchedMeta"
    assert num_splits is None, "num_splits must be None"
    if is_fp8_kvcache or indices is not None or attn_sink is not None or extra_k_cache is not None or topk_length is not None:
        raise NotImplementedError("the forwarding module takes FlashMLA's dense bf16/fp16 decode only")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    config = (q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal)
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, config
    else:
        assert meta.config == config, "Your input arguments are inconsistent with sched_meta."
    out, lse, _ = _graphsafe().decode(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal)
    return out, lse

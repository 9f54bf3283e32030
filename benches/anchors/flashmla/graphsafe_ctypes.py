"""graphsafe's MLA decode from Python through its C ABI (libgraphsafe.so, include/graphsafe.h), for
the FlashMLA anchor: the forwarding `flash_mla` module and speed.py call graphsafe exactly as a C
engine would, every argument checked by graphsafe (shapes, strides, alignment, which allocation
each pointer lies in). ctypes only; torch tensors are passed as device addresses and strides.

    gs = Graphsafe()                       # libgraphsafe.so: $GRAPHSAFE_LIB, else .gpu/lib/
    out, lse = gs.decode(q, k_cache, block_table, cache_seqlens, head_dim_v, sm_scale, causal)

The decode runs on torch's current stream (adopted by graphsafe, so it may not be the legacy
default stream: use a side stream, as the callers here do) with a workspace graphsafe owns and
grows when a shape needs more. A refusal raises GraphsafeError with graphsafe's status and text.
"""
import ctypes
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

GRAPHSAFE_OK = 0
STATUS = {
    -1: "INVALID_ARGUMENT", -2: "NULL_POINTER", -3: "INVALID_HANDLE", -4: "DRIVER_NOT_FOUND", -5: "MISSING_SYMBOL",
    -6: "DRIVER", -7: "CUDA_RUNTIME", -8: "CUTLASS", -9: "CUDNN_NOT_FOUND", -10: "CUDNN", -11: "ARCH_UNSUPPORTED",
    -12: "WORKSPACE_TOO_SMALL", -13: "CAPTURE_INVALIDATED", -14: "BUSY", -15: "PANIC",
}
DTYPE = {"bfloat16": 0, "float16": 1}


class GraphsafeError(RuntimeError):
    """A graphsafe call refused its arguments or failed: `status` (e.g. INVALID_ARGUMENT) and
    graphsafe's text."""

    def __init__(self, call, code, text):
        self.call, self.code, self.status, self.text = call, code, STATUS.get(code, str(code)), text
        super().__init__(f"{call}: GRAPHSAFE_ERROR_{self.status}: {text}")


class Handle(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64)]


class MlaPlan(ctypes.Structure):
    _fields_ = [("num_splits", ctypes.c_int), ("workspace_bytes", ctypes.c_uint64), ("worst_batch", ctypes.c_int),
                ("worst_seq_len", ctypes.c_int)]


class MlaDecodeArgs(ctypes.Structure):
    """GraphsafeMlaDecodeArgs, field for field (include/graphsafe.h)."""
    _fields_ = [
        ("dtype", ctypes.c_int), ("batch", ctypes.c_int), ("num_heads", ctypes.c_int), ("s_q", ctypes.c_int),
        ("causal", ctypes.c_int), ("num_kv_heads", ctypes.c_int),
        ("q_nope", ctypes.c_uint64), ("q_nope_stride_batch", ctypes.c_int64), ("q_nope_stride_token", ctypes.c_int64),
        ("q_nope_stride_head", ctypes.c_int64),
        ("q_pe", ctypes.c_uint64), ("q_pe_stride_batch", ctypes.c_int64), ("q_pe_stride_token", ctypes.c_int64),
        ("q_pe_stride_head", ctypes.c_int64),
        ("kv_cache", ctypes.c_uint64), ("num_pages", ctypes.c_int), ("page_size", ctypes.c_int),
        ("seq_lens", ctypes.c_uint64), ("page_table", ctypes.c_uint64), ("max_pages", ctypes.c_int),
        ("out", ctypes.c_uint64), ("out_stride_batch", ctypes.c_int64), ("out_stride_token", ctypes.c_int64),
        ("out_stride_head", ctypes.c_int64),
        ("lse", ctypes.c_uint64), ("sm_scale", ctypes.c_float), ("max_seq_len", ctypes.c_int), ("num_splits", ctypes.c_int),
    ]


def library_path():
    for p in (os.environ.get("GRAPHSAFE_LIB"), os.path.join(REPO, ".gpu", "lib", "libgraphsafe.so"),
              os.path.join(REPO, "target", "release", "libgraphsafe.so")):
        if p and os.path.isfile(p):
            return p
    raise FileNotFoundError("no libgraphsafe.so: set GRAPHSAFE_LIB or build it (cargo build --release -p graphsafe-clib) and "
                            "copy it to .gpu/lib/")


class Graphsafe:
    def __init__(self, path=None, device=0):
        import torch

        self.torch = torch
        self.lib = ctypes.CDLL(path or library_path())
        self.lib.graphsafe_last_error.restype = ctypes.c_char_p
        self.lib.graphsafe_version.restype = ctypes.c_char_p
        self.lib.graphsafe_build_archs.restype = ctypes.c_char_p
        self.ctx = Handle()
        self._check("graphsafe_context_create", self.lib.graphsafe_context_create(device, ctypes.byref(self.ctx)))
        self.streams = {}  # torch stream pointer -> (graphsafe stream, workspace)

    def version(self):
        return self.lib.graphsafe_version().decode(), self.lib.graphsafe_build_archs().decode()

    def _check(self, call, code):
        if code != GRAPHSAFE_OK:
            raise GraphsafeError(call, code, self.lib.graphsafe_last_error().decode(errors="replace"))

    def _stream(self):
        """torch's current stream, adopted once, and the workspace decodes on it use."""
        raw = self.torch.cuda.current_stream().cuda_stream
        if raw not in self.streams:
            s, ws = Handle(), Handle()
            self._check("graphsafe_stream_adopt", self.lib.graphsafe_stream_adopt(self.ctx, ctypes.c_void_p(raw), ctypes.byref(s)))
            self._check("graphsafe_workspace_create", self.lib.graphsafe_workspace_create(s, ctypes.c_uint64(0), ctypes.byref(ws)))
            self.streams[raw] = (s, ws)
        return self.streams[raw]

    def args(self, q, k_cache, block_table, cache_seqlens, head_dim_v, sm_scale, causal, out=None, lse=None,
             num_splits=0, max_seq_len=None):
        """The C ABI arguments of FlashMLA's dense decode: q [b, s_q, h, 576], k_cache
        [blocks, block, h_kv, 576] (graphsafe refuses h_kv != 1 by name), block_table [b, max_blocks]
        i32, cache_seqlens [b] i32; out [b, s_q, h, 512] and lse [b, h, s_q] f32 made when not given.
        Returns (args, out, lse)."""
        torch = self.torch
        if head_dim_v != 512 or q.shape[-1] != 576:
            raise GraphsafeError("decode", -1, f"head_dim_v 512 and q's last dimension 576 (MLA); got {head_dim_v}, {q.shape[-1]}")
        b, s_q, h, _ = q.shape
        if out is None:
            out = torch.empty(b, s_q, h, head_dim_v, dtype=q.dtype, device=q.device)
        if lse is None:
            lse = torch.empty(b, h, s_q, dtype=torch.float32, device=q.device)
        blocks, block = k_cache.shape[0], k_cache.shape[1]
        h_kv = k_cache.shape[2] if k_cache.dim() == 4 else 1
        if block_table.shape[1] and block_table.stride(0) != block_table.shape[1]:
            raise GraphsafeError("decode", -1, "a block_table with contiguous rows")
        e = q.element_size()
        a = MlaDecodeArgs()
        a.dtype = DTYPE[str(q.dtype).replace("torch.", "")]
        a.batch, a.num_heads, a.s_q, a.causal, a.num_kv_heads = b, h, s_q, int(bool(causal)), h_kv
        sb, st, sh, _ = q.stride()
        a.q_nope, a.q_nope_stride_batch, a.q_nope_stride_token, a.q_nope_stride_head = q.data_ptr(), sb, st, sh
        a.q_pe, a.q_pe_stride_batch, a.q_pe_stride_token, a.q_pe_stride_head = q.data_ptr() + 512 * e, sb, st, sh
        a.kv_cache, a.num_pages, a.page_size = k_cache.data_ptr(), blocks, block
        a.seq_lens, a.page_table = cache_seqlens.data_ptr(), block_table.data_ptr()
        a.max_pages = block_table.shape[1]
        ob, ot, oh, _ = out.stride()
        a.out, a.out_stride_batch, a.out_stride_token, a.out_stride_head = out.data_ptr(), ob, ot, oh
        a.lse = lse.data_ptr()
        a.sm_scale = sm_scale
        a.max_seq_len = max_seq_len if max_seq_len is not None else block_table.shape[1] * block
        a.num_splits = num_splits
        return a, out, lse

    def decode(self, *args, **kwargs):
        """One eager decode on torch's current stream (see args()): (out, lse, plan)."""
        a, out, lse = self.args(*args, **kwargs)
        s, ws = self._stream()
        plan = MlaPlan()
        self._check("graphsafe_mla_decode", self.lib.graphsafe_mla_decode(ctypes.byref(a), ws, s, ctypes.byref(plan)))
        return out, lse, plan

    def capture(self, a, calls):
        """`calls` decodes of arguments `a` captured through graphsafe's own capture on torch's current
        stream (the workspace bound, never grown: call decode() first so it has the size) and
        instantiated: a callable that replays the graph on that stream."""
        s, ws = self._stream()
        cap, graph, exe, plan = Handle(), Handle(), Handle(), MlaPlan()
        ptr, cap_bytes = ctypes.c_uint64(), ctypes.c_uint64()
        self._check("graphsafe_capture_begin", self.lib.graphsafe_capture_begin(s, 1, ctypes.byref(cap)))  # THREAD_LOCAL
        self._check("graphsafe_capture_bind_workspace", self.lib.graphsafe_capture_bind_workspace(cap, ws, ctypes.byref(ptr), ctypes.byref(cap_bytes)))
        for _ in range(calls):
            self._check("graphsafe_mla_decode_captured", self.lib.graphsafe_mla_decode_captured(ctypes.byref(a), cap, ws, ctypes.byref(plan)))
        self._check("graphsafe_capture_end", self.lib.graphsafe_capture_end(cap, ctypes.byref(graph)))
        self._check("graphsafe_graph_instantiate", self.lib.graphsafe_graph_instantiate(graph, ctypes.byref(exe)))
        self._check("graphsafe_graph_destroy", self.lib.graphsafe_graph_destroy(graph))  # the executable keeps what it needs
        lib, check = self.lib, self._check

        class Replay:
            num_splits = plan.num_splits

            def __call__(self):
                check("graphsafe_graph_exec_launch", lib.graphsafe_graph_exec_launch(exe, s))

            def __del__(self):
                lib.graphsafe_graph_exec_destroy(exe)

        return Replay()

#!/usr/bin/env python3
"""Where the time of one graphsafe MLA decode goes, kernel by kernel, on the GPU machine.

For each shape (heads, s_q, batch x seq; bf16, page 64, every request at full length, causal when
s_q > 1) the decode is captured CALLS times into one graph through graphsafe's C ABI, replayed
under torch.profiler (CUPTI traces graph kernel nodes), and for each kernel name the median
duration is printed, with the median gap between one kernel's end and the next one's start and
the whole decode's span (first start to last end, per decode). What the CUDA-event time of
speed.py adds on top is launch of the graph itself.

  GRAPHSAFE_LIB=.gpu/lib/libgraphsafe.so python3 benches/anchors/flashmla/kernels.py 16,1,64x4096 32,2,64x4096

Each argument is HEADS,S_Q,BATCHxSEQ[,SPLITS].
"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from graphsafe_ctypes import Graphsafe  # noqa: E402

D_QK, D_V, PAGE, CALLS = 576, 512, 64, 10


def main():
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.set_device(0)
    torch.cuda.set_stream(torch.cuda.Stream())
    gs = Graphsafe()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for spec in sys.argv[1:] or ["16,1,64x4096"]:
        parts = spec.split(",")
        heads, s_q = int(parts[0]), int(parts[1])
        batch, seq = (int(x) for x in parts[2].split("x"))
        splits = int(parts[3]) if len(parts) > 3 else 0
        pages = batch * seq // PAGE
        q = torch.randn(batch, s_q, heads, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10)
        kv = torch.randn(pages, PAGE, 1, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10)
        table = torch.randperm(pages, device="cuda", dtype=torch.int32, generator=gen).view(batch, seq // PAGE)
        lens = torch.full((batch,), seq, device="cuda", dtype=torch.int32)
        causal, scale = s_q > 1, D_QK ** -0.5
        a, out, lse = gs.args(q, kv, table, lens, D_V, scale, causal, num_splits=splits)
        gs.decode(q, kv, table, lens, D_V, scale, causal, out=out, lse=lse, num_splits=splits)
        replay = gs.capture(a, CALLS)
        for _ in range(5):
            replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                replay()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "mla" in e.name),
                         key=lambda e: e.time_range.start)
        by_name, gaps = {}, {}
        for prev, cur in zip(kernels, kernels[1:]):
            gap = cur.time_range.start - prev.time_range.end
            if gap < 50:  # inside one replay (replays are launched back to back)
                gaps.setdefault((short(prev.name), short(cur.name)), []).append(gap)
        for e in kernels:
            by_name.setdefault(short(e.name), []).append(e.time_range.end - e.time_range.start)
        span = (kernels[-1].time_range.end - kernels[0].time_range.start) / (5 * CALLS)
        print(f"heads {heads} s_q {s_q} batch {batch} seq {seq} splits {replay.num_splits}: "
              f"{span:.1f} us a decode (profiled span / {5 * CALLS})", flush=True)
        for name, d in by_name.items():
            print(f"  {name:<40} x{len(d) // (5 * CALLS)} median {statistics.median(d):7.2f} us", flush=True)
        for (p, c), g in gaps.items():
            print(f"  gap {p} -> {c}: median {statistics.median(g):.2f} us ({len(g)})", flush=True)
        del replay, q, kv, table, lens
        torch.cuda.synchronize()


def short(name):
    name = name.split("(")[0]
    return name.replace("void ", "").replace("graphsafe::mla_sm90::", "")[:40]


if __name__ == "__main__":
    main()

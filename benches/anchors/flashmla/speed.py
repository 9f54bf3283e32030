#!/usr/bin/env python3
"""graphsafe against FlashMLA in one process, on a Hopper GPU (H100 or H200):

  1. FlashMLA's 16 performance cases (its test's performance_cases: batch 128, varlen lengths,
     s_q 1 and 2, s_k 4096..32768, causal and not, 128 heads, bf16, page 64), with the inputs its
     test's own generate_test_data makes (imported from the unmodified test file): FlashMLA's time
     against graphsafe's, ratio = FlashMLA / graphsafe (>= 1: graphsafe as fast or faster);
  2. 16 and 32 heads (TP 8 and 4), s_q 1 and 2 (causal), batch 64 and 128, 4K..16K tokens:
     graphsafe's bytes moved per second against a device-to-device copy timed in the same run.

Each contender's decode is captured CALLS times into one graph (FlashMLA through torch.cuda.graph,
with its scheduler metadata from one eager call first, as its test does; graphsafe through its own
C ABI capture, libgraphsafe.so); the two graphs' replays alternate, each timed with CUDA events
after warm-up; a row is the median replay / CALLS. Outputs are compared too (out and lse).
Needs what run.sh/prepare.sh provide: FlashMLA's export and its built extension (bench.py --build
flashmla), and .gpu/lib/libgraphsafe.so. Writes $OUT/anchor-flashmla-speed.json when OUT is set.
"""
import argparse
import json
import math
import os
import statistics
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (build/load of FlashMLA's extension, copy rate, graph helpers)
from graphsafe_ctypes import Graphsafe  # noqa: E402

D_QK, D_V, PAGE = 576, 512, 64


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--copy-mib", type=int, default=2048)
    ap.add_argument("--skip-flashmla", action="store_true", help="only part 2 (no FlashMLA build needed)")
    ap.add_argument("--skip-tp", action="store_true", help="only part 1")
    ap.add_argument("--splits", default="", help="comma-separated graphsafe split counts to time beside its default (0) in part 1")
    ap.add_argument("--tp-splits", default="", help="the same for part 2")
    ap.add_argument("--tp-shapes", default="", help="part 2: only these batch x seq shapes, comma-separated (e.g. 64x4096)")
    args = ap.parse_args()

    import torch

    torch.cuda.set_device(0)
    torch.cuda.set_stream(torch.cuda.Stream())  # graphsafe adopts the caller's stream, never the legacy one
    gs = Graphsafe()
    props = torch.cuda.get_device_properties(0)
    copy_gbs = bench.copy_rate(torch, args.copy_mib << 20, 5, args.rounds, args.warmup)
    print(f"device: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}; graphsafe {gs.version()}; "
          f"FlashMLA {bench.flashmla_commit()}; D2D copy {copy_gbs:.0f} GB/s (read + write)", flush=True)
    result = {"bench": "anchor-flashmla-speed", "device": props.name, "copy_gb_s": round(copy_gbs, 1), "calls": args.calls,
              "rounds": args.rounds, "flashmla_commit": bench.flashmla_commit(), "flashmla_cases": [], "tp_cases": []}

    def gs_graph(q, kv, table, lens, causal, scale, num_splits=0):
        a, out, lse = gs.args(q, kv, table, lens, D_V, scale, causal, num_splits=num_splits)
        gs.decode(q, kv, table, lens, D_V, scale, causal, out=out, lse=lse, num_splits=num_splits)  # grows the workspace before capture
        return gs.capture(a, args.calls), out, lse

    ok = True
    if not args.skip_flashmla:
        fm, _ = bench.build("flashmla")
        sys.path[:0] = [os.path.join(HERE, "forward"), os.path.join(bench.flashmla_src(), "tests")]
        import test_flash_mla_dense_decoding as t  # FlashMLA's test, unmodified: its cases and its data

        torch.set_default_device("cuda")
        torch.set_default_dtype(torch.bfloat16)
        cases = [t.TestParam(128, s_q, s_k, is_varlen=True, is_causal=c, test_performance=True)
                 for c in (False, True) for s_q in (1, 2) for s_k in (4096, 8192, 16384, 32768)]
        print(f"{'s_q':>3} {'s_k':>6} {'causal':>6} | {'FlashMLA us':>11} {'TFLOP/s':>8} | {'graphsafe us':>12} {'TFLOP/s':>8} "
              f"{'splits':>6} | {'FM/gs':>6} | {'max|dout|':>9} {'max|dlse|':>9}", flush=True)
        for c in cases:
            lens, q, table, kv = t.generate_test_data(c)
            scale = D_QK ** -0.5
            _, _, meta, nsp = fm.flashmla_dense_decode(q, kv, D_V, lens, table, scale, c.is_causal, None, None)
            fm_fn = lambda: fm.flashmla_dense_decode(q, kv, D_V, lens, table, scale, c.is_causal, meta, nsp)  # noqa: E731
            g_fm, fm_res = bench.make_graph(torch, fm_fn, args.calls)
            replay, gs_out, gs_lse = gs_graph(q, kv, table, lens, c.is_causal, scale)

            us_fm, us_gs = (x / args.calls for x in bench.time_alternating(torch, [g_fm, types.SimpleNamespace(replay=replay)], args.rounds, args.warmup))
            fm_out, fm_lse = fm_res[0].float(), fm_res[1].float()
            dout = (fm_out - gs_out.float()).abs().max().item()
            both = torch.isfinite(fm_lse) & torch.isfinite(gs_lse)
            dlse = (fm_lse - gs_lse)[both].abs().max().item() if both.any() else 0.0
            mean_len = lens.float().mean().item()
            flops = c.b * c.h_q * c.s_q * 2 * mean_len * (D_QK + D_V)
            sweep = {}
            for n in [int(x) for x in args.splits.split(",") if x]:
                r2, _, _ = gs_graph(q, kv, table, lens, c.is_causal, scale, n)
                sweep[n] = round(bench.time_alternating(torch, [types.SimpleNamespace(replay=r2)], args.rounds, args.warmup)[0] / args.calls, 2)
                del r2
            row = {"s_q": c.s_q, "s_k": c.s_k, "causal": c.is_causal, "flashmla_us": round(us_fm, 2), "graphsafe_us": round(us_gs, 2), "splits_sweep_us": sweep,
                   "flashmla_tflop_s": round(flops / us_fm / 1e6, 1), "graphsafe_tflop_s": round(flops / us_gs / 1e6, 1),
                   "splits": replay.num_splits, "ratio_flashmla_over_graphsafe": round(us_fm / us_gs, 3),
                   "max_abs_out_diff": dout, "max_abs_lse_diff": dlse}
            result["flashmla_cases"].append(row)
            ok &= dout < 5e-2
            print(f"{c.s_q:>3} {c.s_k:>6} {str(c.is_causal):>6} | {us_fm:>11.1f} {row['flashmla_tflop_s']:>8.1f} | {us_gs:>12.1f} "
                  f"{row['graphsafe_tflop_s']:>8.1f} {replay.num_splits:>6} | {row['ratio_flashmla_over_graphsafe']:>5.3f}x | {dout:>9.2e} {dlse:>9.2e}"
                  + (f"  splits sweep (us): {sweep}" if sweep else ""), flush=True)
            del g_fm, replay, fm_res, gs_out, gs_lse, q, kv, table, lens, meta, nsp
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        r = [row["ratio_flashmla_over_graphsafe"] for row in result["flashmla_cases"]]
        print(f"FlashMLA / graphsafe time over the 16 cases: min {min(r):.3f}, median {statistics.median(r):.3f}, max {max(r):.3f}", flush=True)
        torch.set_default_device("cpu")

    if args.skip_tp:
        print("SPEED_JSON " + json.dumps(result, separators=(",", ":")), flush=True)
        return 0 if ok else 1
    # Part 2: TP 8 / TP 4 head counts against the copy rate.
    print(f"{'heads':>5} {'s_q':>3} {'batch':>5} {'seq':>6} | {'graphsafe us':>12} {'GB/s':>6} {'of copy':>7} {'splits':>6}", flush=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    for heads in (16, 32):
        for s_q in (1, 2):
            for batch in (64, 128):
                for seq in (4096, 8192, 16384):
                    if args.tp_shapes and f"{batch}x{seq}" not in args.tp_shapes.split(","):
                        continue
                    pages = batch * seq // PAGE
                    q = torch.randn(batch, s_q, heads, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10)
                    kv = torch.randn(pages, PAGE, 1, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10)
                    table = torch.randperm(pages, device="cuda", dtype=torch.int32, generator=gen).view(batch, seq // PAGE)
                    lens = torch.full((batch,), seq, device="cuda", dtype=torch.int32)
                    replay, _, _ = gs_graph(q, kv, table, lens, s_q > 1, D_QK ** -0.5)
                    us = bench.time_alternating(torch, [types.SimpleNamespace(replay=replay)], args.rounds, args.warmup)[0] / args.calls
                    sweep = {}
                    for n in [int(x) for x in args.tp_splits.split(",") if x]:
                        r, _, _ = gs_graph(q, kv, table, lens, s_q > 1, D_QK ** -0.5, num_splits=n)
                        sweep[n] = round(bench.time_alternating(torch, [types.SimpleNamespace(replay=r)], args.rounds, args.warmup)[0] / args.calls, 2)
                        del r
                    nbytes = batch * seq * D_QK * 2.0 + batch * s_q * heads * (D_QK + D_V) * 2.0
                    gbs = nbytes / us / 1e3
                    row = {"heads": heads, "s_q": s_q, "batch": batch, "seq": seq, "graphsafe_us": round(us, 2), "gb_s": round(gbs, 1),
                           "of_copy": round(gbs / copy_gbs, 3), "splits": replay.num_splits, "splits_sweep_us": sweep}
                    result["tp_cases"].append(row)
                    print(f"{heads:>5} {s_q:>3} {batch:>5} {seq:>6} | {us:>12.1f} {gbs:>6.0f} {row['of_copy']:>7.3f} {replay.num_splits:>6}"
                          + (f"  splits sweep (us): {sweep}" if sweep else ""), flush=True)
                    del replay, q, kv, table, lens
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
    f = [row["of_copy"] for row in result["tp_cases"]]
    print(f"16/32 heads, of the copy rate: min {min(f):.3f}, median {statistics.median(f):.3f}", flush=True)
    print("SPEED_JSON " + json.dumps(result, separators=(",", ":")), flush=True)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "anchor-flashmla-speed.json"), "w") as fh:
            json.dump(result, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

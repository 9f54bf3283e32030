#!/usr/bin/env python3
"""FlashMLA anchor: FlashMLA's dense Hopper decode against graphsafe's sm90 MLA
decode, in one process, on the same inputs, on the GPU machine. run.sh drives it:

  python3 bench.py --build flashmla      JIT-build the FlashMLA extension (prepare.sh's export)
  python3 bench.py --build graphsafe     JIT-build graphsafe's sm90 decode from cuda-src/
  python3 bench.py [--build-seconds S]   load both (already built) and run the bench

Each extension is a torch JIT extension (torch.utils.cpp_extension.load) built under /tmp with its
own project's flags: FlashMLA's from its setup.py (C++20, fast math, its ptxas register level),
graphsafe's from build/kernels.rs (C++17, no fast math), both for sm_90a only.

The bench: bf16, page 64, every request at full length, a shuffled page table, random data
(FlashMLA's test's: randn / 10 clamped to [-1, 1]), sm_scale 1/sqrt(576) (FlashMLA's default).
Each contender's decode call is captured CALLS times into one torch.cuda.CUDAGraph; the two
graphs' replays alternate (A B, then B A, ...), each replay timed with CUDA events after warm-up;
a row reports the median replay time / CALLS. FlashMLA's scheduler metadata is computed once by an
eager call before capture (as FlashMLA's tests and benchmark do); its graph holds its split kernel
and its combine kernel. graphsafe's split count is its planner's default. A device-to-device copy,
timed the same way in the same run, gives the bandwidth baseline.
  FLOPs = B * S * H * 2 * (576 + 512); bytes = KV (B * S * 576 * 2) + Q (B * H * 576 * 2) + O (B * H * 512 * 2).
"""
import argparse
import glob
import json
import math
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
ANCHORS = os.path.join(REPO, ".gpu", "anchors")
WORK = os.environ.get("ANCHOR_WORK", "/tmp/graphsafe-anchor")

GENCODE = ["-gencode", "arch=compute_90a,code=sm_90a"]
# torch adds -D__CUDA_NO_HALF_OPERATORS__ and friends to every nvcc line; both projects build without.
UNDEF_HALF = [
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
]

# The anchor's shapes: heads x (batch, seq); 16 heads is memory-bound, 128 compute-bound.
SHAPES = [(h, b, s) for h in (16, 128) for (b, s) in ((64, 4096), (128, 8192), (16, 16384), (1, 65536))]
PAGE = 64
D_QK, D_V = 576, 512


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------- build


def cuda_home():
    from torch.utils.cpp_extension import CUDA_HOME

    return CUDA_HOME


def find_cccl():
    """CUDA 13 keeps libcu++/CUB/Thrust (and nv/target, which cuda_fp16.hpp includes) under
    include/cccl: nvcc adds it itself, g++ (the .cpp shims) needs it named."""
    if os.environ.get("CCCL_INCLUDE"):
        return os.environ["CCCL_INCLUDE"]
    roots = []
    if cuda_home():
        roots.append(cuda_home())
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
        roots.append(os.path.dirname(os.path.dirname(nvcc)))
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    cands = []
    for r in roots:
        cands += [os.path.join(r, "include", "cccl")] + sorted(glob.glob(os.path.join(r, "targets", "*", "include", "cccl")))
    for c in cands:
        if os.path.exists(os.path.join(c, "nv", "target")):
            return c
    return None


def cutlass_include():
    for c in (os.environ.get("CUTLASS_INCLUDE"), os.path.join(WORK, "cutlass-include"), os.path.join(ANCHORS, "cutlass-include")):
        if c and os.path.isdir(os.path.join(c, "cute")) and os.path.isdir(os.path.join(c, "cutlass")):
            return c
    sys.exit("bench: no CUTLASS include dir (run prepare.sh; run.sh unpacks .gpu/anchors/cutlass-include.tar.gz into "
             f"{WORK}/cutlass-include; or set CUTLASS_INCLUDE)")


def flashmla_src():
    src = os.environ.get("FLASHMLA_SRC", os.path.join(ANCHORS, "flashmla-src"))
    if not os.path.isfile(os.path.join(src, "csrc", "api", "dense_decode.h")):
        sys.exit(f"bench: no FlashMLA export at {src} (run benches/anchors/flashmla/prepare.sh on the dev machine and carry .gpu/anchors)")
    return src


def flashmla_commit():
    try:
        with open(os.path.join(flashmla_src(), "FLASHMLA_COMMIT")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def host_flags():
    cccl = find_cccl()
    if cccl is None:
        log("bench: warning: no CUDA include/cccl found; g++ may not find <nv/target> (set CCCL_INCLUDE)")
        return []
    return ["-isystem", cccl]


def build(which):
    from torch.utils.cpp_extension import load

    bdir = os.path.join(WORK, "build-" + which)
    os.makedirs(bdir, exist_ok=True)
    if which == "flashmla":
        src = flashmla_src()
        csrc = os.path.join(src, "csrc")
        sources = [
            os.path.join(HERE, "shim_flashmla.cpp"),
            os.path.join(csrc, "sm90/decode/dense/instantiations/bf16.cu"),
            os.path.join(csrc, "smxx/decode/combine/combine.cu"),
            os.path.join(csrc, "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"),
        ]
        # FlashMLA's setup.py flags (less its ptxas -v/warnings and --source-in-ptx; bf16 only).
        cxx = ["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations", "-DFLASH_MLA_DISABLE_FP16"] + host_flags()
        nvcc = [
            "-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-DFLASH_MLA_DISABLE_FP16",
            "-Wno-deprecated-declarations", *UNDEF_HALF, "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "--use_fast_math", "--ptxas-options=--register-usage-level=10", "-lineinfo", *GENCODE,
        ]
        incs = [csrc, os.path.join(csrc, "kerutils", "include"), os.path.join(csrc, "sm90"), cutlass_include()]
        name = "gs_anchor_flashmla"
    elif which == "graphsafe":
        sources = [
            os.path.join(HERE, "shim_graphsafe.cpp"),
            os.path.join(REPO, "cuda-src/mla/sm90/decode.cu"),
            os.path.join(REPO, "cuda-src/mla/sm90/plan.cu"),
            os.path.join(REPO, "cuda-src/common/status.cu"),
        ]
        # build/kernels.rs's flags for these units.
        cxx = ["-O3", "-DNDEBUG"] + host_flags()
        nvcc = ["-std=c++17", "-O3", "-DNDEBUG", *UNDEF_HALF, "--expt-relaxed-constexpr",
                "-Xcudafe=--diag_suppress=177", *GENCODE]
        incs = [os.path.join(REPO, "include"), os.path.join(REPO, "cuda-src"), cutlass_include()]
        name = "gs_anchor_graphsafe"
    else:
        raise ValueError(which)
    t0 = time.time()
    mod = load(name=name, sources=sources, extra_cflags=cxx, extra_cuda_cflags=nvcc, extra_include_paths=incs,
               build_directory=bdir, verbose=os.environ.get("ANCHOR_VERBOSE") == "1")
    return mod, time.time() - t0


# ---------------------------------------------------------------------------------------- bench


def make_graph(torch, fn, calls):
    """fn captured `calls` times into one graph (after warm-up on a side stream, as torch asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(g):
        for _ in range(calls):
            out = fn()
    torch.cuda.synchronize()
    return g, out


def time_alternating(torch, graphs, rounds, warmup):
    """Median replay time (us) of each graph, the graphs' replays alternating, order flipped each round."""
    for _ in range(warmup):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs] for _ in range(rounds)]
    for r in range(rounds):
        order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
        for i in order:
            ev[r][i][0].record()
            graphs[i].replay()
            ev[r][i][1].record()
    torch.cuda.synchronize()
    return [statistics.median(ev[r][i][0].elapsed_time(ev[r][i][1]) * 1e3 for r in range(rounds)) for i in range(len(graphs))]


def copy_rate(torch, nbytes, calls, rounds, warmup):
    # Timed eagerly, as the crate's own benches do (cudaMemcpyAsync on a stream): a memcpy node
    # captured into a graph ran at 2.8 TB/s on the H200 against 4.1-4.2 TB/s eagerly.
    src = torch.empty(nbytes // 8, dtype=torch.int64, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del src, dst
    return 2.0 * nbytes / statistics.median(times) / 1e3  # GB/s, read + write


def reference_rows(torch, q, kv, table, seq, rows, scale):
    """fp32 attention of the requests in `rows` (a check of each contender, not only of their agreement)."""
    outs = []
    flat = kv.view(-1, D_QK)
    for b in rows:
        pages = table[b, : seq // PAGE].long()
        idx = (pages[:, None] * PAGE + torch.arange(PAGE, device=kv.device)[None, :]).reshape(-1)
        k = flat[idx].float()  # [seq, 576]
        qb = q[b, 0].float()  # [H, 576]
        p = torch.softmax((qb @ k.T) * scale, dim=-1)
        outs.append(p @ k[:, :D_V])  # [H, 512]
    return torch.stack(outs)


def bench(args, fm, gs, build_s):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    sm_count = props.multi_processor_count
    scale = 1.0 / math.sqrt(D_QK)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)

    copy_gbs = copy_rate(torch, args.copy_mib << 20, 5, args.rounds, args.warmup)
    log(f"device: {props.name} ({sm_count} SMs), torch {torch.__version__}, CUDA {torch.version.cuda}; FlashMLA {flashmla_commit()}")
    log(f"D2D copy ({args.copy_mib} MiB): {copy_gbs:.0f} GB/s (read + write)")
    hdr = (f"{'heads':>5} {'batch':>5} {'seq':>6} | {'FlashMLA us':>11} {'TFLOP/s':>8} {'GB/s':>6} {'ofcopy':>6} | "
           f"{'splits':>6} {'ours us':>8} {'TFLOP/s':>8} {'GB/s':>6} {'ofcopy':>6} | {'ours/FM':>7} | "
           f"{'max|diff|':>9} {'rel':>7} {'FM-ref':>8} {'ours-ref':>8}")
    log(hdr)
    log("-" * len(hdr))
    rows = []
    shapes = SHAPES if not args.shapes else [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    for heads, batch, seq in shapes:
        assert seq % PAGE == 0
        ppr = seq // PAGE
        num_pages = batch * ppr
        q = torch.randn(batch, 1, heads, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10).clamp_(-1, 1)
        kv = torch.randn(num_pages, PAGE, 1, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen).div_(10).clamp_(-1, 1)
        table = torch.randperm(num_pages, device="cuda", dtype=torch.int32, generator=gen).view(batch, ppr)
        lens = torch.full((batch,), seq, device="cuda", dtype=torch.int32)

        # FlashMLA: one eager call computes the scheduler metadata; the graph reuses it.
        _, _, meta, nsp = fm.flashmla_dense_decode(q, kv, D_V, lens, table, scale, False, None, None)
        fm_fn = lambda: fm.flashmla_dense_decode(q, kv, D_V, lens, table, scale, False, meta, nsp)[0]

        splits = gs.gs_sm90_num_splits(batch, heads, seq, sm_count, 0)
        ws = torch.zeros(max(gs.gs_sm90_workspace_bytes(batch, heads, splits), 1), device="cuda", dtype=torch.uint8)
        gs_out = torch.empty(batch, heads, D_V, device="cuda", dtype=torch.bfloat16)

        def gs_fn():
            gs.gs_sm90_decode(q, kv, lens, table, gs_out, ws, seq, splits, scale)
            return gs_out

        g_fm, fm_out = make_graph(torch, fm_fn, args.calls)
        g_gs, _ = make_graph(torch, gs_fn, args.calls)
        us_fm, us_gs = (t / args.calls for t in time_alternating(torch, [g_fm, g_gs], args.rounds, args.warmup))

        # Agreement (outputs of the graphs' last calls) and an fp32 reference of a few requests.
        fm_o = fm_out.view(batch, heads, D_V).float()
        gs_o = gs_out.float()
        diff = (fm_o - gs_o).abs().max().item()
        rel = diff / max(fm_o.abs().max().item(), 1e-30)
        finite = bool(torch.isfinite(fm_o).all().item() and torch.isfinite(gs_o).all().item())
        check = sorted({0, batch - 1})
        ref = reference_rows(torch, q, kv, table, seq, check, scale)
        fm_ref = (fm_o[check] - ref).abs().max().item()
        gs_ref = (gs_o[check] - ref).abs().max().item()

        flops = batch * seq * heads * 2.0 * (D_QK + D_V)
        nbytes = batch * seq * D_QK * 2.0 + batch * heads * D_QK * 2.0 + batch * heads * D_V * 2.0
        row = {
            "heads": heads, "batch": batch, "seq": seq, "splits": splits,
            "flashmla_us": round(us_fm, 2), "flashmla_tflop_s": round(flops / us_fm / 1e6, 1),
            "flashmla_gb_s": round(nbytes / us_fm / 1e3, 1), "flashmla_of_copy": round(nbytes / us_fm / 1e3 / copy_gbs, 3),
            "ours_us": round(us_gs, 2), "ours_tflop_s": round(flops / us_gs / 1e6, 1),
            "ours_gb_s": round(nbytes / us_gs / 1e3, 1), "ours_of_copy": round(nbytes / us_gs / 1e3 / copy_gbs, 3),
            "ratio_ours_over_flashmla": round(us_fm / us_gs, 3),
            "max_abs_diff": diff, "max_diff_rel_to_max_out": rel, "flashmla_vs_ref": fm_ref, "ours_vs_ref": gs_ref, "ref_rows": check, "finite": finite,
        }
        rows.append(row)
        log(f"{heads:>5} {batch:>5} {seq:>6} | {us_fm:>11.1f} {row['flashmla_tflop_s']:>8.1f} {row['flashmla_gb_s']:>6.0f} "
            f"{row['flashmla_of_copy']:>6.2f} | {splits:>6} {us_gs:>8.1f} {row['ours_tflop_s']:>8.1f} {row['ours_gb_s']:>6.0f} "
            f"{row['ours_of_copy']:>6.2f} | {row['ratio_ours_over_flashmla']:>6.2f}x | {diff:>9.2e} {rel:>7.1e} {fm_ref:>8.1e} {gs_ref:>8.1e}"
            + ("" if finite else "  NOT FINITE"))
        del g_fm, g_gs, fm_out, fm_fn, gs_fn, q, kv, table, lens, ws, gs_out, meta, nsp
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    log("ours/FM = FlashMLA time / ours (> 1: ours faster). max|diff| = ours vs FlashMLA over every output, "
        "rel = that / max|FlashMLA output|; "
        "FM-ref, ours-ref = each vs fp32 attention on requests " + "first and last.")
    result = {
        "bench": "anchor-flashmla", "device": props.name, "sm_count": sm_count, "torch": torch.__version__,
        "cuda": torch.version.cuda, "flashmla_commit": flashmla_commit(), "build_s": build_s,
        "copy_gb_s": round(copy_gbs, 1), "dtype": "bf16", "page_size": PAGE, "sm_scale": scale,
        "calls_per_graph": args.calls, "rounds": args.rounds, "warmup": args.warmup, "rows": rows,
    }
    log("BENCH_JSON " + json.dumps(result, separators=(",", ":")))
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "anchor-flashmla.json"), "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {os.path.join(out, 'anchor-flashmla.json')}")
    bad = [r for r in rows if not r["finite"] or r["max_diff_rel_to_max_out"] > args.tolerance]
    if bad:
        log(f"bench: {len(bad)} shape(s) where the outputs disagree by more than {args.tolerance} of the largest "
            "output (or are not finite)")
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", choices=["flashmla", "graphsafe"], help="only build this extension")
    ap.add_argument("--build-seconds", type=float, default=None, help="build time to record (run.sh measures it)")
    ap.add_argument("--calls", type=int, default=10, help="decode calls captured in each graph")
    ap.add_argument("--rounds", type=int, default=30, help="timed replays of each graph")
    ap.add_argument("--warmup", type=int, default=5, help="untimed replays of each graph first")
    ap.add_argument("--copy-mib", type=int, default=2048, help="size of the D2D copy baseline")
    ap.add_argument("--shapes", default="", help="HEADSxBATCHxSEQ,... instead of the default 16/128-head shapes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=5e-2,
                    help="max |ours - FlashMLA| accepted, as a fraction of max |FlashMLA output| (bf16 outputs)")
    args = ap.parse_args()

    if args.build:
        _, s = build(args.build)
        log(f"built {args.build} in {s:.1f} s")
        return 0
    fm, s_fm = build("flashmla")  # already built by run.sh: these only load
    gs, s_gs = build("graphsafe")
    build_s = args.build_seconds if args.build_seconds is not None else round(s_fm + s_gs, 1)
    return bench(args, fm, gs, build_s)


if __name__ == "__main__":
    sys.exit(main())

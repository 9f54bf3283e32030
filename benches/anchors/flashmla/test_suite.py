#!/usr/bin/env python3
"""FlashMLA's own dense-decoding test suite, run unmodified against graphsafe.

    python3 benches/anchors/flashmla/test_suite.py --dtype bf16|fp16 [--only correctness,corner,performance]

prepare.sh exports FlashMLA's tests/test_flash_mla_dense_decoding.py and its tests/kernelkit at the
pinned commit into .gpu/anchors/flashmla-src (never into the repository). This runner puts
forward/ (a `flash_mla` module forwarding to graphsafe's C ABI, libgraphsafe.so) first on
sys.path, imports the test file as it is and calls its own main(): its case lists, data, reference,
tolerances (kk.check_is_allclose) and assertions are FlashMLA's. Two things are wrapped, not
changed:
  * each call of its test_flash_mla(case) is counted: passed, refused (graphsafe's
    GRAPHSAFE_ERROR_INVALID_ARGUMENT naming h_kv, for cases with h_kv > 1: MLA has one latent KV
    head; counted apart, never as passed) or failed (an assertion, or any other error), and the run
    goes on to the next case instead of stopping at the first failure;
  * its performance cases time "flash_fwd_splitkv_mla_kernel" by name in the profiler's kernel list;
    that name is looked up as graphsafe's split kernel (graphsafe::mla_sm90::…, not the combine),
    as FlashMLA's timing covers its split kernel.
Decodes run on a torch side stream (graphsafe adopts the caller's stream and refuses the legacy
default one). Exit 0 iff no case failed and every h_kv = 1 case passed.
"""
import argparse
import collections
import importlib
import io
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


class Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--flashmla-src", default=os.environ.get("FLASHMLA_SRC", os.path.join(REPO, ".gpu", "anchors", "flashmla-src")))
    ap.add_argument("--only", default="", help="comma-separated kinds to run: correctness, corner, performance")
    ap.add_argument("--quiet", action="store_true", help="keep the test's own per-case output out of stdout")
    args = ap.parse_args()

    tests = os.path.join(args.flashmla_src, "tests")
    if not os.path.isfile(os.path.join(tests, "test_flash_mla_dense_decoding.py")):
        sys.exit(f"test_suite: no {tests}/test_flash_mla_dense_decoding.py: run prepare.sh and carry .gpu/anchors")
    sys.path[:0] = [os.path.join(HERE, "forward"), tests]
    import torch

    torch.cuda.set_device(0)
    torch.cuda.set_stream(torch.cuda.Stream())
    import flash_mla  # ours: forward/flash_mla
    assert os.path.dirname(flash_mla.__file__).startswith(os.path.join(HERE, "forward")), flash_mla.__file__
    import kernelkit as kk

    # The performance cases' kernel-name lookup: FlashMLA's split kernel name -> graphsafe's.
    orig_match = kk.bench.BenchKinetoRawResult._get_matched_kernel_name

    def match(self, name_substr, allow_no_match=False, allow_multiple_match=False):
        if name_substr == "flash_fwd_splitkv_mla_kernel":
            names = [n for n in self.time_ranges if "mla_sm90" in n and "combine" not in n and "schedule" not in n]
            if len(names) != 1 and not (allow_multiple_match and names):
                raise ValueError(f"graphsafe's split kernel not found once among {list(self.time_ranges)}")
            return names
        return orig_match(self, name_substr, allow_no_match, allow_multiple_match)

    kk.bench.BenchKinetoRawResult._get_matched_kernel_name = match

    mod = importlib.import_module("test_flash_mla_dense_decoding")
    orig_test = mod.test_flash_mla
    only = set(filter(None, args.only.split(",")))
    counts = collections.Counter()
    failures = []
    perf = []

    def kind_of(t):
        return "performance" if t.test_performance else ("corner" if t.have_zero_seqlen_k else "correctness")

    def wrapped(t):
        kind = kind_of(t)
        if only and kind not in only:
            return
        buf = io.StringIO()
        real = sys.stdout
        try:
            sys.stdout = buf if args.quiet else Tee(buf, real)
            orig_test(t)
        except flash_mla.GraphsafeError as e:
            if t.h_kv != 1 and e.status == "INVALID_ARGUMENT" and "h_kv" in e.text:
                counts[(kind, "refused")] += 1
            else:
                counts[(kind, "failed")] += 1
                failures.append((t, f"{e}"))
        except Exception as e:  # noqa: BLE001 - an assertion or any other error is a failed case
            counts[(kind, "failed")] += 1
            failures.append((t, "".join(traceback.format_exception_only(type(e), e)).strip() + "\n" + buf.getvalue()[-2000:]))
        else:
            if t.h_kv != 1:
                counts[(kind, "failed")] += 1
                failures.append((t, "a case with h_kv > 1 ran instead of being refused"))
            else:
                counts[(kind, "passed")] += 1
                if t.test_performance:
                    line = [l for l in buf.getvalue().splitlines() if "TFLOPS" in l]
                    perf.append((t, line[-1] if line else ""))
        finally:
            sys.stdout = real
        n = sum(counts.values())
        if n % 100 == 0:
            print(f"test_suite: {n} cases, {dict(counts)}", flush=True)

    mod.test_flash_mla = wrapped
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    t0 = time.time()
    mod.main(dtype)
    secs = time.time() - t0

    print("=" * 100)
    print(f"FlashMLA {open(os.path.join(args.flashmla_src, 'FLASHMLA_COMMIT')).read().strip() if os.path.exists(os.path.join(args.flashmla_src, 'FLASHMLA_COMMIT')) else '?'} "
          f"tests/test_flash_mla_dense_decoding.py --dtype {args.dtype} against graphsafe ({flash_mla._graphsafe().version()}), "
          f"{torch.cuda.get_device_name()}, {secs:.0f} s")
    for kind in ("correctness", "corner", "performance"):
        p, r, f = counts[(kind, "passed")], counts[(kind, "refused")], counts[(kind, "failed")]
        print(f"  {kind:12s} passed {p:5d}   refused (h_kv > 1) {r:5d}   failed {f:5d}   total {p + r + f:5d}")
    for t, line in perf:
        print(f"  perf b={t.b} s_q={t.s_q} s_k={t.s_k} causal={t.is_causal}: {line}")
    for t, why in failures[:20]:
        print(f"FAILED {t}: {why}")
    total_failed = sum(v for (k, s), v in counts.items() if s == "failed")
    print(f"SUITE {'PASS' if total_failed == 0 else 'FAIL'}: {sum(v for (k, s), v in counts.items() if s == 'passed')} passed, "
          f"{sum(v for (k, s), v in counts.items() if s == 'refused')} refused, {total_failed} failed")
    return 0 if total_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# FlashMLA's acceptance of graphsafe's MLA decode, on the GPU machine (H200: nvcc, PyTorch, Triton;
# no network, no Rust), from the repository root, after prepare.sh and with .gpu/lib/libgraphsafe.so
# (cargo build --release -p graphsafe-clib here, GRAPHSAFE_CUDA_ARCHS=sm_90a, copied there) carried along:
#
#   bash benches/anchors/flashmla/acceptance.sh [suite|speed|all]     (default all)
#
#   suite  FlashMLA's tests/test_flash_mla_dense_decoding.py, unmodified, against graphsafe through a
#          forwarding flash_mla module (test_suite.py), --dtype bf16 and fp16 side by side; prints
#          the passed / refused (h_kv > 1) / failed counts of each.
#   speed  speed.py: FlashMLA's 16 performance cases, FlashMLA against graphsafe in one process
#          (builds FlashMLA's extension first, as run.sh does), and 16/32 heads against the copy rate.
# Logs and JSON under $OUT when it is set. Exit status: non-zero if a suite case failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
cd "$repo"
what=${1:-all}
out=${OUT:-/tmp/graphsafe-acceptance}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 GRAPHSAFE_LIB=${GRAPHSAFE_LIB:-$repo/.gpu/lib/libgraphsafe.so}
[ -f "$GRAPHSAFE_LIB" ] || { echo "acceptance: no $GRAPHSAFE_LIB (build libgraphsafe.so and carry it)"; exit 2; }
rc=0
if [ "$what" = speed ] || [ "$what" = all ]; then
  # FlashMLA's extension builds (about 100 s) while the suites run.
  ( [ -f .gpu/anchors/cutlass-include.tar.gz ] && ! [ -d /tmp/graphsafe-anchor/cutlass-include/cute ] &&
      mkdir -p /tmp/graphsafe-anchor/cutlass-include && tar -xzf .gpu/anchors/cutlass-include.tar.gz -C /tmp/graphsafe-anchor/cutlass-include
    python3 "$here/bench.py" --build flashmla > "$out/build-flashmla.log" 2>&1 ) & build=$!
fi
if [ "$what" = suite ] || [ "$what" = all ]; then
  python3 "$here/test_suite.py" --dtype bf16 --quiet > "$out/suite-bf16.log" 2>&1 & a=$!
  python3 "$here/test_suite.py" --dtype fp16 --quiet > "$out/suite-fp16.log" 2>&1 & b=$!
  wait $a || rc=1
  wait $b || rc=1
  for d in bf16 fp16; do echo "== suite --dtype $d"; sed -n '/^=====/,$p' "$out/suite-$d.log" | head -40; tail -3 "$out/suite-$d.log" | grep -v SUITE; done
fi
if [ "$what" = speed ] || [ "$what" = all ]; then
  wait $build || { echo "acceptance: the FlashMLA build failed:"; tail -30 "$out/build-flashmla.log"; exit 1; }
  # shellcheck disable=SC2086
  CUTLASS_INCLUDE=/tmp/graphsafe-anchor/cutlass-include python3 "$here/speed.py" ${SPEED_ARGS:-} 2>&1 | tee "$out/speed.log" || rc=1
fi
exit $rc

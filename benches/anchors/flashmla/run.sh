#!/usr/bin/env bash
# FlashMLA anchor, on the GPU machine (H200, nvcc 13, PyTorch, no network, no
# Rust), from the repository root:
#
#   bash benches/anchors/flashmla/run.sh [bench.py options]
#
# Needs what prepare.sh put under .gpu/anchors (carry it): FlashMLA's dense-decode export and the
# CUTLASS headers. Builds two torch JIT extensions under /tmp in parallel (FlashMLA's dense sm90
# decode with its own flags, graphsafe's sm90 decode from cuda-src/ with the crate's flags), then
# times both on bench.py's default shapes (16 and 128 heads) and prints the table; with $OUT set it also writes
# $OUT/anchor-flashmla.json (and the build logs). Options (see bench.py --help): --calls, --rounds,
# --warmup, --shapes HxBxS,..., --copy-mib.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
work="${ANCHOR_WORK:-/tmp/graphsafe-anchor}"
export ANCHOR_WORK="$work"
mkdir -p "$work"
cd "$repo"

[ -f .gpu/anchors/flashmla-src/csrc/api/dense_decode.h ] || {
  echo "run: no .gpu/anchors/flashmla-src: run benches/anchors/flashmla/prepare.sh on the dev machine and carry .gpu/anchors" >&2
  exit 1
}
# CUTLASS headers: $CUTLASS_INCLUDE, else the carried tree, else the carried tarball unpacked here.
if [ -z "${CUTLASS_INCLUDE:-}" ]; then
  if [ -d .gpu/anchors/cutlass-include/cute ]; then
    export CUTLASS_INCLUDE="$repo/.gpu/anchors/cutlass-include"
  elif [ -f .gpu/anchors/cutlass-include.tar.gz ]; then
    if [ ! -d "$work/cutlass-include/cute" ]; then
      rm -rf "$work/cutlass-include.tmp" && mkdir -p "$work/cutlass-include.tmp"
      tar -xzf .gpu/anchors/cutlass-include.tar.gz -C "$work/cutlass-include.tmp"
      rm -rf "$work/cutlass-include" && mv "$work/cutlass-include.tmp" "$work/cutlass-include"
    fi
    export CUTLASS_INCLUDE="$work/cutlass-include"
  else
    echo "run: no CUTLASS headers under .gpu/anchors (prepare.sh makes them)" >&2
    exit 1
  fi
fi

# The commit can be stale on a copied working tree (the GPU machine's copy keeps an older .git), so
# also the hash of the sources the graphsafe side is built from.
src_hash=$(find cuda-src include -type f | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12)
echo "run: FlashMLA $(cat .gpu/anchors/flashmla-src/FLASHMLA_COMMIT 2>/dev/null || echo '?'), graphsafe $(git rev-parse --short HEAD 2>/dev/null || echo '?') (cuda-src + include sha1 $src_hash), nvcc: $(command -v nvcc || echo none)"
nvcc --version 2>/dev/null | tail -1 || true
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true

# The two builds in parallel (each its own ninja; about 100 s for FlashMLA's kernel).
t0=$(date +%s.%N)
python3 "$here/bench.py" --build flashmla > "$work/build-flashmla.log" 2>&1 & p1=$!
python3 "$here/bench.py" --build graphsafe > "$work/build-graphsafe.log" 2>&1 & p2=$!
rc=0
wait $p1 || rc=1
wait $p2 || rc=$((rc | 2))
t1=$(date +%s.%N)
build_s=$(python3 -c "print(round($t1 - $t0, 1))")
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$work"/build-*.log "$OUT"/ 2>/dev/null || true; fi
if [ $rc -ne 0 ]; then
  [ $((rc & 1)) -ne 0 ] && { echo "run: the FlashMLA build failed:"; tail -n 60 "$work/build-flashmla.log"; }
  [ $((rc & 2)) -ne 0 ] && { echo "run: the graphsafe build failed:"; tail -n 60 "$work/build-graphsafe.log"; }
  exit 1
fi
tail -n 1 "$work/build-flashmla.log"
tail -n 1 "$work/build-graphsafe.log"
echo "run: build time (both, in parallel): $build_s s"

python3 "$here/bench.py" --build-seconds "$build_s" "$@"

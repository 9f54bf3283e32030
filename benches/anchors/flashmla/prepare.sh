#!/usr/bin/env bash
# Prepares the FlashMLA anchor on the development machine: exports, from a local
# mirror of FlashMLA at one pinned commit, only the files of its dense Hopper bf16 decode, and packs
# the provisioned CUTLASS 4.2 headers, both into the git-ignored .gpu/ folder, which travels to the
# GPU machine. FlashMLA's code is never committed to this repository.
#
#   bash benches/anchors/flashmla/prepare.sh [DEST]      DEST default: .gpu/anchors/flashmla-src
#
# Then, on the GPU machine, from the repository root: bash benches/anchors/flashmla/run.sh
#
# Environment:
#   FLASHMLA_GIT_DIR   a git dir (bare is fine) that has FLASHMLA_COMMIT; default: the search tool's
#                      mirror of github:deepseek-ai/FlashMLA under /work/.mirror
#   CUTLASS_INCLUDE    the CUTLASS include/ folder to carry (cute/ and cutlass/); default: the
#                      provisioned CUTLASS 4.2 under ~/.cache/graphsafe/toolchain
#   CUTLASS_AS_TREE=1  copy that folder as a plain tree (.gpu/anchors/cutlass-include, ~27 MB)
#                      instead of the default gzip tarball (.gpu/anchors/cutlass-include.tar.gz,
#                      ~2.4 MB; run.sh unpacks it under /tmp), to keep the carried .gpu small
set -euo pipefail

# The newest FlashMLA commit with the dense sm90 decode (2026-04-29, "Swap FlashMLA combine grid
# dimensions (#182)"). Its dense decode: csrc/sm90/decode/dense, the combine kernel and the
# scheduler-metadata kernel under csrc/smxx/decode, the torch-facing interface csrc/api/dense_decode.h.
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0

# The paths of that commit that the dense bf16 decode compiles from (nothing of sm100, the sparse
# kernels, prefill, or the fp16 instantiation; the CUTLASS submodule is not taken either), and its
# dense-decoding test with the kernelkit helpers it imports (test_suite.py runs it unmodified).
FLASHMLA_PATHS=(
  LICENSE
  csrc/api/common.h
  csrc/api/dense_decode.h
  csrc/params.h
  csrc/utils.h
  csrc/defines.h
  csrc/kerutils/include
  csrc/sm90/decode/dense/config.h
  csrc/sm90/decode/dense/traits.h
  csrc/sm90/decode/dense/splitkv_mla.h
  csrc/sm90/decode/dense/splitkv_mla.cuh
  csrc/sm90/decode/dense/instantiations/bf16.cu
  csrc/smxx/decode/combine
  csrc/smxx/decode/get_decoding_sched_meta
  tests/test_flash_mla_dense_decoding.py
  tests/kernelkit
)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
dest="$(realpath -m "${1:-$repo/.gpu/anchors/flashmla-src}")"
anchors="$(dirname "$dest")"
git_dir="${FLASHMLA_GIT_DIR:-/work/.mirror/deepseek-ai+FlashMLA/repo}"
cutlass_inc="${CUTLASS_INCLUDE:-$HOME/.cache/graphsafe/toolchain/cutlass-4.2.0.0-e6a0081f3f18/cutlass_library/source/include}"

# The export must stay out of git: refuse a destination inside the repository that git would track.
case "$dest" in
  "$repo"/*)
    if ! git -C "$repo" check-ignore -q "$dest"; then
      echo "prepare: $dest is inside the repository and not ignored by git; FlashMLA's code must not be committed" >&2
      exit 1
    fi ;;
esac

if ! git --git-dir="$git_dir" cat-file -e "$FLASHMLA_COMMIT^{commit}" 2>/dev/null; then
  echo "prepare: $git_dir has no commit $FLASHMLA_COMMIT." >&2
  echo "  Mirror github:deepseek-ai/FlashMLA first (the search tool's fetch), or set FLASHMLA_GIT_DIR." >&2
  exit 1
fi
for f in cute cutlass; do
  [ -d "$cutlass_inc/$f" ] || { echo "prepare: no $cutlass_inc/$f (set CUTLASS_INCLUDE)" >&2; exit 1; }
done

# 1. FlashMLA's dense decode sources at the pinned commit.
rm -rf "$dest"
mkdir -p "$dest"
git --git-dir="$git_dir" archive "$FLASHMLA_COMMIT" "${FLASHMLA_PATHS[@]}" | tar -x -C "$dest"
echo "$FLASHMLA_COMMIT" > "$dest/FLASHMLA_COMMIT"

# 2. CUTLASS's headers (cute/ and cutlass/ only).
rm -rf "$anchors/cutlass-include" "$anchors/cutlass-include.tar.gz"
if [ "${CUTLASS_AS_TREE:-0}" = 1 ]; then
  mkdir -p "$anchors/cutlass-include"
  cp -a "$cutlass_inc/cute" "$cutlass_inc/cutlass" "$anchors/cutlass-include/"
  cutlass_out="$anchors/cutlass-include"
else
  tar -C "$cutlass_inc" -czf "$anchors/cutlass-include.tar.gz" cute cutlass
  cutlass_out="$anchors/cutlass-include.tar.gz"
fi

echo "prepare: FlashMLA $FLASHMLA_COMMIT -> $dest ($(du -sh "$dest" | cut -f1), $(find "$dest" -type f | wc -l) files)"
echo "prepare: CUTLASS headers from $cutlass_inc -> $cutlass_out ($(du -sh "$cutlass_out" | cut -f1))"
echo "prepare: $anchors in all: $(du -sh "$anchors" | cut -f1)"

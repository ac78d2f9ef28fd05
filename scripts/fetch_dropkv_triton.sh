#!/usr/bin/env bash
# Copies the DropKV authors' Triton kernel (dropkv_triton.py of the public repository
# AozhongZhang/DropKV) into the git-ignored .ext/dropkv/, which travels with the GPU run
# (carry .ext); tools/torch_reference_bench.py times it when present and skips its rows
# otherwise. The authors' code is never committed here.
# Source, first found:
#   1. DROPKV_SRC=FILE        a copy of dropkv_triton.py
#   2. DROPKV_SRC=DIR         a checkout holding dropkv_triton.py
#   3. a local mirror of the repository: a bare git directory under ${MIRROR_ROOT:-/work/.mirror}
#      named AozhongZhang+DropKV* (the file is read from its HEAD, or DROPKV_COMMIT)
# Writes .ext/dropkv/dropkv_triton.py and .ext/dropkv/SOURCE.txt (origin, commit, sha256).
# Usage: bash scripts/fetch_dropkv_triton.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.ext/dropkv
FILE=dropkv_triton.py
REPO=AozhongZhang/DropKV
mkdir -p "$DEST"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
origin="" commit=""
src="${DROPKV_SRC:-}"
if [ -n "$src" ] && [ -f "$src" ]; then
  cp "$src" "$tmp"
  origin="$src"
elif [ -n "$src" ] && [ -f "$src/$FILE" ]; then
  cp "$src/$FILE" "$tmp"
  origin="$src/$FILE"
  commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || true)
else
  gitdir=""
  for d in "${MIRROR_ROOT:-/work/.mirror}"/AozhongZhang+DropKV*; do
    [ -e "$d" ] || continue
    # The mirror is a git directory, or holds one.
    for g in "$d" "$d"/*; do
      if git --git-dir="$g" rev-parse --verify -q HEAD >/dev/null 2>&1; then gitdir=$g; break 2; fi
    done
  done
  if [ -z "$gitdir" ]; then
    echo "fetch_dropkv_triton: no source: set DROPKV_SRC, or mirror $REPO under ${MIRROR_ROOT:-/work/.mirror}" >&2
    if [ -f "$DEST/$FILE" ]; then
      echo "fetch_dropkv_triton: keeping the copy already in $DEST ($(head -n 1 "$DEST/SOURCE.txt" 2>/dev/null))" >&2
      exit 0
    fi
    exit 1
  fi
  commit=$(git --git-dir="$gitdir" rev-parse "${DROPKV_COMMIT:-HEAD}")
  git --git-dir="$gitdir" show "$commit:$FILE" >"$tmp"
  origin="$REPO mirror $gitdir"
fi
grep -q "^def dropkv_scores_triton" "$tmp" || { echo "fetch_dropkv_triton: $origin has no dropkv_scores_triton" >&2; exit 1; }
cp "$tmp" "$DEST/$FILE"
{
  echo "$REPO $FILE${commit:+ at $commit}"
  echo "copied from $origin on $(date -u +%F)"
  echo "sha256 $(sha256sum "$DEST/$FILE" | cut -d' ' -f1)"
} >"$DEST/SOURCE.txt"
cat "$DEST/SOURCE.txt"
git check-ignore -q "$DEST/$FILE" || echo "fetch_dropkv_triton: WARNING: $DEST is not git-ignored" >&2

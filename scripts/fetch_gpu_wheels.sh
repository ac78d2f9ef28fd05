#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) exactly the wheels the GPU machine lacks for the kvpress
# rows of tools/torch_reference_bench.py: the pinned list tools/requirements-kvpress.txt, as
# CPython 3.12 manylinux x86_64 wheels, without dependencies (every needed one is listed there,
# one version each). A package published only as an sdist (fire 0.6.0) is built here into a
# pure-Python wheel. Carry .whl with the run; scripts/gpu_run.sh (section wheels) installs it
# with pip --no-index --no-deps --target and puts the target first on PYTHONPATH.
# Usage: bash scripts/fetch_gpu_wheels.sh          (then: du -sh .whl gpu_bundle)
# Environment: WHEEL_DIR (default .whl), PYTHON (default python3), WHEEL_BUDGET_MB (default
# 16: the carried tree, gpu_bundle/ included, must stay under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${WHEEL_DIR:-.whl}"
PYTHON="${PYTHON:-python3}"
BUDGET_MB="${WHEEL_BUDGET_MB:-16}"
LIST=tools/requirements-kvpress.txt
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64)

# download SPEC: the wheel of SPEC for the GPU machine's interpreter, or false.
download() {
  local args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
  local p
  for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
  "$PYTHON" -m pip download -q "${args[@]}" -d "$DEST" "$1"
}

# build_pure SPEC: builds SPEC from its sdist into a wheel; fails unless it is pure Python.
build_pure() {
  local tmp
  tmp=$(mktemp -d)
  "$PYTHON" -m pip wheel -q --no-deps --no-binary=:all: -w "$tmp" "$1"
  local wheel
  wheel=$(ls "$tmp"/*.whl)
  case "$wheel" in
    *-none-any.whl) mv "$wheel" "$DEST/" ;;
    *) echo "fetch_gpu_wheels: $1 built a platform wheel ($wheel); refusing" >&2; rm -rf "$tmp"; return 1 ;;
  esac
  rm -rf "$tmp"
}

rm -rf "$DEST"
mkdir -p "$DEST"
grep -vE '^\s*(#|$)' "$LIST" | while read -r spec; do
  if ! download "$spec" 2>/dev/null; then
    echo "fetch_gpu_wheels: no wheel for $spec; building it from its sdist"
    build_pure "$spec"
  fi
done

# One version of each distribution: two versions of one package stop the whole install.
dupes=$(ls "$DEST" | sed -E 's/-[0-9][^-]*-.*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "fetch_gpu_wheels: several versions of: $dupes" >&2; exit 1; }
expected=$(grep -cvE '^\s*(#|$)' "$LIST")
found=$(ls "$DEST"/*.whl | wc -l)
[ "$found" -eq "$expected" ] || { echo "fetch_gpu_wheels: $found wheels for $expected pins" >&2; exit 1; }

ls -l "$DEST"
total=$(du -cb "$DEST"/*.whl | tail -n 1 | cut -f1)
echo "fetch_gpu_wheels: $found wheels, $((total / 1024)) KiB in $DEST"
if [ "$total" -gt $((BUDGET_MB * 1024 * 1024)) ]; then
  echo "fetch_gpu_wheels: over the ${BUDGET_MB} MiB budget" >&2
  exit 1
fi

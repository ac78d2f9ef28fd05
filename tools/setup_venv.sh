#!/usr/bin/env bash
# Creates the git-ignored virtual environment .venv at the repository root and installs the
# pinned Python dependencies of tools/ (tools/requirements.txt).
# With --bench it also installs what tools/torch_reference_bench.py needs to run on this CPU
# (--device=cpu): tools/requirements-bench.txt (torch 2.11 from PyPI and the packages the GPU
# machine's image has), then the kvpress set tools/requirements-kvpress.txt with --no-deps
# (exactly the wheels scripts/fetch_gpu_wheels.sh carries to the GPU machine; no datasets).
# Usage: tools/setup_venv.sh [--bench]    then: .venv/bin/python tools/make_sample.py
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$repo/.venv/bin/python" ]; then
  "$python" -m venv "$repo/.venv"
fi
"$repo/.venv/bin/python" -m pip install --quiet --upgrade pip
"$repo/.venv/bin/python" -m pip install --quiet -r "$repo/tools/requirements.txt"
"$repo/.venv/bin/python" -c 'import numpy, safetensors; print("venv ready: numpy", numpy.__version__, "safetensors", safetensors.__version__)'
if [ "${1:-}" = "--bench" ]; then
  "$repo/.venv/bin/python" -m pip install --quiet -r "$repo/tools/requirements-bench.txt"
  "$repo/.venv/bin/python" -m pip install --quiet --no-deps -r "$repo/tools/requirements-kvpress.txt"
  "$repo/.venv/bin/python" -c 'import torch, transformers; print("bench venv ready: torch", torch.__version__, "transformers", transformers.__version__)'
fi

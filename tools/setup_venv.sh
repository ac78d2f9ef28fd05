#!/usr/bin/env bash
# Creates the git-ignored virtual environment /work/main/.venv (the repository's .venv) and
# installs the pinned Python dependencies of tools/ (tools/requirements.txt).
# Usage: tools/setup_venv.sh            then: .venv/bin/python tools/make_sample.py
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$repo/.venv/bin/python" ]; then
  "$python" -m venv "$repo/.venv"
fi
"$repo/.venv/bin/python" -m pip install --quiet --upgrade pip
"$repo/.venv/bin/python" -m pip install --quiet -r "$repo/tools/requirements.txt"
"$repo/.venv/bin/python" -c 'import numpy, safetensors; print("venv ready: numpy", numpy.__version__, "safetensors", safetensors.__version__)'

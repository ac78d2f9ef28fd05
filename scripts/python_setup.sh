#!/usr/bin/env bash
# Creates the repo's virtual environment .venv (tools/setup_venv.sh) and installs the kvtrim
# Python package from client/python with its pinned dependencies
# (client/python/requirements.txt). The gRPC stubs are generated from proto/ while pip builds
# the package. Run again after changing the package or the proto.
# Usage: bash scripts/python_setup.sh          then: .venv/bin/python -c 'import kvtrim'
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/tools/setup_venv.sh"
"$repo/.venv/bin/python" -m pip install --quiet -r "$repo/client/python/requirements.txt"
"$repo/.venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$repo/client/python"
# pip builds in-tree: drop its build products so the source tree stays clean.
rm -rf "$repo/client/python/build" "$repo/client/python"/*.egg-info
"$repo/.venv/bin/python" -c 'import kvtrim; print("kvtrim", kvtrim.__version__, "installed")'

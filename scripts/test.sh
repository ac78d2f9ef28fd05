#!/usr/bin/env bash
# The test command: installs dependencies, builds everything, runs every test with ctest.
# GPU tests skip cleanly on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/python_setup.sh
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" --timeout 600

#!/usr/bin/env bash
# Soak test of kvtrimd (issue 17): tools/soak.py with the repository's .venv and build dir.
# kvtrimd, kvtrim-loadgen and libkvtrim.so are copied out of BUILD_DIR into a temporary
# directory first (the build tree may be rebuilt meanwhile). Loopback only, port 0, niced.
# Writes docs/bench/soak.json and docs/bench/soak.md; exit 1 when a goal fails, 2 when the
# run was aborted. Environment: BUILD_DIR (build), CLIENTS (64), DURATION (600 s), NICE (10);
# further arguments go to tools/soak.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS="${CLIENTS:-64}"
DURATION="${DURATION:-600}"
# tools/soak.py caps itself at about DURATION + 425 s; this outer cap only backs it up.
exec timeout --kill-after=30 "$((${DURATION%.*} + 600))" nice -n "${NICE:-10}" \
  .venv/bin/python tools/soak.py --build_dir "${BUILD_DIR:-build}" --clients "$CLIENTS" \
  --duration "$DURATION" "$@"

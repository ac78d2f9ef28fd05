#!/usr/bin/env bash
# The Python client on the GPU machine: its whole pytest suite (CPU-backend tests, CUDA IPC
# from torch tensors against kvtrimd --backend=gpu, kvtrim.local on CUDA tensors, kvtrim.hf on
# real and random models) and tools/python_client_bench.py beside the C++ load generator, in
# one call.
# Prepare here: bash scripts/gpu_bundle.sh kvtrimd kvtrim kvtrim-loadgen kvtrim_c
# kvtrim-c-session-bench (it also copies ../shared/models/stories260K.bin into
# gpu_bundle/models; the last target is optional: the C ABI's sessions from C++), then
#   .venv/bin/python -m pip wheel -q --no-deps client/python -w .whl
# and carry gpu_bundle and .whl. Run there: bash scripts/gpu_python.sh (or SECTIONS=python
# bash scripts/gpu_run.sh). Output under $OUT: python_tests.xml, python_tests.log,
# python.json, python.md, python_breakdown.json (tools/python_latency_breakdown.py),
# python_probe.json and .log (tools/python_overhead_probe.py), the load generator's JSON and
# kvtrimd_python.log.
# Environment: OUT (default out), BUNDLE (gpu_bundle), PYTEST_ARGS (extra pytest arguments).
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
RC=0
PYLIB=$(mktemp -d)
wheel=$(ls .whl/kvtrim-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "gpu_python: no .whl/kvtrim-*.whl carried"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$PYLIB" "$wheel" || exit 1
export PYTHONPATH="$PYLIB${PYTHONPATH:+:$PYTHONPATH}"
export KVTRIMD_PATH="$BIN/kvtrimd" KVTRIM_CLI_PATH="$BIN/kvtrim" PYTHONDONTWRITEBYTECODE=1
export KVTRIM_LIBRARY="$ROOT/$BUNDLE/lib/libkvtrim.so"
if [ -f "$BUNDLE/models/stories260K.bin" ]; then
  export KVTRIM_STORIES260K="$ROOT/$BUNDLE/models/stories260K.bin"
fi
python3 -c 'import kvtrim, torch, transformers as t; print(kvtrim.__version__, torch.__version__,
  t.__version__)'

echo "== pytest: client/python/tests tools/tests"
# shellcheck disable=SC2086
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs client/python/tests tools/tests \
  --junitxml="$OUT/python_tests.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/python_tests.log" |
  tail -n 40
[ "${PIPESTATUS[0]}" -eq 0 ] || RC=1

echo "== kvtrimd --backend=gpu --allow_client_shm; tools/python_client_bench.py"
start_kvtrimd "$OUT/kvtrimd_python.log" --backend=gpu --allow_client_shm --listen=127.0.0.1:0 \
  --metrics_listen= --workers=2 --max_message_bytes=$((256 << 20)) || exit 1
c_bench=()
[ -x "$BIN/kvtrim-c-session-bench" ] &&
  c_bench=(--c_session_bench "$BIN/kvtrim-c-session-bench")
timeout 300 python3 tools/python_client_bench.py --target "$address" \
  --loadgen "$BIN/kvtrim-loadgen" --library "$KVTRIM_LIBRARY" --out "$OUT/python.json" \
  --md "$OUT/python.md" "${c_bench[@]}" || RC=1
echo "== tools/python_latency_breakdown.py"
timeout 120 python3 tools/python_latency_breakdown.py --target "$address" \
  --library "$KVTRIM_LIBRARY" --out "$OUT/python_breakdown.json" || RC=1
echo "== tools/python_overhead_probe.py"
timeout 120 python3 tools/python_overhead_probe.py --library "$KVTRIM_LIBRARY" \
  --target "$address" --out "$OUT/python_probe.json" >"$OUT/python_probe.log" 2>&1 || RC=1
grep -E "compress\(\)|_seconds|inline|session" "$OUT/python_probe.log"
kill -TERM "$pid"
wait "$pid" || RC=1
exit "$RC"

#!/usr/bin/env bash
# RegisterModel at full size on the GPU host (issue 13): a synthetic Llama-3.1-8B-shaped
# bundle (32 layers, w_o [4096, 4096] f32 and the query statistics, 2.3 GB) written by
# tools/make_model_bundle.py, its bytes read once (the reference), then registered with
# `kvtrim register-model` into a kvtrimd without and with --data_dir; then 32K prefills of
# Expected Attention and CriticalKV against the registered model with kvtrim-loadgen.
# Output under $OUT: register_model.txt, register_loadgen_<policy>.json.
# Environment: OUT (default out), BUNDLE (gpu_bundle); for a small local try: LAYERS,
# HIDDEN, TOKENS, BACKEND=cpu, PYTHON (a python with NumPy).
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
RC=0
work=$(mktemp -d)
model="$work/llama8b.safetensors"
report="$OUT/register_model.txt"
PYTHON="${PYTHON:-python3}"
"$PYTHON" tools/make_model_bundle.py --out "$model" --layers "${LAYERS:-32}" \
  --hidden "${HIDDEN:-4096}" --query_stats | tee "$report"
now() { date +%s.%N; }
elapsed() { python3 -c "print(f'{$2 - $1:.3f}')"; }
echo "host: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')" | tee -a "$report"
if [ -x "$BIN/kvtrim_cpu_bench" ]; then
  # The build's Gram matrices alone (one and four layers, every core).
  "$BIN/kvtrim_cpu_bench" --benchmark_filter=BuildModel 2>&1 | grep BM_ | tee -a "$report"
fi
t0=$(now); cat "$model" >/dev/null; t1=$(now); cat "$model" >/dev/null; t2=$(now)
echo "read the bundle's bytes: $(elapsed "$t0" "$t1") s, again $(elapsed "$t1" "$t2") s" | tee -a "$report"

for mode in memory data_dir; do
  args=()
  [ "$mode" = data_dir ] && args=(--data_dir="$work/models")
  start_kvtrimd "$OUT/register_kvtrimd_$mode.log" --backend="${BACKEND:-gpu}" \
    --listen=127.0.0.1:0 --metrics_listen= --workers=2 --max_model_bytes=$((8 << 30)) \
    "${args[@]}" || exit 1
  t0=$(now)
  digest=$(timeout 300 "$BIN/kvtrim" --target="$address" register-model --model="$model") || RC=1
  t1=$(now)
  echo "register-model ($mode): $(elapsed "$t0" "$t1") s -> $digest" | tee -a "$report"
  if [ "$mode" = memory ] && [ -n "$digest" ]; then
    for policy in expected_attention criticalkv; do
      timeout 120 "$BIN/kvtrim-loadgen" --target="$address" --policy="$policy" \
        --keep_fraction=0.2 --tokens="${TOKENS:-32768}" --layers="${LAYERS:-32}" --prefills=2 \
        --warmup_prefills=1 \
        --serial --perturbation=off --model_digest="$digest" \
        --json_out="$OUT/register_loadgen_$policy.json" | tail -n 22 | tee -a "$report" ||
        { echo "loadgen $policy failed"; RC=1; }
    done
  fi
  kill -TERM "$pid"
  wait "$pid" || { echo "kvtrimd exit status $?"; RC=1; }
done
rm -rf "$work"
exit "$RC"

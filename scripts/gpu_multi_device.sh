#!/usr/bin/env bash
# One kvtrimd over every GPU of a node (issue 13), on a machine with two or more GPUs:
# the CUDA IPC tests against a kvtrimd serving all devices, CUDA IPC prefills from a worker
# on each device (computed where the memory lives), inline prefills from several workers
# (spread over the devices), and kvtrim_device_layers_total{device} read from /metrics.
# Output under $OUT: multi_ipc_test.xml, multi_loadgen_<run>.json, multi_metrics.txt,
# multi_device.log. Environment: OUT (default out), BUNDLE (gpu_bundle).
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
RC=0
devices=$(nvidia-smi -L | wc -l)
echo "== $devices GPU(s)"
[ "$devices" -ge 2 ] || { echo "needs two GPUs"; exit 1; }

echo "== CUDA IPC tests against a kvtrimd serving every device"
KVTRIMD_PATH="$BIN/kvtrimd" timeout 240 "$BIN/kvtrim_ipc_test" \
  --gtest_output="xml:$OUT/multi_ipc_test.xml" || RC=1

server_log="$OUT/multi_device.log"
start_kvtrimd "$server_log" --backend=gpu --devices=all --allow_client_shm \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:19464 --workers=2 \
  --max_message_bytes=$((64 << 20)) || exit 1
cat "$server_log"

run() {
  local name=$1
  shift
  echo "== loadgen $name: $*"
  timeout 120 "$BIN/kvtrim-loadgen" --target="$address" --policy=dropkv --keep_fraction=0.2 \
    --tokens=32768 --layers=8 --prefills=2 --warmup_prefills=1 \
    --json_out="$OUT/multi_loadgen_$name.json" "$@" | tail -n 4 ||
    { echo "loadgen $name failed"; RC=1; }
}
metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:19464/metrics').read().decode())" | grep '^kvtrim_device_layers_total'; }

for d in $(seq 0 $((devices - 1))); do
  run "ipc_device$d" --transport=cuda_ipc --device="$d" --serial --output_region
  metrics | tee -a "$OUT/multi_metrics.txt"
done
run inline_w4 --transport=inline --workers=4 --prefills=1 --warmup_prefills=0
metrics | tee -a "$OUT/multi_metrics.txt"
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd exit status $?"; RC=1; }
exit "$RC"

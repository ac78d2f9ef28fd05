#!/usr/bin/env bash
# Issue 5 on the GPU machine: the CUDA IPC transport tests, then a Llama-3.1-8B-shaped
# prefill (32 layers, H_kv 8, H_q 32, d 128, w 32, bf16, DropKV keep 20 %) driven by the
# worker-side load generator through each transport, beside the kernel time alone
# (kvtrim_gpu_bench) and a same-run PyTorch SDPA prefill (tools/sdpa_prefill_bench.py).
# Run by scripts/gpu_run.sh (section `transport`), or alone from the repo copy with the
# bundle: bash scripts/gpu_transport.sh. Output under $OUT: ipc_test.xml, kernel/ (gpu
# bench json/csv), sdpa_prefill.json, loadgen_<run>.json, transport.log.
# Environment: OUT (default out), BUNDLE (gpu_bundle), RUNS (default: every run below),
# THREADS_TOP=1 (the busiest threads of each run, top -H; THREADS_TOP_SAMPLES, default 8).
# Each run also prints the host's CPU use over it (/proc/stat).
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
RC=0

echo "== CUDA IPC transport tests (kvtrim_ipc_test)"
KVTRIMD_PATH="$BIN/kvtrimd" timeout 240 "$BIN/kvtrim_ipc_test" \
  --gtest_output="xml:$OUT/ipc_test.xml" || RC=1

echo "== kernel time alone (kvtrim_gpu_bench, dropkv)"
mkdir -p "$OUT/kernel"
timeout 120 "$BIN/kvtrim_gpu_bench" --out="$OUT/kernel" --policies=dropkv --n=32768,131072 \
  --w=32 --reps=20 --warmup=2 --copy_mib=1024 | grep -vE "^\s*$" | tail -n 20 || RC=1

echo "== PyTorch SDPA prefill (same run)"
timeout 120 python3 tools/sdpa_prefill_bench.py --out "$OUT/sdpa_prefill.json" || RC=1

echo "== kvtrimd --backend=gpu --allow_client_shm"
server_log="$OUT/kvtrimd_transport.log"
start_kvtrimd "$server_log" --backend=gpu --allow_client_shm --listen=127.0.0.1:0 \
  --metrics_listen= --workers=2 --max_message_bytes=$((64 << 20)) || exit 1
cat "$server_log"

# run NAME CAP ARGS...: one load-generator run -> loadgen_NAME.json
# cpu_ticks: "busy total" jiffies of all cores from /proc/stat (the host's CPU use over a run).
cpu_ticks() {
  awk '/^cpu /{busy=$2+$3+$4+$7+$8; total=busy+$5+$6; print busy, total}' /proc/stat
}

run() {
  local name=$1 cap=$2
  shift 2
  case " ${RUNS:-all} " in *" all "*|*" $name "*) ;; *) return 0 ;; esac
  echo "== loadgen $name: $*"
  local before after top_pid=""
  before=$(cpu_ticks)
  # THREADS_TOP=1: the busiest threads over the run (top -H, one sample a second).
  if [ -n "${THREADS_TOP:-}" ] && command -v top >/dev/null; then
    top -b -H -d 1 -n "${THREADS_TOP_SAMPLES:-8}" -w 200 > "$OUT/top_$name.txt" 2>&1 &
    top_pid=$!
  fi
  timeout "$cap" "$BIN/kvtrim-loadgen" --target="$address" --policy=dropkv --keep_fraction=0.2 \
    --layers=32 --kv_heads=8 --q_heads=32 --head_dim=128 --window=32 --dtype=bf16 \
    --json_out="$OUT/loadgen_$name.json" "$@" || { echo "loadgen $name failed"; RC=1; }
  if [ -n "$top_pid" ]; then
    kill "$top_pid" 2>/dev/null; wait "$top_pid" 2>/dev/null
    echo "  busiest threads (mean %CPU over the samples; pid, name):"
    # The first sample counts since each thread started: skipped.
    awk '/^top -/ { samples++; next }
         samples > 1 && $1 ~ /^[0-9]+$/ && NF >= 12 && $12 != "top" { sum[$1 " " $12] += $9 }
         END { for (k in sum) printf "%8.1f  %s\n", sum[k] / (samples - 1), k }' \
      "$OUT/top_$name.txt" | sort -rn | head -12
  fi
  after=$(cpu_ticks)
  # The whole host's CPU over the run (load generator, kvtrimd and the kernel's socket work).
  echo "$before $after" | awk -v cores="$(nproc)" '{b=$3-$1; t=$4-$2;
    if (t > 0) printf "  host CPU busy over the run: %.1f %% of %d cores\n", 100*b/t, cores}'
}
run ipc_32k 60 --transport=cuda_ipc --tokens=32768 --prefills=5 --warmup_prefills=1
run ipc_32k_serial 60 --transport=cuda_ipc --tokens=32768 --prefills=3 --warmup_prefills=1 --serial
run ipc_128k 90 --transport=cuda_ipc --tokens=131072 --prefills=3 --warmup_prefills=1
run ipc_128k_serial 90 --transport=cuda_ipc --tokens=131072 --prefills=2 --warmup_prefills=1 --serial
# The perturbation statistic sampled (the last 8 window rows per query head) and off.
run ipc_32k_serial_sampled 60 --transport=cuda_ipc --tokens=32768 --prefills=3 --warmup_prefills=1 \
  --serial --perturbation=sampled
run ipc_32k_serial_off 60 --transport=cuda_ipc --tokens=32768 --prefills=3 --warmup_prefills=1 \
  --serial --perturbation=off
run ipc_128k_serial_sampled 90 --transport=cuda_ipc --tokens=131072 --prefills=2 \
  --warmup_prefills=1 --serial --perturbation=sampled
run ipc_128k_serial_off 90 --transport=cuda_ipc --tokens=131072 --prefills=2 --warmup_prefills=1 \
  --serial --perturbation=off
# The kept lists into a device output region of the worker (no device-to-host copy of them).
run ipc_32k_serial_off_output 60 --transport=cuda_ipc --tokens=32768 --prefills=3 \
  --warmup_prefills=1 --serial --perturbation=off --output_region
run ipc_128k_serial_off_output 90 --transport=cuda_ipc --tokens=131072 --prefills=2 \
  --warmup_prefills=1 --serial --perturbation=off --output_region
# Pipelined with the statistic off and the lists into a device output region: a worker
# that sends each layer and goes on with the next (prefill attention never waits for an
# eviction answer), the deployment the output region is for.
run ipc_32k_off_output 60 --transport=cuda_ipc --tokens=32768 --prefills=5 --warmup_prefills=1 \
  --perturbation=off --output_region
run ipc_128k_off_output 90 --transport=cuda_ipc --tokens=131072 --prefills=3 --warmup_prefills=1 \
  --perturbation=off --output_region
# Host shm, its segment page-locked at registration (--max_pinned_shm_bytes, on by default).
run shm_32k 90 --transport=host_shm --tokens=32768 --prefills=2 --warmup_prefills=1
run shm_32k_serial 90 --transport=host_shm --tokens=32768 --prefills=2 --warmup_prefills=1 --serial
run inline_32k 120 --transport=inline --tokens=32768 --prefills=2 --warmup_prefills=1
run inline_32k_w8 150 --transport=inline --tokens=32768 --prefills=1 --warmup_prefills=0 --workers=8
run inline_32k_w8_shared 150 --transport=inline --tokens=32768 --prefills=1 --warmup_prefills=0 \
  --workers=8 --shared_connection
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd exit status $?"; RC=1; }
tail -n 3 "$server_log"

# Inline again with 64 MiB HTTP/2 windows on both sides (gRPC's defaults above).
echo "== kvtrimd --http2_window_bytes=67108864"
server_log="$OUT/kvtrimd_transport_window.log"
start_kvtrimd "$server_log" --backend=gpu --listen=127.0.0.1:0 --metrics_listen= --workers=2 \
  --max_message_bytes=$((64 << 20)) --http2_window_bytes=$((64 << 20)) || exit 1
run inline_32k_window 120 --transport=inline --tokens=32768 --prefills=2 --warmup_prefills=1 \
  --http2_window_bytes=$((64 << 20))
run inline_32k_w8_window 150 --transport=inline --tokens=32768 --prefills=1 --warmup_prefills=0 \
  --workers=8 --http2_window_bytes=$((64 << 20))
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd (window) exit status $?"; RC=1; }

# Host shm read with pread into kvtrimd's memory (no page-locking): the same-run reference.
echo "== kvtrimd --max_pinned_shm_bytes=0"
server_log="$OUT/kvtrimd_transport_pread.log"
start_kvtrimd "$server_log" --backend=gpu --allow_client_shm --listen=127.0.0.1:0 \
  --metrics_listen= --workers=2 --max_message_bytes=$((64 << 20)) --max_pinned_shm_bytes=0 || exit 1
run shm_32k_pread 90 --transport=host_shm --tokens=32768 --prefills=2 --warmup_prefills=1
run shm_32k_serial_pread 90 --transport=host_shm --tokens=32768 --prefills=2 --warmup_prefills=1 \
  --serial
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd (pread) exit status $?"; RC=1; }

# The same-run reference for --session_parallel_layers: a session's layers one at a time.
echo "== kvtrimd --session_parallel_layers=1"
server_log="$OUT/kvtrimd_transport_p1.log"
start_kvtrimd "$server_log" --backend=gpu --allow_client_shm --listen=127.0.0.1:0 \
  --metrics_listen= --workers=2 --max_message_bytes=$((64 << 20)) --session_parallel_layers=1 \
  || exit 1
run ipc_32k_off_output_p1 60 --transport=cuda_ipc --tokens=32768 --prefills=5 --warmup_prefills=1 \
  --perturbation=off --output_region
run ipc_128k_off_output_p1 90 --transport=cuda_ipc --tokens=131072 --prefills=3 \
  --warmup_prefills=1 --perturbation=off --output_region
run inline_32k_p1 120 --transport=inline --tokens=32768 --prefills=2 --warmup_prefills=1
run shm_32k_p1 90 --transport=host_shm --tokens=32768 --prefills=2 --warmup_prefills=1
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd (parallel 1) exit status $?"; RC=1; }

# Pipelined CUDA IPC with four layers computed at once instead of two.
echo "== kvtrimd --workers=4"
server_log="$OUT/kvtrimd_transport_w4.log"
start_kvtrimd "$server_log" --backend=gpu --allow_client_shm --listen=127.0.0.1:0 \
  --metrics_listen= --workers=4 --max_message_bytes=$((64 << 20)) || exit 1
run ipc_32k_off_output_kw4 60 --transport=cuda_ipc --tokens=32768 --prefills=5 \
  --warmup_prefills=1 --perturbation=off --output_region
run ipc_128k_off_output_kw4 90 --transport=cuda_ipc --tokens=131072 --prefills=3 \
  --warmup_prefills=1 --perturbation=off --output_region
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd (workers=4) exit status $?"; RC=1; }

# The same node over a Unix domain socket instead of TCP loopback.
echo "== kvtrimd --listen=unix:..."
server_log="$OUT/kvtrimd_transport_uds.log"
socket_dir=$(mktemp -d)
start_kvtrimd "$server_log" --backend=gpu --allow_client_shm --listen="unix:$socket_dir/kvtrimd.sock" \
  --metrics_listen= --workers=2 --max_message_bytes=$((64 << 20)) || exit 1
run ipc_32k_serial_off_output_uds 60 --transport=cuda_ipc --tokens=32768 --prefills=3 \
  --warmup_prefills=1 --serial --perturbation=off --output_region
run ipc_32k_serial_sampled_uds 60 --transport=cuda_ipc --tokens=32768 --prefills=3 \
  --warmup_prefills=1 --serial --perturbation=sampled
run inline_32k_uds 120 --transport=inline --tokens=32768 --prefills=2 --warmup_prefills=1
kill -TERM "$pid"
wait "$pid" || { echo "kvtrimd (uds) exit status $?"; RC=1; }
rm -rf "$socket_dir"
exit "$RC"

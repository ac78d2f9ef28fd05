#!/usr/bin/env bash
# Runs kvtrim's GPU checks and benchmarks ON the GPU machine, in one command, from the repo copy
# with the bundle built here by scripts/gpu_bundle.sh (carry gpu_bundle, and for
# the benchmark references .whl and .ext):
#   bash scripts/gpu_run.sh                       # the benchmark run (default, about 6 min)
#   SECTIONS=checks bash scripts/gpu_run.sh       # tests and sanitizers (about 5 min)
#   SECTIONS="bench report" bash scripts/gpu_run.sh   # any subset, in the order below
# SECTIONS takes section names and three groups (each fits one 10-minute call on an H100):
#   benchmarks (default) = info wheels bench torch kvpress report smoke
#   checks               = info test memcheck racecheck smoke
#   transport            = the transport section alone
#   python               = the python section alone
#   (all = every section: more than one call's 10 minutes)
# Sections (in this order):
#   info       nvidia-smi -L, driver, compute-sanitizer and python/torch versions
#   test       kvtrim_gpu_test, every test (parity incl. the model-aware policies, errors,
#              sticky-error child)
#   memcheck   compute-sanitizer --tool memcheck over the small GPU tests
#   racecheck  compute-sanitizer --tool racecheck over the small GPU tests
#   wheels     installs the carried wheels .whl/*.whl (scripts/fetch_gpu_wheels.sh: kvpress and
#              the transformers it needs) into $SITE and puts it first on PYTHONPATH; without
#              .whl it says so and the kvpress rows are skipped
#   bench      kvtrim_gpu_bench: every preset, numerics fast and exact, bf16 at every n plus
#              f16/f32 at 32K, copy bandwidth; model-aware presets at n 32K / 128K, host
#              DecideLaProx over 32 layers -> gpu_bench.{json,csv}
#   torch      tools/torch_reference_bench.py --impls naive,best,triton: naive and best-effort
#              PyTorch (model-aware presets included, same dtype rows) and the DropKV authors'
#              Triton kernel when .ext/dropkv was carried -> torch_bench.json
#   kvpress    tools/torch_reference_bench.py --impls kvpress: kvpress 0.5.4's presses on the
#              same tensors -> kvpress_bench.json
#   report     tools/bench_report.py joins the three files -> gpu.json (the content of
#              docs/bench/gpu.json) and gpu_tables.md (the tables of docs/benchmarks.md)
#   smoke      kvtrimd --backend=gpu: start, health and a dropkv compress of the sample
#              through the bundled kvtrim CLI, SIGTERM, exit status 0
#   python     scripts/gpu_python.sh: the Python client's tests (CUDA IPC from torch, kvtrim.hf)
#              and tools/python_client_bench.py beside kvtrim-loadgen -> python_tests.xml,
#              python.json, python.md (carry .whl with the kvtrim wheel; see the script)
#   transport  scripts/gpu_transport.sh: the CUDA IPC transport tests, and a Llama-3.1-8B
#              prefill through each transport with kvtrim-loadgen beside the kernel time
#              and a PyTorch SDPA prefill -> ipc_test.xml, loadgen_*.json, sdpa_prefill.json
# test runs concurrently with memcheck and racecheck (the tests are bound by their CPU
# references, the sanitizers by the device; neither is timed); the benchmark sections run
# alone. Every section has a time cap; a section that hits it reports TIMEOUT (the benchmark
# programs rewrite their JSON after every row, so what they measured stays):
#   benchmarks: info 20 + wheels 30 + bench 180 + torch 185 + kvpress 120 + report 15 +
#               smoke 25 = at most 575 s
#   checks:     info 20 + the longer of test 300 and memcheck 120 + racecheck 280 (side by
#               side) + smoke 25 = at most 445 s
#   transport:  540 s
# Output goes to $OUT (default ./out): gpu_run.log (every section's output, the concurrent
# ones appended when they end), summary.txt, gpu_bench.json, gpu_bench.csv, torch_bench.json,
# kvpress_bench.json, gpu.json, gpu_tables.md, and one gpu_test_shard<i>.xml per test shard.
# At most 8 files come back from a call: when $OUT holds more, everything but the first eight
# of summary.txt gpu_run.log gpu.json gpu_tables.md gpu_bench.json torch_bench.json
# kvpress_bench.json gpu_bench.csv goes into more.tar.gz. The last lines printed are the summary.
# Environment: OUT, SECTIONS, BUNDLE (default gpu_bundle), SITE (default /tmp/kvtrim_site),
# TEST_FILTER (gtest filter of the test section, default all), MEMCHECK_FILTER /
# RACECHECK_FILTER (gtest filters of the sanitizer runs, defaults below), BENCH_ARGS,
# TORCH_ARGS, KVPRESS_ARGS (extra arguments of the three benchmark programs, e.g.
# BENCH_ARGS=--stages for per-launch times).
# Exit status: 0 when every section that ran passed, 1 otherwise.
# shellcheck disable=SC2317  # the section_* functions run through `bash -c` (exported)
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1
SITE="${SITE:-/tmp/kvtrim_site}"

# expand_sections WORDS: the section names of WORDS, groups expanded (see the header).
expand_sections() {
  local out=() word
  for word in $1; do
    case $word in
      benchmarks) out+=(info wheels bench torch kvpress report smoke) ;;
      checks) out+=(info test memcheck racecheck smoke) ;;
      all) out+=(info test memcheck racecheck wheels bench torch kvpress report smoke python
                 transport) ;;
      *) out+=("$word") ;;
    esac
  done
  echo "${out[*]}"
}
SECTIONS=$(expand_sections "${SECTIONS:-benchmarks}")
# Small cases only under the sanitizers, and never the tests that fault on purpose (the
# sticky-error child, the deliberate cudaMalloc failure, whose API error the sanitizer would
# report). memcheck: every backend parity case with n <= 99 plus the launchers' edge and
# error tests. racecheck (about 8 s per parity case on an H100): one case per kernel family
# (attention scorers, key scorers, top-k, AdaKV, shared, perturbation).
# The model-aware kernels (ProjectedL1, QuadForm Gram / EA, EA softmax, combines, the per-query
# head reductions): ModelScoreSanitizer (one small case per family), the launcher edges, and
# three host-decided policies at n = 7 (two stages, LU-KV, block-aligned) under memcheck.
MEMCHECK_FILTER="${MEMCHECK_FILTER:-Presets/*_n1:Presets/*_n7:Presets/*_n99:ParityRule*:GpuBackendCreateTest.*:GpuBackendMemoryTest.ArenaCap*:KeyScorerErrors.*:AttentionLaunchTest.*:Scorers/AttentionParityTest.BitIdenticalOnEdgeShapes/*:SelectTopKParity.EmptyShapes*:SelectProtectionParity.*:ModelScoreSanitizer.*:ModelScoreLauncherTest.*:Policies/ModelDecisionParityTest.GpuMatchesCpu/criticalkv_n7:Policies/ModelDecisionParityTest.GpuMatchesCpu/lukv_n7:Policies/ModelDecisionParityTest.GpuMatchesCpu/snapkv_block_n7:FastSanitizer.*:SelectFusedErrors.*:SelectFusedSanitizer.*:FastModelSanitizer.*:FastModelLauncher.EdgesAndErrors:DeviceDecisionSanitizer.*:LaunchGraphCache.*:PoolingParity.FirstMaxTiesAcrossCtas:FastPerturbationSanitizer.*:NonFiniteProbeSanitizer.*}"
RACECHECK_FILTER="${RACECHECK_FILTER:-Presets/*/dropkv_n7:Presets/*/snapkv_n7:Presets/*/tova_n7:Presets/*/adakv_n7:Presets/*/keydiff_n7:Presets/*/knorm_shared_n7:AttentionPerturbationTest.*:ModelScoreSanitizer.*:FastSanitizer.*:SelectFusedSanitizer.ClusterOfThreeWithNaN:FastModelSanitizer.SmallCases:DeviceDecisionSanitizer.*:PoolingParity.FirstMaxTiesAcrossCtas:FastPerturbationSanitizer.*:NonFiniteProbeSanitizer.*}"
TEST_FILTER="${TEST_FILTER:-*}"
LOG="$OUT/gpu_run.log"
: >"$LOG"
SUMMARY=()
FAILED=0

# section_status RC: PASS, TIMEOUT or FAIL(rc=RC).
section_status() {
  if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
    echo TIMEOUT
  elif [ "$1" -ne 0 ]; then
    echo "FAIL(rc=$1)"
  else
    echo PASS
  fi
}

# start_background_section NAME CAP_SECONDS COMMAND...: runs COMMAND with a time cap in the
# background, its output in $OUT/.NAME.log; finish_background_section NAME waits for it,
# appends the output to gpu_run.log (and the terminal) and records the result like
# run_section.
start_background_section() {
  local name=$1 cap=$2
  shift 2
  case " $SECTIONS " in *" $name "*) ;; *) return 0 ;; esac
  echo "===== $name (cap ${cap}s, in the background): $*" | tee -a "$LOG"
  (
    start=$SECONDS
    timeout --signal=TERM --kill-after=10 "$cap" "$@" >"$OUT/.$name.log" 2>&1
    echo "$? $((SECONDS - start))" >"$OUT/.$name.rc"
  ) &
  echo $! >"$OUT/.$name.pid"
}

finish_background_section() {
  local name=$1
  [ -f "$OUT/.$name.pid" ] || return 0
  wait "$(cat "$OUT/.$name.pid")"
  local rc took status
  read -r rc took <"$OUT/.$name.rc"
  echo "===== $name (output of the background run)" | tee -a "$LOG"
  tee -a "$LOG" <"$OUT/.$name.log"
  status=$(section_status "$rc")
  [ "$status" = PASS ] || FAILED=1
  SUMMARY+=("$(printf '%-10s %-14s %5ss' "$name" "$status" "$took")")
  echo "===== $name: $status in ${took}s" | tee -a "$LOG"
  rm -f "$OUT/.$name.pid" "$OUT/.$name.rc" "$OUT/.$name.log"
}

# run_section NAME CAP_SECONDS COMMAND...: runs COMMAND with a time cap, appends its output
# to gpu_run.log (and the terminal), records PASS / FAIL(rc) / TIMEOUT and the seconds taken.
run_section() {
  local name=$1 cap=$2
  shift 2
  case " $SECTIONS " in *" $name "*) ;; *) return 0 ;; esac
  echo "===== $name (cap ${cap}s): $*" | tee -a "$LOG"
  local start=$SECONDS rc
  timeout --signal=TERM --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start)) status
  status=$(section_status "$rc")
  [ "$status" = PASS ] || FAILED=1
  SUMMARY+=("$(printf '%-10s %-14s %5ss' "$name" "$status" "$took")")
  echo "===== $name: $status in ${took}s" | tee -a "$LOG"
}

section_info() {
  nvidia-smi -L || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  compute-sanitizer --version | tail -n 1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  ls -l "$BIN"
  ldd "$BIN/kvtrimd" | grep -E "not found" && return 1
  return 0
}

# The CPU reference of the n=40000 parity cases dominates: run TEST_SHARDS gtest shards at
# once (the machine has 16 cores), each writing its own XML; fails if any shard fails.
section_test() {
  local shards=${TEST_SHARDS:-3} i rc=0 pids=()
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$BIN/kvtrim_gpu_test" \
      --gtest_filter="$TEST_FILTER" --gtest_output="xml:$OUT/gpu_test_shard$i.xml" \
      --gtest_brief=1 >"$OUT/.shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    echo "--- shard $i"
    grep -vE "^\[ parity" "$OUT/.shard$i.log"
    rm -f "$OUT/.shard$i.log"
  done
  return "$rc"
}

section_sanitizer() {
  local tool=$1 filter=$2
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    "$BIN/kvtrim_gpu_test" --gtest_filter="$filter" --gtest_brief=1
}

# Installs the carried wheels into a fresh $SITE (the caller puts it on PYTHONPATH); without
# .whl/ it says so and passes (the kvpress section then records why its rows are missing).
section_wheels() {
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "wheels: no .whl/ carried (scripts/fetch_gpu_wheels.sh); the kvpress rows will be skipped"
    return 0
  fi
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || return 1
  ls .whl
  du -sh "$SITE"
}

# Every preset in both numerics modes, bf16 at every n and f16/f32 at 32K (the defaults).
section_bench() {
  # shellcheck disable=SC2086
  "$BIN/kvtrim_gpu_bench" --out="$OUT" ${BENCH_ARGS:-}
}

# Naive and best-effort PyTorch and the DropKV authors' Triton kernel (when carried).
section_torch() {
  # shellcheck disable=SC2086
  python3 tools/torch_reference_bench.py --impls naive,best,triton --out "$OUT/torch_bench.json" \
    ${TORCH_ARGS:-}
}

# kvpress's presses on the same tensors (needs the wheels section).
section_kvpress() {
  # shellcheck disable=SC2086
  python3 tools/torch_reference_bench.py --impls kvpress --out "$OUT/kvpress_bench.json" \
    ${KVPRESS_ARGS:-}
}

# Joins the run's files into gpu.json and the Markdown tables gpu_tables.md.
section_report() {
  [ -f "$OUT/gpu_bench.json" ] || { echo "report: no gpu_bench.json"; return 1; }
  python3 tools/bench_report.py --kvtrim "$OUT/gpu_bench.json" --torch "$OUT/torch_bench.json" \
    --kvpress "$OUT/kvpress_bench.json" --out "$OUT/gpu.json" --md "$OUT/gpu_tables.md"
}

# Starts kvtrimd on the GPU, checks health, compresses the sample with dropkv through the
# CLI (expects backend=gpu), reads kvtrim_build_info, then SIGTERM and exit status 0.
section_smoke() {
  local server_log
  server_log=$(mktemp)
  "$BIN/kvtrimd" --backend=gpu --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --workers=4 \
    >"$server_log" 2>&1 &
  local pid=$! address="" metrics="" rc=0
  for _ in $(seq 1 600); do
    address=$(sed -n 's/.* serving on \([^ ]*\) .*/\1/p' "$server_log" | head -n 1)
    [ -n "$address" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$server_log"
  if [ -z "$address" ]; then
    echo "smoke: kvtrimd did not start"
    kill -9 "$pid" 2>/dev/null
    return 1
  fi
  grep -q "backend gpu" "$server_log" || { echo "smoke: start-up line does not say backend gpu"; rc=1; }
  metrics=$(sed -n 's/.* metrics \(http[^ ]*\) .*/\1/p' "$server_log" | head -n 1)
  "$BIN/kvtrim" --target="$address" health || rc=1
  local sample=samples/stories260k_prefill.safetensors
  local answer
  answer=$("$BIN/kvtrim" --target="$address" compress --policy=dropkv --keep_fraction=0.25 \
    --input="$sample" 2>&1)
  echo "$answer"
  echo "$answer" | grep -q "backend=gpu" || { echo "smoke: the answer does not say backend=gpu"; rc=1; }
  if [ -n "$metrics" ]; then
    python3 -c 'import sys, urllib.request; t = urllib.request.urlopen(sys.argv[1]).read().decode(); l = [x for x in t.splitlines() if x.startswith("kvtrim_build_info")]; print(*l); sys.exit(0 if any("backend=\"gpu\"" in x for x in l) else 1)' "$metrics" ||
      { echo "smoke: kvtrim_build_info does not say backend=gpu"; rc=1; }
    # NVML's per-device figures, and the layers' queue stage (a wait for a device worker).
    python3 -c 'import sys, urllib.request; t = urllib.request.urlopen(sys.argv[1]).read().decode(); l = [x for x in t.splitlines() if x.startswith(("kvtrim_gpu_", "kvtrim_stage_duration_seconds_count{stage=\"queue\""))]; print(*l, sep="\n"); total = [float(x.split()[-1]) for x in l if x.startswith("kvtrim_gpu_memory_total_bytes")]; queue = [float(x.split()[-1]) for x in l if "queue" in x]; sys.exit(0 if total and min(total) > 0 and queue and queue[0] >= 1 else 1)' "$metrics" ||
      { echo "smoke: no kvtrim_gpu_memory_total_bytes > 0 or no queue stage observation"; rc=1; }
  fi
  "$BIN/kvtrim" --target="$address" regions || { echo "smoke: kvtrim regions failed"; rc=1; }
  kill -TERM "$pid"
  local exit_status=0
  wait "$pid" || exit_status=$?
  tail -n 2 "$server_log"
  rm -f "$server_log"
  [ "$exit_status" -eq 0 ] || { echo "smoke: kvtrimd exited $exit_status after SIGTERM"; rc=1; }
  return "$rc"
}

# The test binary is needed by the test and sanitizer sections only (a benchmark bundle may
# leave it out to stay within what one call carries).
case " $SECTIONS " in
  *" test "* | *" memcheck "* | *" racecheck "*)
    [ -x "$BIN/kvtrim_gpu_test" ] || { echo "gpu_run: $BIN/kvtrim_gpu_test missing; build it with scripts/gpu_bundle.sh and carry $BUNDLE" >&2; exit 1; } ;;
esac

export -f section_info section_test section_sanitizer section_wheels section_bench section_torch \
  section_kvpress section_report section_smoke
export BIN OUT BUNDLE SITE MEMCHECK_FILTER RACECHECK_FILTER TEST_FILTER
run_section info 20 bash -c section_info
start_background_section test 300 bash -c section_test
# shellcheck disable=SC2016  # expanded by the child shell (the filters are exported)
run_section memcheck 120 bash -c 'section_sanitizer memcheck "$MEMCHECK_FILTER"'
# shellcheck disable=SC2016
# racecheck took 164-195 s beside the test section (2026-11-26, H100) and once passed 210 s:
# its cap stays under the test section's, which runs alongside.
run_section racecheck 280 bash -c 'section_sanitizer racecheck "$RACECHECK_FILTER"'
finish_background_section test
run_section wheels 30 bash -c section_wheels
if [ -d "$SITE/kvpress" ]; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
run_section bench 180 bash -c section_bench
run_section torch 185 bash -c section_torch
run_section kvpress 120 bash -c section_kvpress
run_section report 15 bash -c section_report
run_section smoke 25 bash -c section_smoke
run_section python 560 env OUT="$OUT" BUNDLE="$BUNDLE" bash scripts/gpu_python.sh
run_section transport 540 env OUT="$OUT" BUNDLE="$BUNDLE" bash scripts/gpu_transport.sh

{
  echo
  echo "===== summary ($(date -u +%FT%TZ), $(nvidia-smi -L 2>/dev/null | head -n 1))"
  printf '%-10s %-14s %6s\n' section status time
  printf '%s\n' "${SUMMARY[@]}"
  if [ -f "$OUT/gpu.json" ]; then
    echo
    python3 - "$OUT/gpu.json" <<'PY'
import json, sys
for g in json.load(open(sys.argv[1]))["goals"]:
    print(f"  {g['status']:8} {g['goal']}: {g['result']}")
PY
  fi
} | tee "$OUT/summary.txt" | tee -a "$LOG"

# At most 8 files come back from a call: pack the rest into more.tar.gz.
pack_out() {
  local keep=(summary.txt gpu_run.log gpu.json gpu_tables.md gpu_bench.json torch_bench.json
              kvpress_bench.json gpu_bench.csv)
  local files
  mapfile -t files < <(cd "$OUT" && find . -type f ! -name more.tar.gz | sed 's|^\./||' | sort)
  [ "${#files[@]}" -le 8 ] && return 0
  local kept=() rest=() f k
  for k in "${keep[@]}"; do
    for f in "${files[@]}"; do [ "$f" = "$k" ] && [ "${#kept[@]}" -lt 7 ] && kept+=("$f"); done
  done
  for f in "${files[@]}"; do
    case " ${kept[*]} " in *" $f "*) ;; *) rest+=("$f") ;; esac
  done
  (cd "$OUT" && tar czf more.tar.gz "${rest[@]}" && rm -f "${rest[@]}" && find . -type d -empty -delete)
  echo "packed ${#rest[@]} files into $OUT/more.tar.gz: ${rest[*]}" | tee -a "$LOG"
}
pack_out
exit "$FAILED"

#!/usr/bin/env bash
# The main job: installs dependencies, builds, starts kvtrimd with its embedded defaults and
# compresses the bundled sample (real K/V/Q of stories260K) through the real `kvtrim` client,
# once with DropKV and once with LaProx over the registered sample model; ends with a table
# comparing a few policies on the sample (kvtrim compress --summary).
set -euo pipefail
cd "$(dirname "$0")/.."
export KVTRIM_BUILD_TESTS=OFF KVTRIM_BUILD_BENCHMARKS=OFF BUILD_TARGETS="kvtrimd kvtrim"
bash scripts/install_deps.sh
bash scripts/build.sh
BIN="${BUILD_DIR:-build}"
TARGET=127.0.0.1:50051
"$BIN/service/kvtrimd" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
"$BIN/client/kvtrim" --target=$TARGET health --wait=60
"$BIN/client/kvtrim" --target=$TARGET compress --policy="${POLICY:-dropkv}" \
  --keep_fraction="${KEEP_FRACTION:-0.2}" --input=samples/stories260k_prefill.safetensors
# A model-aware policy: the client registers the bundled model (W_O, query statistics, LU-KV
# profile) and compresses with its digest, answered at the end of the session (LaProx).
"$BIN/client/kvtrim" --target=$TARGET compress --policy=laprox --session \
  --keep_fraction="${KEEP_FRACTION:-0.2}" --input=samples/stories260k_prefill.safetensors \
  --model=samples/stories260k_model.safetensors
echo "metrics: curl -s http://127.0.0.1:9464/metrics | grep ^kvtrim_"
curl -s http://127.0.0.1:9464/metrics | grep -E '^kvtrim_(requests_total|tokens_(in|kept)_total)' || true

# The summary table: one row per (policy, keep) over the sample, totalled over its layers and KV
# heads by `kvtrim compress --summary`. The last row gives DropKV an error target instead of a
# count: each head keeps the fewest tokens whose perturbation is <= 0.2. kvtrimd is stopped
# before the table is printed so that its shutdown lines do not follow it.
SAMPLE=samples/stories260k_prefill.safetensors
SUMMARY=("$BIN/client/kvtrim" --target=$TARGET compress --summary --input=$SAMPLE)
table=$("${SUMMARY[@]}" --summary_header --policy=dropkv --keep_fraction="${KEEP_FRACTION:-0.2}")
for policy in snapkv streaming_llm knorm; do
  table+=$'\n'$("${SUMMARY[@]}" --policy=$policy --keep_fraction="${KEEP_FRACTION:-0.2}")
done
table+=$'\n'$("${SUMMARY[@]}" --policy=dropkv --max_perturbation=0.2)
kill -TERM $SERVER
wait $SERVER || true
trap - EXIT
echo
echo "summary of $SAMPLE (kept tokens: kept / cached over its layers and KV heads):"
echo "$table"
echo "perturbation = mean relative change ||a_kept - a_full|| / ||a_full|| of the attention" \
  "output on the observation-window queries caused by the eviction" \
  "(0 = no change, 1 = a change as large as the output itself; it can exceed 1)"

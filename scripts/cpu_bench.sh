#!/usr/bin/env bash
# The CPU backend against best-effort NumPy in the same run (issue 14): kvtrim_cpu_bench's
# policy rows (PolicyEngine::CompressLayer on the CPU backend, every core; the model-aware
# ones with a Llama-3.1-8B-shaped random model) and
# tools/numpy_reference_bench.py on the same shape, joined by tools/cpu_bench_report.py into
# $OUT/cpu.json and $OUT/cpu.md (copy them to docs/bench/cpu.json and docs/benchmarks.md).
# NumPy's OpenBLAS runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (its own choice of
# kernel, recorded in the JSON). Needs a build with benchmarks (the default) and .venv
# (tools/setup_venv.sh; threadpoolctl records the BLAS kernel).
# Environment: OUT (default out), BUILD_DIR (build), TOKENS (4096,32768), FILTER (a
# benchmark regex over the policies), REPEATS (NumPy runs per case, 5).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"
BIN="${BUILD_DIR:-build}"
mkdir -p "$OUT"
policies="${FILTER:-knorm|keydiff|tova|h2o|snapkv|dropkv|pyramidkv|adakv|dropkv_perturbation_full|dropkv_perturbation_sampled|snapkv_perturbation_full|criticalkv|criticalkv_l2|laprox_layer|expected_attention}"
"$BIN/kernels/bench/kvtrim_cpu_bench" --benchmark_filter="BM_(Model)?Policy/(${policies})(_bf16)?(_exact)?/" \
  --benchmark_out="$OUT/kvtrim_cpu_bench.json" --benchmark_out_format=json
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python tools/numpy_reference_bench.py \
  --out "$OUT/numpy_bench.json" --tokens "${TOKENS:-4096,32768}" --repeats "${REPEATS:-5}" \
  --policies "$(echo "$policies" | tr '|' ',')"
python3 tools/cpu_bench_report.py --kvtrim "$OUT/kvtrim_cpu_bench.json" \
  --numpy "$OUT/numpy_bench.json" --out "$OUT/cpu.json" --md "$OUT/cpu.md"
cat "$OUT/cpu.md"

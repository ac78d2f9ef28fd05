#!/usr/bin/env bash
# libFuzzer runs of kvtrim's parsers (fuzz/, docs/reliability.md "Fuzzing").
#
#   scripts/fuzz.sh [SECONDS]       smoke: builds build-fuzz with clang, runs every target for
#                                   SECONDS (default 30) on a copy of its seed corpus
#   scripts/fuzz.sh --campaign RUNS campaign: every target for -runs=RUNS, one at a time;
#                                   writes docs/bench/fuzz.json and docs/bench/fuzz.md
#
# A crash, leak, timeout (a run over 25 s) or out-of-memory in any target fails the script
# (exit 1); its reproducer is copied to build-fuzz/fuzz-artifacts/. The committed corpus
# (fuzz/corpus/) is never written. Environment: BUILD_DIR (build-fuzz), FUZZ_TARGETS (a
# space-separated subset), FUZZ_JOBS (build jobs, default 2), FUZZ_RUNS_<target> (campaign
# runs of one target, overriding RUNS).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR="${BUILD_DIR:-build-fuzz}"
MODE=smoke
SECONDS_PER_TARGET=30
RUNS=0
if [ "${1:-}" = "--campaign" ]; then
  MODE=campaign
  RUNS="${2:?usage: scripts/fuzz.sh --campaign RUNS}"
elif [ $# -gt 0 ]; then
  SECONDS_PER_TARGET="$1"
fi

# Target -> longest input (bytes): above the seeds' sizes, below what slows a run down.
declare -A MAX_LEN=(
  [compress_request]=32768 [session]=32768 [safetensors]=32768 [npy]=16384
  [model_file]=32768 [register_model]=32768 [lukv_profile]=32768 [rope_scaling]=1024
)
TARGETS=(${FUZZ_TARGETS:-compress_request session safetensors npy model_file register_model
         lukv_profile rope_scaling})

# Corpus copies, artifacts and the targets' own files: in memory when /dev/shm is writable.
WORK_BASE="${TMPDIR:-/tmp}"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then WORK_BASE=/dev/shm; fi
WORK=$(mktemp -d "$WORK_BASE/kvtrim-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

build_start=$(date +%s)
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DKVTRIM_FUZZ=ON -DKVTRIM_CUDA=OFF \
  -DKVTRIM_BUILD_TESTS=OFF -DKVTRIM_BUILD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" > "$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; exit 1; }
cmake --build "$BUILD_DIR" -j"${FUZZ_JOBS:-2}" --target kvtrim_fuzzers
build_seconds=$(( $(date +%s) - build_start ))
echo "fuzz: built the targets in ${build_seconds} s"

ARTIFACTS="$BUILD_DIR/fuzz-artifacts"
RESULTS="$WORK/results.tsv"
: > "$RESULTS"
failed=0
run_start=$(date +%s)
for target in "${TARGETS[@]}"; do
  binary="$BUILD_DIR/fuzz/${target}_fuzz"
  corpus="$WORK/corpus/$target"
  mkdir -p "$corpus" "$WORK/tmp/$target" "$WORK/artifacts/$target"
  cp -r "fuzz/corpus/$target/." "$corpus/"
  args=(-max_len="${MAX_LEN[$target]}" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$WORK/artifacts/$target/")
  if [ -f "fuzz/dict/$target.dict" ]; then args+=(-dict="fuzz/dict/$target.dict"); fi
  if [ "$MODE" = campaign ]; then
    runs_var="FUZZ_RUNS_$target"
    args+=(-runs="${!runs_var:-$RUNS}")
  else
    args+=(-max_total_time="$SECONDS_PER_TARGET")
  fi
  log="$WORK/$target.log"
  start_ms=$(date +%s%3N)
  status=0
  TMPDIR="$WORK/tmp/$target" "$binary" "${args[@]}" "$corpus" > "$log" 2>&1 || status=$?
  seconds=$(awk -v ms="$(( $(date +%s%3N) - start_ms ))" 'BEGIN {printf "%.1f", ms / 1000}')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  units=$(ls "$corpus" | wc -l)
  crashes=0
  if [ "$status" -ne 0 ]; then
    crashes=1
    failed=1
    mkdir -p "$ARTIFACTS"
    cp "$WORK/artifacts/$target/"* "$ARTIFACTS/" 2>/dev/null || true
    tail -60 "$log"
    echo "fuzz: $target FAILED (exit $status); reproducers in $ARTIFACTS/"
  fi
  rate=$(awk -v n="${execs:-0}" -v s="$seconds" 'BEGIN {printf "%d", n / (s > 0 ? s : 1)}')
  printf 'fuzz: %-17s %10s execs in %6s s (%s/s), cov %s, corpus %s units%s\n' "$target" \
    "${execs:-0}" "$seconds" "$rate" "${cov:-?}" "$units" \
    "$([ "$crashes" -eq 0 ] && echo "" || echo ", FAILED")"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "${execs:-0}" "$seconds" "$crashes" \
    "${cov:-0}" "$units" "${MAX_LEN[$target]}" >> "$RESULTS"
done
run_seconds=$(( $(date +%s) - run_start ))
total=$(awk -F'\t' '{s += $2} END {print s + 0}' "$RESULTS")
echo "fuzz: ${#TARGETS[@]} targets, $total executions in ${run_seconds} s" \
  "(build ${build_seconds} s)"

if [ "$MODE" = campaign ]; then
  # FUZZ_MACHINE describes the machine in the report (default: the OS and the core count).
  python3 - "$RESULTS" "$run_seconds" "$ROOT" "${FUZZ_MACHINE:-}" <<'EOF'
import datetime, json, os, subprocess, sys
results, wall, root, machine = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
if not machine:
    pretty = dict(line.split("=", 1) for line in open("/etc/os-release").read().split("\n")
                  if "=" in line).get("PRETTY_NAME", "Linux").strip('"')
    machine = f"{pretty}, {os.cpu_count()} cores"
rows = []
for line in open(results):
    t, execs, seconds, crashes, cov, units, max_len = line.rstrip("\n").split("\t")
    rows.append({"target": t, "executions": int(execs), "seconds": round(float(seconds), 1),
                 "execs_per_second": round(int(execs) / max(float(seconds), 0.1)),
                 "crashes": int(crashes), "coverage_edges": int(cov),
                 "corpus_units": int(units), "max_len": int(max_len)})
doc = {"date": datetime.date.today().isoformat(), "commit": run("git", "-C", root, "rev-parse",
                                                                "--short", "HEAD"),
       "compiler": run("clang++", "--version").splitlines()[0], "machine": machine,
       "build": "-O1 -gline-tables-only, -fsanitize=fuzzer,address,undefined",
       "options": "-timeout=25 -rss_limit_mb=2048 (leak detection on), one target at a time",
       "total_executions": sum(r["executions"] for r in rows),
       "total_crashes": sum(r["crashes"] for r in rows), "wall_seconds": wall, "targets": rows}
with open(f"{root}/docs/bench/fuzz.json", "w") as out:
    json.dump(doc, out, indent=2)
    out.write("\n")
md = [f"# Fuzz campaign ({doc['date']}, commit {doc['commit']})", "",
      f"{doc['compiler']}; {machine}; {doc['build']}; {doc['options']}. "
      "Written by `scripts/fuzz.sh --campaign`.", "",
      "| target | executions | seconds | exec/s | crashes | edges | corpus |",
      "|---|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    md.append(f"| {r['target']} | {r['executions']:,} | {r['seconds']} | "
              f"{r['execs_per_second']:,} | {r['crashes']} | {r['coverage_edges']} | "
              f"{r['corpus_units']} |")
md.append(f"| **total** | **{doc['total_executions']:,}** | {wall} | | "
          f"**{doc['total_crashes']}** | | |")
with open(f"{root}/docs/bench/fuzz.md", "w") as out:
    out.write("\n".join(md) + "\n")
print("fuzz: wrote docs/bench/fuzz.json and docs/bench/fuzz.md")
EOF
fi
exit "$failed"

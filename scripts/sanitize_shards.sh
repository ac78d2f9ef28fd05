#!/usr/bin/env bash
# Runs one (sanitized) GoogleTest binary as SHARDS gtest shards side by side and reports what
# passed, failed, was reported by a sanitizer or never ran. For the suites too slow to run
# under ASan on a 2-core machine (kvtrim_kernels_test: its numeric suites take minutes each):
# build it with scripts/sanitize.sh here, carry the binary and the libraries `ldd` names to a
# machine with many cores, and run it there. Usage:
#   bash scripts/sanitize_shards.sh BINARY [extra gtest arguments]
# Environment: SHARDS (default 2 x nproc), CAP_S (seconds per shard, default 560), LOGS (the
# folder of the per-shard logs, default a new temporary one), GTEST_FILTER (as gtest reads it).
# Exit status: 0 when every test ran and passed with no sanitizer report, 1 otherwise.
set -uo pipefail
BINARY="${1:?usage: sanitize_shards.sh BINARY [gtest arguments]}"
shift
SHARDS="${SHARDS:-$((2 * $(nproc)))}"
CAP_S="${CAP_S:-560}"
LOGS="${LOGS:-$(mktemp -d)}"
mkdir -p "$LOGS"
# The sanitizers' settings of scripts/sanitize.sh (a report fails the shard).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:exitcode=87}"
start=$(date +%s)
for ((i = 0; i < SHARDS; i++)); do
  GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout "$CAP_S" "$BINARY" "$@" \
    >"$LOGS/shard_$i.log" 2>&1 &
  pids[i]=$!
done
status=0
for ((i = 0; i < SHARDS; i++)); do
  wait "${pids[i]}"
  rc=$?
  case $rc in
    0) ;;
    124) echo "shard $i: stopped at the ${CAP_S}-s cap in $(grep '^\[ RUN' "$LOGS/shard_$i.log" |
           tail -n 1 | cut -c14-)"; status=1 ;;
    86|87) echo "shard $i: sanitizer report (exit $rc), see $LOGS/shard_$i.log"; status=1 ;;
    *) echo "shard $i: exit $rc"; status=1 ;;
  esac
done
ran=$(mktemp)
grep -ho '^\[       OK \] [^ ]*' "$LOGS"/shard_*.log | cut -c14- | sort >"$ran"
listed=$("$BINARY" --gtest_list_tests "$@" |
  awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' | sort)
echo "== $(wc -l <"$ran") of $(grep -c . <<<"$listed") tests passed in $(($(date +%s) - start)) s" \
  "($SHARDS shards, logs in $LOGS)"
grep -h '^\[  FAILED  \] [^ ]*\.[^ ]*' "$LOGS"/shard_*.log | sort -u
grep -lE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$LOGS"/shard_*.log |
  sed 's/^/sanitizer report in /'
not_passed=$(comm -23 <(echo "$listed") "$ran")
if [ -n "$not_passed" ]; then
  echo "== did not pass (failed or never ran):"
  echo "$not_passed"
  status=1
fi
rm -f "$ran"
exit "$status"

# Sourced by the GPU-machine scripts (gpu_run.sh, gpu_transport.sh, gpu_multi_device.sh,
# gpu_register_model.sh): the repo root as the working directory, $OUT (absolute), the
# bundle's binaries in $BIN and its libraries on LD_LIBRARY_PATH, and start_kvtrimd.
# Environment: OUT (default out), BUNDLE (default gpu_bundle).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
OUT="${OUT:-out}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUNDLE="${BUNDLE:-gpu_bundle}"
BIN="$ROOT/$BUNDLE/bin"
export LD_LIBRARY_PATH="$ROOT/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# start_kvtrimd LOG ARGS...: starts "$BIN/kvtrimd" ARGS... logging to LOG and waits (up to
# 60 s) for its start-up line; sets `pid` and `address` (the address clients dial). Returns
# 1, with the log printed, when it did not start.
start_kvtrimd() {
  local log=$1
  shift
  "$BIN/kvtrimd" "$@" >"$log" 2>&1 &
  pid=$!
  address=""
  for _ in $(seq 1 600); do
    address=$(sed -n 's/.* serving on \([^ ]*\) .*/\1/p' "$log" | head -n 1)
    [ -n "$address" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "kvtrimd did not start ($*)"
  cat "$log"
  return 1
}

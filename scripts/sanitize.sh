#!/usr/bin/env bash
# The C++ unit and integration tests under sanitizers (gcc, CPU backend, benchmarks off):
# AddressSanitizer + UndefinedBehaviorSanitizer (default, build-asan/) or ThreadSanitizer
# (SANITIZER=thread, build-tsan/: the tests that make no gRPC call, see below). kvtrimd, the
# CLI and every test binary are instrumented, so the integration tests' kvtrimd processes
# are checked too; any report fails its test.
# The Python tests are left out (a sanitized libkvtrim.so cannot be loaded into an
# uninstrumented python3) and so are the lint checks (nothing to sanitize).
# Usage: bash scripts/sanitize.sh [extra ctest arguments, e.g. -R Session]
# The kernel tests' numeric suites take minutes each under ASan: scripts/sanitize_shards.sh
# runs the built build-asan/kernels/kvtrim_kernels_test as parallel shards on a machine with
# more cores (docs/reliability.md, "The kernel tests under ASan + UBSan, sharded").
# Environment: SANITIZER (address | thread), BUILD_DIR, JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZER="${SANITIZER:-address}"
case "$SANITIZER" in
  address)
    FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
    BUILD_DIR="${BUILD_DIR:-build-asan}"
    ;;
  thread)
    FLAGS="-fsanitize=thread"
    BUILD_DIR="${BUILD_DIR:-build-tsan}"
    ;;
  *)
    echo "sanitize.sh: SANITIZER must be address or thread, not '$SANITIZER'" >&2
    exit 2
    ;;
esac
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTRIM_CUDA=OFF \
  -DKVTRIM_BUILD_TESTS=ON -DKVTRIM_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CXX_FLAGS="$FLAGS -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"
# Reports end the process with a failure; leaks are reported at exit (kvtrimd's too).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87"
TSAN_SUPPRESSIONS="$PWD/tests/testing/tsan.supp"
export TSAN_OPTIONS="halt_on_error=1:exitcode=88:second_deadlock_stack=1:suppressions=$TSAN_SUPPRESSIONS"
cd "$BUILD_DIR"
# Sanitized code runs 2-15x slower: the per-test timeout is raised accordingly.
if [ "$SANITIZER" = thread ]; then
  # TSan sees no synchronisation inside Debian's uninstrumented libgrpc, so every test that
  # runs a gRPC call reports thousands of races in gRPC's own inline code (docs/reliability.md,
  # "Sanitizers"); they cannot be suppressed without also hiding races in our callbacks, which
  # gRPC's threads run. ThreadSanitizer therefore runs the tests of kvtrim's own concurrency
  # that do not go through gRPC: the CPU thread pool and backend, the service's work pool,
  # admission gate, buffer pool, memory trimmer, model store, region registry and codecs.
  TSAN_TESTS='ThreadPool|CpuBackend|EngineTest|Perturbation|AdmissionGate|WorkPool|SerialLane'
  TSAN_TESTS+='|HostBufferPool|MemoryTrimmer|ModelStore|RegionRegistry|BearerTokens|Codec'
  TSAN_TESTS+='|SessionWire|StatusTest'
  ctest --output-on-failure -j"$JOBS" --timeout 1800 -E '^python\.' -LE '^lint$' \
    -R "$TSAN_TESTS" "$@"
else
  ctest --output-on-failure -j"$JOBS" --timeout 1800 -E '^python\.' -LE '^lint$' "$@"
fi

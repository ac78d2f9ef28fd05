#!/usr/bin/env bash
# Fails when a test source names a fixed path under the shared temp dir: tests that run at the
# same time (ctest -j, --schedule-random, --repeat) would read and overwrite each other's
# files. Tests write under kvtrim::testing::TestDir() / TestPath() (tests/testing/test_dir.h),
# a directory each test process makes for itself; only tests/testing/ may call TempDir().
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t sources < <(git ls-files -- '*_test.cc' '*_test.cu' '*test_util*.h' '*_fixture.h' \
  'tests/*.cc' 'tests/*.cu' 'tests/*.h' | grep -v '^tests/testing/' || true)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "check_test_paths: no test sources found (not a git checkout?)" >&2
  exit 1
fi
status=0
if grep -nE 'TempDir\(\)|"/tmp(/|")|/tmp/|P_tmpdir|tmpnam|tempnam' "${sources[@]}"; then
  echo "check_test_paths: the lines above name the shared temp dir; use" \
       "kvtrim::testing::TestPath() or MakeTestSubdir() (tests/testing/test_dir.h)." >&2
  status=1
fi
if grep -nE 'PickFreePort|SO_REUSEPORT' "${sources[@]}"; then
  echo "check_test_paths: the lines above pick a port before the server binds it; start" \
       "servers on port 0 and read the port they bound (--port_file, Server::port())." >&2
  status=1
fi
[ "$status" -eq 0 ] && echo "check_test_paths: ${#sources[@]} test sources, no shared temp paths"
exit "$status"

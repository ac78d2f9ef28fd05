#!/usr/bin/env bash
# Builds kvtrim with CUDA here (sm_90a + PTX) and bundles the binaries with the non-glibc
# shared libraries they link into gpu_bundle/ (git-ignored), for the GPU machine, which
# has CUDA but no gRPC/Abseil/prometheus-cpp. Usage: bash scripts/gpu_bundle.sh [TARGET...]
# The default targets are what scripts/gpu_run.sh runs there. STRIP=1 strips the host symbols
# of the executables (a third smaller; compute-sanitizer then names host frames by address
# only), when the carry would exceed 64 MiB. Then on the GPU machine
# (device tool, carry gpu_bundle):
#   bash scripts/gpu_run.sh                      # tests, sanitizers, benchmarks, smoke
#   LD_LIBRARY_PATH=gpu_bundle/lib gpu_bundle/bin/<binary>
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-gpu}"
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(kvtrim_gpu_test kvtrim_gpu_bench kvtrimd kvtrim kvtrim_ipc_test kvtrim-loadgen
           kvtrim_c)
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVTRIM_CUDA=ON \
  -DKVTRIM_BUILD_TESTS=ON -DKVTRIM_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${TARGETS[@]}"
rm -rf gpu_bundle && mkdir -p gpu_bundle/bin gpu_bundle/lib
for t in "${TARGETS[@]}"; do
  # kvtrim_c is libkvtrim.so (the in-process engine): it goes to lib/, executables to bin/.
  name=$t dest=gpu_bundle/bin
  if [ "$t" = kvtrim_c ]; then name=libkvtrim.so dest=gpu_bundle/lib; fi
  bin=$(find "$BUILD_DIR" -type f -name "$name" -perm -u+x | head -n 1)
  [ -n "$bin" ] || { echo "gpu_bundle: $t not built" >&2; exit 1; }
  cp "$bin" "$dest/"
  # Every resolved library except glibc's own and the CUDA driver (the GPU machine has both).
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
      *) cp -n "$lib" gpu_bundle/lib/ ;;
    esac
  done
done
if [ "${STRIP:-0}" = 1 ]; then strip --strip-unneeded gpu_bundle/bin/*; fi
# samples/ travels with the working tree (gpu_run.sh reads it there).
# The trained stories260K checkpoint (the Python tests convert it to a transformers model).
if [ -f ../shared/models/stories260K.bin ]; then
  mkdir -p gpu_bundle/models && cp ../shared/models/stories260K.bin gpu_bundle/models/
fi
du -sh gpu_bundle
# What a GPU call carries: the working tree (tracked and untracked files git does not ignore),
# gpu_bundle and, for the benchmark references, .whl (scripts/fetch_gpu_wheels.sh) and .ext
# (scripts/fetch_dropkv_triton.sh): 64 MiB at most together.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null |
  awk '$2 == "total" {s += $1} END {print s + 0}')
carried=$( (du -cb gpu_bundle .whl .ext 2>/dev/null || true) | tail -n 1 | cut -f1)
total=$((tree + carried))
echo "carry: working tree $((tree >> 20)) MiB + gpu_bundle/.whl/.ext $((carried >> 20)) MiB = $((total >> 20)) MiB of 64"
[ "$total" -le $((64 << 20)) ] || echo "gpu_bundle: WARNING: over the 64 MiB a GPU call carries" >&2

#!/usr/bin/env bash
# Configures and builds kvtrim into ./build (CPU backend; CUDA when KVTRIM_CUDA=ON/AUTO finds nvcc).
# Optional: KVTRIM_CUDA_ARCHITECTURES (CMAKE_CUDA_ARCHITECTURES), KVTRIM_GIT_COMMIT (the commit
# --version reports outside a git checkout), BUILD_TARGETS (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVTRIM_CUDA="${KVTRIM_CUDA:-AUTO}" \
  -DKVTRIM_BUILD_TESTS="${KVTRIM_BUILD_TESTS:-ON}" -DKVTRIM_BUILD_BENCHMARKS="${KVTRIM_BUILD_BENCHMARKS:-ON}" \
  ${KVTRIM_CUDA_ARCHITECTURES:+"-DCMAKE_CUDA_ARCHITECTURES=$KVTRIM_CUDA_ARCHITECTURES"} \
  ${KVTRIM_GIT_COMMIT:+"-DKVTRIM_GIT_COMMIT=$KVTRIM_GIT_COMMIT"}
cmake --build "$BUILD_DIR" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}

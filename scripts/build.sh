#!/usr/bin/env bash
# Configures and builds kvtrim into ./build (CPU backend; CUDA when KVTRIM_CUDA=ON/AUTO finds nvcc).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKVTRIM_CUDA="${KVTRIM_CUDA:-AUTO}" \
  -DKVTRIM_BUILD_TESTS="${KVTRIM_BUILD_TESTS:-ON}" -DKVTRIM_BUILD_BENCHMARKS="${KVTRIM_BUILD_BENCHMARKS:-ON}"
cmake --build "$BUILD_DIR" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS}

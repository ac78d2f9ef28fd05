// Shared by the GPU tests: is a CUDA device usable here, and the skip macro for when not.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "gtest/gtest.h"

namespace kvtrim::gpu::testing {

/// Why no GPU is usable ("" when one is). Asked once per process: cudaGetDeviceCount and a
/// first cudaFree(nullptr) that creates the context (a broken driver fails here).
inline const std::string& NoGpuReason() {
  static const std::string reason = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count == 0) return std::string("no CUDA device");
    if (err == cudaSuccess) err = cudaFree(nullptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    }
    return std::string();
  }();
  return reason;
}

/// True when a CUDA device is visible and a context can be created on device 0.
inline bool HaveGpu() { return NoGpuReason().empty(); }

}  // namespace kvtrim::gpu::testing

/// Skips the current test (GTEST_SKIP) when no GPU is usable, naming the reason.
#define KVTRIM_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                              \
    if (!::kvtrim::gpu::testing::HaveGpu()) {                                       \
      GTEST_SKIP() << "no usable GPU: " << ::kvtrim::gpu::testing::NoGpuReason();   \
    }                                                                               \
  } while (0)

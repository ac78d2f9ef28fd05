// Shared by the GPU tests: a device buffer freed at scope exit, and the median time of a
// launch between CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace kvtrim::gpu::testing {

/// Device buffer freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { Allocate(bytes); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// Allocates `bytes` (at least 1) of device memory; false on failure.
  bool Allocate(size_t bytes) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    return cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)) == cudaSuccess;
  }
  /// True when the buffer holds memory.
  bool ok() const { return ptr_ != nullptr; }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

/// Median microseconds of `launch` (returning cudaError_t) over `reps` runs after 3 warm-up
/// runs on the default stream: all runs are enqueued between event pairs first, then read once
/// the stream is idle.
template <typename Fn>
double MedianLaunchMicros(int reps, Fn&& launch) {
  for (int i = 0; i < 3; ++i) EXPECT_EQ(launch(), cudaSuccess);
  std::vector<cudaEvent_t> events(static_cast<size_t>(2 * reps));
  for (cudaEvent_t& e : events) EXPECT_EQ(cudaEventCreate(&e), cudaSuccess);
  for (int i = 0; i < reps; ++i) {
    EXPECT_EQ(cudaEventRecord(events[2 * i], nullptr), cudaSuccess);
    EXPECT_EQ(launch(), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(events[2 * i + 1], nullptr), cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> micros;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), cudaSuccess);
    micros.push_back(1000.0 * ms);
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  std::nth_element(micros.begin(), micros.begin() + reps / 2, micros.end());
  return micros[static_cast<size_t>(reps / 2)];
}

}  // namespace kvtrim::gpu::testing

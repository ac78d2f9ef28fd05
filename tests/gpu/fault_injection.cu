#include "tests/gpu/fault_injection.h"

#include <cstdint>

namespace kvtrim::gpu::testing {

namespace {

/// Writes one word through `target`, an address no allocation covers.
__global__ void WriteThroughBadPointer(int* target) { *target = 42; }

}  // namespace

cudaError_t InjectStickyFault(cudaStream_t stream) {
  // Far above any real allocation and 4-byte aligned: an illegal address, not a misaligned one.
  int* bad = reinterpret_cast<int*>(uintptr_t{0x7ff000000000});
  WriteThroughBadPointer<<<1, 1, 0, stream>>>(bad);
  const cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) return launch;
  return cudaStreamSynchronize(stream);
}

}  // namespace kvtrim::gpu::testing

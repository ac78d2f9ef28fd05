#include "kernels/gpu/runtime/device_probe.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtrim::gpu {

DeviceCensus CountCudaDevices() {
  DeviceCensus census;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    census.reason = absl::StrCat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    return census;
  }
  census.count = count;
  if (count == 0) census.reason = "cudaGetDeviceCount reports 0 devices";
  return census;
}

int DeviceOfAddress(const void* address) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice ? attributes.device : -1;
}

std::string DescribeCudaDevice(int device) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("device ", device, " (properties unavailable: ", cudaGetErrorName(err),
                        ")");
  }
  return absl::StrFormat("%s (device %d, sm_%d%d, %.1f GiB)", prop.name, device, prop.major,
                         prop.minor,
                         static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace kvtrim::gpu

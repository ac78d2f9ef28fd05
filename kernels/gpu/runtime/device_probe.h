// Discovery of the CUDA devices this process can use (before any backend exists).
#pragma once

#include <string>

namespace kvtrim::gpu {

/// What the CUDA runtime reports about the visible devices.
struct DeviceCensus {
  int count = 0;       // devices visible (0 when there is no driver or no device)
  std::string reason;  // why count is 0, e.g. "cudaErrorNoDevice: no CUDA-capable device
                       // is detected"; empty when count > 0
};

/// Calls cudaGetDeviceCount and clears the error it leaves behind when it fails. Never
/// fails itself: a machine without a driver or a GPU has count 0 and a reason.
DeviceCensus CountCudaDevices();

/// The CUDA ordinal of the device that holds `address` (cudaPointerGetAttributes; mapped
/// CUDA IPC memory included), or -1 when it is not device memory of this process.
int DeviceOfAddress(const void* address);

/// "NVIDIA H100 80GB HBM3 (device 0, sm_90, 79.1 GiB)" for the start-up line; a short
/// error text when the properties cannot be read.
std::string DescribeCudaDevice(int device);

}  // namespace kvtrim::gpu

// WgmmaAvailable and ResolveMmaKernel (mma_kernel.h).
#include "kernels/gpu/kernels/mma_kernel.h"

#include <cuda_runtime.h>

#include <atomic>

namespace kvtrim::gpu {

namespace {

constexpr int kMaxDevices = 64;  // devices whose answer is remembered

/// Per device (index < kMaxDevices): 0 unknown, 1 mma.sync only, 2 wgmma.
std::atomic<int> g_wgmma[kMaxDevices];

}  // namespace

bool WgmmaAvailable() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const bool remembered = device >= 0 && device < kMaxDevices;
  if (remembered) {
    const int known = g_wgmma[device].load(std::memory_order_acquire);
    if (known != 0) return known == 2;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  const bool wgmma = major == 9 && minor == 0;
  if (remembered) g_wgmma[device].store(wgmma ? 2 : 1, std::memory_order_release);
  return wgmma;
}

bool ResolveMmaKernel(MmaKernel kernel, bool* use_wgmma) {
  switch (kernel) {
    case MmaKernel::kAuto:
      *use_wgmma = WgmmaAvailable();
      return true;
    case MmaKernel::kMmaSync:
      *use_wgmma = false;
      return true;
    case MmaKernel::kWgmma:
      *use_wgmma = true;
      return WgmmaAvailable();
  }
  return false;
}

}  // namespace kvtrim::gpu

// MakeCudaDeviceMapper for builds without CUDA: there is no device to map onto.
#include "service/device_mapper.h"

namespace kvtrim::service {

absl::StatusOr<std::unique_ptr<DeviceMapper>> MakeCudaDeviceMapper(
    const std::vector<int>& devices) {
  (void)devices;
  return std::unique_ptr<DeviceMapper>();
}

}  // namespace kvtrim::service

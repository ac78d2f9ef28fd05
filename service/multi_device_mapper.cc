// MultiDeviceMapper: the served device of a UUID (service/device_mapper.h).
#include <vector>

#include "absl/strings/str_join.h"
#include "service/device_mapper.h"

namespace kvtrim::service {

DeviceMapper* MultiDeviceMapper::ForUuid(const std::string& uuid16) {
  for (const auto& device : devices_) {
    if (DeviceMapper* found = device->ForUuid(uuid16)) return found;
  }
  return nullptr;
}

std::string MultiDeviceMapper::ServedDevices() const {
  std::vector<std::string> names;
  for (const auto& device : devices_) names.push_back(device->ServedDevices());
  return absl::StrJoin(names, ", ");
}

std::vector<DeviceMapper::Served> MultiDeviceMapper::ServedList() const {
  std::vector<Served> served;
  for (const auto& device : devices_) {
    for (Served& one : device->ServedList()) served.push_back(std::move(one));
  }
  return served;
}

}  // namespace kvtrim::service

// The service's window onto CUDA IPC: opening a worker's exported allocation or event on the
// sidecar's device. Implemented over kernels/gpu when kvtrimd runs the GPU backend
// (service/cuda_device_mapper.cc); absent otherwise, and CUDA IPC regions are then refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtrim::service {

/// A mapped device allocation; unmapped when destroyed.
class MappedDeviceMemory {
 public:
  virtual ~MappedDeviceMemory() = default;
  /// Device address of the allocation's first byte in this process.
  virtual const char* base() const = 0;
};

/// An opened interprocess event; destroyed with the object.
class MappedDeviceEvent {
 public:
  virtual ~MappedDeviceEvent() = default;
  /// The cudaEvent_t, opaque.
  virtual void* event() const = 0;
};

/// Opens CUDA IPC handles on the sidecar's device. Thread-safe.
class DeviceMapper {
 public:
  virtual ~DeviceMapper() = default;
  /// The 16-byte UUID of the sidecar's device.
  virtual const std::string& device_uuid() const = 0;
  /// "GPU-xxxxxxxx-..." form of a 16-byte UUID, for messages.
  virtual std::string FormatUuid(const std::string& uuid16) const = 0;
  /// Maps a cudaIpcMemHandle; checks size_bytes against the allocation. INVALID_ARGUMENT
  /// naming `field` + ".handle" / ".size_bytes".
  virtual absl::StatusOr<std::unique_ptr<MappedDeviceMemory>> OpenMemory(
      const std::string& handle, uint64_t size_bytes, const std::string& field) = 0;
  /// Opens a cudaIpcEventHandle. INVALID_ARGUMENT naming `field` + ".handle".
  virtual absl::StatusOr<std::unique_ptr<MappedDeviceEvent>> OpenEvent(
      const std::string& handle, const std::string& field) = 0;
};

/// The CUDA implementation on device ordinal `device`, or null when this kvtrimd was built
/// without CUDA. INTERNAL when the device cannot be queried.
absl::StatusOr<std::unique_ptr<DeviceMapper>> MakeCudaDeviceMapper(int device);

}  // namespace kvtrim::service

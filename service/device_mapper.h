// The service's window onto CUDA IPC: opening a worker's exported allocation or event on the
// sidecar's device. Implemented over kernels/gpu when kvtrimd runs the GPU backend
// (service/cuda_device_mapper.cc); absent otherwise, and CUDA IPC regions are then refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

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

/// A host shm segment mapped and page-locked for the devices' copy engines; unregistered
/// and unmapped when destroyed. The host CPU never reads it (see PinHost).
class PinnedHostMemory {
 public:
  virtual ~PinnedHostMemory() = default;
  /// The segment's first byte in this process.
  virtual const char* base() const = 0;
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
  /// Maps `size_bytes` of the host shm segment open read-only at `fd` and page-locks it
  /// for every served device, so that layers are copied from it by DMA. UNIMPLEMENTED where
  /// the mapper cannot (the caller then reads the segment with pread); INVALID_ARGUMENT
  /// naming `field` when the system or the driver refuses.
  virtual absl::StatusOr<std::unique_ptr<PinnedHostMemory>> PinHost(int fd, uint64_t size_bytes,
                                                                    const std::string& field) {
    (void)fd;
    (void)size_bytes;
    return absl::UnimplementedError(absl::StrCat(field, ": no device to pin host memory for"));
  }
  /// Page-locks kvtrimd's own memory [data, data + bytes) for every served device (its
  /// pooled layer buffers), so that the devices copy layers from it by DMA. False where the
  /// mapper cannot or the driver refuses: the memory then stays pageable.
  virtual bool LockHost(void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    return false;
  }
  /// Undoes LockHost before the memory is freed.
  virtual void UnlockHost(void* data) { (void)data; }
  /// The mapper of the served device whose UUID is `uuid16`, or null when kvtrimd does not
  /// compute on it. One device: itself when the UUID matches.
  virtual DeviceMapper* ForUuid(const std::string& uuid16) {
    return uuid16 == device_uuid() ? this : nullptr;
  }
  /// A served device: its CUDA ordinal and 16-byte UUID.
  struct Served {
    int ordinal = 0;
    std::string uuid16;
  };
  /// Every device this mapper serves (none for mappers that stand for no real device).
  virtual std::vector<Served> ServedList() const { return {}; }
  /// The served devices for messages ("GPU-…, GPU-…").
  virtual std::string ServedDevices() const { return FormatUuid(device_uuid()); }
};

/// Several devices' mappers behind one: ForUuid picks the device; the rest is the first
/// device's. Built by MakeCudaDeviceMapper for more than one device.
class MultiDeviceMapper final : public DeviceMapper {
 public:
  explicit MultiDeviceMapper(std::vector<std::unique_ptr<DeviceMapper>> devices)
      : devices_(std::move(devices)) {}
  const std::string& device_uuid() const override { return devices_.front()->device_uuid(); }
  std::string FormatUuid(const std::string& uuid16) const override {
    return devices_.front()->FormatUuid(uuid16);
  }
  absl::StatusOr<std::unique_ptr<MappedDeviceMemory>> OpenMemory(
      const std::string& handle, uint64_t size_bytes, const std::string& field) override {
    return devices_.front()->OpenMemory(handle, size_bytes, field);
  }
  absl::StatusOr<std::unique_ptr<MappedDeviceEvent>> OpenEvent(
      const std::string& handle, const std::string& field) override {
    return devices_.front()->OpenEvent(handle, field);
  }
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> PinHost(int fd, uint64_t size_bytes,
                                                            const std::string& field) override {
    return devices_.front()->PinHost(fd, size_bytes, field);  // portable: every device
  }
  bool LockHost(void* data, size_t bytes) override {
    return devices_.front()->LockHost(data, bytes);  // portable: every device
  }
  void UnlockHost(void* data) override { devices_.front()->UnlockHost(data); }
  DeviceMapper* ForUuid(const std::string& uuid16) override;
  std::string ServedDevices() const override;
  std::vector<Served> ServedList() const override;

 private:
  std::vector<std::unique_ptr<DeviceMapper>> devices_;
};

/// The CUDA implementation on the device ordinals `devices` (one mapper, or a
/// MultiDeviceMapper over several), or null when this kvtrimd was built without CUDA.
/// INTERNAL when a device cannot be queried.
absl::StatusOr<std::unique_ptr<DeviceMapper>> MakeCudaDeviceMapper(const std::vector<int>& devices);

}  // namespace kvtrim::service

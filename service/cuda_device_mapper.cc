// DeviceMapper over kernels/gpu/ipc_region (built with CUDA only; see
// service/no_cuda_device_mapper.cc for the other build).
#include "kernels/gpu/runtime/ipc_region.h"
#include "kernels/gpu/runtime/pinned_host_mapping.h"
#include "service/device_mapper.h"

namespace kvtrim::service {

namespace {

/// gpu::IpcMemoryMapping as a MappedDeviceMemory.
class CudaMappedMemory final : public MappedDeviceMemory {
 public:
  explicit CudaMappedMemory(std::unique_ptr<gpu::IpcMemoryMapping> mapping)
      : mapping_(std::move(mapping)) {}
  const char* base() const override { return mapping_->base(); }

 private:
  std::unique_ptr<gpu::IpcMemoryMapping> mapping_;
};

/// gpu::IpcEvent as a MappedDeviceEvent.
class CudaMappedEvent final : public MappedDeviceEvent {
 public:
  explicit CudaMappedEvent(std::unique_ptr<gpu::IpcEvent> event) : event_(std::move(event)) {}
  void* event() const override { return event_->event(); }

 private:
  std::unique_ptr<gpu::IpcEvent> event_;
};

/// gpu::PinnedHostMapping as a PinnedHostMemory.
class CudaPinnedHost final : public PinnedHostMemory {
 public:
  explicit CudaPinnedHost(std::unique_ptr<gpu::PinnedHostMapping> mapping)
      : mapping_(std::move(mapping)) {}
  const char* base() const override { return mapping_->base(); }

 private:
  std::unique_ptr<gpu::PinnedHostMapping> mapping_;
};

/// Opens handles on one device ordinal.
class CudaDeviceMapper final : public DeviceMapper {
 public:
  CudaDeviceMapper(int device, std::string uuid) : device_(device), uuid_(std::move(uuid)) {}
  const std::string& device_uuid() const override { return uuid_; }
  std::string FormatUuid(const std::string& uuid16) const override {
    return gpu::FormatUuid(uuid16);
  }
  absl::StatusOr<std::unique_ptr<MappedDeviceMemory>> OpenMemory(
      const std::string& handle, uint64_t size_bytes, const std::string& field) override {
    auto mapping = gpu::IpcMemoryMapping::Open(device_, handle, size_bytes, field);
    if (!mapping.ok()) return mapping.status();
    return std::unique_ptr<MappedDeviceMemory>(new CudaMappedMemory(*std::move(mapping)));
  }
  absl::StatusOr<std::unique_ptr<MappedDeviceEvent>> OpenEvent(
      const std::string& handle, const std::string& field) override {
    auto event = gpu::IpcEvent::Open(device_, handle, field);
    if (!event.ok()) return event.status();
    return std::unique_ptr<MappedDeviceEvent>(new CudaMappedEvent(*std::move(event)));
  }
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> PinHost(int fd, uint64_t size_bytes,
                                                            const std::string& field) override {
    auto mapping = gpu::PinnedHostMapping::Map(device_, fd, size_bytes, field);
    if (!mapping.ok()) return mapping.status();
    return std::unique_ptr<PinnedHostMemory>(new CudaPinnedHost(*std::move(mapping)));
  }
  bool LockHost(void* data, size_t bytes) override {
    return gpu::LockHostMemory(device_, data, bytes);
  }
  void UnlockHost(void* data) override { gpu::UnlockHostMemory(data); }
  std::vector<Served> ServedList() const override { return {{device_, uuid_}}; }

 private:
  int device_;
  std::string uuid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMapper>> MakeCudaDeviceMapper(
    const std::vector<int>& devices) {
  std::vector<std::unique_ptr<DeviceMapper>> mappers;
  for (int device : devices) {
    auto uuid = gpu::DeviceUuid(device);
    if (!uuid.ok()) return uuid.status();
    mappers.push_back(std::make_unique<CudaDeviceMapper>(device, *std::move(uuid)));
  }
  if (mappers.size() == 1) return std::move(mappers.front());
  return std::unique_ptr<DeviceMapper>(std::make_unique<MultiDeviceMapper>(std::move(mappers)));
}

}  // namespace kvtrim::service

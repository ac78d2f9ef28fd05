// CUDA IPC on the sidecar's side: opening a worker's exported device allocation or event
// once, checking it against the sidecar's device, and closing it when the last user is done.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvtrim::gpu {

/// A worker's device allocation mapped into this process (cudaIpcOpenMemHandle). The
/// mapping is closed (cudaIpcCloseMemHandle) when the object is destroyed. Thread-safe.
class IpcMemoryMapping {
 public:
  /// Opens the 64-byte cudaIpcMemHandle `handle` on `device` and checks that the worker's
  /// declared `size_bytes` fits the allocation the handle names (cuMemGetAddressRange).
  /// Errors (the messages name `field` + sub-field):
  ///  INVALID_ARGUMENT  handle not 64 bytes; size_bytes 0 or larger than the allocation;
  ///                    the driver refuses the handle (not an exported cudaMalloc
  ///                    allocation: VMM / cuMemCreate / expandable-segments memory cannot be
  ///                    shared through cudaIpcGetMemHandle, or a handle of this very
  ///                    process)
  static absl::StatusOr<std::unique_ptr<IpcMemoryMapping>> Open(int device,
                                                                const std::string& handle,
                                                                uint64_t size_bytes,
                                                                const std::string& field);
  ~IpcMemoryMapping();
  IpcMemoryMapping(const IpcMemoryMapping&) = delete;
  IpcMemoryMapping& operator=(const IpcMemoryMapping&) = delete;

  /// Device address of the allocation's first byte in this process.
  const char* base() const { return base_; }

 private:
  IpcMemoryMapping(int device, char* base) : device_(device), base_(base) {}
  int device_;
  char* base_;
};

/// A worker's interprocess event (cudaIpcOpenEventHandle); destroyed with the object.
class IpcEvent {
 public:
  /// Opens the 64-byte cudaIpcEventHandle `handle` on `device`. INVALID_ARGUMENT naming
  /// `field` + ".handle" when it is malformed or the driver refuses it.
  static absl::StatusOr<std::unique_ptr<IpcEvent>> Open(int device, const std::string& handle,
                                                        const std::string& field);
  ~IpcEvent();
  IpcEvent(const IpcEvent&) = delete;
  IpcEvent& operator=(const IpcEvent&) = delete;

  /// The cudaEvent_t, opaque (LayerRequest::ready_event).
  void* event() const { return event_; }

 private:
  IpcEvent(int device, void* event) : device_(device), event_(event) {}
  int device_;
  void* event_;
};

/// The 16-byte UUID of `device` (cudaDeviceProp::uuid), as raw bytes. INTERNAL on failure.
absl::StatusOr<std::string> DeviceUuid(int device);

/// "GPU-xxxxxxxx-xxxx-..." for messages.
std::string FormatUuid(const std::string& uuid16);

}  // namespace kvtrim::gpu

// A worker's CUDA device memory exported to kvtrimd by CUDA IPC: one cudaMalloc buffer of
// equal slots, a stream and one interprocess event. Built only with CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtrim::loadgen {

/// What RegionLease::RegisterCudaIpc / RegisterCudaIpcEvent need.
struct DeviceExport {
  std::string mem_handle;    // 64-byte cudaIpcMemHandle_t of the buffer's base
  std::string event_handle;  // 64-byte cudaIpcEventHandle_t of the ready event
  std::string device_uuid;   // 16-byte cudaDeviceProp.uuid
  int device = 0;            // device ordinal
  uint64_t size_bytes = 0;   // slots * slot_bytes
};

/// A cudaMalloc buffer of `slots` slots of `slot_bytes` bytes on one device, with its IPC
/// handles, a non-blocking stream and an interprocess (timing-disabled) event.
class DeviceBuffer {
 public:
  /// Allocates `wanted_slots` slots of `slot_bytes` on `device` -- or a single slot when
  /// that many do not fit in the device's free memory (less a 1 GiB margin); `note` then
  /// says so. FAILED_PRECONDITION when cudaIpcGetMemHandle refuses the memory (it cannot
  /// be shared by CUDA IPC, e.g. VMM / expandable-segments allocations); the CUDA error
  /// text naming the call otherwise.
  static absl::StatusOr<std::unique_ptr<DeviceBuffer>> Create(int device, uint64_t slot_bytes,
                                                              int wanted_slots, std::string* note);

  /// Frees the event, the stream and the buffer.
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// Copies `bytes` bytes from host `source` to byte `offset` of every slot, and waits.
  absl::Status CopyToEverySlot(uint64_t offset, const void* source, uint64_t bytes);

  /// Records the ready event on the buffer's stream (after everything queued on it).
  absl::Status RecordReady();

  /// Slots allocated (the wanted count, or 1 after the fallback).
  int slots() const { return slots_; }
  /// Bytes per slot.
  uint64_t slot_bytes() const { return slot_bytes_; }
  /// The handles and sizes to register.
  const DeviceExport& exported() const { return export_; }

 private:
  DeviceBuffer() = default;

  int slots_ = 0;
  uint64_t slot_bytes_ = 0;
  void* base_ = nullptr;    // device pointer
  void* stream_ = nullptr;  // cudaStream_t
  void* event_ = nullptr;   // cudaEvent_t
  DeviceExport export_;
};

}  // namespace kvtrim::loadgen

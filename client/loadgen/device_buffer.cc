#include "client/loadgen/device_buffer.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvtrim::loadgen {
namespace {

/// OK, or INTERNAL "`call`: <CUDA error name>: <text>".
absl::Status Check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

constexpr uint64_t kFreeMemoryMargin = uint64_t{1} << 30;

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Create(int device, uint64_t slot_bytes,
                                                                   int wanted_slots,
                                                                   std::string* note) {
  if (slot_bytes == 0 || wanted_slots < 1) {
    return absl::InvalidArgumentError("DeviceBuffer: slot_bytes and slots must be positive");
  }
  KVTRIM_RETURN_IF_ERROR(Check(cudaSetDevice(device), "cudaSetDevice"));
  size_t free_bytes = 0, total_bytes = 0;
  KVTRIM_RETURN_IF_ERROR(Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  std::unique_ptr<DeviceBuffer> buffer(new DeviceBuffer());
  buffer->slot_bytes_ = slot_bytes;
  buffer->slots_ = wanted_slots;
  const uint64_t usable = free_bytes > kFreeMemoryMargin ? free_bytes - kFreeMemoryMargin : 0;
  if (slot_bytes * static_cast<uint64_t>(wanted_slots) > usable) {
    buffer->slots_ = 1;
    if (note != nullptr) {
      *note = absl::StrCat("cuda_ipc: ", wanted_slots, " layer slots of ", slot_bytes,
                           " bytes do not fit in device ", device, "'s free memory (", free_bytes,
                           " bytes, 1 GiB kept free): every layer shares one slot");
    }
  }
  const uint64_t size = slot_bytes * static_cast<uint64_t>(buffer->slots_);
  if (absl::Status s = Check(cudaMalloc(&buffer->base_, size), "cudaMalloc"); !s.ok()) {
    buffer->base_ = nullptr;
    return s;
  }
  cudaStream_t stream = nullptr;
  if (absl::Status s = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  buffer->stream_ = stream;
  cudaEvent_t event = nullptr;
  if (absl::Status s =
          Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
                "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  buffer->event_ = event;

  cudaIpcMemHandle_t mem_handle;
  if (cudaError_t error = cudaIpcGetMemHandle(&mem_handle, buffer->base_); error != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaIpcGetMemHandle: ", cudaGetErrorName(error), ": ", cudaGetErrorString(error),
        ": this memory cannot be shared by CUDA IPC (only cudaMalloc allocations can; VMM / "
        "cuMemCreate and PyTorch expandable-segments memory cannot)"));
  }
  cudaIpcEventHandle_t event_handle;
  if (absl::Status s = Check(cudaIpcGetEventHandle(&event_handle, event), "cudaIpcGetEventHandle");
      !s.ok()) {
    return s;
  }
  cudaDeviceProp properties;
  if (absl::Status s =
          Check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  DeviceExport& out = buffer->export_;
  out.mem_handle.assign(mem_handle.reserved, sizeof(mem_handle.reserved));
  out.event_handle.assign(event_handle.reserved, sizeof(event_handle.reserved));
  out.device_uuid.assign(properties.uuid.bytes, sizeof(properties.uuid.bytes));
  out.device = device;
  out.size_bytes = size;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (base_ != nullptr) cudaFree(base_);
}

absl::Status DeviceBuffer::CopyToEverySlot(uint64_t offset, const void* source, uint64_t bytes) {
  if (offset + bytes > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("CopyToEverySlot: bytes [", offset, ", ",
                                                   offset + bytes, ") leave the slot of ",
                                                   slot_bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  KVTRIM_RETURN_IF_ERROR(Check(cudaSetDevice(export_.device), "cudaSetDevice"));
  auto stream = static_cast<cudaStream_t>(stream_);
  for (int slot = 0; slot < slots_; ++slot) {
    char* target = static_cast<char*>(base_) + slot * slot_bytes_ + offset;
    if (absl::Status s =
            Check(cudaMemcpyAsync(target, source, bytes, cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync");
        !s.ok()) {
      return s;
    }
  }
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status DeviceBuffer::RecordReady() {
  return Check(
      cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream_)),
      "cudaEventRecord");
}

}  // namespace kvtrim::loadgen

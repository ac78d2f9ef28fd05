#include "libkvtrim/native_client.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

#if KVTRIM_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>
#endif

namespace kvtrim::inprocess {

namespace {

#if KVTRIM_HAVE_CUDA
/// INTERNAL "<what>: <CUDA error>" for a failed runtime call.
absl::Status CudaError(const char* what, cudaError_t error) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

/// The 16-byte UUID of CUDA device `device`.
absl::StatusOr<std::string> DeviceUuid(int device) {
  cudaDeviceProp properties{};
  if (cudaError_t e = cudaGetDeviceProperties(&properties, device); e != cudaSuccess) {
    return CudaError("cudaGetDeviceProperties", e);
  }
  return std::string(properties.uuid.bytes, sizeof(properties.uuid.bytes));
}

/// cuMemGetAddressRange (v2) from the driver through the runtime's entry-point query, so that
/// libkvtrim does not link libcuda: it loads on machines without the NVIDIA driver.
using MemGetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

/// The driver's cuMemGetAddressRange, or null when the driver lacks it.
MemGetAddressRange AddressRangeFunction() {
  static const MemGetAddressRange function = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &pointer, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return MemGetAddressRange{nullptr};
    }
    return reinterpret_cast<MemGetAddressRange>(pointer);
  }();
  return function;
}

/// cuPointerGetAttributes from the driver (as cuMemGetAddressRange): one call gives an
/// allocation's range and its buffer id, unique within the process for the allocation's life.
using PointerGetAttributes = CUresult (*)(unsigned int, CUpointer_attribute*, void**,
                                          CUdeviceptr);

/// The driver's cuPointerGetAttributes, or null when the driver lacks it.
PointerGetAttributes PointerAttributesFunction() {
  static const PointerGetAttributes function = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &pointer, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return PointerGetAttributes{nullptr};
    }
    return reinterpret_cast<PointerGetAttributes>(pointer);
  }();
  return function;
}

/// The allocation holding a device pointer: its base, size and buffer id.
struct Allocation {
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;  // 0: unknown (the driver could not say)
};

/// The allocation of `pointer`: one cuPointerGetAttributes call, else cuMemGetAddressRange
/// (buffer id 0). INVALID_ARGUMENT when it is no device pointer.
absl::StatusOr<Allocation> AllocationOf(const void* pointer) {
  Allocation out;
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(pointer);
  if (const PointerGetAttributes attributes = PointerAttributesFunction();
      attributes != nullptr) {
    CUpointer_attribute names[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void* values[] = {&out.base, &out.size, &out.buffer_id};
    if (attributes(3, names, values, address) == CUDA_SUCCESS && out.base != 0) return out;
    out = Allocation{};
  }
  const MemGetAddressRange address_range = AddressRangeFunction();
  if (address_range == nullptr) {
    return absl::FailedPreconditionError("the CUDA driver has no cuMemGetAddressRange");
  }
  if (CUresult r = address_range(&out.base, &out.size, address); r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a CUDA device pointer (cuMemGetAddressRange: error ", r, ")"));
  }
  return out;
}

/// Makes `device` current for this thread until destroyed.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<NativeClient>> NativeClient::Connect(const std::string& target,
                                                                    double timeout_seconds,
                                                                    int max_message_bytes,
                                                                    const std::string& auth_token) {
  ClientOptions options;
  options.auth_token = auth_token;
  if (timeout_seconds > 0) options.default_deadline = absl::Seconds(timeout_seconds);
  if (max_message_bytes > 0) options.max_message_bytes = max_message_bytes;
  auto client = Client::Connect(target, options);
  if (!client.ok()) return client.status();
  std::unique_ptr<NativeClient> native(new NativeClient());
  native->client_ = *std::move(client);
  return native;
}

NativeClient::~NativeClient() {
  if (lease_ != nullptr) lease_->Close().IgnoreError();
#if KVTRIM_HAVE_CUDA
  for (auto& [device, entry] : events_) cudaEventDestroy(static_cast<cudaEvent_t>(entry.event));
#endif
}

absl::StatusOr<RegionLease*> NativeClient::Lease() {
  if (lease_ == nullptr) {
    auto lease = client_->OpenRegionLease();
    if (!lease.ok()) return lease.status();
    lease_ = *std::move(lease);
    client_->SetClientId(lease_->client_id());
  }
  return lease_.get();
}

absl::StatusOr<std::string> NativeClient::RegionOf(const void* pointer, int device,
                                                   uint64_t* offset) {
#if KVTRIM_HAVE_CUDA
  DeviceScope scope(device);
  auto allocation = AllocationOf(pointer);
  if (!allocation.ok()) return allocation.status();
  *offset = reinterpret_cast<CUdeviceptr>(pointer) - allocation->base;
  const std::pair<int, unsigned long long> buffer(device, allocation->buffer_id);
  if (allocation->buffer_id != 0) {
    // A registered allocation that still lives (a freed one's range gets a new buffer id):
    // no IPC handle query.
    std::lock_guard<std::mutex> lock(mu_);
    if (auto known = buffer_handles_.find(buffer); known != buffer_handles_.end()) {
      if (auto it = regions_.find(known->second); it != regions_.end()) {
        region_order_.remove(known->second);
        region_order_.push_back(known->second);
        return it->second;
      }
      buffer_handles_.erase(known);
    }
  }
  cudaIpcMemHandle_t handle;
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(allocation->base));
      e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaIpcGetMemHandle refuses this memory (", cudaGetErrorName(e),
                     "): VMM / expandable-segments allocations cannot be shared by CUDA IPC"));
  }
  const std::string key(handle.reserved, sizeof(handle.reserved));
  std::lock_guard<std::mutex> lock(mu_);
  if (allocation->buffer_id != 0) buffer_handles_[buffer] = key;
  if (auto it = regions_.find(key); it != regions_.end()) {
    region_order_.remove(key);
    region_order_.push_back(key);
    return it->second;
  }
  auto lease = Lease();
  if (!lease.ok()) return lease.status();
  // Room for the new region, the device events and a spare: release the oldest first.
  const size_t limit = static_cast<size_t>(std::max(1, (*lease)->max_regions() - 4));
  while (regions_.size() >= limit && !region_order_.empty()) {
    const std::string oldest = region_order_.front();
    (*lease)->Unregister(regions_[oldest]).IgnoreError();
    regions_.erase(oldest);
    region_order_.pop_front();
    for (auto it = buffer_handles_.begin(); it != buffer_handles_.end();) {
      it = it->second == oldest ? buffer_handles_.erase(it) : std::next(it);
    }
  }
  auto uuid = DeviceUuid(device);
  if (!uuid.ok()) return uuid.status();
  auto region = (*lease)->RegisterCudaIpc(key, device, *uuid, allocation->size);
  if (!region.ok()) return region.status();
  regions_[key] = *region;
  region_order_.push_back(key);
  return *region;
#else
  (void)pointer;
  (void)device;
  (void)offset;
  return absl::UnimplementedError("this libkvtrim was built without CUDA");
#endif
}

absl::StatusOr<std::string> NativeClient::ReadyEvent(int device, void* stream) {
#if KVTRIM_HAVE_CUDA
  DeviceScope scope(device);
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (cudaStreamQuery(cuda_stream) == cudaSuccess) return std::string();  // nothing pending
  cudaGetLastError();  // cudaErrorNotReady is not an error here
  std::lock_guard<std::mutex> lock(mu_);
  DeviceEvent& entry = events_[device];
  if (entry.event == nullptr) {
    cudaEvent_t event = nullptr;
    if (cudaError_t e =
            cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess);
        e != cudaSuccess) {
      events_.erase(device);
      return CudaError("cudaEventCreateWithFlags", e);
    }
    entry.event = event;
  }
  cudaEvent_t event = static_cast<cudaEvent_t>(entry.event);
  if (cudaError_t e = cudaEventRecord(event, cuda_stream); e != cudaSuccess) {
    return CudaError("cudaEventRecord", e);
  }
  if (entry.id.empty()) {
    cudaIpcEventHandle_t handle;
    if (cudaError_t e = cudaIpcGetEventHandle(&handle, event); e != cudaSuccess) {
      return CudaError("cudaIpcGetEventHandle", e);
    }
    auto lease = Lease();
    if (!lease.ok()) return lease.status();
    auto uuid = DeviceUuid(device);
    if (!uuid.ok()) return uuid.status();
    auto id = (*lease)->RegisterCudaIpcEvent(std::string(handle.reserved, sizeof(handle.reserved)),
                                             *uuid);
    if (!id.ok()) return id.status();
    entry.id = *id;
  }
  return entry.id;
#else
  (void)device;
  (void)stream;
  return std::string();
#endif
}

absl::Status NativeClient::FillTensor(const CallerTensor& tensor, const std::string& field,
                                      v1::Tensor* out, absl::Span<const char>* host_bytes) {
  out->set_dtype(tensor.dtype);
  for (int64_t extent : tensor.shape) out->add_shape(extent);
  const int64_t element = tensor.dtype == v1::DTYPE_F32 ? 4 : 2;
  if (tensor.device < 0) {
    if (!tensor.dense()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".strides: host tensors must be dense row-major"));
    }
    const int64_t bytes = tensor.shape[0] * tensor.shape[1] * tensor.shape[2] * element;
    const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 0));
    if (host_bytes != nullptr) {
      *host_bytes = absl::Span<const char>(static_cast<const char*>(tensor.data), size);
    } else {
      out->set_inline_data(tensor.data, size);
    }
    return absl::OkStatus();
  }
  uint64_t offset = 0;
  auto region = RegionOf(tensor.data, tensor.device, &offset);
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat(field, ".device: ", region.status().message()));
  }
  v1::RegionSlice* slice = out->mutable_cuda_ipc();
  slice->set_region_id(*region);
  slice->set_offset_bytes(offset);
  if (!tensor.dense()) {
    for (int64_t stride : tensor.strides) slice->add_strides_elements(stride);
  }
  return absl::OkStatus();
}

absl::Status NativeClient::BuildLayer(const CallerLayer& layer, const std::string& field,
                                      v1::LayerInput* input, LayerTensorBytes* bytes, int* device) {
  input->set_layer_id(layer.layer_id);
  input->set_softmax_scale(layer.softmax_scale);
  struct Slot {
    const CallerTensor* tensor;
    const char* name;
    v1::Tensor* (v1::LayerInput::*mutable_tensor)();
    absl::Span<const char>* bytes;
  };
  const Slot slots[3] = {
      {&layer.keys, "keys", &v1::LayerInput::mutable_keys, bytes ? &bytes->keys : nullptr},
      {&layer.values, "values", &v1::LayerInput::mutable_values, bytes ? &bytes->values : nullptr},
      {&layer.queries, "queries", &v1::LayerInput::mutable_queries,
       bytes ? &bytes->queries : nullptr}};
  for (const Slot& slot : slots) {
    if (slot.tensor->data == nullptr) continue;
    if (auto st = FillTensor(*slot.tensor, absl::StrCat(field, ".", slot.name),
                             (input->*slot.mutable_tensor)(), slot.bytes);
        !st.ok()) {
      return st;
    }
    if (slot.tensor->device >= 0) *device = slot.tensor->device;
  }
  if (layer.output != nullptr) {
    uint64_t offset = 0;
    auto region = RegionOf(layer.output, layer.keys.device, &offset);
    if (!region.ok()) {
      return absl::Status(region.status().code(),
                          absl::StrCat(field, ".output: ", region.status().message()));
    }
    v1::RegionSlice* slice = input->mutable_output()->mutable_cuda_ipc();
    slice->set_region_id(*region);
    slice->set_offset_bytes(offset);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CompressResponse> NativeClient::Compress(const v1::CompressionSettings& settings,
                                                            const std::vector<CallerLayer>& layers,
                                                            void* cuda_stream) {
  v1::CompressRequest request;
  *request.mutable_settings() = settings;
  int device = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (auto st = BuildLayer(layers[i], absl::StrCat("layers[", i, "]"), request.add_layers(),
                             nullptr, &device);
        !st.ok()) {
      return st;
    }
  }
  if (device >= 0) {
    auto ready = ReadyEvent(device, cuda_stream);
    if (!ready.ok()) return ready.status();
    if (!ready->empty()) {
      for (v1::LayerInput& input : *request.mutable_layers()) input.set_ready_event_id(*ready);
    }
  }
  return client_->Compress(request);
}

absl::StatusOr<std::unique_ptr<NativeSession>> NativeClient::OpenSession(
    const v1::CompressionSettings& settings, bool open_lease, bool* regions) {
  *regions = false;
  if (open_lease) {
    // Region tensors need the lease's client id on the stream's metadata, fixed at open.
    std::lock_guard<std::mutex> lock(mu_);
    *regions = Lease().ok();
  }
  auto session = client_->OpenSession(settings);
  if (!session.ok()) return session.status();
  return std::unique_ptr<NativeSession>(new NativeSession(this, *std::move(session)));
}

absl::Status NativeSession::Send(const CallerLayer& layer, void* cuda_stream) {
  v1::LayerInput input;
  LayerTensorBytes bytes;
  int device = -1;
  KVTRIM_RETURN_IF_ERROR(client_->BuildLayer(layer, "layer", &input, &bytes, &device));
  if (device >= 0) {
    auto ready = client_->ReadyEvent(device, cuda_stream);
    if (!ready.ok()) return ready.status();
    if (!ready->empty()) input.set_ready_event_id(*ready);
  }
  return session_->SendLayer(std::move(input), bytes);
}

}  // namespace kvtrim::inprocess

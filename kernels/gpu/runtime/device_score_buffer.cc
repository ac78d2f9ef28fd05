#include "kernels/gpu/runtime/device_score_buffer.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime/device_error.h"

namespace kvtrim::gpu {

namespace {

/// Bytes an uncapped store keeps pooled when idle (two sessions of 32 x 8 x 128K scores).
constexpr uint64_t kPooledBytes = uint64_t{256} << 20;

/// Makes `device` current for the scope and restores the previous device afterwards.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) cudaSetDevice(device_);
  }
  ~CurrentDevice() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

}  // namespace

DeviceScoreBuffer::~DeviceScoreBuffer() { store_->Release(data_, bytes_); }

absl::StatusOr<std::shared_ptr<DeviceScoreStore>> DeviceScoreStore::Create(int device,
                                                                          size_t limit_bytes) {
  std::shared_ptr<DeviceScoreStore> store(new DeviceScoreStore(device, limit_bytes));
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  int pools = 0;
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device),
      "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
  if (pools == 0) return store;  // cudaMalloc / cudaFree
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&store->free_stream_, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags(score store)");
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&store->pool_, &props), "cudaMemPoolCreate");
  // Freed memory stays in the pool for the next session's layers: up to the cap, or without
  // one up to kPooledBytes (beyond it, memory goes back to the device at synchronisations, so
  // an idle pool does not hold the peak of one large session from the arenas).
  uint64_t keep = limit_bytes != 0 ? limit_bytes : kPooledBytes;
  KVTRIM_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(store->pool_, cudaMemPoolAttrReleaseThreshold, &keep),
      "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
  return store;
}

DeviceScoreStore::~DeviceScoreStore() {
  CurrentDevice scope(device_);
  if (free_stream_ != nullptr) {
    cudaStreamSynchronize(free_stream_);  // nothing to report from a destructor
    cudaStreamDestroy(free_stream_);
  }
  if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
}

absl::StatusOr<std::shared_ptr<DeviceScoreBuffer>> DeviceScoreStore::Allocate(
    size_t floats, cudaStream_t stream) {
  const size_t bytes = floats * sizeof(float);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (limit_bytes_ != 0 && bytes_ + bytes > limit_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a layer's scores need ", bytes, " bytes of device memory but the GPU backend keeps "
          "at most ", limit_bytes_, " bytes of model-wide scores (", bytes_,
          " held now by sessions that have not finished)"));
    }
    bytes_ += bytes;
  }
  void* data = nullptr;
  cudaError_t err = cudaSuccess;
  if (bytes > 0) {
    CurrentDevice scope(device_);
    err = pool_ != nullptr ? cudaMallocFromPoolAsync(&data, bytes, pool_, stream)
                           : cudaMalloc(&data, bytes);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ -= bytes;
    return CudaStatus(err, absl::StrCat("allocating ", bytes, " bytes of model-wide scores"));
  }
  return std::shared_ptr<DeviceScoreBuffer>(
      new DeviceScoreBuffer(shared_from_this(), static_cast<float*>(data), bytes));
}

size_t DeviceScoreStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

void DeviceScoreStore::Release(float* data, size_t bytes) {
  if (data != nullptr) {
    CurrentDevice scope(device_);
    if (pool_ != nullptr) {
      cudaFreeAsync(data, free_stream_);  // nothing to report from a destructor
    } else {
      cudaFree(data);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_ -= bytes;
}

}  // namespace kvtrim::gpu

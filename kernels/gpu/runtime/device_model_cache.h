// Device copies of registered models' per-layer tensors for the model-aware scorers
// (criticalkv W_O in fp32 and, for fast numerics, in f16; Gram matrices), uploaded once per
// (model, layer, tensor) and shared by every
// worker of a GpuBackend, keyed by the model object (digest and address). Entries die with
// their model: an entry whose RegisteredModel is gone
// (the service deleted it and no request holds it) is dropped at the next lookup, and
// least-recently-used entries are evicted to stay under a byte limit or when cudaMalloc runs
// out of memory. A lookup returns a shared handle, so an evicted tensor is freed only when
// the last in-flight layer that uses it lets go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/model.h"

namespace kvtrim::gpu {

/// Which per-layer tensor of a model: the lane-major fp32 layout of launchers.h, or the f16
/// W_O image of the fast CriticalKV kernel (fast_model.cuh).
enum class ModelTensor : int {
  kWo,         // [H_q, D, 8E]: row (q, e) = w_o[e, q*d : q*d + d]
  kHeadGram,   // [H_q, d, 8E]
  kGroupGram,  // [H_kv, d, 8E]
  kWoF16,      // FastWoImage: inv_scale [H_q] fp32, then [H_q, D, DP] f16 scaled rows of w_o
};

/// One tensor in device memory (cudaFree on destruction, on the device it was made on).
class DeviceModelTensor {
 public:
  DeviceModelTensor(int device, float* data, size_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  ~DeviceModelTensor();
  DeviceModelTensor(const DeviceModelTensor&) = delete;
  DeviceModelTensor& operator=(const DeviceModelTensor&) = delete;
  /// The fp32 tensors (kWo, kHeadGram, kGroupGram).
  const float* data() const { return data_; }
  /// Any tensor's bytes (kWoF16 is not fp32).
  const void* raw() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  int device_;
  float* data_;
  size_t bytes_;
};

/// The host-side lane-major image of (model, layer, tensor) (launchers.h ToLaneMajor), for
/// the fp32 tensors (empty for kWoF16).
std::vector<float> LaneMajorModelTensor(const RegisteredModel& model, int32_t layer,
                                        ModelTensor tensor);

/// The bytes uploaded for (model, layer, tensor): LaneMajorModelTensor's floats, or the
/// FastWoImage of the layer's w_o for kWoF16.
std::vector<uint8_t> ModelTensorImage(const RegisteredModel& model, int32_t layer,
                                      ModelTensor tensor);

/// Thread-safe cache of device model tensors on one device.
class DeviceModelCache {
 public:
  /// Copies `bytes` from pinned-or-pageable host memory `src` to device memory `dst` and
  /// waits for the copy (the caller's stream and staging; GpuBackend passes the worker's).
  using Uploader = std::function<absl::Status(void* dst, const void* src, size_t bytes)>;

  /// `limit_bytes` caps the cached bytes (0 = no cap: entries are evicted only when a
  /// cudaMalloc fails).
  DeviceModelCache(int device, size_t limit_bytes) : device_(device), limit_bytes_(limit_bytes) {}

  /// The device copy of (model, layer, tensor), uploaded through `upload` on first use.
  /// Errors: RESOURCE_EXHAUSTED when the tensor alone exceeds the cap or the device has no
  /// room even after evicting every other idle entry; INVALID_ARGUMENT for a layer the model
  /// lacks; the uploader's errors.
  absl::StatusOr<std::shared_ptr<const DeviceModelTensor>> Get(
      const std::shared_ptr<const RegisteredModel>& model, int32_t layer, ModelTensor tensor,
      const Uploader& upload);

  /// Bytes held by the cache now.
  size_t bytes() const;
  /// Entries held now.
  size_t size() const;
  size_t limit_bytes() const { return limit_bytes_; }

 private:
  /// (digest + the model object's address, layer, tensor).
  using Key = std::tuple<std::string, int32_t, int>;
  struct Entry {
    std::weak_ptr<const RegisteredModel> owner;
    std::shared_ptr<const DeviceModelTensor> tensor;  // null while loading
    uint64_t last_use = 0;
    size_t bytes = 0;
  };

  /// Evicts idle LRU entries (not `keep`) until `incoming` more bytes fit under the cap, or,
  /// with `all`, every idle entry. Caller holds mutex_.
  void EvictLocked(size_t incoming, const Key* keep, bool all);
  int PurgeExpiredLocked();

  int device_;
  size_t limit_bytes_;
  mutable std::mutex mutex_;
  std::mutex load_mutex_;  // one upload at a time (uploads are rare; keeps accounting simple)
  std::map<Key, Entry> entries_;  // guarded by mutex_
  size_t bytes_ = 0;              // guarded by mutex_
  uint64_t clock_ = 0;            // guarded by mutex_
};

}  // namespace kvtrim::gpu

#include "kernels/gpu/runtime/device_model_cache.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/runtime/device_error.h"
#include "kernels/gpu/kernels/fast_model.cuh"
#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

DeviceModelTensor::~DeviceModelTensor() {
  if (data_ == nullptr) return;
  int current = -1;
  cudaGetDevice(&current);
  if (current != device_) cudaSetDevice(device_);
  cudaFree(data_);  // nothing to report from a destructor
  if (current != device_ && current >= 0) cudaSetDevice(current);
}

std::vector<float> LaneMajorModelTensor(const RegisteredModel& model, int32_t layer,
                                        ModelTensor tensor) {
  const ModelLayout& m = model.layout;
  const int64_t d = m.head_dim;
  const int64_t vf = LaneMajorFloats(d);
  std::vector<float> out;
  switch (tensor) {
    case ModelTensor::kWo: {
      const int64_t hq = m.num_query_heads;
      const int64_t hidden = m.hidden_size;
      const float* w = model.w_o[static_cast<size_t>(layer)].data();  // [D, H_q * d]
      out.assign(static_cast<size_t>(hq * hidden * vf), 0.0f);
      for (int64_t q = 0; q < hq; ++q) {
        ToLaneMajor(w + q * d, hidden, d, hq * d, out.data() + q * hidden * vf);
      }
      break;
    }
    case ModelTensor::kHeadGram:
    case ModelTensor::kGroupGram: {
      const std::vector<float>& gram = tensor == ModelTensor::kHeadGram
                                           ? model.head_gram[static_cast<size_t>(layer)]
                                           : model.group_gram[static_cast<size_t>(layer)];
      const int64_t rows = static_cast<int64_t>(gram.size()) / d;  // [heads * d] rows of d
      out.assign(static_cast<size_t>(rows * vf), 0.0f);
      ToLaneMajor(gram.data(), rows, d, d, out.data());
      break;
    }
    case ModelTensor::kWoF16:
      break;  // not fp32: ModelTensorImage
  }
  return out;
}

std::vector<uint8_t> ModelTensorImage(const RegisteredModel& model, int32_t layer,
                                      ModelTensor tensor) {
  if (tensor == ModelTensor::kWoF16) {
    const ModelLayout& m = model.layout;
    return FastWoImage(model.w_o[static_cast<size_t>(layer)].data(), m.num_query_heads,
                       m.head_dim, m.hidden_size);
  }
  const std::vector<float> floats = LaneMajorModelTensor(model, layer, tensor);
  std::vector<uint8_t> out(floats.size() * sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), floats.data(), out.size());
  return out;
}

int DeviceModelCache::PurgeExpiredLocked() {
  int purged = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.tensor != nullptr && it->second.owner.expired()) {
      bytes_ -= it->second.bytes;
      it = entries_.erase(it);
      ++purged;
    } else {
      ++it;
    }
  }
  return purged;
}

size_t DeviceModelCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t DeviceModelCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void DeviceModelCache::EvictLocked(size_t incoming, const Key* keep, bool all) {
  while (!entries_.empty()) {
    if (!all && (limit_bytes_ == 0 || bytes_ + incoming <= limit_bytes_)) return;
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.tensor == nullptr || (keep != nullptr && it->first == *keep)) continue;
      if (victim == entries_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == entries_.end()) return;
    bytes_ -= victim->second.bytes;
    entries_.erase(victim);  // freed when the last in-flight user lets go
  }
}

absl::StatusOr<std::shared_ptr<const DeviceModelTensor>> DeviceModelCache::Get(
    const std::shared_ptr<const RegisteredModel>& model, int32_t layer, ModelTensor tensor,
    const Uploader& upload) {
  if (model == nullptr) return absl::InvalidArgumentError("no registered model");
  const ModelLayout& m = model->layout;
  const bool has_layer =
      layer >= 0 && layer < m.num_layers &&
      static_cast<size_t>(layer) < (tensor == ModelTensor::kWo || tensor == ModelTensor::kWoF16
                                        ? model->w_o.size()
                                    : tensor == ModelTensor::kHeadGram
                                        ? model->head_gram.size()
                                        : model->group_gram.size());
  if (!has_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer_id ", layer, " is not a layer of the registered model (", m.num_layers, ")"));
  }
  char address[32];
  std::snprintf(address, sizeof address, "@%p", static_cast<const void*>(model.get()));
  // The object, not only its digest: two live models never share an address, and a dead
  // one's entries are purged before the lookup (tests register different random models under
  // one digest; production has one object per digest).
  const Key key{model->digest + address, layer, static_cast<int>(tensor)};
  auto lookup = [&]() -> std::shared_ptr<const DeviceModelTensor> {
    std::lock_guard<std::mutex> lock(mutex_);
    PurgeExpiredLocked();
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tensor == nullptr) return nullptr;
    it->second.last_use = ++clock_;
    return it->second.tensor;
  };
  if (auto hit = lookup()) return hit;

  std::lock_guard<std::mutex> loading(load_mutex_);
  if (auto hit = lookup()) return hit;  // another worker loaded it meanwhile
  const std::vector<uint8_t> image = ModelTensorImage(*model, layer, tensor);
  const size_t bytes = image.size();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (limit_bytes_ != 0 && bytes > limit_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the model tensor of layer ", layer, " needs ", bytes,
          " bytes of device memory but the GPU model cache may hold at most ", limit_bytes_));
    }
    EvictLocked(bytes, &key, /*all=*/false);
  }
  KVTRIM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  void* data = nullptr;
  cudaError_t err = cudaMalloc(&data, bytes ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      EvictLocked(bytes, &key, /*all=*/true);
    }
    err = cudaMalloc(&data, bytes ? bytes : 1);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes of model cache)"));
  }
  auto held = std::make_shared<const DeviceModelTensor>(device_, static_cast<float*>(data), bytes);
  if (bytes > 0) KVTRIM_RETURN_IF_ERROR(upload(data, image.data(), bytes));
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = entries_[key];
  entry.owner = model;
  entry.tensor = held;
  entry.bytes = bytes;
  entry.last_use = ++clock_;
  bytes_ += bytes;
  return held;
}

}  // namespace kvtrim::gpu

#include "client/chunking.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvtrim {
namespace {

/// One tensor's bytes taken out of the layer message, to be sent as chunks.
struct PendingTensor {
  v1::TensorSlot slot;
  std::string data;
};

/// When `tensor` holds more than `chunk_bytes` inline bytes: moves them into `pending`
/// and marks the tensor `chunked` with their total size.
void TakeIfLarge(v1::Tensor* tensor, v1::TensorSlot slot, int64_t chunk_bytes,
                 std::vector<PendingTensor>* pending) {
  if (tensor->data_case() != v1::Tensor::kInlineData) return;
  if (static_cast<int64_t>(tensor->inline_data().size()) <= chunk_bytes) return;
  PendingTensor taken{slot, std::move(*tensor->mutable_inline_data())};
  tensor->mutable_chunked()->set_total_bytes(taken.data.size());  // clears inline_data
  pending->push_back(std::move(taken));
}

}  // namespace

std::vector<v1::SessionRequest> SplitLayer(v1::LayerInput layer, int64_t chunk_bytes) {
  std::vector<PendingTensor> pending;
  if (chunk_bytes > 0) {
    if (layer.has_keys()) {
      TakeIfLarge(layer.mutable_keys(), v1::TENSOR_SLOT_KEYS, chunk_bytes, &pending);
    }
    if (layer.has_values()) {
      TakeIfLarge(layer.mutable_values(), v1::TENSOR_SLOT_VALUES, chunk_bytes, &pending);
    }
    if (layer.has_queries()) {
      TakeIfLarge(layer.mutable_queries(), v1::TENSOR_SLOT_QUERIES, chunk_bytes, &pending);
    }
  }
  const int32_t layer_id = layer.layer_id();
  std::vector<v1::SessionRequest> messages;
  size_t count = 1;
  for (const PendingTensor& tensor : pending) {
    count += (tensor.data.size() + chunk_bytes - 1) / chunk_bytes;
  }
  messages.reserve(count);
  messages.emplace_back();
  messages.back().mutable_layer()->Swap(&layer);
  for (PendingTensor& tensor : pending) {
    const size_t step = static_cast<size_t>(chunk_bytes);
    for (size_t offset = 0; offset < tensor.data.size(); offset += step) {
      messages.emplace_back();
      v1::TensorChunk* chunk = messages.back().mutable_tensor_chunk();
      chunk->set_layer_id(layer_id);
      chunk->set_slot(tensor.slot);
      chunk->set_offset_bytes(offset);
      chunk->set_data(tensor.data.data() + offset, std::min(step, tensor.data.size() - offset));
    }
    std::string().swap(tensor.data);  // free each tensor once it is chunked
  }
  return messages;
}

int64_t InlineTensorBytes(const v1::LayerInput& layer) {
  int64_t bytes = 0;
  for (const v1::Tensor* tensor : {&layer.keys(), &layer.values(), &layer.queries()}) {
    if (tensor->data_case() == v1::Tensor::kInlineData) {
      bytes += static_cast<int64_t>(tensor->inline_data().size());
    }
  }
  return bytes;
}

}  // namespace kvtrim

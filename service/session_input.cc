#include "service/session_input.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::service {

namespace {

using Clock = std::chrono::steady_clock;

const char* SlotName(int slot) {
  static const char* const kNames[] = {"keys", "values", "queries"};
  return kNames[slot];
}

SessionItem ErrorItem(absl::Status status) {
  SessionItem item;
  item.kind = SessionItem::Kind::kError;
  item.status = std::move(status);
  return item;
}

}  // namespace

std::optional<SessionItem> SessionInput::Take(std::unique_ptr<v1::SessionRequest> message,
                                              Clock::time_point received) {
  if (pending_.has_value()) {
    const absl::Status added = AddChunk(*message);
    if (!added.ok()) {
      pending_.reset();
      return ErrorItem(added);
    }
    if (open_ > 0) return std::nullopt;
    return DecodePending();
  }
  SessionItem item;
  item.received = received;
  switch (message->message_case()) {
    case v1::SessionRequest::kBegin: item.kind = SessionItem::Kind::kBegin; break;
    case v1::SessionRequest::kFinish: item.kind = SessionItem::Kind::kFinish; break;
    case v1::SessionRequest::kLayer: item.kind = SessionItem::Kind::kLayer; break;
    case v1::SessionRequest::kTensorChunk:
      return ErrorItem(absl::InvalidArgumentError(absl::StrCat(
          "tensor_chunk: no chunked tensor is pending (layer_id ",
          message->tensor_chunk().layer_id(), "); chunks follow their layer message")));
    default: item.kind = SessionItem::Kind::kEmpty; break;
  }
  item.request = std::move(message);
  if (item.kind != SessionItem::Kind::kLayer) return item;
  pending_start_ = received;
  if (absl::Status started = StartChunks(&item); !started.ok()) return ErrorItem(started);
  pending_ = std::move(item);
  if (open_ > 0) return std::nullopt;
  return DecodePending();
}

std::optional<SessionItem> SessionInput::TakeChunk(const ChunkHeader& header,
                                                   absl::FunctionRef<bool(char*)> copy_data) {
  if (!pending_.has_value()) {
    return ErrorItem(absl::InvalidArgumentError(absl::StrCat(
        "tensor_chunk: no chunked tensor is pending (layer_id ", header.layer_id,
        "); chunks follow their layer message")));
  }
  const absl::Status added = AddChunk(header, copy_data);
  if (!added.ok()) {
    pending_.reset();
    return ErrorItem(added);
  }
  if (open_ > 0) return std::nullopt;
  return DecodePending();
}

SessionItem SessionInput::End(bool cancelled) {
  if (!pending_.has_value()) return SessionItem{};  // kEnd
  const std::string text =
      absl::StrCat("tensor_chunk: the stream ended before layer ",
                   pending_->request->layer().layer_id(), "'s chunked tensors were complete");
  pending_.reset();
  return ErrorItem(cancelled ? absl::CancelledError(text) : absl::InvalidArgumentError(text));
}

absl::Status SessionInput::StartChunks(SessionItem* item) {
  const v1::LayerInput& layer = item->request->layer();
  const v1::Tensor* tensors[3] = {layer.has_keys() ? &layer.keys() : nullptr,
                                  layer.has_values() ? &layer.values() : nullptr,
                                  layer.has_queries() ? &layer.queries() : nullptr};
  expected_ = {};
  received_ = {};
  open_ = 0;
  int64_t total = 0;
  for (int slot = 0; slot < 3; ++slot) {
    chunks_[slot] = HostBuffer();
    if (tensors[slot] == nullptr || tensors[slot]->data_case() != v1::Tensor::kChunked) continue;
    const std::string field = absl::StrCat("layer.", SlotName(slot));
    auto bytes = TensorByteSize(*tensors[slot], static_cast<TensorRole>(slot), limits_, field);
    if (!bytes.ok()) return bytes.status();
    if (tensors[slot]->chunked().total_bytes() != static_cast<uint64_t>(*bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".chunked.total_bytes: ", tensors[slot]->chunked().total_bytes(),
          ", but the shape needs ", *bytes));
    }
    total += *bytes;
    if (total > max_layer_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "layer: chunked tensors of ", total, " bytes exceed --max_layer_bytes=",
          max_layer_bytes_));
    }
    expected_[slot] = *bytes;
    chunks_[slot] = AcquireHostBuffer(context_.buffers, static_cast<size_t>(*bytes));
    ++open_;
  }
  return absl::OkStatus();
}

absl::Status SessionInput::AddChunk(const v1::SessionRequest& message) {
  const int32_t layer_id = pending_->request->layer().layer_id();
  if (message.message_case() != v1::SessionRequest::kTensorChunk) {
    for (int slot = 0; slot < 3; ++slot) {
      if (received_[slot] < expected_[slot]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor_chunk: layer ", layer_id, "'s ", SlotName(slot), " has ", received_[slot],
            " of ", expected_[slot], " bytes, but the next message is not a tensor_chunk; send "
            "every chunk of a layer before the next layer or finish"));
      }
    }
  }
  const v1::TensorChunk& chunk = message.tensor_chunk();
  ChunkHeader header;
  header.layer_id = chunk.layer_id();
  header.slot = static_cast<int32_t>(chunk.slot());
  header.offset_bytes = chunk.offset_bytes();
  header.data_bytes = static_cast<int64_t>(chunk.data().size());
  return AddChunk(header, [&chunk](char* destination) {
    std::memcpy(destination, chunk.data().data(), chunk.data().size());
    return true;
  });
}

absl::Status SessionInput::AddChunk(const ChunkHeader& chunk,
                                    absl::FunctionRef<bool(char*)> copy_data) {
  const int32_t layer_id = pending_->request->layer().layer_id();
  if (chunk.layer_id != layer_id) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_chunk.layer_id: ", chunk.layer_id,
                                                   ", but the layer being assembled is ",
                                                   layer_id));
  }
  const int slot = chunk.slot - 1;
  if (slot < 0 || slot > 2 || expected_[slot] == 0) {
    const std::string name = v1::TensorSlot_IsValid(chunk.slot)
                                 ? v1::TensorSlot_Name(static_cast<v1::TensorSlot>(chunk.slot))
                                 : absl::StrCat(chunk.slot);
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_chunk.slot: ", name, " is not a chunked tensor of layer ", layer_id));
  }
  if (chunk.offset_bytes != static_cast<uint64_t>(received_[slot])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_chunk.offset_bytes: ", chunk.offset_bytes, " for layer ", layer_id, "'s ",
        SlotName(slot), ", expected ", received_[slot], " (chunks arrive in order)"));
  }
  const int64_t size = chunk.data_bytes;
  if (size == 0 || received_[slot] + size > expected_[slot]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_chunk.data: ", size, " bytes at offset ", received_[slot], " of layer ",
        layer_id, "'s ", SlotName(slot), " (", expected_[slot], " bytes in all)"));
  }
  if (!copy_data(reinterpret_cast<char*>(chunks_[slot].get()) + received_[slot])) {
    return absl::InternalError(absl::StrCat("tensor_chunk.data: ", size,
                                            " bytes could not be read from the message"));
  }
  received_[slot] += size;
  pending_->wire_bytes += size;
  if (received_[slot] == expected_[slot]) --open_;
  return absl::OkStatus();
}

SessionItem SessionInput::DecodePending() {
  SessionItem item = std::move(*pending_);
  pending_.reset();
  DecodeContext context = context_;
  for (int slot = 0; slot < 3; ++slot) {
    context.chunks[slot] = chunks_[slot].get();
    context.chunks_page_locked[slot] = chunks_[slot].page_locked();
  }
  item.decoded = std::make_unique<DecodedLayer>();
  item.status = DecodeLayer(item.request->layer(), limits_, "layer", context, item.decoded.get());
  item.wire_bytes += item.decoded->tensor_bytes;
  for (auto& buffer : chunks_) {
    if (buffer) item.decoded->owned.push_back(std::move(buffer));
  }
  item.decode_seconds = std::chrono::duration<double>(Clock::now() - pending_start_).count();
  return item;
}

}  // namespace kvtrim::service

#include "service/session_reader.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::service {

namespace {

const char* SlotName(int slot) {
  static const char* const kNames[] = {"keys", "values", "queries"};
  return kNames[slot];
}

}  // namespace

SessionReader::SessionReader(grpc::ServerContext* server_context, Stream* stream,
                             const EngineLimits& limits, DecodeContext context,
                             int64_t max_layer_bytes, int max_pending_layers,
                             FrontEnd front_end)
    : server_context_(server_context),
      stream_(stream),
      limits_(limits),
      context_(std::move(context)),
      max_layer_bytes_(max_layer_bytes),
      max_pending_layers_(std::max(1, max_pending_layers)),
      front_end_(std::move(front_end)) {}

SessionReader::~SessionReader() { Stop(); }

void SessionReader::Start() { thread_ = std::thread([this] { Run(); }); }

void SessionReader::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (!done_) server_context_->TryCancel();  // unblocks a pending Read
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool SessionReader::Push(SessionItem item) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool is_layer = item.kind == SessionItem::Kind::kLayer;
  changed_.wait(lock, [&] {
    return stopping_ || !is_layer || pending_layers_ < max_pending_layers_;
  });
  if (stopping_) return false;
  if (is_layer) ++pending_layers_;
  // Nothing is read after these: Stop() must not cancel the call once one is queued.
  const bool last = item.kind == SessionItem::Kind::kEnd ||
                    item.kind == SessionItem::Kind::kError ||
                    item.kind == SessionItem::Kind::kFinish;
  if (last) done_ = true;
  queue_.push_back(std::move(item));
  changed_.notify_all();
  return true;
}

SessionItem SessionReader::Next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (delivered_end_) return SessionItem{};
  changed_.wait(lock, [&] { return !queue_.empty() || done_; });
  if (queue_.empty()) return SessionItem{};
  SessionItem item = std::move(queue_.front());
  queue_.pop_front();
  if (item.kind == SessionItem::Kind::kLayer) --pending_layers_;
  if (item.kind == SessionItem::Kind::kEnd || item.kind == SessionItem::Kind::kError) {
    delivered_end_ = true;
  }
  changed_.notify_all();
  return item;
}

absl::Status SessionReader::AssembleChunks(SessionItem* item,
                                           std::array<HostBuffer, 3>* chunks) {
  const v1::LayerInput& layer = item->request->layer();
  const v1::Tensor* tensors[3] = {layer.has_keys() ? &layer.keys() : nullptr,
                                  layer.has_values() ? &layer.values() : nullptr,
                                  layer.has_queries() ? &layer.queries() : nullptr};
  int64_t expected[3] = {0, 0, 0};
  int64_t received[3] = {0, 0, 0};
  int64_t total = 0;
  int open = 0;
  for (int slot = 0; slot < 3; ++slot) {
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
    expected[slot] = *bytes;
    (*chunks)[slot] = AcquireHostBuffer(context_.buffers, static_cast<size_t>(*bytes));
    ++open;
  }
  v1::SessionRequest message;
  while (open > 0) {
    message.Clear();
    if (!stream_->Read(&message)) {
      const std::string text = absl::StrCat("tensor_chunk: the stream ended before layer ",
                                            layer.layer_id(), "'s chunked tensors were complete");
      if (server_context_->IsCancelled()) return absl::CancelledError(text);
      return absl::InvalidArgumentError(text);
    }
    if (message.message_case() != v1::SessionRequest::kTensorChunk) {
      for (int slot = 0; slot < 3; ++slot) {
        if (received[slot] < expected[slot]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor_chunk: layer ", layer.layer_id(), "'s ", SlotName(slot), " has ",
              received[slot], " of ", expected[slot], " bytes, but the next message is not a "
              "tensor_chunk; send every chunk of a layer before the next layer or finish"));
        }
      }
    }
    const v1::TensorChunk& chunk = message.tensor_chunk();
    if (chunk.layer_id() != layer.layer_id()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor_chunk.layer_id: ", chunk.layer_id(),
                                                     ", but the layer being assembled is ",
                                                     layer.layer_id()));
    }
    const int slot = static_cast<int>(chunk.slot()) - 1;
    if (slot < 0 || slot > 2 || expected[slot] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor_chunk.slot: ", v1::TensorSlot_Name(chunk.slot()), " is not a chunked tensor "
          "of layer ", layer.layer_id()));
    }
    if (chunk.offset_bytes() != static_cast<uint64_t>(received[slot])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor_chunk.offset_bytes: ", chunk.offset_bytes(), " for layer ", layer.layer_id(),
          "'s ", SlotName(slot), ", expected ", received[slot], " (chunks arrive in order)"));
    }
    const int64_t size = static_cast<int64_t>(chunk.data().size());
    if (size == 0 || received[slot] + size > expected[slot]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor_chunk.data: ", size, " bytes at offset ", received[slot], " of layer ",
          layer.layer_id(), "'s ", SlotName(slot), " (", expected[slot], " bytes in all)"));
    }
    std::memcpy(reinterpret_cast<char*>((*chunks)[slot].get()) + received[slot],
                chunk.data().data(), static_cast<size_t>(size));
    received[slot] += size;
    item->wire_bytes += size;
    if (received[slot] == expected[slot]) --open;
  }
  return absl::OkStatus();
}

void SessionReader::Run() {
  while (true) {
    auto request = std::make_unique<v1::SessionRequest>();
    if (!stream_->Read(request.get())) {
      Push(SessionItem{});  // kEnd
      return;
    }
    SessionItem item;
    item.received = std::chrono::steady_clock::now();
    switch (request->message_case()) {
      case v1::SessionRequest::kBegin: item.kind = SessionItem::Kind::kBegin; break;
      case v1::SessionRequest::kFinish: item.kind = SessionItem::Kind::kFinish; break;
      case v1::SessionRequest::kLayer: item.kind = SessionItem::Kind::kLayer; break;
      case v1::SessionRequest::kTensorChunk:
        item.kind = SessionItem::Kind::kError;
        item.status = absl::InvalidArgumentError(absl::StrCat(
            "tensor_chunk: no chunked tensor is pending (layer_id ",
            request->tensor_chunk().layer_id(), "); chunks follow their layer message"));
        Push(std::move(item));
        return;
      default: item.kind = SessionItem::Kind::kEmpty; break;
    }
    item.request = std::move(request);
    if (item.kind == SessionItem::Kind::kLayer) {
      const auto start = std::chrono::steady_clock::now();
      std::array<HostBuffer, 3> chunks;
      if (absl::Status assembled = AssembleChunks(&item, &chunks); !assembled.ok()) {
        item.kind = SessionItem::Kind::kError;
        item.status = assembled;
        Push(std::move(item));
        return;
      }
      DecodeContext context = context_;
      for (int slot = 0; slot < 3; ++slot) context.chunks[slot] = chunks[slot].get();
      item.decoded = std::make_unique<DecodedLayer>();
      item.status = DecodeLayer(item.request->layer(), limits_, "layer", context,
                                item.decoded.get());
      item.wire_bytes += item.decoded->tensor_bytes;
      for (auto& buffer : chunks) {
        if (buffer) item.decoded->owned.push_back(std::move(buffer));
      }
      item.decode_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    front_end_(&item);
    item.ready = std::chrono::steady_clock::now();
    if (item.kind == SessionItem::Kind::kError) {
      Push(std::move(item));
      return;
    }
    // Nothing may follow finish; the compute loop ends the call after it.
    const bool stop = item.kind == SessionItem::Kind::kFinish;
    if (!Push(std::move(item)) || stop) return;
  }
}

}  // namespace kvtrim::service

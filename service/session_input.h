// The input half of a CompressSession: messages in stream order become items (begin,
// layer with its chunked tensors assembled and decoded, finish, end, errors).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/engine.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "service/host_buffer_pool.h"
#include "service/tensor_codec.h"

namespace kvtrim::service {

/// One message of the session, read and (for layers) decoded, in stream order.
struct SessionItem {
  enum class Kind {
    kBegin,   // `request` holds begin
    kLayer,   // `request` holds the layer; `decoded` / `status` its decoding
    kFinish,  // finish
    kEmpty,   // a SessionRequest with no message set
    kEnd,     // the stream ended (client half-close, cancellation or deadline)
    kError,   // a protocol error (`status`), after which nothing more is read
  };
  Kind kind = Kind::kEnd;
  std::unique_ptr<v1::SessionRequest> request;  // owns what `decoded` views alias
  std::unique_ptr<DecodedLayer> decoded;        // kLayer, when `status` is OK
  absl::Status status;                          // kLayer: decoding; kError: the error
  int64_t wire_bytes = 0;                       // inline tensor bytes (layer + chunks)
  double decode_seconds = 0;                    // assembling and decoding this layer
  std::chrono::steady_clock::time_point received;  // the layer message read
  std::chrono::steady_clock::time_point ready;     // decoded and through the front end
  // Set by the front end:
  std::shared_ptr<const ResolvedPolicy> policy;  // kBegin / kLayer: the session's policy
  std::unique_ptr<ValidatedLayer> validated;     // kLayer: the engine's validated layer
  double validate_seconds = 0;

  /// Nothing is read after an item of this kind.
  bool last() const { return kind == Kind::kEnd || kind == Kind::kError || kind == Kind::kFinish; }
};

/// A tensor_chunk's fields other than its data (read from a parsed message or its wire
/// bytes).
struct ChunkHeader {
  int32_t layer_id = 0;
  int32_t slot = 0;  // a v1::TensorSlot value
  uint64_t offset_bytes = 0;
  int64_t data_bytes = 0;
};

/// Turns a session's messages into items. A layer whose tensors are `chunked` is held
/// until the tensor_chunk messages that follow it complete them (each layer at most
/// `max_layer_bytes` in total); layers are decoded with `context` (regions, client id,
/// buffers) and `limits`. Not thread-safe: one caller, messages in stream order.
class SessionInput {
 public:
  SessionInput(const EngineLimits& limits, DecodeContext context, int64_t max_layer_bytes)
      : limits_(limits), context_(std::move(context)), max_layer_bytes_(max_layer_bytes) {}

  /// The next message, read at `received`: the item it completes, or nothing while a
  /// layer's chunks are still coming.
  std::optional<SessionItem> Take(std::unique_ptr<v1::SessionRequest> message,
                                  std::chrono::steady_clock::time_point received);
  /// A tensor_chunk read from the wire without parsing its data: `copy_data` copies its
  /// `header.data_bytes` bytes to the given address once the header is found valid. The
  /// item it completes, nothing while chunks are still coming, or kError (also when
  /// `copy_data` returns false).
  std::optional<SessionItem> TakeChunk(const ChunkHeader& header,
                                       absl::FunctionRef<bool(char*)> copy_data);
  /// The stream ended (`cancelled`: by the client or the deadline): kEnd, or kError when a
  /// layer's chunks were incomplete.
  SessionItem End(bool cancelled);

 private:
  /// Starts assembling `item`'s chunked tensors; the item is complete when none is open.
  absl::Status StartChunks(SessionItem* item);
  /// Adds one tensor_chunk to the pending layer.
  absl::Status AddChunk(const v1::SessionRequest& message);
  /// Adds the chunk `header` describes; `copy_data` writes its data where it belongs.
  absl::Status AddChunk(const ChunkHeader& header, absl::FunctionRef<bool(char*)> copy_data);
  /// Decodes the pending (complete) layer into its item.
  SessionItem DecodePending();

  EngineLimits limits_;
  DecodeContext context_;
  int64_t max_layer_bytes_;
  std::optional<SessionItem> pending_;  // a layer waiting for its chunks
  std::chrono::steady_clock::time_point pending_start_;
  std::array<HostBuffer, 3> chunks_;
  std::array<int64_t, 3> expected_{};
  std::array<int64_t, 3> received_{};
  int open_ = 0;  // chunked tensors of the pending layer not yet complete
};

}  // namespace kvtrim::service

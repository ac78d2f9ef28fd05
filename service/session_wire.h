// CompressSession's messages as wire bytes: a tensor_chunk is read without parsing its data
// into a message (its bytes are copied once, from gRPC's receive buffers straight into the
// layer's tensor), every other message is parsed as a SessionRequest.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::service {

/// The fields of a tensor_chunk read from a SessionRequest's wire bytes, and where its
/// data lies in them.
struct WireTensorChunk {
  int32_t layer_id = 0;
  int32_t slot = 0;  // a v1::TensorSlot value
  uint64_t offset_bytes = 0;
  int64_t data_bytes = 0;     // length of `data`
  int64_t data_position = 0;  // where `data` starts in the message's bytes
};

/// When `message` is a SessionRequest made of one tensor_chunk field whose fields are the
/// four of TensorChunk with their own wire types (in any order, `data` at most once), its
/// chunk; otherwise nothing, and the message is to be parsed whole (ParseSessionRequest),
/// which also reports a malformed one. Reads the bytes, copies none of the data.
std::optional<WireTensorChunk> PeekTensorChunk(grpc::ByteBuffer& message);

/// Copies the chunk's `data` [chunk.data_bytes] from `message` into `destination`. False
/// when the message is shorter than PeekTensorChunk found it (it never is).
bool CopyTensorChunkData(grpc::ByteBuffer& message, const WireTensorChunk& chunk,
                         char* destination);

/// Parses `message` as a SessionRequest: INVALID_ARGUMENT naming the stream's message
/// when its bytes are not one.
absl::Status ParseSessionRequest(grpc::ByteBuffer& message, v1::SessionRequest* request);

/// `response`'s wire bytes.
grpc::ByteBuffer SerializeSessionResponse(const v1::SessionResponse& response);

}  // namespace kvtrim::service

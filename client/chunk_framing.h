// tensor_chunk messages framed by hand, so that their data goes from the caller's memory
// into gRPC's send buffer in one copy: the wire bytes are those protobuf would write for
// SessionRequest{tensor_chunk{layer_id, slot, offset_bytes, data}}, without building the
// message (a copy of the data) and serialising it (a second copy).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// The wire bytes of SessionRequest{tensor_chunk{layer_id, slot, offset_bytes, data}} in
/// one owned slice: the header (tags, lengths and the small fields) then a copy of `data`
/// [size]. The same bytes as protobuf's encoding of those fields.
grpc::ByteBuffer FrameTensorChunk(int32_t layer_id, v1::TensorSlot slot, uint64_t offset_bytes,
                                  const char* data, size_t size);

/// `message` serialised into a ByteBuffer (gRPC's own protobuf serialisation).
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);

}  // namespace kvtrim

// protobuf's own encoding of a CompressSession tensor_chunk message: the reference that the
// hand-framed chunks (client/chunk_framing.h) and the wire reader (service/session_wire.h)
// are tested against.
#pragma once

#include <cstdint>
#include <string>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim::testing {

/// The bytes of a SessionRequest holding tensor_chunk {layer_id, slot, offset, data}.
inline std::string TensorChunkRequestBytes(int32_t layer_id, v1::TensorSlot slot,
                                           uint64_t offset, const std::string& data) {
  v1::SessionRequest request;
  v1::TensorChunk* chunk = request.mutable_tensor_chunk();
  chunk->set_layer_id(layer_id);
  chunk->set_slot(slot);
  chunk->set_offset_bytes(offset);
  chunk->set_data(data);
  return request.SerializeAsString();
}

}  // namespace kvtrim::testing

// Splitting a session layer into a small layer message plus tensor_chunk messages, so that
// no single CompressSession message carries a whole large tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtrim/v1/kvtrim.pb.h"

namespace kvtrim {

/// The CompressSession messages that send `layer`. Every tensor (keys, values, queries)
/// whose inline_data is longer than `chunk_bytes` is replaced in the layer message by
/// `chunked { total_bytes }`, and its bytes follow as tensor_chunk {layer_id, slot,
/// offset_bytes, data} messages of at most `chunk_bytes` data bytes each, in order: the
/// layer message first, then the keys' chunks, the values' chunks, the queries' chunks.
/// Tensors of at most `chunk_bytes`, region tensors and absent tensors stay as they are.
/// `chunk_bytes` <= 0 never splits: the result is the one layer message.
std::vector<v1::SessionRequest> SplitLayer(v1::LayerInput layer, int64_t chunk_bytes);

/// Sum of the inline_data bytes of the layer's keys, values and queries (what an inline
/// layer puts on the wire as tensor bytes; 0 for region tensors).
int64_t InlineTensorBytes(const v1::LayerInput& layer);

}  // namespace kvtrim

// The service limits the fuzz targets run under: kvtrimd's flags, lowered so that a size
// an input declares cannot reach the fuzzer's memory limit (2 GiB) before it is refused.
#pragma once

#include <cstdint>

namespace kvtrim::fuzz {

/// Most bytes of chunked tensors one session layer may declare (kvtrimd's --max_layer_bytes).
inline constexpr int64_t kFuzzMaxLayerBytes = int64_t{1} << 20;

/// Largest registration, the sum of its weights' bytes (kvtrimd's --max_model_bytes).
inline constexpr int64_t kFuzzMaxModelBytes = int64_t{4} << 20;

}  // namespace kvtrim::fuzz

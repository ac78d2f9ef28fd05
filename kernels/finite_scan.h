// The NaN / Inf scan of host tensors (the engine's input check): the first non-finite
// element, found by several threads for large tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

#include "kernels/tensor.h"

namespace kvtrim {

/// Tensors below this many bytes are scanned on the caller's thread only.
constexpr int64_t kParallelScanBytes = int64_t{8} << 20;

/// The flat index of the first NaN or Inf element of host tensor `t` [numel] (f32, f16 or
/// bf16 by its exponent bits), or -1 when every element is finite. Tensors of at least
/// kParallelScanBytes are split into contiguous ranges scanned by up to `max_threads`
/// threads (0: the host's hardware threads, at most 8); the answer is the same first index
/// whatever the split.
int64_t FirstNonFinite(const TensorView& t, int max_threads = 0);

/// OK when every element of host tensor `t` is finite, else INVALID_ARGUMENT "<field>:
/// contains NaN at [a, b, c]" (NonFiniteError) for the first one.
absl::Status CheckFinite(const TensorView& t, const std::string& field);

/// True when every value is finite (no NaN, no infinity).
bool AllFinite(const std::vector<double>& values);

}  // namespace kvtrim

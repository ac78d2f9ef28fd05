// The keys or values of a layer as they arrived (f32, f16 or bf16, [H_kv, n, d] dense),
// read by the fast CPU kernels a tile at a time in fp32: f32 rows are read in place, f16 and
// bf16 rows are widened into the caller's scratch (a tile fits the cache) -- never a whole
// fp32 copy of the tensor.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "base/dtype.h"

namespace kvtrim {

/// Rows of d elements in one dtype.
struct TokenRows {
  const void* data = nullptr;  // element 0 of the rows
  DType dtype = DType::kF32;
  int64_t d = 0;  // elements per row
  /// When set, Rows() checks every row it hands out and raises the flag on a NaN or Inf
  /// (the keys' finiteness check fused into the kernels' own read; CpuLayer::keys_nonfinite).
  std::atomic<bool>* nonfinite = nullptr;

  /// The keys / values of `layer`: the arriving tensor, or its fp32 tensor when the layer
  /// was built without one (tests).
  static TokenRows Keys(const CpuLayer& layer);
  static TokenRows Values(const CpuLayer& layer);

  /// The rows from row `first` on (e.g. a head's first token: h * n).
  TokenRows From(int64_t first) const;
  /// Rows [first, first + count) in fp32: in place for f32, else widened into `scratch`
  /// (resized as needed; the pointer stays valid until scratch changes); checked for
  /// NaN / Inf when `nonfinite` is set.
  const float* Rows(int64_t first, int64_t count, std::vector<float>* scratch) const;
  /// Copies rows [first, first + count) in fp32 to out [count, d].
  void CopyRows(int64_t first, int64_t count, float* out) const;
};

/// Reads every key of `layer` through TokenRows::Keys once, raising layer.keys_nonfinite on
/// a NaN / Inf: for a fast scorer that has nothing to compute (a layer no longer than its
/// window) and so never reads the keys the engine left to it. A no-op when the engine
/// scanned them.
void CheckKeysRead(const CpuLayer& layer);

}  // namespace kvtrim

// 1-D pooling of a score vector along the token axis (stride 1, same length).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvtrim {

/// The pooling operator of the window-attention scorers (SnapKV, DropKV).
enum class PoolKind {
  kMax,  // max over the window clipped at the sequence ends (-inf padding)
  kAvg,  // PyTorch avg_pool1d default: zero padding, always divided by the kernel size
};

/// Parses "max" or "avg"; nullopt for anything else.
std::optional<PoolKind> ParsePoolKind(std::string_view name);

/// Parses `name` and checks `kernel` for a scorer: INVALID_ARGUMENT naming `scorer` for an
/// unknown pooling name or a kernel that is not odd and >= 1.
absl::StatusOr<PoolKind> ResolvePooling(const char* scorer, const std::string& name,
                                        int64_t kernel);

/// Pools in[0..n) into out[0..n) with an odd `kernel` >= 1 (the caller validates it),
/// stride 1 and radius r = kernel / 2:
///   max: out[j] = max(in[max(0, j-r) .. min(n-1, j+r)])
///   avg: out[j] = (sum of in[i] over the same clipped range, in double) / kernel
/// `in` and `out` must not overlap. kernel == 1 copies. Deterministic: this is step 6 of the
/// canonical window attention (window_attention.h); kernels/gpu/pooling.cuh reproduces it
/// bit for bit (the avg sum uses IEEE double adds in index order and one double division).
void Pool1D(PoolKind kind, const float* in, int64_t n, int64_t kernel, float* out);

}  // namespace kvtrim

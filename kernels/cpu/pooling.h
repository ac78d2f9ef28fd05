// 1-D pooling of a score vector along the token axis (stride 1, same length).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

#include "kernels/scorer_params.h"

namespace kvtrim {


/// Pools in[0..n) into out[0..n) with an odd `kernel` >= 1 (the caller validates it),
/// stride 1 and radius r = kernel / 2:
///   max: out[j] = max(in[max(0, j-r) .. min(n-1, j+r)])
///   avg: out[j] = (sum of in[i] over the same clipped range, in double) / kernel
/// `in` and `out` must not overlap. kernel == 1 copies. Deterministic: this is step 6 of the
/// canonical window attention (window_attention.h); kernels/gpu/kernels/pooling.cuh reproduces it
/// bit for bit (the avg sum uses IEEE double adds in index order and one double division).
void Pool1D(PoolKind kind, const float* in, int64_t n, int64_t kernel, float* out);

/// The largest of x[0..count) by a left-to-right scan that replaces the running value only
/// on a strictly larger one (so of equal values, +0 and -0 included, the first one wins);
/// 0 when count == 0. kernels/gpu/kernels/pooling.cuh computes the same value in parallel.
float FirstMax(const float* x, int64_t count);

/// The pooling stage of the SnapKV family (baselines.md §0 and §3, kvpress SnapKVPress): only
/// the prefix P = `prefix` tokens are pooled, among themselves, and the window tokens take
/// the prefix's best pooled score (kvpress pads the window with the max score):
///   out[0..P) = Pool1D(kind, in[0..P), kernel)   (the pooling window is clipped at P)
///   out[P..n) = FirstMax(out, P)                  (0 when P == 0)
/// in[P..n) is never read, so the window's own attention never reaches a prefix score.
/// 0 <= prefix <= n; `in` and `out` [n] must not overlap. kernels/gpu/kernels/pooling.cuh
/// (LaunchPoolPrefix) reproduces it bit for bit.
void PoolPrefix(PoolKind kind, const float* in, int64_t n, int64_t prefix, int64_t kernel,
                float* out);

}  // namespace kvtrim

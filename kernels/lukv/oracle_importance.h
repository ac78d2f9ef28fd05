// The oracle importance of LU-KV (lukv.md §3, §8, §11 items 2-4): the largest projected
// contribution of each context token to a KV head's output over the answer's decode steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/lukv/calibration.h"

namespace kvtrim {
class ThreadPool;
}

namespace kvtrim::lukv {

/// How the G query heads of a KV head combine (§8): mean (default), sum or max over g.
enum class GqaAggregation { kMean, kSum, kMax };

/// "mean" | "sum" | "max" -> GqaAggregation; INVALID_ARGUMENT otherwise.
absl::StatusOr<GqaAggregation> ParseGqaAggregation(absl::string_view text);
/// The spelling ParseGqaAggregation accepts.
const char* GqaAggregationName(GqaAggregation agg);

/// Options of the oracle.
struct OracleOptions {
  GqaAggregation gqa = GqaAggregation::kMean;
  int64_t k_max = 128;  // decode steps used: positions S .. min(N, S + k_max) - 1
};

/// I [H_kv, T] of one layer (not normalised), in double precision:
///   I_{h,j} = max_{p} agg_{g∈grp(h)} A_{g,p,j} · ‖v_{h,j} W_O^{(g)}‖₂,
/// where p runs over the decode positions S .. min(N, S + k_max) - 1, A_{g,p,·} is the
/// full-cache causal softmax of query row p of head g over keys 0..p (scale `softmax_scale`,
/// 0 = 1/sqrt(d)), and j < T. Query head g reads KV head g / G.
/// keys/values [H_kv, N, d], queries [H_q, N, d], w_o [1, D, H_q*d]. `pool` may be null.
std::vector<double> OracleImportance(const F32Tensor& keys, const F32Tensor& values,
                                     const F32Tensor& queries, const F32Tensor& w_o,
                                     const CalibrationDims& dims, float softmax_scale,
                                     const OracleOptions& options, ThreadPool* pool);

/// Intra-layer normalisation (§11 item 3): divides importance [H_kv, T] by its total so
/// that the layer's mass over heads and tokens is 1. A zero total is left unchanged.
void NormaliseLayer(std::vector<double>* importance);

}  // namespace kvtrim::lukv

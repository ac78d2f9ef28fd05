// Host-side preparation of Expected Attention (baselines.md §7): the future-query Gaussian of
// every query head, rotated by the mean RoPE rotation of the next positions. Computed in
// double and rounded once to fp32, so the CPU and GPU backends score from identical inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/model.h"
#include "kernels/params.h"
#include "kernels/tensor.h"

namespace kvtrim {

/// Rotated query statistics of one layer.
struct ExpectedQueryStats {
  std::vector<float> mean;  // [H_q, d]    mu_bar = R_bar mu
  std::vector<float> cov;   // [H_q, d, d] Sigma_bar = R_bar Sigma R_bar^T
  float half_scale2 = 0;    // 0.5 * scale^2 (= 1/(2d) for the default scale), rounded once
  bool from_window = false; // statistics estimated from the query window (approximation)
};

/// Builds the statistics for layer `layer_id` with n cached tokens. Source (params
/// "query_stats"): the model's registered pre-RoPE mean/covariance, or the sent query rows
/// `queries` [H_q, w, d] (row t at position n - w + t) un-rotated to pre-RoPE, mean and
/// population covariance (1/w) over the w rows. R_bar averages the rotations of positions
/// n .. n + n_future_positions - 1. Errors: FAILED_PRECONDITION when "model" is asked for
/// and the model has no statistics; INVALID_ARGUMENT when the window is needed and absent.
absl::StatusOr<ExpectedQueryStats> ComputeExpectedQueryStats(const RegisteredModel& model,
                                                             const ResolvedParams& params,
                                                             int32_t layer_id, int64_t n,
                                                             const TensorView& queries,
                                                             float softmax_scale);

}  // namespace kvtrim

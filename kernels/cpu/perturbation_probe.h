// The CPU backend's PerturbationProbe: HeadStats.perturbation's computation on one layer,
// evaluated as often as an error-targeted budget's search asks.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Evaluates per-head kept lists on `layer` (values and queries present): exact = fp64 over
/// every window row (perturbation.h), fast = fast_perturbation.h over the last
/// `rows_per_head` rows of every query head. The layer, pool and `full_outputs` (fast: the
/// window rows' full outputs a fast scorer already computed, [H_kv, G * rows_per_head, d],
/// or null) must outlive the probe.
class CpuPerturbationProbe final : public PerturbationProbe {
 public:
  CpuPerturbationProbe(const CpuLayer& layer, bool fast, int64_t rows_per_head,
                       const float* full_outputs, ThreadPool& pool);
  /// out [H_kv] for lists offsets [H_kv + 1] / indices; always OK.
  absl::Status Evaluate(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        std::vector<double>* out) override;

 private:
  const CpuLayer& layer_;
  bool fast_;
  int64_t rows_per_head_;
  const float* full_outputs_;
  ThreadPool& pool_;
};

}  // namespace kvtrim

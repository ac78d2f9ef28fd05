// The CPU backend: the readable, threaded reference the GPU backend is tested against.
#pragma once

#include <map>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/thread_pool.h"

namespace kvtrim {

/// Signature of a CPU scorer (see scorers.h): writes scores [H_kv, n].
using CpuScoreFn = absl::Status (*)(const CpuLayer&, const ResolvedParams&, ThreadPool&, float*);

/// Composes scorer -> protection -> allocator -> selector -> perturbation on the CPU.
class CpuBackend final : public Backend {
 public:
  /// `num_threads` threads per layer computation (<= 1: inline).
  explicit CpuBackend(int num_threads);
  const char* name() const override { return "cpu"; }
  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override;

  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, LayerScores* out) override;

  /// Scores alone, protection applied (used by tests and benchmarks): scores [H_kv, n].
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const CpuLayer& layer,
                          const LayerBudget& budget, std::vector<float>* scores);
  /// Raw scores [H_kv, n] without protection and, for CriticalKV, critical [H_kv, n].
  absl::Status ScoreRaw(const ResolvedPolicy& policy, const CpuLayer& layer,
                        std::vector<float>* scores, std::vector<float>* critical);

 private:
  ThreadPool pool_;
  std::map<ScorerKind, CpuScoreFn> scorers_;  // the scorers that need no model
};

/// Sets scores of protected tokens (first p.sink, last p.recent of each head) to +inf.
void ApplyProtection(const Protection& p, int64_t num_heads, int64_t n, float* scores);

}  // namespace kvtrim

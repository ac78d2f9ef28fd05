// The CPU backend: the readable, threaded reference the GPU backend is tested against.
#pragma once

#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/cpu_scorer_table.h"
#include "kernels/cpu/scorers.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Composes scorer -> protection -> allocator -> selector -> perturbation on the CPU.
class CpuBackend final : public HostFallback {
 public:
  /// `num_threads` threads per layer computation (<= 1: inline).
  explicit CpuBackend(int num_threads);
  const char* name() const override { return "cpu"; }
  absl::Status CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                             const LayerBudget& budget, LayerDecision* out) override;

  absl::Status ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                          const LayerBudget& budget, LayerScores* out) override;
  /// Scores as CompressLayer does, then runs `search` with a CpuPerturbationProbe in the
  /// scores' numerics (fast: over the rows settings.perturbation chooses; fast DropKV's own
  /// row outputs reused). A fast final statistic that overflowed fp32 is recomputed exact,
  /// as CompressLayer does.
  absl::Status CompressByPerturbation(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                      const LayerBudget& budget, const PerturbationSearch& search,
                                      LayerDecision* out) override;

  /// Scores alone, protection applied (used by tests and benchmarks): scores [H_kv, n].
  absl::Status ScoreLayer(const ResolvedPolicy& policy, const CpuLayer& layer,
                          const LayerBudget& budget, std::vector<float>* scores);
  /// Raw canonical (exact) scores [H_kv, n] without protection and, for CriticalKV,
  /// critical [H_kv, n], whatever numerics the policy's settings ask for: the reference.
  absl::Status ScoreRaw(const ResolvedPolicy& policy, const CpuLayer& layer,
                        std::vector<float>* scores, std::vector<float>* critical);
  /// Raw scores in `numerics` where the scorer has a fast CPU path (kFast), else exact;
  /// *used says which computed them. `rows`, when not null, receives the window rows'
  /// outputs a fast scorer computed on the way (fast DropKV), for the statistic.
  absl::Status ScoreRawIn(Numerics numerics, const ResolvedPolicy& policy,
                          const CpuLayer& layer, std::vector<float>* scores,
                          std::vector<float>* critical, Numerics* used,
                          FastRowOutputs* rows = nullptr);

  /// The exact (fp64, every window row) perturbation statistic of decision->offsets /
  /// indices on `layer` (host tensors, values and queries present) into decision: the
  /// fallback where a fast statistic overflowed fp32 (non-finite), on either backend.
  void ExactPerturbation(const ValidatedLayer& layer, LayerDecision* decision) override;

  /// kFast and kExact: every scorer has a fast CPU path (the model-aware ones included;
  /// StreamingLLM's and Random's fast scores are their exact ones).
  std::vector<Numerics> NumericsModes(const ScorerSpec& scorer,
                                      const AllocatorSpec& allocator) const override;

  /// True for fast requests over a scorer whose fast kernels read every key (all but
  /// StreamingLLM and Random, which never read them): the keys' NaN / Inf check then runs on
  /// each tile as the kernels read it (token_rows.h), and a non-finite key is answered with
  /// the engine's own error.
  bool ChecksKeysFinite(const ResolvedPolicy& policy) const override;

 private:
  /// True when `policy` asks for fast numerics and its scorer has them: every read of its
  /// keys and values then goes through the fast kernels (which widen tiles themselves).
  bool RunsFast(const ResolvedPolicy& policy) const;
  /// The raw scores of `cpu` for a decision (CompressLayer, CompressByPerturbation): every
  /// LayerScores field but resident from the layer and `budget`, scores [H_kv, n] in the
  /// settings' numerics; `rows` receives the window rows' outputs a fast scorer computed.
  absl::Status ScoreForDecision(const ResolvedPolicy& policy, const CpuLayer& cpu,
                                const LayerBudget& budget, LayerScores* scores,
                                FastRowOutputs* rows);
  /// True when `scorer` has fast CPU numerics (its scorer table entry's fast function, or a
  /// model-aware scorer).
  bool HasFastPath(const ScorerSpec& scorer) const;

  ThreadPool pool_;
};


}  // namespace kvtrim

#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/fast/fast_perturbation.h"
#include "kernels/cpu/perturbation.h"
#include "kernels/cpu/perturbation_probe.h"
#include "kernels/cpu/scorers.h"
#include "kernels/decide/protection.h"
#include "kernels/finite_scan.h"
#include "kernels/layer_error.h"

namespace kvtrim {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

std::vector<Numerics> CpuBackend::NumericsModes(const ScorerSpec& scorer,
                                                const AllocatorSpec& allocator) const {
  (void)allocator;
  if (HasFastPath(scorer)) return {Numerics::kFast, Numerics::kExact};
  return {Numerics::kExact};
}

namespace {

/// INVALID_ARGUMENT naming the first NaN of `scores` [H, n], or OK.
absl::Status CheckNoNaN(const std::string& scorer, const std::vector<float>& scores, int64_t n) {
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) {
      return LayerFieldError(
          "keys", absl::StrCat("scorer '", scorer, "' produced NaN for head ",
                               static_cast<int64_t>(i) / n, " token ", static_cast<int64_t>(i) % n,
                               "; the input magnitudes overflow fp32 arithmetic"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::ScoreRaw(const ResolvedPolicy& policy, const CpuLayer& layer,
                                  std::vector<float>* scores, std::vector<float>* critical) {
  Numerics used = Numerics::kExact;
  return ScoreRawIn(Numerics::kExact, policy, layer, scores, critical, &used);
}

absl::Status CpuBackend::ScoreRawIn(Numerics numerics, const ResolvedPolicy& policy,
                                    const CpuLayer& layer, std::vector<float>* scores,
                                    std::vector<float>* critical, Numerics* used,
                                    FastRowOutputs* rows) {
  const std::string& name = policy.scorer->name;
  *used = Numerics::kExact;
  const int64_t heads = layer.shape.num_kv_heads;
  const int64_t n = layer.shape.num_tokens;
  scores->assign(static_cast<size_t>(heads * n), 0.0f);
  critical->clear();
  absl::Status st;
  const ScorerKind kind = policy.scorer->kind;
  if (IsModelScorer(kind)) {
    // PolicyEngine::AttachModel refused such a policy without a model: a null one is a
    // caller that skipped the engine (INTERNAL, naming no request field).
    if (policy.model == nullptr) {
      return absl::InternalError(
          absl::StrCat("scorer '", name, "' reached the CPU backend without a model"));
    }
    const bool fast = numerics == Numerics::kFast;
    if (fast) *used = Numerics::kFast;
    if (kind == ScorerKind::kCriticalKV) {
      critical->assign(static_cast<size_t>(heads * n), 0.0f);
      st = (fast ? ScoreCriticalKVFast : ScoreCriticalKV)(layer, policy.params, *policy.model,
                                                          pool_, scores->data(), critical->data());
    } else if (kind == ScorerKind::kLaProx) {
      st = (fast ? ScoreLaProxFast : ScoreLaProx)(layer, policy.params, *policy.model, pool_,
                                                  scores->data());
    } else {
      st = (fast ? ScoreExpectedAttentionFast : ScoreExpectedAttention)(
          layer, policy.params, *policy.model, pool_, scores->data());
    }
  } else {
    // Table scorers: by name (kernels/cpu/cpu_scorer_table.h).
    const CpuScorer* table = CpuScorerTable::Builtin().Find(name);
    if (table == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("scorer '", name, "' has no CPU implementation"));
    }
    const bool fast = numerics == Numerics::kFast && table->fast != nullptr;
    if (fast) *used = Numerics::kFast;
    if (fast && rows != nullptr && table->fast_with_rows != nullptr) {
      st = table->fast_with_rows(layer, policy.params, pool_, scores->data(), rows);
    } else {
      st = (fast ? table->fast : table->exact)(layer, policy.params, pool_, scores->data());
    }
  }
  // Keys the engine did not scan: the kernels checked each tile they read; a flagged (or
  // failed) run gets the engine's own error for the first non-finite key.
  if (layer.keys_nonfinite != nullptr && (!st.ok() || layer.keys_nonfinite->load())) {
    KVTRIM_RETURN_IF_ERROR(CheckFinite(layer.keys_in, layer.unchecked_keys_field));
  }
  if (!st.ok()) return st;
  KVTRIM_RETURN_IF_ERROR(CheckNoNaN(name, *scores, n));
  return CheckNoNaN(name, *critical, n);
}

absl::Status CpuBackend::ScoreLayer(const ResolvedPolicy& policy, const CpuLayer& layer,
                                    const LayerBudget& budget, std::vector<float>* scores) {
  std::vector<float> critical;
  KVTRIM_RETURN_IF_ERROR(ScoreRaw(policy, layer, scores, &critical));
  ApplyProtection(budget.protection, layer.shape.num_kv_heads, layer.shape.num_tokens,
                  scores->data());
  return absl::OkStatus();
}

bool CpuBackend::ChecksKeysFinite(const ResolvedPolicy& policy) const {
  return RunsFast(policy) && policy.scorer->reads_key_values;
}

bool CpuBackend::HasFastPath(const ScorerSpec& scorer) const {
  if (IsModelScorer(scorer.kind)) return true;
  const CpuScorer* table = CpuScorerTable::Builtin().Find(scorer.name);
  return table != nullptr && table->fast != nullptr;
}

bool CpuBackend::RunsFast(const ResolvedPolicy& policy) const {
  return policy.settings.numerics == Numerics::kFast && HasFastPath(*policy.scorer);
}

absl::Status CpuBackend::ScoreLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                    const LayerBudget& budget, LayerScores* out) {
  // Fast kernels widen f16 / bf16 keys and values a tile at a time: no fp32 copy then.
  const CpuLayer cpu = CpuLayer::From(layer, /*widen_keys_values=*/!RunsFast(policy));
  return ScoreRawIn(policy.settings.numerics, policy, cpu, &out->scores, &out->critical,
                    &out->numerics);
}

void CpuBackend::ExactPerturbation(const ValidatedLayer& layer, LayerDecision* decision) {
  const CpuLayer cpu = CpuLayer::From(layer);  // f16 / bf16 widened: the exact path reads fp32
  decision->perturbation.assign(static_cast<size_t>(cpu.shape.num_kv_heads), 0.0);
  OutputPerturbation(cpu, decision->offsets, decision->indices, pool_,
                     decision->perturbation.data());
  decision->perturbation_rows = static_cast<int32_t>(cpu.shape.window_rows);  // every row
  decision->perturbation_sampled = false;
}

absl::Status CpuBackend::ScoreForDecision(const ResolvedPolicy& policy, const CpuLayer& cpu,
                                          const LayerBudget& budget, LayerScores* scores,
                                          FastRowOutputs* rows) {
  scores->layer_id = cpu.layer_id;
  scores->num_layers = cpu.num_layers;
  scores->num_heads = cpu.shape.num_kv_heads;
  scores->num_tokens = cpu.shape.num_tokens;
  scores->budget = budget;
  return ScoreRawIn(policy.settings.numerics, policy, cpu, &scores->scores, &scores->critical,
                    &scores->numerics, rows);
}

absl::Status CpuBackend::CompressLayer(const ResolvedPolicy& policy, const ValidatedLayer& layer,
                                       const LayerBudget& budget, LayerDecision* out) {
  const CpuLayer cpu = CpuLayer::From(layer, /*widen_keys_values=*/!RunsFast(policy));
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto stage_start = Clock::now();
  LayerScores scores;
  FastRowOutputs rows;  // the window rows' full outputs, where a fast scorer has them
  KVTRIM_RETURN_IF_ERROR(ScoreForDecision(policy, cpu, budget, &scores, &rows));
  const double score_seconds = since(stage_start);
  stage_start = Clock::now();
  if (policy.scorer->kind == ScorerKind::kLaProx) {
    // One layer alone: local / layer modes decide here; model-wide modes are the caller's.
    auto decisions = DecideLaProx(policy, {scores});
    if (!decisions.ok()) return decisions.status();
    *out = std::move((*decisions)[0]);
  } else if (auto st = DecideLayer(policy, scores, out); !st.ok()) {
    return st;
  }
  out->numerics = scores.numerics;
  out->profile.score = score_seconds;
  out->profile.select = since(stage_start);
  // The output perturbation on the observation window: fp64 over every row with exact
  // scores; with fast ones fp32 SIMD outputs, over the last kSampledPerturbationRows rows
  // of each query head when the request asks for the sampled statistic (fp64 over every row
  // where fp32 overflowed).
  out->perturbation.clear();
  if (cpu.shape.has_values && cpu.shape.has_queries && policy.settings.perturbation) {
    stage_start = Clock::now();
    const auto w = static_cast<int32_t>(cpu.shape.window_rows);
    out->perturbation.assign(static_cast<size_t>(cpu.shape.num_kv_heads), 0.0);
    const bool fast = scores.numerics == Numerics::kFast;
    if (fast) {
      out->perturbation_rows = policy.settings.perturbation_sampled
                                   ? std::min(w, kSampledPerturbationRows)
                                   : w;
      // DropKV's own rows serve as the full outputs when they are the statistic's rows.
      const bool reuse = rows.rows_per_head == out->perturbation_rows && !rows.outputs.empty();
      FastOutputPerturbation(cpu, out->offsets, out->indices, out->perturbation_rows, pool_,
                             out->perturbation.data(), reuse ? rows.outputs.data() : nullptr);
    }
    // Inputs whose attention overflows fp32 (|q.k| or |a|^2 past 3.4e38) get the fp64
    // statistic instead of a NaN, which would poison the metrics' sums.
    if (!fast) {
      OutputPerturbation(cpu, out->offsets, out->indices, pool_, out->perturbation.data());
      out->perturbation_rows = w;  // every row
    } else if (!AllFinite(out->perturbation)) {
      ExactPerturbation(layer, out);
    }
    out->perturbation_sampled = out->perturbation_rows < w;
    out->profile.perturbation = since(stage_start);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CompressByPerturbation(const ResolvedPolicy& policy,
                                                const ValidatedLayer& layer,
                                                const LayerBudget& budget,
                                                const PerturbationSearch& search,
                                                LayerDecision* out) {
  const CpuLayer cpu = CpuLayer::From(layer, /*widen_keys_values=*/!RunsFast(policy));
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto stage_start = Clock::now();
  LayerScores scores;
  FastRowOutputs rows;  // the window rows' full outputs, where a fast scorer has them
  KVTRIM_RETURN_IF_ERROR(ScoreForDecision(policy, cpu, budget, &scores, &rows));
  const double score_seconds = since(stage_start);
  stage_start = Clock::now();
  // The statistic's rows and numerics, as CompressLayer computes HeadStats.perturbation.
  const auto w = static_cast<int32_t>(cpu.shape.window_rows);
  const bool fast = scores.numerics == Numerics::kFast;
  const int32_t stat_rows =
      fast && policy.settings.perturbation_sampled ? std::min(w, kSampledPerturbationRows) : w;
  const bool reuse = fast && rows.rows_per_head == stat_rows && !rows.outputs.empty();
  CpuPerturbationProbe probe(cpu, fast, stat_rows, reuse ? rows.outputs.data() : nullptr,
                             pool_);
  KVTRIM_RETURN_IF_ERROR(search(scores, probe, out));
  out->numerics = scores.numerics;
  out->perturbation_rows = stat_rows;
  out->perturbation_sampled = stat_rows < w;
  out->device = -1;
  if (fast && !AllFinite(out->perturbation)) ExactPerturbation(layer, out);
  out->profile.score = score_seconds;
  out->profile.perturbation = since(stage_start);  // the search: mostly the statistic
  return absl::OkStatus();
}

}  // namespace kvtrim

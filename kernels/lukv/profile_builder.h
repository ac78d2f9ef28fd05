// LU-KV offline profiling (lukv.md §5.2): per calibration dump, the metric π's ordering of
// each head's context tokens (through the sidecar's own CPU scorers, protected tokens
// first), the oracle importance along that ordering, the greedy solver per dump, and the
// average over dumps -> the profile Φ [99, L, H_kv].
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/lukv/calibration.h"
#include "kernels/lukv/oracle_importance.h"
#include "kernels/registry.h"

namespace kvtrim::lukv {

/// What to profile: the wrapped metric, its parameters and protection, and the oracle.
struct ProfileConfig {
  std::string metric;                        // a scorer name, e.g. "snapkv"
  std::map<std::string, ParamValue> params;  // scorer parameter overrides
  int64_t sink = 0;    // protected first tokens (forced first in π's order)
  int64_t window = 0;  // protected last tokens; also the scorer's `window` parameter when it
                       // has one and `params` does not set it
  OracleOptions oracle;
  int num_threads = 1;  // CPU threads for scoring and the oracle
};

/// Builds one profile from any number of calibration dumps of one model.
class ProfileBuilder {
 public:
  /// Called after each layer of a dump with the layer index.
  using LayerCallback = std::function<void(int64_t layer)>;

  /// Resolves the metric through the built-in registry. INVALID_ARGUMENT for an unknown
  /// scorer, bad parameters, a negative sink/window, a scorer that needs a registered model
  /// (kInputModel: criticalkv, laprox, expected_attention) or a bad model layout.
  static absl::StatusOr<std::unique_ptr<ProfileBuilder>> Create(ProfileConfig config,
                                                                ModelWeights model);

  /// π's order of every KV head of `layer` over the context: orders [H_kv][T], protected
  /// tokens (+inf) first, then by descending score, ties by position.
  absl::StatusOr<std::vector<std::vector<int32_t>>> PiOrders(const CalibrationDump& dump,
                                                             int64_t layer);

  /// The intra-layer-normalised oracle importance of `layer`: I [H_kv, T].
  std::vector<double> Importance(const CalibrationDump& dump, int64_t layer);

  /// Raw gains of a dump: d [L*H_kv][T] with d_{ℓ,h}(i) = I_{ℓ,h,order(i)}.
  absl::StatusOr<std::vector<std::vector<double>>> RawGains(const CalibrationDump& dump,
                                                            const LayerCallback& on_layer = {});

  /// Validates the dump against the model, solves §5.1 on its raw gains and adds
  /// r* [99, L, H_kv] to the running sum.
  absl::Status AddDump(const CalibrationDump& dump, const LayerCallback& on_layer = {});

  /// Φ [99, L, H_kv] float32: the mean of r* over the dumps added (double accumulation).
  /// FAILED_PRECONDITION before the first dump.
  absl::StatusOr<std::vector<float>> Profile() const;

  /// Dumps added so far and their context lengths T.
  int64_t num_dumps() const { return static_cast<int64_t>(context_lengths_.size()); }
  const std::vector<int64_t>& context_lengths() const { return context_lengths_; }

  /// Every parameter of the scorer after defaults and overrides, in declaration order.
  std::vector<std::pair<std::string, ParamValue>> ScorerParams() const;

  const ProfileConfig& config() const { return config_; }
  const ModelWeights& model() const { return model_; }

 private:
  ProfileBuilder(ProfileConfig config, ModelWeights model, PolicyRegistry registry);

  ProfileConfig config_;
  ModelWeights model_;
  PolicyRegistry registry_;
  ResolvedPolicy policy_;
  CpuBackend backend_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<double> sum_;  // [99, L, H_kv]
  std::vector<int64_t> context_lengths_;
};

}  // namespace kvtrim::lukv

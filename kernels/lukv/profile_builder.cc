#include "kernels/lukv/profile_builder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kernels/budget.h"
#include "kernels/thread_pool.h"
#include "kernels/lukv/greedy_solver.h"
#include "kernels/lukv/loss_curves.h"

namespace kvtrim::lukv {
namespace {

/// Copies rows [row0, row0 + rows) of every head of t [heads, n, d] -> [heads, rows, d].
F32Tensor SliceRows(const F32Tensor& t, int64_t row0, int64_t rows) {
  const int64_t heads = t.dim(0), d = t.dim(2);
  std::vector<float> out(static_cast<size_t>(heads * rows * d));
  for (int64_t h = 0; h < heads; ++h) {
    std::copy(t.row(h, row0), t.row(h, row0) + rows * d, out.begin() + h * rows * d);
  }
  return F32Tensor::Owning(std::move(out), {heads, rows, d});
}

}  // namespace

ProfileBuilder::ProfileBuilder(ProfileConfig config, ModelWeights model, PolicyRegistry registry)
    : config_(std::move(config)),
      model_(std::move(model)),
      registry_(std::move(registry)),
      backend_(config_.num_threads),
      pool_(std::make_unique<ThreadPool>(config_.num_threads)) {}

absl::StatusOr<std::unique_ptr<ProfileBuilder>> ProfileBuilder::Create(ProfileConfig config,
                                                                      ModelWeights model) {
  KVTRIM_RETURN_IF_ERROR(model.Validate());
  if (config.sink < 0 || config.window < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sink and window must be >= 0, got sink=", config.sink, " window=", config.window));
  }
  if (config.oracle.k_max < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("k_max must be >= 1, got ", config.oracle.k_max));
  }
  PolicyRegistry registry;
  RegisterBuiltinPolicies(&registry);
  const ScorerSpec* scorer = registry.FindScorer(config.metric);
  if (config.metric.find('+') != std::string::npos || scorer == nullptr) {
    std::vector<std::string> names;
    for (const ScorerSpec* s : registry.scorers()) names.push_back(s->name);
    return absl::InvalidArgumentError(absl::StrCat("metric: unknown scorer '", config.metric,
                                                   "'; known scorers: ",
                                                   absl::StrJoin(names, ", ")));
  }
  if (scorer->required_inputs & (kInputModel | kInputProfile)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric: scorer '", config.metric,
        "' needs a registered model (W_O or query statistics); kvtrim-lukv-profile supports only "
        "scorers that read keys, values and queries alone"));
  }
  bool has_window = false;
  for (const ParamSpec& p : scorer->params) has_window |= p.name == "window";
  if (has_window && config.params.count("window") == 0) {
    config.params["window"] = ParamValue::Number(static_cast<double>(config.window));
  }
  auto builder = std::unique_ptr<ProfileBuilder>(
      new ProfileBuilder(std::move(config), std::move(model), std::move(registry)));
  CompressionSettings settings;
  settings.policy = absl::StrCat(builder->config_.metric, "+uniform");
  settings.params = builder->config_.params;
  settings.sink_tokens = builder->config_.sink;
  settings.recent_tokens = builder->config_.window;
  settings.num_layers = static_cast<int32_t>(builder->model_.num_layers);
  auto policy = builder->registry_.Resolve(settings, "profile");
  if (!policy.ok()) return policy.status();
  builder->policy_ = *std::move(policy);
  builder->sum_.assign(
      static_cast<size_t>(kGridRows * builder->model_.num_layers * builder->model_.num_kv_heads),
      0.0);
  return builder;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ProfileBuilder::PiOrders(
    const CalibrationDump& dump, int64_t layer) {
  const CalibrationDims& dims = dump.dims;
  const int64_t T = dims.context_length, hkv = dims.num_kv_heads;
  const ScorerSpec& scorer = *policy_.scorer;
  const uint32_t reads = scorer.required_inputs | scorer.optional_inputs;
  // Query rows before T: the scorer's observation window, else the protected window.
  const int64_t rows = std::min(
      T, policy_.params.Has("window") ? policy_.params.Int("window") : config_.window);

  CpuLayer cpu;
  cpu.layer_id = static_cast<int32_t>(layer);
  cpu.num_layers = static_cast<int32_t>(dims.num_layers);
  cpu.shape.num_kv_heads = hkv;
  cpu.shape.num_tokens = T;
  cpu.shape.head_dim = dims.head_dim;
  cpu.keys = SliceRows(dump.keys[layer], 0, T);
  if (reads & kInputValues) {
    cpu.values = SliceRows(dump.values[layer], 0, T);
    cpu.shape.has_values = true;
  }
  if ((scorer.required_inputs & kInputQueries) && rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window: scorer '", scorer.name, "' reads query rows; window must be >= 1"));
  }
  if ((reads & kInputQueries) && rows > 0) {
    cpu.queries = SliceRows(dump.queries[layer], T - rows, rows);
    cpu.shape.has_queries = true;
    cpu.shape.num_query_heads = dims.num_query_heads;
    cpu.shape.window_rows = rows;
  }
  cpu.softmax_scale = dump.softmax_scale > 0
                          ? dump.softmax_scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.head_dim)));
  const std::string field = absl::StrCat(dump.source, ": layers.", layer);
  KVTRIM_RETURN_IF_ERROR(scorer.validate(cpu.shape, policy_.params, T, field));

  LayerBudget budget;
  budget.kept_per_head = T;
  budget.protection = ClampProtection({config_.sink, config_.window}, T, T);
  budget.requested = {config_.sink, config_.window};
  std::vector<float> scores;
  if (auto st = backend_.ScoreLayer(policy_, cpu, budget, &scores); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(field, ": ", st.message()));
  }
  std::vector<std::vector<int32_t>> orders(static_cast<size_t>(hkv));
  for (int64_t h = 0; h < hkv; ++h) orders[h] = DescendingOrder(scores.data() + h * T, T);
  return orders;
}

std::vector<double> ProfileBuilder::Importance(const CalibrationDump& dump, int64_t layer) {
  std::vector<double> importance =
      OracleImportance(dump.keys[layer], dump.values[layer], dump.queries[layer],
                       model_.w_o[layer], dump.dims, dump.softmax_scale, config_.oracle,
                       pool_.get());
  NormaliseLayer(&importance);
  return importance;
}

absl::StatusOr<std::vector<std::vector<double>>> ProfileBuilder::RawGains(
    const CalibrationDump& dump, const LayerCallback& on_layer) {
  KVTRIM_RETURN_IF_ERROR(dump.Validate());
  KVTRIM_RETURN_IF_ERROR(model_.CheckMatches(dump.dims, dump.source));
  const int64_t L = dump.dims.num_layers, hkv = dump.dims.num_kv_heads;
  const int64_t T = dump.dims.context_length;
  std::vector<std::vector<double>> gains(static_cast<size_t>(L * hkv));
  for (int64_t l = 0; l < L; ++l) {
    auto orders = PiOrders(dump, l);
    if (!orders.ok()) return orders.status();
    const std::vector<double> importance = Importance(dump, l);
    for (int64_t h = 0; h < hkv; ++h) {
      gains[l * hkv + h] = OrderedGains(importance.data() + h * T, (*orders)[h]);
    }
    if (on_layer) on_layer(l);
  }
  return gains;
}

absl::Status ProfileBuilder::AddDump(const CalibrationDump& dump, const LayerCallback& on_layer) {
  auto gains = RawGains(dump, on_layer);
  if (!gains.ok()) return gains.status();
  const std::vector<double> ratios =
      SolveLocalRatios(*gains, dump.dims.num_layers, dump.dims.num_kv_heads);
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += ratios[i];
  context_lengths_.push_back(dump.dims.context_length);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ProfileBuilder::Profile() const {
  if (context_lengths_.empty()) {
    return absl::FailedPreconditionError("no calibration dump was added");
  }
  const double m = static_cast<double>(context_lengths_.size());
  std::vector<float> profile(sum_.size());
  for (size_t i = 0; i < sum_.size(); ++i) profile[i] = static_cast<float>(sum_[i] / m);
  return profile;
}

std::vector<std::pair<std::string, ParamValue>> ProfileBuilder::ScorerParams() const {
  std::vector<std::pair<std::string, ParamValue>> out;
  for (const ParamSpec& spec : policy_.scorer->params) {
    out.emplace_back(spec.name, spec.kind == ParamSpec::Kind::kEnum
                                    ? ParamValue::Text(policy_.params.Text(spec.name))
                                    : ParamValue::Number(policy_.params.Number(spec.name)));
  }
  return out;
}

}  // namespace kvtrim::lukv

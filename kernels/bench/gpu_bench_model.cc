#include "kernels/bench/gpu_bench_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "kernels/decide/decide.h"
#include "kernels/expected_attention_stats.h"

namespace kvtrim::gpu::bench {
namespace {

/// Fast deterministic uniforms in [0, 1) (host).
float HostUniform(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<float>(static_cast<double>(*state >> 40) / 16777216.0);
}

}  // namespace

void MakeBenchModel(const Options& o, BenchModel* m) {
  const int64_t hq = kKvHeads * kGroup;
  auto model = std::make_shared<RegisteredModel>();
  model->digest = "sha256:bench";
  model->layout = {"bench", kNumLayers, static_cast<int32_t>(hq), static_cast<int32_t>(kKvHeads),
                   static_cast<int32_t>(kHeadDim), static_cast<int32_t>(o.hidden)};
  LukvProfile profile;
  profile.name = profile.metric = "snapkv";
  profile.sink = 0;
  profile.window = o.model_w;
  profile.prune_ratios.resize(static_cast<size_t>(kLukvProfileRows * kNumLayers * kKvHeads));
  uint64_t state = 17;
  for (int64_t r = 0; r < kLukvProfileRows; ++r) {
    for (int64_t i = 0; i < kNumLayers * kKvHeads; ++i) {
      const float f = 0.5f + HostUniform(&state);
      profile.prune_ratios[static_cast<size_t>(r * kNumLayers * kKvHeads + i)] =
          std::min(1.0f, static_cast<float>(r + 1) / 100.0f * f);
    }
  }
  model->profiles["snapkv"] = std::move(profile);
  // Pre-RoPE query statistics of every layer (Expected Attention, ea_stats_host row).
  model->query_mean.assign(static_cast<size_t>(kNumLayers),
                           std::vector<float>(static_cast<size_t>(hq * kHeadDim)));
  model->query_cov.assign(static_cast<size_t>(kNumLayers),
                          std::vector<float>(static_cast<size_t>(hq * kHeadDim * kHeadDim)));
  for (auto& layer : model->query_mean) for (float& x : layer) x = HostUniform(&state) - 0.5f;
  for (auto& layer : model->query_cov) for (float& x : layer) x = 0.05f * (HostUniform(&state) - 0.5f);
  // W_O [D, H_q d] ~ U(-0.5, 0.5) / sqrt(D) and the Gram matrices of layer kLayerId only.
  auto fill = [&](std::vector<std::vector<float>>* per_layer, size_t count, float scale) {
    per_layer->assign(static_cast<size_t>(kNumLayers), std::vector<float>());
    std::vector<float>& t = (*per_layer)[static_cast<size_t>(kLayerId)];
    t.resize(count);
    for (float& x : t) x = scale * (HostUniform(&state) - 0.5f);
  };
  fill(&model->w_o, static_cast<size_t>(o.hidden * hq * kHeadDim),
       1.0f / std::sqrt(static_cast<float>(o.hidden)));
  fill(&model->head_gram, static_cast<size_t>(hq * kHeadDim * kHeadDim), 0.05f);
  fill(&model->group_gram, static_cast<size_t>(kKvHeads * kHeadDim * kHeadDim), 0.05f);
  m->host = model;
}

std::vector<Row> RunHostRows(const PolicyRegistry& registry, const BenchModel& model, int64_t n,
                             const Options& options, GpuBackend& backend) {
  std::vector<Row> rows;
  // The median over host_reps of the time a model-wide decision takes; each answer is checked
  // and freed after its clock stops, so the figure is the decision alone.
  using Decisions = absl::StatusOr<std::vector<LayerDecision>>;
  auto median_decide_ms = [&](const std::function<Decisions()>& decide, int64_t n,
                              absl::Status* status) {
    std::vector<double> ms;
    for (int rep = 0; rep < options.host_reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      const Decisions decisions = decide();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
      if (!decisions.ok()) {
        *status = decisions.status();
        continue;
      }
      for (const LayerDecision& d : *decisions) {
        if (std::string e = CheckAnswer(d.offsets, d.indices, n, -1); !e.empty()) {
          *status = absl::InternalError(e);
        }
      }
    }
    return Median(ms);
  };
  auto median_ms = [&](const std::function<void()>& fn) {
    std::vector<double> ms;
    for (int rep = 0; rep < options.host_reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
    return Median(ms);
  };
  {
    Row row;
    row.policy = "laprox_decide32_host";
    row.scorer = "laprox";
    row.n = n;
    row.w = options.model_w;
    row.note = absl::StrCat("host DecideLaProx (mode model) over ", kNumLayers, " layers");
    CompressionSettings settings;
    settings.policy = "laprox";
    settings.budget.keep_fraction = options.keep_fraction;
    settings.num_layers = kNumLayers;
    auto policy = registry.Resolve(settings, "settings");
    if (!policy.ok()) {
      row.error = policy.status().ToString();
      rows.push_back(row);
      return rows;
    }
    policy->model = model.host;
    std::vector<LayerScores> layers(static_cast<size_t>(kNumLayers));
    uint64_t state = static_cast<uint64_t>(n);
    for (int32_t l = 0; l < kNumLayers; ++l) {
      LayerScores& ls = layers[static_cast<size_t>(l)];
      ls.layer_id = l;
      ls.num_layers = kNumLayers;
      ls.num_heads = kKvHeads;
      ls.num_tokens = n;
      ls.scores.resize(static_cast<size_t>(kKvHeads * n));
      for (float& x : ls.scores) x = HostUniform(&state);
      ls.budget.kept_per_head = KeptCount(policy->settings.budget, n);
      ls.budget.requested = Protection{0, options.model_w};
      ls.budget.protection =
          ClampProtection(ls.budget.requested, ls.budget.kept_per_head, n);
    }
    absl::Status status;
    row.select_us =
        1e3 * median_decide_ms([&] { return DecideLaProx(*policy, layers); }, n, &status);
    row.total_us = row.select_us;
    if (!status.ok()) row.error = status.ToString();
    rows.push_back(row);

    // The same decision on the device: the layers' scores kept there as a session keeps them.
    Row device = row;
    device.policy = "laprox_decide32";
    device.error.clear();
    device.note = absl::StrCat("GpuBackend::DecideModelWide (mode model) over ", kNumLayers,
                               " layers of device-resident scores, the kept indices back");
    absl::Status kept;
    for (LayerScores& ls : layers) {
      if (kept.ok()) kept = backend.KeepScoresOnDevice(*policy, &ls);
    }
    absl::Status decided = kept;
    if (kept.ok()) {
      device.select_us = 1e3 * median_decide_ms(
                                   [&] { return backend.DecideModelWide(*policy, layers); }, n,
                                   &decided);
    }
    device.total_us = device.select_us;
    if (!decided.ok()) device.error = decided.ToString();
    rows.push_back(device);
  }
  {
    Row row;
    row.policy = "ea_stats_host";
    row.scorer = "expected_attention";
    row.n = n;
    row.w = options.model_w;
    row.note = "host ComputeExpectedQueryStats of one layer (query_stats model)";
    CompressionSettings settings;
    settings.policy = "expected_attention";
    settings.params["query_stats"] = ParamValue::Text("model");
    auto policy = registry.Resolve(settings, "settings");
    if (!policy.ok()) {
      row.error = policy.status().ToString();
      rows.push_back(row);
      return rows;
    }
    absl::Status status;
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    row.select_us = 1e3 * median_ms([&] {
      auto stats = ComputeExpectedQueryStats(*model.host, policy->params, kLayerId, n,
                                             TensorView(), scale);
      if (!stats.ok()) status = stats.status();
    });
    row.total_us = row.select_us;
    if (!status.ok()) row.error = status.ToString();
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvtrim::gpu::bench

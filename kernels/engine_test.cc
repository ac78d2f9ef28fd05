// PolicyEngine validation: every bad layer gets INVALID_ARGUMENT naming the field.
#include "kernels/engine.h"
#include "tests/testing/random_model_test_util.h"
#include "tests/testing/random_layer_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "kernels/cpu/cpu_backend.h"

namespace kvtrim {
namespace {

using Layer = RandomLayer;

class EngineTest : public ::testing::Test {
 protected:
  EngineTest() : backend_(2), engine_(registry_, backend_) { RegisterBuiltinPolicies(&registry_); }

  ResolvedPolicy Policy(const std::string& name, double fraction = 0.25,
                        std::map<std::string, ParamValue> params = {}) {
    CompressionSettings s;
    s.policy = name;
    s.budget.keep_fraction = fraction;
    s.params = std::move(params);
    auto p = engine_.Prepare(s, "settings");
    EXPECT_TRUE(p.ok()) << p.status();
    // Policies that need a model get a random one of the test layers' layout (H_kv=3,
    // H_q=6, d=16) with query statistics and a snapkv profile.
    RandomModelOptions o;
    o.layers = 1;
    o.kv_heads = 3;
    o.query_heads = 6;
    o.head_dim = 16;
    o.query_stats = true;
    o.profile_metric = "snapkv";
    const uint32_t needs = p->scorer->required_inputs | p->allocator->required_inputs;
    if (needs & kInputModel) EXPECT_TRUE(engine_.AttachModel(&*p, RandomModel(o), "settings").ok());
    return *p;
  }

  void ExpectInvalid(const ResolvedPolicy& policy, const LayerRequest& layer,
                     const std::string& fragment) {
    auto r = engine_.CompressLayer(policy, layer, "layers[0]");
    ASSERT_FALSE(r.ok()) << "expected an error containing: " << fragment;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status();
  }

  PolicyRegistry registry_;
  CpuBackend backend_;
  PolicyEngine engine_;
};

TEST_F(EngineTest, PrepareRejectsBadSettings) {
  CompressionSettings s;
  s.policy = "dropkv";
  s.budget.keep_fraction = 0;
  EXPECT_NE(engine_.Prepare(s, "settings").status().message().find(
                "settings.budget.keep_fraction: must be in (0, 1]"),
            std::string::npos);
  s.budget.keep_fraction = 1.5;
  EXPECT_EQ(engine_.Prepare(s, "settings").status().code(), absl::StatusCode::kInvalidArgument);
  s.budget.keep_fraction = std::nan("");
  EXPECT_EQ(engine_.Prepare(s, "settings").status().code(), absl::StatusCode::kInvalidArgument);
  s.budget = Budget{false, 0, 0};
  EXPECT_NE(engine_.Prepare(s, "settings").status().message().find(
                "settings.budget.keep_tokens: must be >= 1"),
            std::string::npos);
  s.budget = Budget{true, 0.5, 0};
  s.policy = "no_such_policy";
  EXPECT_NE(engine_.Prepare(s, "settings").status().message().find(
                "settings.policy.name: unknown policy 'no_such_policy'"),
            std::string::npos);
  s.policy = "dropkv+nothing";
  EXPECT_EQ(engine_.Prepare(s, "settings").status().code(), absl::StatusCode::kInvalidArgument);
  s.policy = "dropkv";
  s.params["window"] = ParamValue::Number(-1);
  EXPECT_NE(engine_.Prepare(s, "settings").status().message().find(
                "settings.policy.params.window: -1 is out of range"),
            std::string::npos);
  s.params.clear();
  s.sink_tokens = -1;
  EXPECT_NE(engine_.Prepare(s, "settings").status().message().find("settings.sink_tokens"),
            std::string::npos);
}

TEST_F(EngineTest, CompositionsResolve) {
  CompressionSettings s;
  s.policy = "dropkv+adakv";
  s.params["safeguard_alpha"] = ParamValue::Number(0.5);
  auto p = engine_.Prepare(s, "settings");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->scorer->name, "dropkv");
  EXPECT_EQ(p->allocator->name, "adakv");
  EXPECT_DOUBLE_EQ(p->params.Number("safeguard_alpha"), 0.5);
}

TEST_F(EngineTest, RejectsBadShapesNamingTheField) {
  const ResolvedPolicy dropkv = Policy("dropkv");
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.keys.shape = {2, 0, 8};
    ExpectInvalid(dropkv, l.request, "layers[0].keys.shape[1]: n must be in [1");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.values.shape = {2, 39, 8};
    ExpectInvalid(dropkv, l.request, "layers[0].values.shape: [2, 39, 8] does not match keys");
  }
  {
    Layer l(2, 40, 8, 3, 8);
    ExpectInvalid(dropkv, l.request, "layers[0].queries.shape[0]: H_q=3 is not a positive multiple of H_kv=2");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.queries.shape = {4, 8, 4};
    ExpectInvalid(dropkv, l.request, "layers[0].queries.shape[2]: d=4 does not match keys d=8");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.queries.shape = {4, 41, 8};
    ExpectInvalid(dropkv, l.request, "layers[0].queries.shape[1]: w=41 must be in [1, min(n=40");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.values.dtype = DType::kBF16;
    ExpectInvalid(dropkv, l.request, "layers[0].values.dtype: bf16 differs from keys f32");
  }
  {
    Layer l(2, 40, 8, 4, 4);  // dropkv's window is 8 rows
    ExpectInvalid(dropkv, l.request, "layers[0].queries.shape[1]: the policy reads window=8");
  }
}

TEST_F(EngineTest, RejectsMissingInputsNonFiniteAndBudgetOverN) {
  const ResolvedPolicy dropkv = Policy("dropkv");
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.queries = {};
    ExpectInvalid(dropkv, l.request, "layers[0].queries: policy 'dropkv' needs window queries");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.values = {};
    ExpectInvalid(dropkv, l.request, "layers[0].values: policy 'dropkv' needs values");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.k[1 * 40 * 8 + 3 * 8 + 5] = std::nanf("");
    ExpectInvalid(dropkv, l.request, "layers[0].keys: contains NaN at [1, 3, 5]");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.q[7] = INFINITY;
    ExpectInvalid(dropkv, l.request, "layers[0].queries: contains Inf at [0, 0, 7]");
  }
  {
    // Past the first scan block (4096 elements), and the lowest of two bad ones.
    Layer l(2, 600, 8, 4, 8);
    l.v[1 * 600 * 8 + 550 * 8 + 2] = INFINITY;
    l.v[1 * 600 * 8 + 10 * 8 + 6] = std::nanf("");
    ExpectInvalid(dropkv, l.request, "layers[0].values: contains NaN at [1, 10, 6]");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    CompressionSettings s;
    s.policy = "knorm";
    s.budget = Budget{false, 0, 41};
    auto p = engine_.Prepare(s, "settings");
    ASSERT_TRUE(p.ok());
    ExpectInvalid(*p, l.request, "budget.keep_tokens=41 exceeds n=40");
  }
  {
    Layer l(2, 40, 8, 4, 8);
    l.request.softmax_scale = -1;
    ExpectInvalid(dropkv, l.request, "layers[0].softmax_scale");
  }
}

// The engine is the one place a layer is checked against its scorer: the scorers read their
// inputs and window parameters without checking them again (kernels/cpu/scorers.h), so every
// scorer's missing inputs, even kernel and window past the rows sent must be refused here.
TEST_F(EngineTest, ChecksEveryScorersInputsAndWindowParametersOnce) {
  int windowed = 0;
  for (const ScorerSpec* scorer : registry_.scorers()) {
    SCOPED_TRACE(scorer->name);
    // The random model Policy attaches has H_kv = 3, H_q = 6, d = 16.
    const ResolvedPolicy policy = Policy(scorer->name);
    if (scorer->required_inputs & kInputQueries) {
      Layer l(3, 40, 16, 6, 8);
      l.request.queries = {};
      ExpectInvalid(policy, l.request,
                    "layers[0].queries: policy '" + scorer->name + "' needs window queries");
    }
    if (scorer->required_inputs & kInputValues) {
      Layer l(3, 40, 16, 6, 8);
      l.request.values = {};
      ExpectInvalid(policy, l.request,
                    "layers[0].values: policy '" + scorer->name + "' needs values");
    }
    const bool has_kernel = std::any_of(scorer->params.begin(), scorer->params.end(),
                                        [](const ParamSpec& p) { return p.name == "kernel"; });
    if (!has_kernel) continue;
    ++windowed;
    Layer l(3, 40, 16, 6, 4);
    ExpectInvalid(Policy(scorer->name, 0.25, {{"window", ParamValue::Number(5)}}), l.request,
                  "layers[0].queries.shape[1]: the policy reads window=5 query rows but only 4");
    ExpectInvalid(Policy(scorer->name, 0.25,
                         {{"window", ParamValue::Number(4)}, {"kernel", ParamValue::Number(4)}}),
                  l.request, "layers[0]: policy.params.kernel must be odd, got 4");
    EXPECT_TRUE(engine_
                    .CompressLayer(Policy(scorer->name, 0.25, {{"window", ParamValue::Number(4)}}),
                                   l.request, "layers[0]")
                    .ok());
  }
  EXPECT_EQ(windowed, 4);  // snapkv, dropkv, criticalkv, laprox
}

// What AttachModel refuses, the backends and the decision code no longer check as a request
// (they keep INTERNAL guards): each refusal names the request's field.
TEST_F(EngineTest, AttachModelRefusesMissingModelsStatisticsAndProfiles) {
  auto prepare = [&](const std::string& name, std::map<std::string, ParamValue> params) {
    CompressionSettings s;
    s.policy = name;
    s.budget.keep_fraction = 0.25;
    s.params = std::move(params);
    absl::StatusOr<ResolvedPolicy> p = engine_.Prepare(s, "settings");
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  RandomModelOptions bare;  // no query statistics, no profile
  bare.layers = 1;
  bare.kv_heads = 3;
  bare.query_heads = 6;
  bare.head_dim = 16;
  for (const char* name : {"criticalkv", "laprox", "expected_attention"}) {
    ResolvedPolicy p = prepare(name, {});
    const absl::Status st = engine_.AttachModel(&p, nullptr, "settings");
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_NE(st.message().find(std::string("settings.model_digest: policy '") + name +
                                "' needs a registered model"),
              std::string::npos)
        << st;
  }
  ResolvedPolicy stats =
      prepare("expected_attention", {{"query_stats", ParamValue::Text("model")}});
  absl::Status st = engine_.AttachModel(&stats, RandomModel(bare), "settings");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("settings.model_digest: expected_attention with query_stats=model"),
            std::string::npos)
      << st;
  ResolvedPolicy lukv = prepare("lukv", {});
  st = engine_.AttachModel(&lukv, RandomModel(bare), "settings");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("settings.model_digest: lukv over scorer 'snapkv' needs profile"),
            std::string::npos)
      << st;
}

TEST_F(EngineTest, DeviceReadTensorsNeedABackendThatReadsDeviceMemory) {
  const ResolvedPolicy knorm = Policy("knorm");
  for (MemorySpace space : {MemorySpace::kDevice, MemorySpace::kPinnedHost}) {
    Layer l(2, 40, 8, 4, 8);
    l.request.values.space = space;
    l.k[3] = std::nanf("");  // never scanned: the refusal comes before the host scan
    l.request.values.data = l.k.data();
    auto r = engine_.CompressLayer(knorm, l.request, "layers[0]");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_NE(r.status().message().find(
                  space == MemorySpace::kDevice
                      ? "layers[0].values: a device tensor (cuda_ipc) needs the GPU backend"
                      : "layers[0].values: a page-locked host_shm tensor needs the GPU backend"),
              std::string::npos)
        << r.status();
  }
}

TEST_F(EngineTest, KeptCountsFollowTheBudgetRule) {
  Layer l(3, 99, 16, 6, 32);
  for (const auto& preset : registry_.presets()) {
    const ResolvedPolicy p = Policy(preset.name, 0.3);
    auto d = engine_.CompressLayer(p, l.request, "layers[0]");
    ASSERT_TRUE(d.ok()) << preset.name << ": " << d.status();
    ASSERT_EQ(d->offsets.size(), 4u);
    int64_t total = 0;
    for (int h = 0; h < 3; ++h) {
      total += d->kept_per_head[h];
      if (preset.allocator == "uniform" && preset.scorer != "laprox") {
        EXPECT_EQ(d->kept_per_head[h], 30) << preset.name;
      }
      for (int64_t i = d->offsets[h] + 1; i < d->offsets[h + 1]; ++i) {
        EXPECT_LT(d->indices[i - 1], d->indices[i]) << preset.name;
      }
    }
    if (preset.allocator != "pyramid" && preset.allocator != "lukv") {
      EXPECT_EQ(total, 90) << preset.name;
    }
    EXPECT_EQ(d->perturbation.size(), 3u) << preset.name;
  }
}

}  // namespace
}  // namespace kvtrim

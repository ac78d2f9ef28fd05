// CpuBackend composition: protection, allocation, output shapes, determinism, dtypes.
#include "kernels/cpu/cpu_backend.h"
#include "tests/testing/random_layer_test_util.h"

#include <gtest/gtest.h>

#include <random>

#include "kernels/decide/allocate.h"
#include "kernels/engine.h"
#include "tests/testing/random_model_test_util.h"

namespace kvtrim {
namespace {

using Layer = RandomLayer;

std::vector<int32_t> Head(const LayerDecision& d, int h) {
  return std::vector<int32_t>(d.indices.begin() + d.offsets[h], d.indices.begin() + d.offsets[h + 1]);
}

class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackendTest() { RegisterBuiltinPolicies(&registry_); }

  /// Compresses `layer`; presets that need a model get a random one of the layer's layout
  /// (with query statistics and a snapkv profile).
  LayerDecision Run(const CompressionSettings& s, const LayerRequest& layer, int threads = 2) {
    CpuBackend backend(threads);
    PolicyEngine engine(registry_, backend);
    auto p = engine.Prepare(s, "settings");
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    RandomModelOptions o;
    o.layers = 1;
    o.kv_heads = static_cast<int32_t>(layer.keys.shape[0]);
    o.query_heads = static_cast<int32_t>(layer.queries.shape[0]);
    o.head_dim = static_cast<int32_t>(layer.keys.shape[2]);
    o.query_stats = true;
    o.profile_metric = "snapkv";
    const uint32_t needs = p->scorer->required_inputs | p->allocator->required_inputs;
    const absl::Status attached =
        engine.AttachModel(&*p, (needs & kInputModel) ? RandomModel(o) : nullptr, "settings");
    EXPECT_TRUE(attached.ok()) << attached;
    auto d = engine.CompressLayer(*p, layer, "layer");
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : LayerDecision{};
  }

  static CompressionSettings Settings(const std::string& policy, double fraction) {
    CompressionSettings s;
    s.policy = policy;
    s.budget.keep_fraction = fraction;
    return s;
  }

  PolicyRegistry registry_;
};

TEST_F(CpuBackendTest, DropKVAlwaysKeepsTheWindow) {
  Layer l(2, 200, 16, 8, 8);
  for (double f : {0.04, 0.1, 0.5}) {
    const LayerDecision d = Run(Settings("dropkv", f), l.request);
    for (int h = 0; h < 2; ++h) {
      const auto kept = Head(d, h);
      for (int32_t j = 192; j < 200; ++j) {
        EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), j)) << "f=" << f << " j=" << j;
      }
    }
  }
}

TEST_F(CpuBackendTest, StreamingLlmKeepsSinksAndMostRecent) {
  Layer l(2, 50, 8, 2, 1);
  const LayerDecision d = Run(Settings("streaming_llm", 0.2), l.request);  // k = 10
  std::vector<int32_t> expected = {0, 1, 2, 3, 44, 45, 46, 47, 48, 49};
  EXPECT_EQ(Head(d, 0), expected);
  EXPECT_EQ(Head(d, 1), expected);
}

TEST_F(CpuBackendTest, RequestOverridesProtection) {
  Layer l(1, 60, 8, 1, 8);
  CompressionSettings s = Settings("knorm", 0.25);  // k = 15
  s.sink_tokens = 3;
  s.recent_tokens = 5;
  const auto kept = Head(Run(s, l.request), 0);
  ASSERT_EQ(kept.size(), 15u);
  for (int32_t j : {0, 1, 2, 55, 56, 57, 58, 59}) {
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), j)) << j;
  }
}

TEST_F(CpuBackendTest, SharedOutputIsOneListOfTheBudget) {
  Layer l(4, 120, 8, 8, 32);
  CompressionSettings s = Settings("snapkv", 0.4);  // k = 48
  s.output_shape = OutputShape::kShared;
  const LayerDecision d = Run(s, l.request);
  ASSERT_EQ(d.offsets.size(), 2u);
  EXPECT_EQ(d.indices.size(), 48u);
  EXPECT_TRUE(std::is_sorted(d.indices.begin(), d.indices.end()));
  // The protected window is in the shared list.
  for (int32_t j = 88; j < 120; ++j) {
    EXPECT_TRUE(std::binary_search(d.indices.begin(), d.indices.end(), j)) << j;
  }
  // TOVA scores every head alike, so shared equals each head's own list.
  CompressionSettings t = Settings("tova", 0.3);
  const LayerDecision per_head = Run(t, l.request);
  t.output_shape = OutputShape::kShared;
  const LayerDecision shared = Run(t, l.request);
  EXPECT_EQ(shared.indices, Head(per_head, 0));
  EXPECT_EQ(Head(per_head, 3), Head(per_head, 0));
}

TEST_F(CpuBackendTest, PerturbationOffSkipsTheStatisticOnly) {
  Layer l(2, 120, 16, 4, 32);
  CompressionSettings s = Settings("dropkv", 0.3);
  const LayerDecision with = Run(s, l.request);
  s.perturbation = false;
  const LayerDecision without = Run(s, l.request);
  EXPECT_EQ(with.perturbation.size(), 2u);
  EXPECT_TRUE(without.perturbation.empty());
  EXPECT_EQ(with.offsets, without.offsets);
  EXPECT_EQ(with.indices, without.indices);
}

TEST_F(CpuBackendTest, IdenticalAcrossThreadCounts) {
  Layer l(4, 333, 16, 16, 32);
  for (const auto& preset : registry_.presets()) {
    const LayerDecision one = Run(Settings(preset.name, 0.3), l.request, 1);
    const LayerDecision two = Run(Settings(preset.name, 0.3), l.request, 2);
    EXPECT_EQ(one.indices, two.indices) << preset.name;
    EXPECT_EQ(one.perturbation, two.perturbation) << preset.name;
  }
}

TEST_F(CpuBackendTest, Bf16InputMatchesItsF32Widening) {
  Layer l(2, 150, 16, 4, 32);
  std::vector<uint16_t> kb(l.k.size()), vb(l.v.size()), qb(l.q.size());
  Layer widened = l;
  for (size_t i = 0; i < l.k.size(); ++i) {
    kb[i] = FloatToBf16(l.k[i]);
    widened.k[i] = Bf16ToFloat(kb[i]);
    vb[i] = FloatToBf16(l.v[i]);
    widened.v[i] = Bf16ToFloat(vb[i]);
  }
  for (size_t i = 0; i < l.q.size(); ++i) {
    qb[i] = FloatToBf16(l.q[i]);
    widened.q[i] = Bf16ToFloat(qb[i]);
  }
  widened.request.keys.data = widened.k.data();
  widened.request.values.data = widened.v.data();
  widened.request.queries.data = widened.q.data();
  LayerRequest bf16 = l.request;
  bf16.keys = {kb.data(), DType::kBF16, l.request.keys.shape};
  bf16.values = {vb.data(), DType::kBF16, l.request.values.shape};
  bf16.queries = {qb.data(), DType::kBF16, l.request.queries.shape};
  for (const char* policy : {"knorm", "keydiff", "snapkv", "h2o", "tova", "adakv"}) {
    EXPECT_EQ(Run(Settings(policy, 0.25), bf16).indices,
              Run(Settings(policy, 0.25), widened.request).indices)
        << policy;
  }
  // DropKV rounds p to bf16 for bf16 inputs ("auto"); forcing it on for f32 matches.
  CompressionSettings s = Settings("dropkv", 0.25);
  const auto from_bf16 = Run(s, bf16).indices;
  s.params["bf16_prob_round"] = ParamValue::Text("on");
  EXPECT_EQ(from_bf16, Run(s, widened.request).indices);
}

TEST_F(CpuBackendTest, PyramidFollowsTheLinearSchedule) {
  Layer l(2, 400, 8, 4, 32);
  CompressionSettings s = Settings("pyramidkv", 0.25);  // k = 100
  s.num_layers = 8;
  for (int32_t layer : {0, 3, 7}) {
    l.request.layer_id = layer;
    const LayerDecision d = Run(s, l.request);
    EXPECT_EQ(d.kept_per_head[0], PyramidLayerBudget(100, 400, layer, 8, 20.0, 32)) << layer;
    EXPECT_EQ(d.kept_per_head[0], d.kept_per_head[1]);
  }
  l.request.layer_id = 0;
  EXPECT_GT(Run(s, l.request).kept_per_head[0], 100);
  l.request.layer_id = 7;
  EXPECT_LT(Run(s, l.request).kept_per_head[0], 100);
}

TEST_F(CpuBackendTest, AdaKVConservesTheLayerTotal) {
  Layer l(4, 256, 8, 16, 32, 11);
  const LayerDecision d = Run(Settings("adakv", 0.25), l.request);  // k = 64
  int64_t total = 0;
  for (int h = 0; h < 4; ++h) {
    total += d.kept_per_head[h];
    EXPECT_GE(d.kept_per_head[h], 32 + 0) << "window + safeguard floor(0.2*64)=12 inside";
  }
  EXPECT_EQ(total, 256);
}

}  // namespace
}  // namespace kvtrim

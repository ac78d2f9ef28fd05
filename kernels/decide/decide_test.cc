// DecideLayer / DecideLaProx: the checkable theorems of criticalkv.md §4 and laprox.md §4,
// LU-KV's online allocation (lukv.md §5.3) and the block_aligned / equal_count shapes.
#include "kernels/decide/decide.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/testing/attention_test_layer.h"
#include "kernels/cpu/scorers.h"
#include "kernels/decide/lukv_budget.h"
#include "tests/testing/random_model_test_util.h"
#include "kernels/registry.h"

namespace kvtrim {
namespace {

ResolvedPolicy Resolve(const std::string& name, std::map<std::string, ParamValue> params = {},
                       OutputShape shape = OutputShape::kPerHead) {
  static PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry;
    RegisterBuiltinPolicies(r);
    return r;
  }();
  CompressionSettings settings;
  settings.policy = name;
  settings.params = std::move(params);
  settings.output_shape = shape;
  auto p = registry->Resolve(settings, "settings");
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::set<int32_t> List(const LayerDecision& d, int64_t i) {
  return {d.indices.begin() + d.offsets[i], d.indices.begin() + d.offsets[i + 1]};
}

// ------------------------------- CriticalKV (§4) --------------------------------------

/// theta(N) = C - (2 - 1/m(N)) sum_{i in N} A_i v_i (T3.3).
double Theta(const std::vector<double>& a, const std::vector<double>& v, const std::set<int>& kept) {
  double c = 0, mass = 0, sel = 0;
  for (size_t i = 0; i < a.size(); ++i) c += a[i] * v[i];
  for (int i : kept) {
    mass += a[i];
    sel += a[i] * v[i];
  }
  return c - (2.0 - 1.0 / mass) * sel;
}

TEST(CriticalKVTheoryTest, RenormalisationIdentityAndUpperBound) {
  // T3.2: masked softmax = N.A / m(N); T3.3: L(N) <= theta(N) = sum |A - A'| v.
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal;
  const int n = 24, D = 16;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> logits(n), a(n), vw(n * D), v(n, 0.0);
    for (auto& x : logits) x = 2.0 * normal(rng);
    const double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (int i = 0; i < n; ++i) z += std::exp(logits[i] - mx);
    for (int i = 0; i < n; ++i) a[i] = std::exp(logits[i] - mx) / z;
    for (int i = 0; i < n; ++i) {
      for (int e = 0; e < D; ++e) {
        vw[i * D + e] = normal(rng);
        v[i] += std::fabs(vw[i * D + e]);
      }
    }
    std::set<int> kept;
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) kept.insert(i);
    }
    if (kept.empty()) kept.insert(0);
    // Masked softmax directly.
    double zk = 0, mass = 0;
    for (int i : kept) zk += std::exp(logits[i] - mx);
    for (int i : kept) mass += a[i];
    std::vector<double> masked(n, 0.0);
    for (int i : kept) masked[i] = std::exp(logits[i] - mx) / zk;
    double l = 0, identity = 0;
    for (int i = 0; i < n; ++i) {
      const double renorm = kept.count(i) ? a[i] / mass : 0.0;
      ASSERT_NEAR(masked[i], renorm, 1e-12);
      identity += std::fabs(a[i] - renorm) * v[i];
    }
    for (int e = 0; e < D; ++e) {
      double acc = 0;
      for (int i = 0; i < n; ++i) acc += (a[i] - masked[i]) * vw[i * D + e];
      l += std::fabs(acc);
    }
    const double theta = Theta(a, v, kept);
    EXPECT_LE(l, theta * (1 + 1e-9));
    EXPECT_NEAR(theta, identity, 1e-9 * std::max(1.0, identity));
  }
}

TEST(CriticalKVTheoryTest, StageTwoMinimisesItsBoundGivenStageOne) {
  // T3.5 / I.1 through DecideLayer: one head, no protection, eps = 0.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  const int n = 14;
  const ResolvedPolicy policy = Resolve("criticalkv", {{"eps", ParamValue::Number(0)}});
  int checked = 0;
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<double> logits(n), a(n), v(n);
    for (auto& x : logits) x = 3.0 * normal(rng);  // peaked: stage-1 mass > 0.5 (A3.4)
    const double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (int i = 0; i < n; ++i) z += std::exp(logits[i] - mx);
    LayerScores layer;
    layer.num_heads = 1;
    layer.num_tokens = n;
    layer.budget.kept_per_head = 4 + static_cast<int64_t>(trial % 6);
    for (int i = 0; i < n; ++i) {
      a[i] = static_cast<float>(std::exp(logits[i] - mx) / z);
      v[i] = static_cast<float>(std::exp(normal(rng)));
      layer.scores.push_back(static_cast<float>(a[i]));
      layer.critical.push_back(static_cast<float>(a[i]) * static_cast<float>(v[i]));
    }
    for (int i = 0; i < n; ++i) {  // the oracle uses the float values the selector sees
      a[i] = layer.scores[i];
      v[i] = static_cast<float>(v[i]);
    }
    LayerDecision out;
    ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
    const std::set<int32_t> kept32 = List(out, 0);
    const std::set<int> kept(kept32.begin(), kept32.end());
    // b1 = round_half_up(0.5 * b) (specs README rule 6).
    const int64_t b = layer.budget.kept_per_head, b1 = (b + 1) / 2, b2 = b - b1;
    ASSERT_EQ(static_cast<int64_t>(kept.size()), b);
    // Stage 1: the top b1 by attention are kept.
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[x] > a[y]; });
    std::set<int> stage1(order.begin(), order.begin() + b1);
    double sigma = 0;
    for (int i : stage1) {
      ASSERT_TRUE(kept.count(i)) << "stage-1 token " << i << " dropped";
      sigma += a[i];
    }
    if (sigma <= 0.5) continue;  // A3.4 violated: the bound says nothing
    ++checked;
    const double c = std::inner_product(a.begin(), a.end(), v.begin(), 0.0);
    double c1 = 0;
    for (int i : stage1) c1 += a[i] * v[i];
    const double coef = 2.0 - 1.0 / sigma;
    auto theta_hat = [&](const std::set<int>& s2) {
      double sel = 0;
      for (int i : s2) sel += a[i] * v[i];
      return c - coef * c1 - coef * sel;
    };
    std::set<int> ours;
    for (int i : kept) {
      if (!stage1.count(i)) ours.insert(i);
    }
    // (a) theta(ours) <= theta_hat(ours).
    EXPECT_LE(Theta(a, v, kept), theta_hat(ours) + 1e-9);
    // (b) every other b2-subset of the remaining tokens has theta_hat >= ours (exhaustive).
    std::vector<int> rest;
    for (int i = 0; i < n; ++i) {
      if (!stage1.count(i)) rest.push_back(i);
    }
    const double best = theta_hat(ours);
    std::vector<bool> pick(rest.size(), false);
    std::fill(pick.begin(), pick.begin() + b2, true);
    do {
      std::set<int> other;
      for (size_t i = 0; i < rest.size(); ++i) {
        if (pick[i]) other.insert(rest[i]);
      }
      ASSERT_LE(best, theta_hat(other) + 1e-7);
    } while (std::prev_permutation(pick.begin(), pick.end()));
    // I.1: theta_hat <= the attention-only relaxation with M = min v.
    const double m_min = *std::min_element(v.begin(), v.end());
    double mass2 = 0;
    for (int i : ours) mass2 += a[i];
    EXPECT_LE(best, c - coef * c1 - m_min * coef * mass2 + 1e-9);
  }
  EXPECT_GT(checked, 60);
}

/// One head of 20 tokens keeping `budget` with the last 4 protected: the attention score
/// ranks the early prefix tokens first (20 - j), the critical score the late ones (j); the
/// window scores 0 in both. [1, 20] each.
LayerScores OppositeRankings(int64_t budget) {
  LayerScores layer;
  layer.num_heads = 1;
  layer.num_tokens = 20;
  layer.budget.kept_per_head = budget;
  layer.budget.protection = {0, 4};
  layer.budget.requested = {0, 4};
  for (int j = 0; j < 20; ++j) {
    layer.scores.push_back(j < 16 ? static_cast<float>(20 - j) : 0.0f);   // attention: early
    layer.critical.push_back(j < 16 ? static_cast<float>(j) : 0.0f);       // critical: late
  }
  return layer;
}

TEST(CriticalKVDecideTest, WindowKeptAndStagesCountInsideTheBudget) {
  // Protected window of 4, budget 10: 4 window + round(0.5 * 6) = 3 by attention + 3 by
  // critical score.
  const ResolvedPolicy policy = Resolve("criticalkv", {{"window", ParamValue::Number(4)}});
  const LayerScores layer = OppositeRankings(10);
  LayerDecision out;
  ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
  EXPECT_EQ(List(out, 0), (std::set<int32_t>{0, 1, 2, 13, 14, 15, 16, 17, 18, 19}));
}

TEST(CriticalKVDecideTest, StageOneTakesAlphaTimesBRoundedHalfUp) {
  // Window 4, budget 11: b = 7 and alpha * b = 3.5, so stage 1 keeps round(3.5) = 4 tokens by
  // attention (0..3) and stage 2 the other 3 by the critical score (13..15). The spec's floor
  // would give 0..2 and 12..15.
  const ResolvedPolicy policy = Resolve("criticalkv", {{"window", ParamValue::Number(4)}});
  LayerDecision out;
  ASSERT_TRUE(DecideLayer(policy, OppositeRankings(11), &out).ok());
  EXPECT_EQ(List(out, 0), (std::set<int32_t>{0, 1, 2, 3, 13, 14, 15, 16, 17, 18, 19}));
  // alpha = 0.25, b = 6: 1.5 rounds up to 2 (0, 1), then 4 by critical (12..15).
  const ResolvedPolicy quarter = Resolve(
      "criticalkv", {{"window", ParamValue::Number(4)}, {"alpha", ParamValue::Number(0.25)}});
  ASSERT_TRUE(DecideLayer(quarter, OppositeRankings(10), &out).ok());
  EXPECT_EQ(List(out, 0), (std::set<int32_t>{0, 1, 12, 13, 14, 15, 16, 17, 18, 19}));
}

// ------------------------------------ LaProx (§4) --------------------------------------

/// Scores of a two-layer LaProx problem (G = 1, kernel 1: p_i = ||X_i|| ||Y_i|| exactly).
std::vector<LayerScores> LaProxLayers(const ResolvedPolicy& policy, const RegisteredModel& model,
                                      int64_t n, int64_t k, std::vector<oracle::AttentionProblem>* pbs) {
  std::vector<LayerScores> layers;
  ThreadPool pool(1);
  for (int l = 0; l < model.layout.num_layers; ++l) {
    pbs->push_back(oracle::RandomProblem(100 + l, model.layout.num_kv_heads, 1, n,
                                         model.layout.head_dim, 6, 2.0));
    CpuLayer cpu = MakeLayer(pbs->back());
    cpu.layer_id = l;
    LayerScores s;
    s.layer_id = l;
    s.num_layers = model.layout.num_layers;
    s.num_heads = model.layout.num_kv_heads;
    s.num_tokens = n;
    s.budget.kept_per_head = k;
    s.budget.protection = {0, 6};
    s.budget.requested = {0, 6};
    s.scores.resize(s.num_heads * n);
    EXPECT_TRUE(ScoreLaProx(cpu, policy.params, model, pool, s.scores.data()).ok());
    layers.push_back(std::move(s));
  }
  return layers;
}

TEST(LaProxTheoryTest, LayerModeMinimisesTheDroppedTermBound) {
  // P5: U(S) = sum_{i not in S} p_i is minimal for LaProx's set among sets of the same size
  // (SnapKV-like, local-mode and random sets), and E(S) <= U(S).
  auto model = RandomModel({1, 3, 3, 8, 24, 11});
  const auto layer_mode = Resolve("laprox", {{"window", ParamValue::Number(6)},
                                             {"kernel", ParamValue::Number(1)},
                                             {"mode", ParamValue::Text("layer")}});
  const auto local_mode = Resolve("laprox", {{"window", ParamValue::Number(6)},
                                             {"kernel", ParamValue::Number(1)},
                                             {"mode", ParamValue::Text("local")}});
  std::vector<oracle::AttentionProblem> pbs;
  const int64_t n = 40, k = 16;
  auto layers = LaProxLayers(layer_mode, *model, n, k, &pbs);
  auto ours = DecideLaProx(layer_mode, layers);
  auto local = DecideLaProx(local_mode, layers);
  ASSERT_TRUE(ours.ok() && local.ok());
  const int64_t heads = 3, prefix = n - 6;
  auto dropped_bound = [&](const LayerDecision& d) {
    double u = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const auto kept = List(d, h);
      for (int64_t j = 0; j < prefix; ++j) {
        if (!kept.count(static_cast<int32_t>(j))) u += layers[0].scores[h * n + j];
      }
    }
    return u;
  };
  const double u_ours = dropped_bound((*ours)[0]);
  EXPECT_LE(u_ours, dropped_bound((*local)[0]) + 1e-6);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {  // random sets of the same total size
    std::vector<int64_t> cand(heads * prefix);
    std::iota(cand.begin(), cand.end(), 0);
    std::shuffle(cand.begin(), cand.end(), rng);
    double u = 0;
    for (size_t i = heads * (k - 6); i < cand.size(); ++i) {
      u += layers[0].scores[(cand[i] / prefix) * n + cand[i] % prefix];
    }
    EXPECT_LE(u_ours, u + 1e-6);
  }
  // E(S) <= U(S) with the dense X (attention columns) and Y (V W_O rows).
  const oracle::AttentionProblem& pb = pbs[0];
  const int64_t D = 24, d = 8;
  std::vector<double> err(6 * D, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    const std::vector<double> P = oracle::ProbMatrix(pb, h);
    const auto kept = List((*ours)[0], h);
    for (int64_t j = 0; j < prefix; ++j) {
      if (kept.count(static_cast<int32_t>(j))) continue;
      for (int64_t e = 0; e < D; ++e) {
        double y = 0;
        for (int64_t i = 0; i < d; ++i) y += pb.values[(h * n + j) * d + i] * model->w_o[0][e * heads * d + h * d + i];
        for (int64_t t = 0; t < 6; ++t) err[t * D + e] += P[t * n + j] * y;
      }
    }
  }
  double e2 = 0;
  for (double x : err) e2 += x * x;
  EXPECT_LE(std::sqrt(e2), u_ours * (1 + 1e-5));
}

TEST(LaProxTheoryTest, ModelModeIsScaleInvariantPerLayerAndConservesTheBudget) {
  // P6 and P7: scaling layer 1's W_O by 4 (exact in fp32) leaves the `model` selection
  // unchanged and moves budget toward layer 1 under `model_raw`.
  RandomModelOptions o = RandomModelLayout(2, 2, 2, 8, 16, 21);
  ModelInput in = RandomModelInput(o);
  auto base = BuildModel(in);
  RawTensor& w1 = in.tensors["layers.1.w_o"];
  auto* f = reinterpret_cast<float*>(w1.bytes.data());
  for (size_t i = 0; i < w1.bytes.size() / 4; ++i) f[i] *= 4.0f;
  auto scaled = BuildModel(in);
  ASSERT_TRUE(base.ok() && scaled.ok());
  const int64_t n = 30, k = 12;
  for (const char* mode : {"model", "model_raw"}) {
    const auto policy = Resolve("laprox", {{"window", ParamValue::Number(6)},
                                           {"mode", ParamValue::Text(mode)}});
    std::vector<oracle::AttentionProblem> pa, pb;
    auto a = DecideLaProx(policy, LaProxLayers(policy, **base, n, k, &pa));
    auto b = DecideLaProx(policy, LaProxLayers(policy, **scaled, n, k, &pb));
    ASSERT_TRUE(a.ok() && b.ok());
    int64_t total = 0, layer1_a = 0, layer1_b = 0;
    for (int l = 0; l < 2; ++l) {
      for (int32_t kept : (*a)[l].kept_per_head) total += kept;
      if (l == 1) {
        for (int32_t kept : (*a)[l].kept_per_head) layer1_a += kept;
        for (int32_t kept : (*b)[l].kept_per_head) layer1_b += kept;
      }
    }
    EXPECT_EQ(total, k * 2 * 2) << mode;  // P7
    if (std::string(mode) == "model") {
      for (int l = 0; l < 2; ++l) EXPECT_EQ((*a)[l].indices, (*b)[l].indices);
    } else {
      EXPECT_GT(layer1_b, layer1_a);
    }
  }
}

TEST(LaProxDecideTest, ATieGoesToTheLowerLayerThenHeadThenToken) {
  const auto policy = Resolve("laprox", {{"mode", ParamValue::Text("model_raw")}});
  std::vector<LayerScores> layers(2);
  for (int l = 0; l < 2; ++l) {
    layers[l].layer_id = l;
    layers[l].num_heads = 2;
    layers[l].num_tokens = 4;
    layers[l].budget.kept_per_head = 2;       // 1 protected + 1 evictable per head
    layers[l].budget.protection = {0, 1};
    layers[l].scores.assign(8, 1.0f);         // all tied
  }
  layers[1].budget.kept_per_head = 1;         // layer 1 adds nothing to the pool
  auto d = DecideLaProx(policy, layers);
  ASSERT_TRUE(d.ok());
  // Pool of 2 (layer 0) + 0 (layer 1) entries: ties go to layer 0, head 0 tokens 0 and 1.
  EXPECT_EQ(List((*d)[0], 0), (std::set<int32_t>{0, 1, 3}));
  EXPECT_EQ(List((*d)[0], 1), (std::set<int32_t>{3}));
  EXPECT_EQ(List((*d)[1], 0), (std::set<int32_t>{3}));
}

TEST(LaProxDecideTest, GlobalTopKMatchesAStableSortWithManyTies) {
  const auto policy = Resolve("laprox", {{"mode", ParamValue::Text("model_raw")}});
  std::mt19937 rng(5);
  std::vector<LayerScores> layers(3);
  std::vector<std::tuple<float, int, int, int>> all;  // (score, layer, head, token)
  for (int l = 0; l < 3; ++l) {
    layers[l].layer_id = l;
    layers[l].num_heads = 2;
    layers[l].num_tokens = 50;
    layers[l].budget.kept_per_head = 10 + l;
    for (int i = 0; i < 100; ++i) {
      const float v = static_cast<float>(rng() % 7) * 0.25f + (rng() % 5 == 0 ? 1e30f : 0.0f);
      layers[l].scores.push_back(v);
      all.emplace_back(v, l, i / 50, i % 50);
    }
  }
  auto d = DecideLaProx(policy, layers);
  ASSERT_TRUE(d.ok());
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::set<std::tuple<int, int, int>> want;
  for (int i = 0; i < 2 * (10 + 11 + 12); ++i) {
    want.emplace(std::get<1>(all[i]), std::get<2>(all[i]), std::get<3>(all[i]));
  }
  std::set<std::tuple<int, int, int>> got;
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int32_t j : List((*d)[l], h)) got.emplace(l, h, j);
    }
  }
  EXPECT_EQ(got, want);
}

// ------------------------------------ LU-KV (§5.3) -------------------------------------

TEST(LukvBudgetTest, NearestRowLargestRemainderAndClamp) {
  LukvProfile p;
  p.prune_ratios.assign(99 * 1 * 3, 0.0f);
  // Row 79 (sigma = 0.80): ratios 0.7, 0.8, 0.9 -> ideal (n = 10) 3, 2, 1 (+ fractions).
  p.prune_ratios[79 * 3 + 0] = 0.65f;  // ideal 3.5
  p.prune_ratios[79 * 3 + 1] = 0.75f;  // ideal 2.5
  p.prune_ratios[79 * 3 + 2] = 0.99f;  // ideal 0.1 -> clamped to 1
  const auto counts = LukvHeadBudgets(p, 1, 3, 0, 10, 0.8, false);
  // floor: 3, 2, 0 (sum 5); target round(6.1) = 6: one extra to the largest fraction (head 0,
  // tie with head 1 at .5 broken to the lower head); then head 2 clamped up to 1.
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 2, 1}));
  EXPECT_DOUBLE_EQ(LukvEvictedRatio({true, 0.2, 0}, 10), 0.8);
  EXPECT_DOUBLE_EQ(LukvEvictedRatio({false, 1.0, 5}, 20), 0.75);
}

TEST(LukvBudgetTest, InterpolationConservesTheLayerTotal) {
  auto model = RandomModel([] {
    RandomModelOptions o = RandomModelLayout(3, 4, 4, 8, 16, 5);
    o.profile_metric = "snapkv";
    return o;
  }());
  const LukvProfile& p = *model->FindProfile("snapkv");
  for (double sigma : {0.05, 0.333, 0.5, 0.8, 0.97}) {
    for (bool interp : {false, true}) {
      for (int64_t l = 0; l < 3; ++l) {
        const auto counts = LukvHeadBudgets(p, 3, 4, l, 1000, sigma, interp);
        double ideal = 0;
        if (interp) {
          const double x = 100 * sigma - 1;
          const int64_t lo = static_cast<int64_t>(std::floor(x));
          const double t = x - lo;
          for (int h = 0; h < 4; ++h) {
            ideal += (1 - ((1 - t) * p.ratio(lo, l, h, 3, 4) + t * p.ratio(lo + 1, l, h, 3, 4))) * 1000;
          }
        } else {
          const int64_t row = RoundHalfUp(100 * sigma) - 1;
          for (int h = 0; h < 4; ++h) ideal += (1 - p.ratio(row, l, h, 3, 4)) * 1000;
        }
        EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), RoundHalfUp(ideal));
      }
    }
  }
}

TEST(LukvDecideTest, ProtectionIsClampedPerHeadInsideEachHeadsBudget) {
  RandomModelOptions o = RandomModelLayout(1, 2, 2, 8, 16, 5);
  o.profile_metric = "snapkv";
  o.profile_window = 4;
  auto model = RandomModel(o);
  ResolvedPolicy policy = Resolve("lukv", {{"window", ParamValue::Number(4)}});
  policy.model = model;
  LayerScores layer;
  layer.num_heads = 2;
  layer.num_tokens = 100;
  layer.budget.kept_per_head = 20;
  layer.budget.requested = {0, 4};
  layer.budget.protection = {0, 4};
  policy.settings.budget = {true, 0.2, 0};
  for (int i = 0; i < 200; ++i) layer.scores.push_back(static_cast<float>((i * 37) % 101));
  LayerDecision out;
  ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
  const auto counts = LukvHeadBudgets(*model->FindProfile("snapkv"), 1, 2, 0, 100, 0.8, false);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(out.kept_per_head[h], counts[h]);
    const auto kept = List(out, h);
    for (int j = 96; j < 100; ++j) {
      if (counts[h] >= 4) {
        EXPECT_TRUE(kept.count(j)) << "head " << h << " window token " << j;
      }
    }
  }
}

// --------------------------------- Output shapes ---------------------------------------

TEST(OutputShapeTest, BlockAlignedKeepsWholeBlocksRankedByTheirBestToken) {
  ResolvedPolicy policy = Resolve("knorm", {}, OutputShape::kBlockAligned);
  policy.settings.block_size = 4;
  LayerScores layer;
  layer.num_heads = 2;
  layer.num_tokens = 10;  // blocks [0,4) [4,8) [8,10)
  layer.budget.kept_per_head = 5;  // round(5/4) = 1 block
  layer.scores = {0, 0, 0, 0, 0, 9, 0, 0, 0, 0,    // head 0 prefers block 1
                  0, 0, 0, 0, 0, 0, 0, 0, 0, 8};   // head 1 prefers block 2
  LayerDecision out;
  ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
  EXPECT_EQ(out.offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(out.indices, (std::vector<int32_t>{4, 5, 6, 7}));
  layer.budget.kept_per_head = 7;  // round(7/4) = 2 blocks: head 0's best, then head 1's
  ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
  EXPECT_EQ(out.indices, (std::vector<int32_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(out.output_shape, OutputShape::kBlockAligned);
}

TEST(OutputShapeTest, EqualCountReplacesARaggedAllocation) {
  const ResolvedPolicy policy = Resolve("adakv", {}, OutputShape::kEqualCount);
  LayerScores layer;
  layer.num_heads = 2;
  layer.num_tokens = 10;
  layer.budget.kept_per_head = 3;
  layer.scores = {9, 9, 9, 9, 9, 9, 0, 0, 0, 0,   // AdaKV would give head 0 more
                  1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  LayerDecision out;
  ASSERT_TRUE(DecideLayer(policy, layer, &out).ok());
  EXPECT_EQ(out.kept_per_head, (std::vector<int32_t>{3, 3}));
}

}  // namespace
}  // namespace kvtrim

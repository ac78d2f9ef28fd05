// max_perturbation budgets on the GPU backend against the CPU backend (skips without a GPU).
//  * Exact numerics: the same k per head, unless the CPU's search evaluated a statistic
//    within 1e-9 relative (+ 1e-12) of epsilon (the fp64 statistics of the two backends agree
//    that far, docs/gpu.md "Parity rule"); equal k gives identical lists and statistics within
//    that bound.
//  * Fast numerics: the GPU's answer is consistent on its own (each head's list is the GPU's
//    keep_tokens = k list, its statistic <= epsilon unless capped), its statistics are within
//    the fast bound of the fp64 statistic of the same lists (docs/numerics.md), its lists are
//    within the fast band of the exact ranking at the GPU's counts (the tolerance rule), and
//    its k equals the CPU's fast k unless the CPU's search evaluated a statistic within twice
//    the fast bound of epsilon.
// Odd sizes n in {7, 99, 1000}, f32 and bf16, H_kv = 3, G = 4, d = 64, w = min(32, n).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/perturbation.h"
#include "kernels/decide/protection.h"
#include "base/dtype.h"
#include "kernels/engine.h"
#include "kernels/gpu/runtime/gpu_backend.h"
#include "kernels/decide/perturbation_budget.h"
#include "tests/gpu/parity_rule.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/shared_backends.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int64_t kHeads = 3, kGroup = 4, kDim = 64;
constexpr double kCap = 0.6;

/// One case: policy, numerics, dtype, n.
struct BudgetCase {
  std::string policy;
  Numerics numerics = Numerics::kExact;
  DType dtype = DType::kF32;
  int64_t n = 0;
  int64_t window() const { return std::min<int64_t>(32, n); }
  std::string Describe() const {
    return absl::StrCat("policy=", policy, " numerics=",
                        numerics == Numerics::kFast ? "fast" : "exact",
                        " dtype=", DTypeName(dtype), " n=", n);
  }
};

/// Host tensors of one case in its dtype, and the request viewing them.
struct CaseLayer {
  std::vector<uint8_t> k, v, q;
  LayerRequest request;
};

std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = FloatToBf16(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

/// Pseudo-normal K / V / Q from a counter hash (queries x1.5: somewhat peaked attention).
void Generate(const BudgetCase& c, CaseLayer* layer) {
  auto normal = [](uint64_t stream, uint64_t i) {
    uint64_t x = stream * 0xD1B54A32D192ED03ull ^ i;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    float sum = 0;
    for (int k = 0; k < 4; ++k) sum += static_cast<float>((x >> (16 * k)) & 0xFFFF) / 65536.0f;
    return (sum - 2.0f) * 1.7320508f;
  };
  const int64_t w = c.window();
  std::vector<float> k(static_cast<size_t>(kHeads * c.n * kDim)), v(k.size());
  std::vector<float> q(static_cast<size_t>(kHeads * kGroup * w * kDim));
  const uint64_t base = static_cast<uint64_t>(c.n) * 7919;
  for (size_t i = 0; i < k.size(); ++i) k[i] = normal(base, i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = normal(base + 1, i);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 1.5f * normal(base + 2, i);
  layer->k = Encode(k, c.dtype);
  layer->v = Encode(v, c.dtype);
  layer->q = Encode(q, c.dtype);
  layer->request.layer_id = 0;
  layer->request.keys = {layer->k.data(), c.dtype, {kHeads, c.n, kDim}};
  layer->request.values = {layer->v.data(), c.dtype, {kHeads, c.n, kDim}};
  layer->request.queries = {layer->q.data(), c.dtype, {kHeads * kGroup, w, kDim}};
}

/// Forwards to another probe and records every evaluation's values [H].
class RecordingProbe final : public PerturbationProbe {
 public:
  RecordingProbe(PerturbationProbe& inner, std::vector<std::vector<double>>* seen)
      : inner_(inner), seen_(seen) {}
  absl::Status Evaluate(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        std::vector<double>* out) override {
    absl::Status status = inner_.Evaluate(offsets, indices, out);
    seen_->push_back(*out);
    return status;
  }

 private:
  PerturbationProbe& inner_;
  std::vector<std::vector<double>>* seen_;
};

CompressionSettings Settings(const BudgetCase& c, double epsilon) {
  CompressionSettings s;
  s.policy = c.policy;
  s.numerics = c.numerics;
  s.budget = Budget{true, kCap, 0, true, epsilon};
  return s;
}

std::vector<int32_t> Head(const LayerDecision& d, int64_t h) {
  return std::vector<int32_t>(d.indices.begin() + d.offsets[h],
                              d.indices.begin() + d.offsets[h + 1]);
}

/// True when some statistic the CPU's search evaluated for head h lies within `band(e)` of
/// epsilon: there the two backends may decide that comparison differently.
bool NearEpsilon(const std::vector<std::vector<double>>& seen, int64_t h, double epsilon,
                 const std::function<double(double)>& band) {
  for (const auto& values : seen) {
    if (std::abs(values[h] - epsilon) <= band(values[h])) return true;
  }
  return false;
}

class PerturbationBudgetGpuTest : public ::testing::TestWithParam<BudgetCase> {};

TEST_P(PerturbationBudgetGpuTest, GpuMatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const BudgetCase& c = GetParam();
  CaseLayer layer;
  Generate(c, &layer);
  CpuBackend& cpu = SharedCpu(/*large=*/false, 1);
  PolicyEngine cpu_engine(BuiltinRegistry(), cpu);
  PolicyEngine gpu_engine(BuiltinRegistry(), SharedGpu());
  const int64_t cap = KeptCount(Budget{true, kCap, 0}, c.n);

  // Epsilons from the CPU's own statistics at half the cap: a spread of searched heads.
  CompressionSettings half = Settings(c, 0);
  half.budget = Budget{false, 0, std::max<int64_t>(1, cap / 2)};
  auto half_policy = PrepareForRows(cpu_engine, half, c.window());
  ASSERT_TRUE(half_policy.ok()) << half_policy.status();
  auto half_decision = cpu_engine.CompressLayer(*half_policy, layer.request, "layers[0]");
  ASSERT_TRUE(half_decision.ok()) << half_decision.status();
  std::vector<double> epsilons = {0.0, 1e9};
  for (double e : half_decision->perturbation) epsilons.push_back(e);

  int differing = 0, heads_seen = 0;
  for (double epsilon : epsilons) {
    SCOPED_TRACE(absl::StrCat(c.Describe(), " epsilon=", epsilon));
    auto gpu_policy = PrepareForRows(gpu_engine, Settings(c, epsilon), c.window());
    ASSERT_TRUE(gpu_policy.ok()) << gpu_policy.status();
    auto on_gpu = gpu_engine.CompressLayer(*gpu_policy, layer.request, "layers[0]");
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
    // A scorer without GPU fast kernels for this dtype computes exact: so does the reference.
    const bool fast = on_gpu->numerics == Numerics::kFast;
    CompressionSettings cpu_settings = Settings(c, epsilon);
    cpu_settings.numerics = on_gpu->numerics;
    auto policy = PrepareForRows(cpu_engine, cpu_settings, c.window());
    ASSERT_TRUE(policy.ok()) << policy.status();
    // The CPU's answer, with the statistics its search evaluated.
    auto validated = cpu_engine.Validate(*policy, layer.request, "layers[0]");
    ASSERT_TRUE(validated.ok()) << validated.status();
    std::vector<std::vector<double>> seen;
    const PerturbationSearch search = [&](const LayerScores& scores, PerturbationProbe& probe,
                                          LayerDecision* out) {
      RecordingProbe recording(probe, &seen);
      return DecidePerturbationBudget(*policy, scores, recording, out);
    };
    LayerDecision on_cpu;
    ASSERT_TRUE(cpu.CompressByPerturbation(*policy, *validated, BudgetFor(*policy, c.n), search,
                                           &on_cpu)
                    .ok());
    EXPECT_EQ(on_gpu->numerics, on_cpu.numerics);
    EXPECT_EQ(on_gpu->perturbation_rows, on_cpu.perturbation_rows);
    ASSERT_EQ(on_gpu->kept_per_head.size(), static_cast<size_t>(kHeads));

    // The fp64 statistic of the GPU's lists (fast: the bound's reference).
    LayerDecision exact_of_gpu = *on_gpu;
    cpu.ExactPerturbation(*validated, &exact_of_gpu);
    for (int64_t h = 0; h < kHeads; ++h) {
      ++heads_seen;
      const int64_t k_gpu = on_gpu->kept_per_head[h], k_cpu = on_cpu.kept_per_head[h];
      const double e_gpu = on_gpu->perturbation[h];
      EXPECT_LE(k_gpu, cap) << "head " << h;
      if (k_gpu < cap) EXPECT_LE(e_gpu, epsilon) << "head " << h;
      if (!fast) {
        if (k_gpu != k_cpu) {
          ++differing;
          EXPECT_TRUE(NearEpsilon(seen, h, epsilon,
                                  [](double e) { return 1e-9 * std::abs(e) + 1e-12; }))
              << "head " << h << ": k gpu " << k_gpu << " cpu " << k_cpu;
          continue;
        }
        EXPECT_EQ(Head(*on_gpu, h), Head(on_cpu, h)) << "head " << h;
        EXPECT_NEAR(e_gpu, on_cpu.perturbation[h],
                    1e-9 * std::abs(on_cpu.perturbation[h]) + 1e-12)
            << "head " << h;
        continue;
      }
      const double exact = exact_of_gpu.perturbation[h];
      EXPECT_NEAR(e_gpu, exact, kFastPerturbationRel * std::abs(exact) + kFastPerturbationAbs)
          << "head " << h;
      if (k_gpu != k_cpu) {
        ++differing;
        EXPECT_TRUE(NearEpsilon(seen, h, epsilon, [](double e) {
          return 2 * (kFastPerturbationRel * std::abs(e) + kFastPerturbationAbs);
        })) << "head " << h << ": k gpu " << k_gpu << " cpu " << k_cpu;
      }
    }

    if (fast) {
      // Each GPU list is the GPU's keep_tokens = k list of its head.
      std::map<int64_t, LayerDecision> by_count;
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t k = on_gpu->kept_per_head[h];
        if (by_count.count(k) == 0) {
          CompressionSettings fixed = Settings(c, 0);
          fixed.numerics = on_gpu->numerics;
          fixed.budget = Budget{false, 0, k};
          auto fixed_policy = PrepareForRows(gpu_engine, fixed, c.window());
          ASSERT_TRUE(fixed_policy.ok()) << fixed_policy.status();
          auto d = gpu_engine.CompressLayer(*fixed_policy, layer.request, "layers[0]");
          ASSERT_TRUE(d.ok()) << d.status();
          by_count[k] = *d;
        }
        EXPECT_EQ(Head(*on_gpu, h), Head(by_count[k], h)) << "head " << h << " k " << k;
      }
      // The tolerance rule: the GPU's lists against the exact ranking at the GPU's counts.
      CompressionSettings exact_settings = Settings(c, epsilon);
      exact_settings.numerics = Numerics::kExact;
      auto exact_policy = PrepareForRows(cpu_engine, exact_settings, c.window());
      ASSERT_TRUE(exact_policy.ok());
      LayerScores exact_scores;
      exact_scores.num_heads = kHeads;
      exact_scores.num_tokens = c.n;
      exact_scores.budget = BudgetFor(*exact_policy, c.n);
      auto exact_validated = cpu_engine.Validate(*exact_policy, layer.request, "layers[0]");
      ASSERT_TRUE(exact_validated.ok());
      ASSERT_TRUE(cpu.ScoreLayer(*exact_policy, *exact_validated, exact_scores.budget,
                                 &exact_scores)
                      .ok());
      LayerDecision reference = *on_gpu;
      const std::vector<int32_t> ranking = RankHeads(exact_scores, cap);
      std::vector<int64_t> counts(on_gpu->kept_per_head.begin(), on_gpu->kept_per_head.end());
      PrefixLists(ranking, cap, counts, &reference.offsets, &reference.indices);
      std::vector<float> protected_scores = exact_scores.scores;
      ApplyProtection(exact_scores.budget.protection, kHeads, c.n, protected_scores.data());
      CaseSpec spec{c.policy, OutputShape::kPerHead, c.dtype, kHeads, c.n, kDim, kGroup,
                    c.window()};
      ToleranceBand band;
      band.tau = FastTau(*exact_policy, c.dtype);
      const Outcome outcome = CompareDecisions(
          spec, *exact_policy, reference, *on_gpu,
          [&] {
            CpuScores s;
            s.scores = protected_scores;
            s.scale = HeadScales(exact_scores.scores, kHeads, c.n);
            return s;
          },
          /*exact_required=*/false, band);
      EXPECT_TRUE(outcome.failure.empty()) << outcome.failure;
    }
  }
  std::printf("[ budget   ] %s: %d of %d heads chose another k than the CPU (near epsilon)\n",
              c.Describe().c_str(), differing, heads_seen);
}

std::vector<BudgetCase> Cases() {
  std::vector<BudgetCase> cases;
  for (const char* policy : {"dropkv", "snapkv", "knorm", "tova"}) {
    for (Numerics numerics : {Numerics::kExact, Numerics::kFast}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (int64_t n : {7, 99, 1000}) cases.push_back({policy, numerics, dtype, n});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, PerturbationBudgetGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<BudgetCase>& info) {
                           const BudgetCase& c = info.param;
                           return absl::StrCat(
                               c.policy, "_", c.numerics == Numerics::kFast ? "fast" : "exact",
                               "_", DTypeName(c.dtype), "_n", c.n);
                         });

}  // namespace
}  // namespace kvtrim::gpu::testing

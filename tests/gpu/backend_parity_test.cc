// GPU vs CPU parity through PolicyEngine (design.md convention 10): every preset of
// RegisterBuiltinPolicies, a few SCORER+ALLOCATOR compositions and the shared output shape,
// in f32 / f16 / bf16, at odd sizes n in {1, 7, 99, 1000, 40000}, d in {64, 128},
// G in {1, 4, 8}, H_kv = 3, w = min(32, n) (window parameters lowered to w when n is small).
//
// Rule (docs/gpu.md, "Parity rule"):
//  * f32: offsets and kept indices are EQUAL, list for list.
//  * f16 / bf16: inputs convert to fp32 exactly on both backends, but the GPU may sum in
//    another order (tensor cores). A kept list may differ from the CPU's only in tokens
//    whose CPU score lies within 4 * eps_dtype * |b| of the list's boundary score b, where
//    eps_dtype is the dtype's machine epsilon (bf16 2^-7, f16 2^-10) and b is
//      per head (uniform, pyramid): the lowest CPU score the CPU kept in that head;
//      adakv: that, or the layer's extra-pool threshold (the lowest CPU score the CPU kept
//             beyond a head's safeguard) -- head counts may then move between heads;
//      shared: in some head, the score of that head's token at the round-robin's last rank
//             (or the one before).
//    Per-head counts must be equal except under adakv. Protected (+inf) tokens never
//    differ (the rule's comparison is false for infinities).
//  * Perturbation: |gpu - cpu| <= 1e-9 * |cpu| + 1e-12 for every head whose kept list is
//    identical on both backends (always, in f32).
// A failure prints policy, dtype, n, d, G, head and the first differing position.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/select.h"
#include "kernels/dtype.h"
#include "kernels/engine.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/registry.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

constexpr int64_t kKvHeads = 3;     // H_kv (odd on purpose)
constexpr int64_t kMaxWindow = 32;  // w when n allows
constexpr int32_t kLayerId = 1;
constexpr int32_t kNumLayers = 4;
constexpr double kKeepFraction = 0.3;
constexpr uint64_t kSeed = 11;
constexpr int64_t kLargeN = 40000;  // above this, V/Q only when the policy needs them

/// One policy under test: a preset or composition, and the output shape.
struct PolicyCase {
  std::string policy;
  OutputShape shape = OutputShape::kPerHead;
  /// Test-name fragment: "dropkv", "dropkv_adakv", "snapkv_shared".
  std::string label() const {
    std::string out = absl::StrReplaceAll(policy, {{"+", "_"}});
    if (shape == OutputShape::kShared) out += "_shared";
    return out;
  }
};

/// One parameterised test: a policy at one n; d, G and dtype are looped inside.
struct ParityParam {
  PolicyCase policy;
  int64_t n = 0;
};

const PolicyRegistry& Registry() {
  static const PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
    RegisterBuiltinPolicies(r);
    return r;
  }();
  return *registry;
}

std::vector<PolicyCase> PolicyCases() {
  std::vector<PolicyCase> cases;
  for (const PolicyPreset& preset : Registry().presets()) cases.push_back({preset.name});
  for (const char* composition :
       {"dropkv+adakv", "dropkv+pyramid", "knorm+pyramid", "h2o+adakv", "keydiff+adakv",
        "tova+pyramid", "random+adakv"}) {
    cases.push_back({composition});
  }
  for (const char* shared : {"snapkv", "dropkv", "adakv", "knorm", "h2o"}) {
    cases.push_back({shared, OutputShape::kShared});
  }
  return cases;
}

std::vector<ParityParam> AllParams() {
  std::vector<ParityParam> params;
  for (const PolicyCase& policy : PolicyCases()) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{99}, int64_t{1000}, kLargeN}) {
      params.push_back({policy, n});
    }
  }
  return params;
}

/// The shape and dtype of one comparison.
struct CaseSpec {
  PolicyCase policy;
  DType dtype = DType::kF32;
  int64_t n = 0;
  int64_t d = 0;
  int64_t group = 0;
  int64_t window = 0;  // w

  std::string Describe() const {
    return absl::StrCat("policy=", policy.policy,
                        policy.shape == OutputShape::kShared ? " (shared)" : "",
                        " dtype=", DTypeName(dtype), " n=", n, " d=", d, " G=", group,
                        " H_kv=", kKvHeads, " w=", window);
  }
};

/// Host tensors of one layer encoded in the case's dtype.
struct LayerData {
  std::vector<uint8_t> keys, values, queries;
};

/// Encodes fp32 values in `dtype`.
std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits =
          dtype == DType::kBF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

/// Random normal K/V/Q with exact duplicates (every 17th token from token 8 on copies the
/// key and value of the token 5 before it), so that scores tie and rule 1 is exercised.
LayerData MakeData(const CaseSpec& c) {
  std::mt19937_64 rng(static_cast<uint64_t>(c.n * 1000003 + c.d * 101 + c.group * 7 +
                                            static_cast<int>(c.dtype)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t heads_q = kKvHeads * c.group;
  std::vector<float> k(static_cast<size_t>(kKvHeads * c.n * c.d));
  std::vector<float> v(k.size());
  std::vector<float> q(static_cast<size_t>(heads_q * c.window * c.d));
  for (auto& x : k) x = normal(rng);
  for (auto& x : v) x = normal(rng);
  for (auto& x : q) x = 1.5f * normal(rng);  // somewhat peaked attention
  for (int64_t h = 0; h < kKvHeads; ++h) {
    for (int64_t j = 8; j < c.n; j += 17) {
      const size_t dst = static_cast<size_t>((h * c.n + j) * c.d);
      const size_t src = static_cast<size_t>((h * c.n + j - 5) * c.d);
      std::copy_n(k.begin() + src, c.d, k.begin() + dst);
      std::copy_n(v.begin() + src, c.d, v.begin() + dst);
    }
  }
  return {Encode(k, c.dtype), Encode(v, c.dtype), Encode(q, c.dtype)};
}

/// Machine epsilon of the input dtype (the resolution of the parity rule).
double DTypeEpsilon(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return std::ldexp(1.0, -7);
    case DType::kF16: return std::ldexp(1.0, -10);
    case DType::kF32: return 0.0;
  }
  return 0.0;
}

/// True when CPU score `s` lies within 4 * eps * |b| of boundary `b` (both finite).
bool NearBoundary(double s, double b, double eps) {
  return std::isfinite(s) && std::isfinite(b) && std::fabs(s - b) <= 4.0 * eps * std::fabs(b);
}

/// The tokens of a and b (ascending lists) that are in exactly one of them.
std::vector<int32_t> SymmetricDifference(const std::vector<int32_t>& a,
                                         const std::vector<int32_t>& b) {
  std::vector<int32_t> out;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

/// First position where two lists differ, as text.
std::string FirstDifference(const std::vector<int32_t>& cpu, const std::vector<int32_t>& gpu) {
  const size_t m = std::min(cpu.size(), gpu.size());
  for (size_t i = 0; i < m; ++i) {
    if (cpu[i] != gpu[i]) {
      return absl::StrCat("first differing index at position ", i, ": cpu=", cpu[i],
                          " gpu=", gpu[i], " (cpu kept ", cpu.size(), ", gpu kept ",
                          gpu.size(), ")");
    }
  }
  return absl::StrCat("lists agree on the first ", m, " positions; cpu kept ", cpu.size(),
                      ", gpu kept ", gpu.size());
}

/// Kept list `l` of a decision.
std::vector<int32_t> List(const LayerDecision& d, size_t l) {
  return std::vector<int32_t>(d.indices.begin() + d.offsets[l], d.indices.begin() + d.offsets[l + 1]);
}

/// What one comparison found.
struct Outcome {
  bool exact = true;      // indices identical
  std::string failure;    // empty when the rule holds
};

/// Everything the low-precision rule needs from the CPU: the layer's scores after
/// protection [H_kv, n] and the AdaKV safeguard.
struct CpuScores {
  std::vector<float> scores;
  int64_t safeguard = 0;
};

/// Applies the parity rule to one case.
Outcome Compare(const CaseSpec& c, const ResolvedPolicy& policy, const LayerDecision& cpu,
                const LayerDecision& gpu, const std::function<CpuScores()>& cpu_scores) {
  Outcome out;
  const std::string where = c.Describe();
  if (cpu.output_shape != gpu.output_shape || cpu.offsets.size() != gpu.offsets.size() ||
      (cpu.kept_per_head != gpu.kept_per_head && c.dtype == DType::kF32)) {
    out.exact = false;
    out.failure = absl::StrCat(where, ": output shape, list count or kept_per_head differ (cpu ",
                               cpu.offsets.size() - 1, " lists, gpu ", gpu.offsets.size() - 1, ")");
    return out;
  }
  const size_t lists = cpu.offsets.size() - 1;
  const bool shared = cpu.output_shape == OutputShape::kShared;
  const bool adakv = !shared && policy.allocator->name == "adakv";
  std::vector<bool> same(lists, true);
  std::vector<size_t> differing;
  for (size_t l = 0; l < lists; ++l) {
    if (List(cpu, l) != List(gpu, l)) {
      same[l] = false;
      differing.push_back(l);
    }
  }
  if (!differing.empty()) {
    out.exact = false;
    const size_t l = differing.front();
    if (c.dtype == DType::kF32) {
      out.failure = absl::StrCat(where, " head=", shared ? std::string("shared") : absl::StrCat(l),
                                 ": fp32 indices must be equal; ",
                                 FirstDifference(List(cpu, l), List(gpu, l)));
      return out;
    }
    // Low precision: every differing token must sit at its list's boundary.
    const double eps = DTypeEpsilon(c.dtype);
    const CpuScores s = cpu_scores();
    const int64_t n = c.n;
    auto score = [&](int64_t h, int64_t j) { return static_cast<double>(s.scores[h * n + j]); };
    std::vector<std::vector<int32_t>> rankings(kKvHeads);
    for (int64_t h = 0; h < kKvHeads; ++h) RankTokens(s.scores.data() + h * n, n, &rankings[h]);
    double pool_threshold = std::numeric_limits<double>::infinity();  // adakv extra pool
    if (adakv) {
      for (int64_t h = 0; h < kKvHeads; ++h) {
        const int64_t kept = cpu.offsets[h + 1] - cpu.offsets[h];
        if (kept > s.safeguard) pool_threshold = std::min(pool_threshold, score(h, rankings[h][kept - 1]));
      }
    }
    int64_t last_rank = 0;  // shared: the deepest rank the CPU's round robin reached
    if (shared) {
      std::vector<char> taken(static_cast<size_t>(n), 0);
      int64_t chosen = 0;
      const int64_t count = cpu.offsets[1];
      for (int64_t r = 0; r < n && chosen < count; ++r) {
        for (int64_t h = 0; h < kKvHeads && chosen < count; ++h) {
          const int32_t t = rankings[h][r];
          if (!taken[t]) {
            taken[t] = 1;
            ++chosen;
            last_rank = r;
          }
        }
      }
    }
    for (size_t l : differing) {
      const std::vector<int32_t> cl = List(cpu, l);
      const std::vector<int32_t> gl = List(gpu, l);
      if (!adakv && cl.size() != gl.size()) {
        out.failure = absl::StrCat(where, " head=", l, ": kept counts differ; ", FirstDifference(cl, gl));
        return out;
      }
      for (int32_t j : SymmetricDifference(cl, gl)) {
        bool ok = false;
        std::string boundary;
        if (shared) {
          for (int64_t h = 0; h < kKvHeads && !ok; ++h) {
            for (int64_t r : {last_rank, std::max<int64_t>(0, last_rank - 1)}) {
              ok = ok || NearBoundary(score(h, j), score(h, rankings[h][r]), eps);
            }
          }
          boundary = absl::StrCat("round-robin rank ", last_rank);
        } else {
          const int64_t h = static_cast<int64_t>(l);
          double b = std::numeric_limits<double>::infinity();
          for (int32_t t : cl) b = std::min(b, score(h, t));
          ok = NearBoundary(score(h, j), b, eps) || (adakv && NearBoundary(score(h, j), pool_threshold, eps));
          boundary = absl::StrCat("boundary ", b, adakv ? absl::StrCat(", pool threshold ", pool_threshold) : "");
        }
        if (!ok) {
          out.failure = absl::StrCat(
              where, " head=", shared ? std::string("shared") : absl::StrCat(l), ": token ", j,
              " is kept by only one backend but its CPU score ",
              shared ? score(0, j) : score(static_cast<int64_t>(l), j),
              " is not within 4*eps_", DTypeName(c.dtype), " of the ", boundary, "; ",
              FirstDifference(cl, gl));
          return out;
        }
      }
    }
  }
  // Perturbation statistic.
  if (cpu.perturbation.size() != gpu.perturbation.size()) {
    out.failure = absl::StrCat(where, ": perturbation has ", gpu.perturbation.size(),
                               " entries on the GPU, ", cpu.perturbation.size(), " on the CPU");
    return out;
  }
  for (size_t h = 0; h < cpu.perturbation.size(); ++h) {
    if (!same[shared ? 0 : h]) continue;
    const double a = cpu.perturbation[h];
    const double b = gpu.perturbation[h];
    if (!(std::fabs(a - b) <= 1e-9 * std::fabs(a) + 1e-12)) {
      out.failure = absl::StrCat(where, " head=", h, ": perturbation cpu=", a, " gpu=", b,
                                 " differs by more than 1e-9 relative");
      return out;
    }
  }
  return out;
}

/// The GPU backend shared by every test of this binary (created on first use).
GpuBackend& SharedGpu() {
  static GpuBackend* backend = [] {
    GpuBackendOptions options;
    options.workers = 8;
    auto created = GpuBackend::Create(options);
    if (!created.ok()) {
      ADD_FAILURE() << "GpuBackend::Create: " << created.status();
      std::abort();
    }
    return created->release();
  }();
  return *backend;
}

CpuBackend& SharedCpu() {
  static CpuBackend* backend = new CpuBackend(1);  // one thread per case; cases run in parallel
  return *backend;
}

/// Runs one case on both backends and applies the rule. Thread-safe.
Outcome RunCase(const CaseSpec& c) {
  const PolicyRegistry& registry = Registry();
  PolicyEngine cpu_engine(registry, SharedCpu());
  PolicyEngine gpu_engine(registry, SharedGpu());
  CompressionSettings settings;
  settings.policy = c.policy.policy;
  settings.output_shape = c.policy.shape;
  settings.budget.by_fraction = true;
  settings.budget.keep_fraction = kKeepFraction;
  settings.num_layers = kNumLayers;
  settings.seed = kSeed;
  // Lower window parameters to the rows sent.
  {
    auto probe = registry.Resolve(settings, "settings");
    if (!probe.ok()) return {false, absl::StrCat(c.Describe(), ": ", probe.status().ToString())};
    if (probe->params.Has("window") && probe->params.Int("window") > c.window) {
      settings.params["window"] = ParamValue::Number(static_cast<double>(c.window));
    }
  }
  auto policy = cpu_engine.Prepare(settings, "settings");
  if (!policy.ok()) return {false, absl::StrCat(c.Describe(), ": Prepare: ", policy.status().ToString())};

  const LayerData data = MakeData(c);
  const uint32_t needs = policy->scorer->required_inputs;
  const bool large = c.n >= kLargeN;
  LayerRequest layer;
  layer.layer_id = kLayerId;
  layer.keys = {data.keys.data(), c.dtype, {kKvHeads, c.n, c.d}};
  if (!large || (needs & kInputValues)) layer.values = {data.values.data(), c.dtype, {kKvHeads, c.n, c.d}};
  if (!large || (needs & kInputQueries)) {
    layer.queries = {data.queries.data(), c.dtype, {kKvHeads * c.group, c.window, c.d}};
  }
  auto cpu = cpu_engine.CompressLayer(*policy, layer, "layer");
  if (!cpu.ok()) return {false, absl::StrCat(c.Describe(), ": CPU: ", cpu.status().ToString())};
  auto gpu = gpu_engine.CompressLayer(*policy, layer, "layer");
  if (!gpu.ok()) return {false, absl::StrCat(c.Describe(), ": GPU: ", gpu.status().ToString())};

  auto cpu_scores = [&]() {
    CpuScores s;
    auto validated = cpu_engine.Validate(*policy, layer, "layer");
    if (!validated.ok()) return s;
    LayerBudget budget;  // as PolicyEngine::CompressLayer builds it
    budget.kept_per_head = KeptCount(policy->settings.budget, c.n);
    Protection requested = policy->scorer->default_protection(policy->params, budget.kept_per_head);
    budget.protection = ClampProtection(requested, budget.kept_per_head, c.n);
    const absl::Status st =
        SharedCpu().ScoreLayer(*policy, CpuLayer::From(*validated), budget, &s.scores);
    if (!st.ok()) s.scores.assign(static_cast<size_t>(kKvHeads * c.n), NAN);
    if (policy->params.Has("safeguard_alpha")) {
      s.safeguard = std::min<int64_t>(
          c.n, static_cast<int64_t>(std::floor(policy->params.Number("safeguard_alpha") *
                                               static_cast<double>(budget.kept_per_head))));
    }
    return s;
  };
  return Compare(c, *policy, *cpu, *gpu, cpu_scores);
}

/// Runs `cases` on up to hardware_concurrency threads; returns the outcomes in order.
std::vector<Outcome> RunCases(const std::vector<CaseSpec>& cases) {
  std::vector<Outcome> outcomes(cases.size());
  std::atomic<size_t> next{0};
  const size_t threads = std::max<size_t>(
      1, std::min<size_t>(cases.size(), std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < cases.size(); i = next++) outcomes[i] = RunCase(cases[i]);
    });
  }
  for (auto& thread : pool) thread.join();
  return outcomes;
}

class BackendParityTest : public ::testing::TestWithParam<ParityParam> {};

TEST_P(BackendParityTest, GpuMatchesCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const ParityParam& p = GetParam();
  std::vector<CaseSpec> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t d : {64, 128}) {
      for (int64_t group : {1, 4, 8}) {
        cases.push_back({p.policy, dtype, p.n, d, group, std::min(kMaxWindow, p.n)});
      }
    }
  }
  const std::vector<Outcome> outcomes = RunCases(cases);
  int exact_low_precision = 0;
  int low_precision = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(outcomes[i].failure.empty()) << outcomes[i].failure;
    if (cases[i].dtype != DType::kF32) {
      ++low_precision;
      exact_low_precision += outcomes[i].exact ? 1 : 0;
    }
  }
  // The tolerance rule's usage, for docs/gpu.md: how often f16/bf16 were exact anyway.
  RecordProperty("low_precision_exact", absl::StrCat(exact_low_precision, "/", low_precision));
  std::printf("[ parity   ] %s n=%lld: f16/bf16 indices exact in %d of %d cases\n",
              p.policy.label().c_str(), static_cast<long long>(p.n), exact_low_precision,
              low_precision);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, BackendParityTest, ::testing::ValuesIn(AllParams()),
    [](const ::testing::TestParamInfo<ParityParam>& info) {
      return absl::StrCat(info.param.policy.label(), "_n", info.param.n);
    });

}  // namespace
}  // namespace kvtrim::gpu::testing

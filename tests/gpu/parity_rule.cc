#include "tests/gpu/parity_rule.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/decide/select.h"

namespace kvtrim::gpu::testing {

namespace {

/// The half-width of the tolerance band around boundary `b` of a head with score scale
/// `scale`: 4 * eps * |b| (dtype tolerance), plus tau * (|b| + scale) (fast-numerics band).
struct Band {
  double eps = 0;
  double tau = 0;
  std::function<bool(int64_t, int32_t)> also_near;  // a second boundary (ToleranceBand)
  bool Near(double s, double b, double scale) const {
    return std::isfinite(s) && std::isfinite(b) &&
           std::fabs(s - b) <= 4.0 * eps * std::fabs(b) + tau * (std::fabs(b) + scale);
  }
};

/// The tokens in exactly one of two ascending lists.
std::vector<int32_t> SymmetricDifference(const std::vector<int32_t>& a,
                                         const std::vector<int32_t>& b) {
  std::vector<int32_t> out;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

/// The first position where two lists differ, as text.
std::string FirstDifference(const std::vector<int32_t>& cpu, const std::vector<int32_t>& gpu) {
  const size_t m = std::min(cpu.size(), gpu.size());
  for (size_t i = 0; i < m; ++i) {
    if (cpu[i] != gpu[i]) {
      return absl::StrCat("first differing index at position ", i, ": cpu=", cpu[i],
                          " gpu=", gpu[i], " (cpu kept ", cpu.size(), ", gpu kept ",
                          gpu.size(), ")");
    }
  }
  return absl::StrCat("the lists agree on their first ", m, " positions; cpu kept ",
                      cpu.size(), ", gpu kept ", gpu.size());
}

/// Kept list `l` of a decision.
std::vector<int32_t> List(const LayerDecision& d, size_t l) {
  return std::vector<int32_t>(d.indices.begin() + d.offsets[l],
                              d.indices.begin() + d.offsets[l + 1]);
}

/// "head=2" or "head=shared".
std::string HeadName(bool shared, size_t l) {
  return shared ? std::string(" head=shared") : absl::StrCat(" head=", l);
}

/// Checks every differing list of a low-precision case against the tolerance rule.
std::string CheckTolerance(const CaseSpec& c, bool adakv, bool shared, const LayerDecision& cpu,
                           const LayerDecision& gpu, const std::vector<size_t>& differing,
                           const CpuScores& s, const Band& band) {
  const int64_t n = c.n;
  const int64_t heads = static_cast<int64_t>(cpu.kept_per_head.size());
  if (s.scores.size() != static_cast<size_t>(heads * n)) {
    return absl::StrCat(c.Describe(), ": the CPU scores for the tolerance rule are missing");
  }
  auto score = [&](int64_t h, int64_t j) { return static_cast<double>(s.scores[h * n + j]); };
  auto scale = [&](int64_t h) { return s.scale.empty() ? 0.0 : s.scale[static_cast<size_t>(h)]; };
  std::vector<std::vector<int32_t>> rankings(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) RankTokens(s.scores.data() + h * n, n, &rankings[h]);

  double pool_threshold = std::numeric_limits<double>::infinity();  // adakv extra pool
  if (adakv) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kept = cpu.offsets[h + 1] - cpu.offsets[h];
      if (kept > s.safeguard) {
        pool_threshold = std::min(pool_threshold, score(h, rankings[h][kept - 1]));
      }
    }
  }
  int64_t last_rank = 0;  // shared: the deepest rank the CPU's round robin reached
  if (shared) {
    std::vector<char> taken(static_cast<size_t>(n), 0);
    const int64_t count = cpu.offsets[1];
    int64_t chosen = 0;
    for (int64_t r = 0; r < n && chosen < count; ++r) {
      for (int64_t h = 0; h < heads && chosen < count; ++h) {
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
      return absl::StrCat(c.Describe(), HeadName(shared, l), ": kept counts differ; ",
                          FirstDifference(cl, gl));
    }
    for (int32_t j : SymmetricDifference(cl, gl)) {
      bool ok = false;
      double s_j = 0;
      std::string boundary;
      if (shared) {
        s_j = score(0, j);
        for (int64_t h = 0; h < heads && !ok; ++h) {
          for (int64_t r : {last_rank, std::max<int64_t>(0, last_rank - 1)}) {
            ok = ok || band.Near(score(h, j), score(h, rankings[h][r]), scale(h)) ||
                 (band.also_near && band.also_near(h, j));
          }
        }
        boundary = absl::StrCat("round-robin boundary (rank ", last_rank, ") of any head");
      } else {
        const int64_t h = static_cast<int64_t>(l);
        s_j = score(h, j);
        double b = std::numeric_limits<double>::infinity();
        for (int32_t t : cl) b = std::min(b, score(h, t));
        ok = band.Near(s_j, b, scale(h)) || (adakv && band.Near(s_j, pool_threshold, scale(h))) ||
             (band.also_near && band.also_near(h, j));
        boundary = absl::StrCat("boundary ", b,
                                adakv ? absl::StrCat(" or pool threshold ", pool_threshold) : "");
      }
      if (!ok) {
        return absl::StrCat(c.Describe(), HeadName(shared, l), ": token ", j,
                            " is kept by one backend only and its CPU score ", s_j,
                            " is not within ",
                            band.tau > 0 ? absl::StrCat("tau*(|b|+scale) (tau=", band.tau, ")")
                                         : absl::StrCat("4*eps_", DTypeName(c.dtype)),
                            " of the ", boundary,
                            "; ", FirstDifference(cl, gl));
      }
    }
  }
  return "";
}

}  // namespace

std::string CaseSpec::Describe() const {
  return absl::StrCat("policy=", policy, shape == OutputShape::kShared ? " (shared)" : "",
                      " dtype=", DTypeName(dtype), " n=", n, " d=", d, " G=", group,
                      " H_kv=", num_kv_heads, " w=", window);
}

std::vector<double> HeadScales(const std::vector<float>& scores, int64_t heads, int64_t n) {
  std::vector<double> out(static_cast<size_t>(heads), 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = scores[static_cast<size_t>(h * n + j)];
      if (std::isfinite(v)) out[h] = std::max(out[h], std::fabs(static_cast<double>(v)));
    }
  }
  return out;
}

double DTypeEpsilon(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return std::ldexp(1.0, -7);
    case DType::kF16: return std::ldexp(1.0, -10);
    case DType::kF32: return 0.0;
  }
  return 0.0;
}

Outcome CompareDecisions(const CaseSpec& c, const ResolvedPolicy& policy,
                         const LayerDecision& cpu, const LayerDecision& gpu,
                         const std::function<CpuScores()>& cpu_scores, bool exact_required,
                         const ToleranceBand& band) {
  Outcome out;
  if (cpu.output_shape != gpu.output_shape || cpu.offsets.size() != gpu.offsets.size() ||
      cpu.offsets.size() < 2 || cpu.kept_per_head.size() != gpu.kept_per_head.size()) {
    out.exact = false;
    out.failure = absl::StrCat(c.Describe(), ": output shape or list count differ (cpu ",
                               cpu.offsets.size(), " offsets, gpu ", gpu.offsets.size(), ")");
    return out;
  }
  const size_t lists = cpu.offsets.size() - 1;
  const bool shared = cpu.output_shape == OutputShape::kShared;
  const bool adakv =
      !shared && ((policy.allocator != nullptr && policy.allocator->kind == AllocatorKind::kAdaKV) ||
                  band.movable_counts);
  std::vector<bool> same(lists, true);
  std::vector<size_t> differing;
  for (size_t l = 0; l < lists; ++l) {
    if (List(cpu, l) != List(gpu, l)) {
      same[l] = false;
      differing.push_back(l);
    }
  }
  out.exact = differing.empty() && cpu.kept_per_head == gpu.kept_per_head;
  if (!differing.empty()) {
    const size_t l = differing.front();
    if (exact_required) {
      out.failure = absl::StrCat(c.Describe(), HeadName(shared, l), ": indices must be equal (",
                                 DTypeName(c.dtype), " is exact on the GPU); ",
                                 FirstDifference(List(cpu, l), List(gpu, l)));
      return out;
    }
    Band rule;
    if (band.tau > 0) {
      rule.tau = band.tau;
      rule.also_near = band.also_near;
    } else {
      rule.eps = DTypeEpsilon(c.dtype);
    }
    out.failure = CheckTolerance(c, adakv, shared, cpu, gpu, differing, cpu_scores(), rule);
    if (!out.failure.empty()) return out;
  } else if (cpu.kept_per_head != gpu.kept_per_head) {
    out.failure = absl::StrCat(c.Describe(), ": kept_per_head differs with identical lists");
    return out;
  }
  if (cpu.perturbation.size() != gpu.perturbation.size()) {
    out.failure = absl::StrCat(c.Describe(), ": perturbation has ", gpu.perturbation.size(),
                               " entries on the GPU, ", cpu.perturbation.size(), " on the CPU");
    return out;
  }
  for (size_t h = 0; h < cpu.perturbation.size(); ++h) {
    if (!same[lists == 1 ? 0 : h]) continue;  // one list (shared, block-aligned) serves all
    const double a = cpu.perturbation[h];
    const double b = gpu.perturbation[h];
    // The fast statistic (tensor cores, fp32; docs/numerics.md) against the fp64 one.
    const bool fast = band.tau > 0;
    const double rel = fast ? kFastPerturbationRel : 1e-9;
    const double abs = fast ? kFastPerturbationAbs : 1e-12;
    if (!(std::fabs(a - b) <= rel * std::fabs(a) + abs)) {
      out.failure = absl::StrCat(c.Describe(), " head=", h, ": perturbation cpu=", a, " gpu=", b,
                                 " differs by more than ", rel, " relative + ", abs);
      return out;
    }
  }
  return out;
}

namespace {

/// True for a scorer whose term is DropKV's eviction cost (p / (1 - p))^2 ||a - v||^2: the
/// one that declares bf16_prob_round, the rounding of that p.
bool ScoresEvictionCost(const ResolvedPolicy& policy) {
  return policy.params.Has("bf16_prob_round");
}

}  // namespace

double FastTau(const ResolvedPolicy& policy, DType dtype) {
  if (!ScoresEvictionCost(policy)) return kFastTau;
  const std::string& round = policy.params.Text("bf16_prob_round");
  const bool rounds = round == "on" || (round == "auto" && dtype == DType::kBF16);
  return rounds ? kFastTauBf16Rounding : kFastTau;
}

int64_t FastScoreCheckedTokens(const ResolvedPolicy& policy, int64_t n) {
  if (!ScoresEvictionCost(policy)) return n;
  return std::max<int64_t>(0, n - policy.params.Int("window") - policy.params.Int("kernel") / 2);
}

}  // namespace kvtrim::gpu::testing

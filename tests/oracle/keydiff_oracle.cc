// fp64 brute-force KeyDiff references (see keydiff_oracle.h).
#include "tests/oracle/keydiff_oracle.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "tests/oracle/selection_oracle.h"

namespace kvtrim::oracle {

namespace {

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t c = 0; c < a.size(); ++c) s += a[c] * b[c];
  return s;
}

double Norm(const std::vector<double>& a) { return std::sqrt(Dot(a, a)); }

// Minimises `objective` over every size-`budget` subset of [0, n) by plain recursion.
SubsetOptimum BruteForceMin(int64_t n, int64_t budget,
                            const std::function<double(const std::vector<int64_t>&)>& objective) {
  SubsetOptimum best;
  best.value = INFINITY;
  std::vector<int64_t> current;
  std::function<void(int64_t)> recurse = [&](int64_t next) {
    if (static_cast<int64_t>(current.size()) == budget) {
      const double v = objective(current);
      if (v < best.value) {
        best.value = v;
        best.subset = current;
      }
      return;
    }
    const int64_t needed = budget - static_cast<int64_t>(current.size());
    for (int64_t i = next; i + needed <= n; ++i) {
      current.push_back(i);
      recurse(i + 1);
      current.pop_back();
    }
  };
  recurse(0);
  return best;
}

}  // namespace

double CosSim(const std::vector<double>& a, const std::vector<double>& b, double eps) {
  return Dot(a, b) / std::max(Norm(a) * Norm(b), eps);
}

std::vector<double> Unit(const std::vector<double>& k) {
  const double nrm = Norm(k);
  std::vector<double> u(k.size(), 0.0);
  if (nrm > 0) {
    for (size_t c = 0; c < k.size(); ++c) u[c] = k[c] / nrm;
  }
  return u;
}

std::vector<double> Anchor(const KeyMatrix& keys, KeyDiffAnchorMode mode) {
  const size_t d = keys.empty() ? 0 : keys[0].size();
  std::vector<double> a(d, 0.0);
  for (const auto& k : keys) {
    const std::vector<double> v = mode == KeyDiffAnchorMode::kRawMean ? k : Unit(k);
    for (size_t c = 0; c < d; ++c) a[c] += v[c];
  }
  for (double& x : a) x /= static_cast<double>(keys.size());
  return a;
}

std::vector<double> Eq8Scores(const KeyMatrix& keys, KeyDiffAnchorMode mode, double eps) {
  const std::vector<double> a = Anchor(keys, mode);
  std::vector<double> s;
  for (const auto& k : keys) s.push_back(-CosSim(k, a, eps));
  return s;
}

std::vector<double> Eq7Scores(const KeyMatrix& keys) {
  std::vector<double> s;
  for (const auto& ki : keys) {
    double sum = 0;
    for (const auto& kj : keys) sum += CosSim(ki, kj);
    s.push_back(-sum);
  }
  return s;
}

std::vector<int64_t> OneShotSelect(const KeyMatrix& keys, int64_t budget, KeyDiffAnchorMode mode,
                                   double recent_fraction) {
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int64_t> kept;
  if (n <= budget) {
    for (int64_t i = 0; i < n; ++i) kept.push_back(i);
    return kept;
  }
  // Round half up (specs README rule 6), not keydiff.md's floor.
  const int64_t recent =
      static_cast<int64_t>(std::floor(recent_fraction * static_cast<double>(budget) + 0.5));
  std::vector<double> scores = Eq8Scores(keys, mode);
  scores.resize(static_cast<size_t>(n - recent));  // the protected rows do not compete
  kept = TopKByRank(scores, budget - recent);
  for (int64_t i = n - recent; i < n; ++i) kept.push_back(i);
  return kept;
}

std::vector<int64_t> BlockSelect(const KeyMatrix& keys, int64_t budget, int64_t block_size,
                                 KeyDiffAnchorMode mode, double recent_fraction) {
  std::vector<int64_t> cache;  // positions, ascending
  const int64_t total = static_cast<int64_t>(keys.size());
  for (int64_t start = 0; start < total; start += block_size) {
    for (int64_t t = start; t < std::min(total, start + block_size); ++t) cache.push_back(t);
    if (static_cast<int64_t>(cache.size()) <= budget) continue;
    KeyMatrix held;
    for (int64_t p : cache) held.push_back(keys[p]);
    std::vector<int64_t> rows = OneShotSelect(held, budget, mode, recent_fraction);
    std::vector<int64_t> next;
    for (int64_t r : rows) next.push_back(cache[r]);
    cache = next;
  }
  return cache;
}

double A3Objective(const KeyMatrix& keys, const std::vector<int64_t>& subset) {
  const std::vector<double> mu = Anchor(keys, KeyDiffAnchorMode::kNormalizedMean);
  double s = 0;
  for (int64_t i : subset) s += Dot(Unit(keys[i]), mu);
  return s;
}

double A2Objective(const KeyMatrix& keys, const std::vector<int64_t>& subset) {
  double s = 0;
  for (int64_t i : subset) {
    for (int64_t j : subset) s += CosSim(keys[i], keys[j]);
  }
  return s;
}

SubsetOptimum BruteForceMinA3(const KeyMatrix& keys, int64_t budget) {
  return BruteForceMin(static_cast<int64_t>(keys.size()), budget,
                       [&](const std::vector<int64_t>& s) { return A3Objective(keys, s); });
}

SubsetOptimum BruteForceMinA2(const KeyMatrix& keys, int64_t budget) {
  // Pairwise cosines once, then each subset is an O(N^2) sum.
  const size_t n = keys.size();
  std::vector<std::vector<double>> cos(n, std::vector<double>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) cos[i][j] = CosSim(keys[i], keys[j]);
  }
  return BruteForceMin(static_cast<int64_t>(n), budget, [&](const std::vector<int64_t>& s) {
    double v = 0;
    for (int64_t i : s) {
      for (int64_t j : s) v += cos[i][j];
    }
    return v;
  });
}

double Lemma31LowerBound(int64_t n, double w, double max_sq_norm) {
  const double nd = static_cast<double>(n);
  return (std::log(nd / (nd + 1.0)) - std::log(1.0 - w)) / (2.0 * max_sq_norm) - 1.0;
}

double TheoremC3UpperBound(double alpha, double beta) {
  return 1.0 + alpha * beta - 0.5 * alpha * alpha - 0.5 * beta * beta;
}

}  // namespace kvtrim::oracle

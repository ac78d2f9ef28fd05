// fp64 brute-force selection and allocation references (see selection_oracle.h).
#include "tests/oracle/selection_oracle.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

namespace kvtrim::oracle {

std::vector<int64_t> RankByScore(const std::vector<double>& scores) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  return order;
}

std::vector<int64_t> TopKByRank(const std::vector<double>& scores, int64_t count) {
  std::vector<int64_t> order = RankByScore(scores);
  count = std::clamp<int64_t>(count, 0, static_cast<int64_t>(order.size()));
  std::vector<int64_t> kept(order.begin(), order.begin() + count);
  std::sort(kept.begin(), kept.end());
  return kept;
}

std::vector<int64_t> SharedRoundRobin(const std::vector<std::vector<double>>& scores,
                                      int64_t count) {
  std::vector<std::vector<int64_t>> ranks;
  for (const auto& head : scores) ranks.push_back(RankByScore(head));
  const int64_t n = scores.empty() ? 0 : static_cast<int64_t>(scores[0].size());
  std::set<int64_t> chosen;
  for (int64_t r = 0; r < n; ++r) {
    for (const auto& rank : ranks) {
      if (static_cast<int64_t>(chosen.size()) >= count) break;
      chosen.insert(rank[r]);
    }
  }
  return std::vector<int64_t>(chosen.begin(), chosen.end());
}

AdaKVResult AdaKV(const std::vector<std::vector<double>>& scores, int64_t k, double alpha) {
  const int64_t num_heads = static_cast<int64_t>(scores.size());
  const int64_t safeguard = static_cast<int64_t>(std::floor(alpha * static_cast<double>(k)));
  std::vector<std::vector<bool>> taken;
  // Step 1: the safeguard, each head's own top floor(alpha*k).
  for (const auto& head : scores) {
    std::vector<bool> t(head.size(), false);
    std::vector<int64_t> order = RankByScore(head);
    for (int64_t r = 0; r < safeguard && r < static_cast<int64_t>(order.size()); ++r) {
      t[order[r]] = true;
    }
    taken.push_back(std::move(t));
  }
  // Step 2: one flattened top-k over every remaining (head, token) pair.
  std::vector<std::tuple<double, int64_t, int64_t>> rest;  // (score, token, head)
  for (int64_t h = 0; h < num_heads; ++h) {
    for (size_t j = 0; j < scores[h].size(); ++j) {
      if (!taken[h][j]) rest.emplace_back(scores[h][j], static_cast<int64_t>(j), h);
    }
  }
  std::sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) < std::get<1>(b);
    return std::get<2>(a) < std::get<2>(b);
  });
  const int64_t remaining = num_heads * k - num_heads * safeguard;
  for (int64_t i = 0; i < remaining && i < static_cast<int64_t>(rest.size()); ++i) {
    taken[std::get<2>(rest[i])][std::get<1>(rest[i])] = true;
  }
  AdaKVResult out;
  for (int64_t h = 0; h < num_heads; ++h) {
    std::vector<int64_t> kept;
    for (size_t j = 0; j < taken[h].size(); ++j) {
      if (taken[h][j]) kept.push_back(static_cast<int64_t>(j));
    }
    out.counts.push_back(static_cast<int64_t>(kept.size()));
    out.kept.push_back(std::move(kept));
  }
  return out;
}

namespace {

using Int128 = __int128;

// floor(a / b) for b > 0.
Int128 FloorDiv(Int128 a, Int128 b) {
  Int128 q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

// floor(a / b + 1/2) for b > 0: round half up of an exact fraction.
int64_t RoundHalfUpFraction(Int128 a, Int128 b) {
  return static_cast<int64_t>(FloorDiv(2 * a + b, 2 * b));
}

}  // namespace

int64_t PyramidLayerBudget(int64_t k, int64_t n, int32_t layer, int32_t num_layers, double beta,
                           int64_t protected_tokens) {
  if (num_layers <= 1) return k;
  // beta = p / q exactly: a 53-bit integer mantissa times a power of two.
  int exponent = 0;
  const double mantissa = std::frexp(beta, &exponent);  // beta = mantissa * 2^exponent
  Int128 p = static_cast<Int128>(std::ldexp(mantissa, 53));
  Int128 q = 1;
  int shift = exponent - 53;
  while (shift > 0) {
    p *= 2;
    --shift;
  }
  while (shift < 0) {
    if (p % 2 == 0) {
      p /= 2;
    } else {
      q *= 2;
    }
    ++shift;
  }
  const Int128 K = k, N = n, span = num_layers - 1, l = layer;
  const Int128 F = std::max<int64_t>(1, protected_tokens);
  // k_{L-1} = last_num / den and k_0 = first_num / den, exactly.
  Int128 den = p, last_num = K * q;  // k / beta = k q / p
  if (last_num < F * den) {          // k / beta < F: clamp up to F
    den = 1;
    last_num = F;
  }
  Int128 first_num = 2 * K * den - last_num;
  if (first_num > N * den) {  // k_0 > n: k_0 = n, k_{L-1} = 2k - n
    den = 1;
    first_num = N;
    last_num = 2 * K - N;
  }
  if (last_num < F * den || first_num < last_num) return k;
  return RoundHalfUpFraction(first_num * (span - l) + last_num * l, den * span);
}

}  // namespace kvtrim::oracle

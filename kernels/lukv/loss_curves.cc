#include "kernels/lukv/loss_curves.h"

#include <algorithm>
#include <numeric>

namespace kvtrim::lukv {
namespace {

template <typename T>
std::vector<int32_t> DescendingOrderImpl(const T* scores, int64_t n) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [scores](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  return order;
}

}  // namespace

std::vector<int32_t> DescendingOrder(const float* scores, int64_t n) {
  return DescendingOrderImpl(scores, n);
}

std::vector<int32_t> DescendingOrder(const double* scores, int64_t n) {
  return DescendingOrderImpl(scores, n);
}

std::vector<double> OrderedGains(const double* importance, const std::vector<int32_t>& order) {
  std::vector<double> d(order.size());
  for (size_t i = 0; i < order.size(); ++i) d[i] = importance[order[i]];
  return d;
}

std::vector<double> RawLossCurve(const std::vector<double>& d) {
  std::vector<double> f(d.size() + 1, 0.0);
  for (size_t i = d.size(); i-- > 0;) f[i] = f[i + 1] + d[i];
  return f;
}

std::vector<double> SurrogateCurve(double f0, const std::vector<double>& g) {
  std::vector<double> f(g.size() + 1, f0);
  double kept = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    kept += g[i];
    f[i + 1] = f0 - kept;
  }
  return f;
}

GapResult OptimalityGap(const std::vector<double>& importance, const std::vector<int32_t>& order_pi,
                        const std::vector<int32_t>& order_star, int64_t b) {
  const size_t n = importance.size();
  std::vector<char> in_p(n, 0), in_o(n, 0);
  for (int64_t i = 0; i < b; ++i) {
    in_p[static_cast<size_t>(order_pi[i])] = 1;
    in_o[static_cast<size_t>(order_star[i])] = 1;
  }
  GapResult r;
  for (size_t j = 0; j < n; ++j) {
    if (in_o[j] && !in_p[j]) {
      r.delta += importance[j];
      ++r.num_miss;
    } else if (in_p[j] && !in_o[j]) {
      r.delta -= importance[j];
      ++r.num_fp;
    }
  }
  return r;
}

}  // namespace kvtrim::lukv

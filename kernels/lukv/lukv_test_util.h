// Test helpers of kernels/lukv: random importance vectors and imperfect metric orderings.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/lukv/loss_curves.h"

namespace kvtrim::lukv::testing {

/// One random head: importance I [T] (exponential, some exact ties and zeros) and the order
/// of a noisy metric π over it (inversions against π* = DescendingOrder(I)).
struct RandomHead {
  std::vector<double> importance;  // [T]
  std::vector<int32_t> order_pi;   // [T]
  std::vector<int32_t> order_star; // [T]
  std::vector<double> d;           // [T] gains along π

  RandomHead(int64_t T, std::mt19937& rng, double noise = 1.0) {
    std::exponential_distribution<double> expo(1.0);
    std::normal_distribution<double> normal(0.0, noise);
    std::uniform_int_distribution<int> pick(0, 9);
    importance.resize(static_cast<size_t>(T));
    for (double& x : importance) {
      const int kind = pick(rng);
      x = kind == 0 ? 0.0 : kind == 1 ? 0.5 : expo(rng);  // zeros and ties on purpose
    }
    std::vector<double> scores(importance.size());
    for (size_t j = 0; j < scores.size(); ++j) scores[j] = importance[j] + normal(rng);
    order_pi = DescendingOrder(scores.data(), T);
    order_star = DescendingOrder(importance.data(), T);
    d = OrderedGains(importance.data(), order_pi);
  }
};

}  // namespace kvtrim::lukv::testing

#include "kernels/lukv/pava.h"

#include <cstddef>

namespace kvtrim::lukv {

std::vector<double> AntitonicPava(const std::vector<double>& d) {
  struct Block {
    double sum;
    int64_t count;
    double mean() const { return sum / static_cast<double>(count); }
  };
  std::vector<Block> blocks;
  blocks.reserve(d.size());
  for (double x : d) {
    blocks.push_back({x, 1});
    // Pool while the previous block's mean is below the newest one's (a rise violates the
    // non-increasing order). Comparing the stored means keeps the output exactly monotone.
    while (blocks.size() >= 2 && blocks[blocks.size() - 2].mean() < blocks.back().mean()) {
      Block last = blocks.back();
      blocks.pop_back();
      blocks.back().sum += last.sum;
      blocks.back().count += last.count;
    }
  }
  std::vector<double> out;
  out.reserve(d.size());
  for (const Block& b : blocks) out.insert(out.end(), static_cast<size_t>(b.count), b.mean());
  return out;
}

std::vector<int64_t> LowerHullVertices(const std::vector<double>& f) {
  std::vector<int64_t> hull;
  const int64_t n = static_cast<int64_t>(f.size());
  for (int64_t p = 0; p < n; ++p) {
    // Andrew's monotone chain: drop the last vertex while it does not make a strict
    // counter-clockwise (convex) turn towards p.
    while (hull.size() >= 2) {
      const int64_t o = hull[hull.size() - 2], a = hull.back();
      const double cross = static_cast<double>(a - o) * (f[p] - f[o]) -
                           (f[a] - f[o]) * static_cast<double>(p - o);
      if (cross > 0) break;
      hull.pop_back();
    }
    hull.push_back(p);
  }
  return hull;
}

std::vector<double> LowerHullGains(const std::vector<double>& f) {
  std::vector<double> gains;
  if (f.size() < 2) return gains;
  gains.reserve(f.size() - 1);
  const std::vector<int64_t> hull = LowerHullVertices(f);
  for (size_t s = 0; s + 1 < hull.size(); ++s) {
    const int64_t u = hull[s], v = hull[s + 1];
    const double gain = (f[u] - f[v]) / static_cast<double>(v - u);
    gains.insert(gains.end(), static_cast<size_t>(v - u), gain);
  }
  return gains;
}

}  // namespace kvtrim::lukv

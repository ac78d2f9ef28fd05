// The convex-hull relaxation of LU-KV (lukv.md §4): antitonic PAVA on the raw gains and, as
// an independent second implementation, the lower convex hull of the raw loss curve.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::lukv {

/// Antitonic (non-increasing) isotonic regression with unit weights by pool-adjacent-
/// violators: d [T] (d[i-1] is the gain d(i) of the i-th kept token) -> ĝ [T], the
/// non-increasing sequence closest to d in least squares. Every pooled block holds one
/// value (its mean), so ĝ is exactly non-increasing and Σĝ = Σd up to rounding.
std::vector<double> AntitonicPava(const std::vector<double>& d);

/// Vertices of the lower convex hull (greatest convex minorant) of the points (i, f[i]),
/// i = 0..T, for f [T+1]: ascending indices, always holding 0 and T. Collinear interior
/// points are not vertices.
std::vector<int64_t> LowerHullVertices(const std::vector<double>& f);

/// The hull's marginal gains for f [T+1] -> ĝ [T]: ĝ[i-1] = -(slope of the hull segment
/// over [i-1, i]). Equals AntitonicPava(d) for f(i) = Σ_{m>i} d(m) (lukv.md §4).
std::vector<double> LowerHullGains(const std::vector<double>& f);

}  // namespace kvtrim::lukv

// fp64 brute-force references for KeyDiff (specs/keydiff.md §2, §4). Written independently
// of kernels/: plain loops in double, full sorts, exhaustive subset search. For tests only.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtrim::oracle {

/// Keys of one head, [n][d] fp64.
using KeyMatrix = std::vector<std::vector<double>>;

/// The KeyDiff anchor (keydiff.md §1): mean of unit keys or mean of raw keys.
enum class KeyDiffAnchorMode { kNormalizedMean, kRawMean };

/// cos(a, b) = <a, b> / max(||a|| ||b||, eps).
double CosSim(const std::vector<double>& a, const std::vector<double>& b, double eps = 1e-8);

/// k / ||k|| (the zero vector for a zero key).
std::vector<double> Unit(const std::vector<double>& k);

/// The anchor over all rows: (1/n) sum k_i or (1/n) sum k_i/||k_i||. [d]
std::vector<double> Anchor(const KeyMatrix& keys, KeyDiffAnchorMode mode);

/// Eq. 8 scores: -cos(k_i, anchor) with the eps guard. [n]
std::vector<double> Eq8Scores(const KeyMatrix& keys, KeyDiffAnchorMode mode, double eps = 1e-8);

/// Eq. 7 scores: -sum_j cos(k_i, k_j), self included, O(n^2 d). [n]
std::vector<double> Eq7Scores(const KeyMatrix& keys);

/// §2.2 one-shot selection: all rows when n <= N; otherwise the R = floor(x*N + 1/2) last rows
/// plus the N - R highest Eq. 8 scores among the others (ties to the lower row). Ascending.
std::vector<int64_t> OneShotSelect(const KeyMatrix& keys, int64_t budget, KeyDiffAnchorMode mode,
                                   double recent_fraction);

/// §2.3 block-wise run, naively: append B rows at a time, and whenever more than N rows
/// are held run OneShotSelect on them. Returns the original positions kept, ascending.
std::vector<int64_t> BlockSelect(const KeyMatrix& keys, int64_t budget, int64_t block_size,
                                 KeyDiffAnchorMode mode, double recent_fraction);

/// A.3 relaxed objective of a subset S: sum_{i in S} <k̂_i, mean of ALL unit keys>.
double A3Objective(const KeyMatrix& keys, const std::vector<int64_t>& subset);

/// A.2 objective of a subset S: sum_{i in S} sum_{j in S} cos(k_i, k_j).
double A2Objective(const KeyMatrix& keys, const std::vector<int64_t>& subset);

/// The minimum of `objective` over every subset of size N of the n rows (n choose N
/// evaluations), with one minimising subset (ascending).
struct SubsetOptimum {
  double value = 0;
  std::vector<int64_t> subset;
};
SubsetOptimum BruteForceMinA3(const KeyMatrix& keys, int64_t budget);
SubsetOptimum BruteForceMinA2(const KeyMatrix& keys, int64_t budget);

/// Lemma 3.1 / Theorem C.1 lower bound on cos(k*, q) for n other keys, attention weight w
/// of k* and squared-norm bound M: (log(n/(n+1)) - log(1-w)) / (2M) - 1.
double Lemma31LowerBound(int64_t n, double w, double max_sq_norm);

/// Theorem C.3 upper bound on cos(k̄, k*) from alpha = cos(k̄, q), beta = cos(k*, q):
/// 1 + alpha*beta - alpha^2/2 - beta^2/2.
double TheoremC3UpperBound(double alpha, double beta);

}  // namespace kvtrim::oracle

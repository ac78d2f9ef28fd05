// Brute-force fp64 oracle for the attention-based scorers and the output perturbation.
// Written independently of kernels/: it materialises dense softmax matrices, uses the GEMM
// form for DropKV and recomputes attention outputs directly. Slow on purpose; tests only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtrim::oracle {

/// One layer's attention inputs (fp32 values, as the kernels see them after conversion).
struct AttentionProblem {
  int64_t num_kv_heads = 0;     // H_kv
  int64_t num_tokens = 0;       // n
  int64_t head_dim = 0;         // d
  int64_t num_query_heads = 0;  // H_q = G * H_kv
  int64_t window_rows = 0;      // w; row t sits at position n - w + t
  double scale = 0;             // softmax scale
  std::vector<float> keys;      // [H_kv, n, d] row-major
  std::vector<float> values;    // [H_kv, n, d] row-major
  std::vector<float> queries;   // [H_q, w, d] row-major

  /// G = H_q / H_kv.
  int64_t group() const { return num_query_heads / num_kv_heads; }
};

/// Random problem: keys, values and queries i.i.d. N(0, 1) from a mt19937_64 seeded with
/// `seed`; queries are multiplied by `query_gain` (> 1 sharpens the softmax). scale =
/// 1/sqrt(d) rounded to fp32 (the type the API carries it in).
AttentionProblem RandomProblem(uint64_t seed, int64_t num_kv_heads, int64_t group, int64_t n,
                               int64_t d, int64_t w, double query_gain = 1.0);

/// A hand-made SnapKV conformance problem (one KV head, G = 1, n = 40, d = 4, w = 8, scale
/// 0.5): every window row is 4·e0; keys are 0 except k_5 = 2·e0 (logit 4), k_15 = e0
/// (logit 2) and a spike k_32 = 6·e0 (logit 12) on the first window token (P = 32 for window
/// 8); values are 1. With window 8 and max pooling of kernel 7 over the prefix alone, tokens
/// 2..8 share token 5's pooled score, 12..18 token 15's, and 26..31 keep the background
/// score; pooling the whole length would lift 29..31 to the spike instead. Keeping 15 tokens
/// (window + 7) must therefore keep {2..8, 32..39}.
AttentionProblem WindowBoundarySpikeProblem();

/// Dense causal softmax of query head `q_head` (KV head q_head / G): [w, n] fp64, zero where
/// token j > n - w + t (rows at negative positions are all zero).
std::vector<double> ProbMatrix(const AttentionProblem& pb, int64_t q_head);

/// Dense attention outputs A = P V of query head `q_head`: [w, d] fp64.
std::vector<double> OutputMatrix(const AttentionProblem& pb, int64_t q_head);

/// Reference pooling of x[0..n) (kernel odd) by explicit padding: max pads with -inf,
/// avg pads with zeros and divides by the kernel (PyTorch avg_pool1d defaults).
std::vector<double> Pool(const std::vector<double>& x, int64_t kernel, bool max_pool);

/// SnapKV (baselines §0, §3; kvpress SnapKVPress): per KV head, the mean over the group and
/// the last `window` rows of P restricted to the prefix columns j < P = max(0, n - window),
/// Pool over that length-P vector alone, and the window tokens j >= P padded with the
/// largest pooled prefix score (0 when P = 0): [H_kv, n].
std::vector<double> SnapKVScores(const AttentionProblem& pb, int64_t window, int64_t kernel,
                                 bool max_pool);

/// H2O: mean over the group of the column sums of P over all w rows (optionally divided by
/// the number of rows that see each token; 0 when none does): [H_kv, n].
std::vector<double> H2OScores(const AttentionProblem& pb, bool causal_normalize);

/// TOVA: last row of P averaged over all H_q heads, repeated for every KV head: [H_kv, n].
std::vector<double> TovaScores(const AttentionProblem& pb);

/// Options of the DropKV oracle.
struct DropKVOptions {
  int64_t window = 8;
  int64_t kernel = 11;
  bool max_pool = true;
  double eps = 1e-6;
  bool bf16_round = false;  // round p to fp32 then to bf16 (round to nearest even)
};

/// DropKV, direct form: per element (p~/(1-p~+eps))^2 * max(0, ||a_t - v_j||^2) with the
/// difference formed explicitly, group mean, then pooling: [H_kv, n].
std::vector<double> DropKVScoresDirect(const AttentionProblem& pb, const DropKVOptions& opt);

/// DropKV, GEMM form (dropkv.md §2.2): with Omega [(G*window), n] and A [(G*window), d],
/// G*score = (1^T Omega) .* ||V||^2_rows - 2 rowdot(V, Omega^T A) + Omega^T ||A||^2_rows,
/// then pooling: [H_kv, n]. No clamp (equal to the direct form when no delta^2 < 0).
std::vector<double> DropKVScoresGemm(const AttentionProblem& pb, const DropKVOptions& opt);

/// Output of one query over explicit fp64 tokens, with `excluded[j]` tokens removed and the
/// softmax renormalised: [d]. keys/values [n, d], q [d]. Zero when nothing remains.
std::vector<double> SingleQueryOutput(const std::vector<double>& keys,
                                      const std::vector<double>& values,
                                      const std::vector<double>& q, int64_t n, int64_t d,
                                      double scale, const std::vector<bool>& excluded);

/// Relative output perturbation of kept sets by direct recomputation: for each KV head, the
/// mean over its group and the w rows of ||a_kept - a_full|| / ||a_full|| (1 for a row that
/// sees no kept token; 0/1 when a_full = 0). offsets [H_kv + 1] (or [2] for one shared list),
/// kept ascending token indices. Returns [H_kv].
std::vector<double> OutputPerturbation(const AttentionProblem& pb,
                                       const std::vector<int64_t>& offsets,
                                       const std::vector<int32_t>& kept);

/// min over all k-subsets J of {0..m) of F(J) = ||sum_{i in J} p_i r_i|| / (1 - P_J), by
/// enumeration (C(m, k) subsets). r is [m, d] fp64.
double MinSubsetPerturbation(const std::vector<double>& p, const std::vector<double>& r,
                             int64_t m, int64_t d, int64_t k);

/// F(J) for one subset (see MinSubsetPerturbation).
double SubsetPerturbation(const std::vector<double>& p, const std::vector<double>& r, int64_t d,
                          const std::vector<int64_t>& subset);

/// Largest |got - want| / max(|want|, floor) over n elements.
double MaxRelativeError(const float* got, const double* want, int64_t n, double floor = 1e-30);

/// Indices of the k highest scores (ties: lower index), ascending.
std::vector<int64_t> TopK(const std::vector<double>& scores, int64_t k);

/// Compares top-k of `got` and `want` (n elements each): returns "" when the sets are equal
/// or differ only in tokens whose `want` score is within `tie_rel` (relative) of the k-th
/// highest `want` score; otherwise a description of the first real difference.
std::string CompareTopK(const float* got, const double* want, int64_t n, int64_t k,
                        double tie_rel);

}  // namespace kvtrim::oracle

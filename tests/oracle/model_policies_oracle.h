// Brute-force fp64 oracle for the model-aware scorers (CriticalKV, LaProx, Expected
// Attention), written from the specs independently of kernels/: it materialises W_O^h as a
// dense [d, D] matrix, V W_O^h as a dense product, and RoPE rotations as explicit d x d
// matrices. Slow on purpose; tests only.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/oracle/attention_oracle.h"

namespace kvtrim::oracle {

/// The model slice one layer needs: o_proj.weight [D, H_q*d] (HF layout).
struct ProjectionProblem {
  int64_t hidden = 0;          // D
  std::vector<float> w_o;      // [D, H_q * d]
};

/// CriticalKV (criticalkv.md §2): attention [H_kv, n] and critical [H_kv, n] (0 on the last
/// `window` tokens); norm_l1 selects ||.||_1 or ||.||_2 of V W_O^h.
void CriticalKVScores(const AttentionProblem& pb, const ProjectionProblem& proj, int64_t window,
                      int64_t kernel, bool max_pool, double eps, bool norm_l1,
                      std::vector<double>* attention, std::vector<double>* critical);

/// LaProx (laprox.md §2.1) scores p [H_kv, n] (0 on the window), gqa: 0 = mean,
/// 1 = head_bound, 2 = summed_wo.
std::vector<double> LaProxScores(const AttentionProblem& pb, const ProjectionProblem& proj,
                                 int64_t window, int64_t kernel, bool max_pool, int gqa);

/// Expected Attention (baselines.md §7) from pre-RoPE mean [H_q, d] and covariance
/// [H_q, d, d]; inverse RoPE frequencies `inv_freq` [d/2] in the rotate_half layout (or
/// interleaved); R_bar averages explicit rotation matrices over positions n .. n+F-1.
std::vector<double> ExpectedAttentionScores(const AttentionProblem& pb,
                                            const std::vector<double>& mean,
                                            const std::vector<double>& cov,
                                            const std::vector<double>& inv_freq, bool interleaved,
                                            int64_t future, double eps, bool use_vnorm);

/// The d x d RoPE rotation matrix of `position` (row-major).
std::vector<double> RopeMatrix(const std::vector<double>& inv_freq, bool interleaved,
                               int64_t position);

}  // namespace kvtrim::oracle

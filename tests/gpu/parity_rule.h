// The GPU-vs-CPU parity rule (docs/gpu.md, "Parity rule"), shared by the parity test and
// its own unit test.
//  * Exact mode (fp32 always; f16/bf16 while the GPU scorers are bit-identical to the CPU,
//    which they are today): offsets and kept indices are EQUAL, list for list.
//  * Tolerance mode (f16/bf16 once a GPU path sums in another order, e.g. on tensor
//    cores): a kept list may differ from the CPU's only in tokens whose CPU score lies
//    within 4 * eps_dtype * |b| of the list's boundary score b, eps_dtype being the
//    dtype's machine epsilon (bf16 2^-7, f16 2^-10) and b
//      per head (uniform, pyramid): the lowest CPU score the CPU kept in that head;
//      adakv: that, or the layer's extra-pool threshold (the lowest CPU score the CPU
//             kept beyond a head's safeguard); counts may then move between heads;
//      shared: in some head, that head's score at the CPU round robin's last rank (or
//             the one before).
//    Per-head counts must be equal except under adakv. Protected (+inf) tokens never
//    differ: the comparison is false for infinities. The factor 4: two scores each off by
//    up to 2 eps relative can swap order only when they lie within 4 eps of each other.
//  * Fast-numerics band (fast vs exact, docs/numerics.md): as the tolerance mode, with the
//    reference's scores and the band |s - b| <= tau * (|b| + scale_h), scale_h the head's
//    score scale (largest finite |score| of the head); counts may move between heads under
//    adakv and model/layer-wide selections (LaProx).
//  * Perturbation: |gpu - cpu| <= 1e-9 * |cpu| + 1e-12 for every head whose kept list is
//    identical on both backends (always, in exact mode); under the fast-numerics band
//    |fast - exact| <= kFastPerturbationRel * |exact| + kFastPerturbationAbs (the fast
//    statistic: tensor cores, fp32 accumulation, outputs kept as bf16 / f16 hi + lo).
// Failures name policy, dtype, n, d, G, head and the first differing position.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/layer.h"
#include "kernels/policy_spec.h"

namespace kvtrim::gpu::testing {

/// The case a comparison is about: what failure messages print, and the dtype.
struct CaseSpec {
  std::string policy;                           // preset or composition
  OutputShape shape = OutputShape::kPerHead;
  DType dtype = DType::kF32;
  int64_t num_kv_heads = 0;                     // H_kv
  int64_t n = 0;
  int64_t d = 0;
  int64_t group = 0;                            // G
  int64_t window = 0;                           // w

  /// "policy=dropkv dtype=bf16 n=99 d=64 G=4 H_kv=3 w=32".
  std::string Describe() const;
};

/// What the tolerance mode needs from the CPU (computed only when lists differ).
struct CpuScores {
  std::vector<float> scores;  // [H_kv, n] after protection
  int64_t safeguard = 0;      // adakv: min(n, floor(alpha * k))
  std::vector<double> scale;  // [H_kv] head score scales (fast-numerics band only)
};

/// The fast perturbation statistic's bound against the fp64 one (docs/numerics.md).
constexpr double kFastPerturbationRel = 1e-3;
constexpr double kFastPerturbationAbs = 1e-4;

/// The fast-numerics band (tau > 0) in place of the dtype-epsilon tolerance.
struct ToleranceBand {
  double tau = 0;              // |s - b| <= tau * (|b| + scale_h)
  bool movable_counts = false; // counts may move between heads (layer / model-wide top-K)
  /// A second boundary a token may lie near instead (a decision made in two stages, e.g.
  /// CriticalKV's stage 1 on attention): true when token j of head h is inside it.
  std::function<bool(int64_t head, int32_t token)> also_near;
};

/// Largest finite |score| of each head of scores [H, n]: the band's scale.
std::vector<double> HeadScales(const std::vector<float>& scores, int64_t heads, int64_t n);

/// What one comparison found.
struct Outcome {
  bool exact = true;    // offsets and indices identical
  std::string failure;  // empty when the rule holds
};

/// Machine epsilon of `dtype` (bf16 2^-7, f16 2^-10, f32 0).
double DTypeEpsilon(DType dtype);

/// The fast-numerics band of docs/numerics.md ("Tolerance rule"): tau = 2^-11 ...
constexpr double kFastTau = 1.0 / 2048.0;
/// ... and 2^-7 where DropKV rounds p to bf16 before its weight (bf16_prob_round): a p
/// within rounding noise of a bf16 midpoint rounds either way, moving that term's weight
/// (p / (1 - p))^2 by up to 2 * 2^-8 of itself.
constexpr double kFastTauBf16Rounding = 1.0 / 128.0;

/// tau of the fast band for a resolved policy with inputs in `dtype`.
double FastTau(const ResolvedPolicy& policy, DType dtype);

/// How many leading tokens of a head the fast-vs-exact score comparison checks: all n, but
/// for DropKV only those before its window and the pooling's reach into it (ill-conditioned
/// in both modes: rows that see few tokens give p near 1, whose weight multiplies the
/// rounding noise of |a - v|^2; the policy protects them).
int64_t FastScoreCheckedTokens(const ResolvedPolicy& policy, int64_t n);

/// Applies the rule to the CPU and GPU decisions of one layer. `exact_required` selects
/// exact mode; otherwise the tolerance mode of c.dtype applies, with `cpu_scores` called
/// at most once, only when some list differs. `policy` gives the allocator.
/// With `band.tau` > 0 the fast-numerics band applies instead of the dtype epsilon (cpu =
/// the exact decision, gpu = the fast one, cpu_scores = the exact scores and their scales).
Outcome CompareDecisions(const CaseSpec& c, const ResolvedPolicy& policy,
                         const LayerDecision& cpu, const LayerDecision& gpu,
                         const std::function<CpuScores()>& cpu_scores, bool exact_required,
                         const ToleranceBand& band = {});

}  // namespace kvtrim::gpu::testing

// The project-wide budget rules (specs/README.md, rules 2 and 3).
#pragma once

#include <cstdint>

namespace kvtrim {

/// A per-head budget as the API takes it: a kept fraction in (0, 1] or a kept token count,
/// or an error target (proto Budget.max_perturbation).
struct Budget {
  bool by_fraction = true;
  double keep_fraction = 1.0;  // used when by_fraction
  int64_t keep_tokens = 0;     // used when !by_fraction
  /// Error-targeted budget (kernels/decide/perturbation_budget.h): each KV head keeps the fewest
  /// tokens of its ranking whose output perturbation is <= `epsilon`, at most the cap. The
  /// cap is the fraction budget above (by_fraction true, keep_fraction = max_keep_fraction),
  /// so KeptCount and the protection rules see the cap k_cap.
  bool by_perturbation = false;
  double epsilon = 0;  // used when by_perturbation: finite, >= 0
};

/// Rule 2: tokens kept per head out of `n`: max(1, floor(f*n + 0.5)) in double precision,
/// or min(keep_tokens, n). Always in [1, n] for n >= 1.
int64_t KeptCount(const Budget& budget, int64_t n);

/// Protected token counts of one head: the first `sink` and the last `recent` tokens.
struct Protection {
  int64_t sink = 0;
  int64_t recent = 0;
};

/// Rule 3: clamps requested protection to a head that keeps `k` of `n` tokens. Sink and
/// recent count inside k: sink' = min(sink, k), recent' = min(recent, k - sink'), and the
/// two ranges never overlap.
Protection ClampProtection(Protection requested, int64_t k, int64_t n);

/// Round half up in double precision (rule 6): floor(x + 0.5).
int64_t RoundHalfUp(double x);

}  // namespace kvtrim

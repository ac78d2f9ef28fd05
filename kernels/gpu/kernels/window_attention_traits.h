// What a window-attention scorer (SnapKV, H2O, TOVA, DropKV) is made of on the GPU: which
// window rows it scores, the per-row term it sums for a token, how the sum is normalised and
// how the scores are pooled. These scorers are variants of one computation (the window's
// softmax over the cached tokens, kernels/cpu/window_attention.h), so the shared kernels
// (attention_plan.cuh, fast_attention.cuh, LaunchScore) take these traits instead of a scorer
// identity. Each scorer's GPU file (kernels/gpu/scorers/<name>.cu) declares its traits and
// registers them (window_attention_scorer.h); docs/architecture.md, "Adding a scorer".
#pragma once

namespace kvtrim {

/// The window rows a scorer reads, per query head (w = rows sent).
enum class WindowRowSpan {
  kLastWindow,  // the last `window` rows (the scorer declares the `window` parameter)
  kAllRows,     // every row sent
  kLastRow,     // the last row only
};

/// The term a scored row t adds to token j's sum (p = that row's softmax probability of j).
enum class WindowTerm {
  kProbability,   // p
  kEvictionCost,  // (p / (1 - p + eps))^2 ||a_t - v_j||^2 (DropKV; reads values, eps and
                  // bf16_prob_round, and forms the rows' outputs a_t on the way)
};

/// What a token's sum over the scored rows of its KV head's G query heads is divided by.
enum class WindowNormalize {
  kRowMean,         // G * T (T rows per query head): the mean over every scored row
  kGroupMean,       // G: the rows add up, the query heads are averaged
  kVisibleRowMean,  // G * the rows that see token j (0 when none does)
  kEveryHeadMean,   // G * H_kv, summed over every KV head too: one score shared by all heads
};

/// How the scores are pooled over the tokens (the `kernel` and `pooling` parameters).
enum class PoolingSpan {
  kNone,         // no pooling
  kPrefix,       // the prefix P = n - window only; the window takes the best pooled prefix
                 // score (SnapKV; run for every kernel)
  kWholeLength,  // the whole length, when kernel > 1 (DropKV)
};

/// One window-attention scorer's traits.
struct WindowAttentionTraits {
  WindowRowSpan rows = WindowRowSpan::kLastWindow;
  WindowTerm term = WindowTerm::kProbability;
  WindowNormalize normalize = WindowNormalize::kRowMean;
  PoolingSpan pooling = PoolingSpan::kNone;
  /// True when the scorer declares the bool `causal_normalize`: set, a token's sum is divided
  /// by G times the rows that see it instead (H2O).
  bool causal_normalize_param = false;

  /// True when the scorer reads the layer's values (and forms the rows' outputs).
  constexpr bool ReadsValues() const { return term == WindowTerm::kEvictionCost; }
  /// True when the scorer reads `window`, `kernel` and `pooling` (ReadWindowPooling).
  constexpr bool ReadsWindowPooling() const {
    return rows == WindowRowSpan::kLastWindow || pooling != PoolingSpan::kNone;
  }
  /// True when one score is shared by every KV head.
  constexpr bool SharedByEveryHead() const {
    return normalize == WindowNormalize::kEveryHeadMean;
  }
  /// The normalisation a request gets: kVisibleRowMean where the scorer declares
  /// causal_normalize and the request sets it, `normalize` otherwise.
  constexpr WindowNormalize NormalizeWith(bool causal_normalize) const {
    return causal_normalize_param && causal_normalize ? WindowNormalize::kVisibleRowMean
                                                      : normalize;
  }
};

/// The rows the window-reading model scorers (CriticalKV, LaProx) take the attention of: the
/// last `window` rows' probabilities, unpooled (they reduce and pool them themselves).
inline constexpr WindowAttentionTraits kLastWindowProbabilities{
    WindowRowSpan::kLastWindow, WindowTerm::kProbability, WindowNormalize::kRowMean,
    PoolingSpan::kNone, false};

/// The rows the output-perturbation statistic reads: the last `window` rows with their
/// outputs (DropKV's term, unpooled; kernels/gpu/kernels/fast_perturbation.cu).
inline constexpr WindowAttentionTraits kLastWindowOutputs{
    WindowRowSpan::kLastWindow, WindowTerm::kEvictionCost, WindowNormalize::kGroupMean,
    PoolingSpan::kNone, false};

}  // namespace kvtrim

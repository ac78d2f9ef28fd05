// Typed values of the policies' enumerated parameters (policy.params.pooling, .anchor, ...).
// Each enum lists its parameter's choices in order, and its Choices() list is the one the
// registry declares the parameter with (kernels/builtin_policies.cc), so both backends and the
// decision read a resolved value as `params.Enum<E>("name")`, with no string compare.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/params.h"

namespace kvtrim {

/// The pooling operator of the window-attention scorers (SnapKV, DropKV, CriticalKV, LaProx).
enum class PoolKind {
  kMax,  // max over the window clipped at the sequence ends (-inf padding)
  kAvg,  // PyTorch avg_pool1d default: zero padding, always divided by the kernel size
};
/// {"max", "avg"}: the choices of `pooling`, in PoolKind's order.
const std::vector<std::string>& PoolKindChoices();

/// The window and pooling parameters of a window-attention scorer (SnapKV, DropKV, CriticalKV,
/// LaProx).
struct WindowPooling {
  int64_t window = 0;  // window rows read per query head, 1 <= window <= the rows sent
  int64_t kernel = 0;  // odd pooling kernel, >= 1
  PoolKind pooling = PoolKind::kMax;
};

/// The "window", "kernel" and "pooling" of a window-attention scorer's resolved parameters.
/// Read, not checked: the scorer's ScorerSpec::validate (ValidateWindowed) checked them
/// against the layer when the engine validated it, and nothing below re-validates.
WindowPooling ReadWindowPooling(const ResolvedParams& params);

/// The anchor KeyDiff compares every key with (keydiff.md §1, §7.1).
enum class KeyDiffAnchor {
  kNormalizedMean,  // mean of the unit keys k_i / ||k_i|| (the project default)
  kRawMean,         // mean of the raw keys
};
/// {"normalized_mean", "raw_mean"}: the choices of keydiff's `anchor`.
const std::vector<std::string>& KeyDiffAnchorChoices();

/// DropKV's `bf16_prob_round`: round p to bf16 before the weight (dropkv.md).
enum class Bf16ProbRound {
  kAuto,  // on for bf16 inputs, off otherwise
  kOn,
  kOff,
};
/// {"auto", "on", "off"}.
const std::vector<std::string>& Bf16ProbRoundChoices();
/// True when p is rounded to bf16 for inputs of `input_dtype` (auto: bf16 inputs only).
inline bool RoundsProbToBf16(Bf16ProbRound mode, DType input_dtype) {
  return mode == Bf16ProbRound::kOn ||
         (mode == Bf16ProbRound::kAuto && input_dtype == DType::kBF16);
}

/// CriticalKV's projected-value norm ||v W_O^h|| (criticalkv.md).
enum class CriticalKVNorm {
  kL1,  // the paper's: sum over the model dimension of |v . W_O column|
  kL2,  // through the Gram matrices
};
/// {"l1", "l2"}.
const std::vector<std::string>& CriticalKVNormChoices();

/// LaProx's selection scope (laprox.md).
enum class LaProxMode {
  kModel,     // one top-K over every layer on layer-normalised scores
  kModelRaw,  // the same without the normalisation
  kLayer,     // one top-k over the heads of a layer
  kLocal,     // per-head top-k
};
/// {"model", "model_raw", "layer", "local"}.
const std::vector<std::string>& LaProxModeChoices();

/// LaProx's GQA combination (laprox.md §2.1; canonical definitions in kernels/cpu/scorers.h).
enum class LaProxGqa : int32_t { kMean, kHeadBound, kSummedWo };
/// {"mean", "head_bound", "summed_wo"}.
const std::vector<std::string>& LaProxGqaChoices();

/// Where Expected Attention's query mean and covariance come from (baselines.md §7).
enum class QueryStatsSource {
  kAuto,    // the model's registered statistics when it has them, else the window's
  kModel,   // the registered pre-RoPE statistics
  kWindow,  // estimated from the sent query rows
};
/// {"auto", "model", "window"}.
const std::vector<std::string>& QueryStatsSourceChoices();

}  // namespace kvtrim

// Typed identities of the policy parts and of the numerics mode, resolved once by the
// registry so that nothing below it compares policy names as strings.
#pragma once

#include <optional>
#include <string_view>

namespace kvtrim {

/// Every built-in scorer. The last three read a registered model.
enum class ScorerKind {
  kStreamingLlm, kRandom, kKnorm, kKeyDiff, kSnapKV, kH2O, kTova, kDropKV,
  kCriticalKV, kLaProx, kExpectedAttention
};

/// Every built-in allocator.
enum class AllocatorKind { kUniform, kPyramid, kAdaKV, kLukv };

/// True for kCriticalKV, kLaProx and kExpectedAttention (they read a registered model).
inline bool IsModelScorer(ScorerKind kind) {
  return kind == ScorerKind::kCriticalKV || kind == ScorerKind::kLaProx ||
         kind == ScorerKind::kExpectedAttention;
}

/// How scores are computed (design.md, "Numerics").
///  kFast   tensor cores / FMA / hardware exp2, fp32 accumulate; within the tolerance rule of
///          docs/numerics.md of kExact (the server default, --numerics=fast)
///  kExact  the canonical arithmetic of kernels/canonical_math.h: CPU and GPU bit-identical
enum class Numerics { kFast, kExact };

/// "fast" / "exact".
inline const char* NumericsName(Numerics mode) {
  return mode == Numerics::kFast ? "fast" : "exact";
}

/// Parses "fast" / "exact"; nullopt otherwise.
inline std::optional<Numerics> ParseNumerics(std::string_view name) {
  if (name == "fast") return Numerics::kFast;
  if (name == "exact") return Numerics::kExact;
  return std::nullopt;
}

}  // namespace kvtrim

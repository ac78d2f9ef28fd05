// Typed identities of the policy parts and of the numerics mode, resolved once by the
// registry so that nothing below it compares policy names as strings.
#pragma once

#include <optional>
#include <string_view>

namespace kvtrim {

/// The scorers the backends know by identity (kCriticalKV, kLaProx and kExpectedAttention read
/// a registered model), and kTable: a scorer no backend special-cases. Each backend finds a
/// kTable scorer's implementation in its scorer table by the scorer's registered name
/// (kernels/cpu/cpu_scorer_table.h, kernels/gpu/kernels/gpu_scorer_table.h), so adding one
/// takes its registry entry, its CPU file and its GPU file (docs/architecture.md). The
/// window-attention scorers (SnapKV, H2O, TOVA, DropKV) are table scorers: their GPU files
/// register the shared window-attention kernels with their traits.
enum class ScorerKind { kCriticalKV, kLaProx, kExpectedAttention, kTable };

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

// The CPU implementations of the table scorers (ScorerKind::kTable), found by the scorer's
// registered name. Every file kernels/cpu/scorers/<stem>.cc defines
//   void RegisterCpuScorer_<stem>(CpuScorerTable& table);
// which adds its scorer; the build generates the one function that calls them all
// (RegisterCpuScorerFiles, kernels/CMakeLists.txt), so a new file needs no other edit.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/params.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Signature of a CPU scorer (see scorers.h): writes scores [H_kv, n] fp32, without
/// protection, deterministic whatever the thread count.
using CpuScoreFn = absl::Status (*)(const CpuLayer&, const ResolvedParams&, ThreadPool&, float*);

/// One table scorer's CPU implementations.
struct CpuScorer {
  CpuScoreFn exact = nullptr;  // the canonical arithmetic (kernels/canonical_math.h)
  CpuScoreFn fast = nullptr;   // fast numerics (docs/numerics.md); nullptr: exact only
};

/// Scorer name -> CpuScorer. Filled once (Builtin: on first use); read-only and thread-safe
/// after.
class CpuScorerTable {
 public:
  /// Adds `scorer` under `name`; false (and no change) when the name is taken or exact is
  /// missing.
  bool Add(std::string name, CpuScorer scorer);
  /// Add, from a scorer file's registration: a refusal is a build error (two files claim one
  /// name, or one registers no exact scorer), so it aborts with the name.
  void Register(std::string name, CpuScorer scorer);
  /// The scorer registered as `name`, or nullptr.
  const CpuScorer* Find(std::string_view name) const;
  /// Every registered name, sorted.
  std::vector<std::string> Names() const;

  /// The table of every file in kernels/cpu/scorers/ (built on first use).
  static const CpuScorerTable& Builtin();

 private:
  std::map<std::string, CpuScorer, std::less<>> scorers_;
};

/// Calls RegisterCpuScorer_<stem>(table) for every kernels/cpu/scorers/<stem>.cc (generated).
void RegisterCpuScorerFiles(CpuScorerTable& table);

}  // namespace kvtrim

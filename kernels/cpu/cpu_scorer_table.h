// The CPU implementations of the table scorers (ScorerKind::kTable), found by the scorer's
// registered name. Every file kernels/cpu/scorers/<stem>.cc defines
//   void RegisterCpuScorer_<stem>(CpuScorerTable& table);
// which adds its scorer; the build generates the one function that calls them all
// (RegisterCpuScorerFiles, kernels/CMakeLists.txt), so a new file needs no other edit.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/params.h"
#include "kernels/scorer_table.h"
#include "kernels/thread_pool.h"

namespace kvtrim {

/// Signature of a CPU scorer (see scorers.h): writes scores [H_kv, n] fp32, without
/// protection, deterministic whatever the thread count.
using CpuScoreFn = absl::Status (*)(const CpuLayer&, const ResolvedParams&, ThreadPool&, float*);

/// The full attention outputs of the window rows a fast scorer computed on the way (DropKV),
/// kept for the perturbation statistic over the same rows.
struct FastRowOutputs {
  int64_t rows_per_head = 0;   // the last rows of each query head they cover (0: none)
  std::vector<float> outputs;  // [H_kv, G * rows_per_head, d] (FastDropKVCost's layout)
};

/// A fast scorer that also keeps the outputs of the window rows it scored in *rows.
using CpuScoreRowsFn = absl::Status (*)(const CpuLayer&, const ResolvedParams&, ThreadPool&,
                                        float*, FastRowOutputs* rows);

/// One scorer's CPU implementations.
struct CpuScorer {
  CpuScoreFn exact = nullptr;  // the canonical arithmetic (kernels/canonical_math.h)
  CpuScoreFn fast = nullptr;   // fast numerics (docs/numerics.md); nullptr: exact only
  /// `fast` that also returns its window rows' outputs (a scorer that forms them, DropKV);
  /// nullptr: the backend computes the perturbation statistic's rows itself.
  CpuScoreRowsFn fast_with_rows = nullptr;

  static constexpr const char* kBackend = "CPU";  // names the backend in ScorerTable's messages
  /// True when the exact scorer is set (ScorerTable refuses an entry without it).
  bool HasExact() const { return exact != nullptr; }
};

/// Scorer name -> CpuScorer (kernels/scorer_table.h).
using CpuScorerTable = ScorerTable<CpuScorer>;

/// The table of every file in kernels/cpu/scorers/ (built on first use).
template <>
const CpuScorerTable& CpuScorerTable::Builtin();

/// Calls RegisterCpuScorer_<stem>(table) for every kernels/cpu/scorers/<stem>.cc (generated).
void RegisterCpuScorerFiles(CpuScorerTable& table);

}  // namespace kvtrim

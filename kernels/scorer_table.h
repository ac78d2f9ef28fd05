// ScorerTable<Scorer>: a backend's table scorers (ScorerKind::kTable), found by the scorer's
// registered name. Each backend instantiates it with its own implementation struct:
// CpuScorerTable (kernels/cpu/cpu_scorer_table.h) and gpu::GpuScorerTable
// (kernels/gpu/kernels/gpu_scorer_table.h), and defines its Builtin(), which fills the table
// from the backend's generated list of scorer files.
//
// `Scorer` provides
//   static constexpr const char* kBackend;  // "CPU", "GPU": names the backend in messages
//   bool HasExact() const;                  // a table entry needs its exact implementation
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtrim {

/// Scorer name -> `Scorer`. Filled once (Builtin: on first use); read-only and thread-safe
/// after.
template <typename Scorer>
class ScorerTable {
 public:
  /// Adds `scorer` under `name`; false (and no change) when the name is taken or the exact
  /// implementation is missing.
  bool Add(std::string name, Scorer scorer) {
    if (!scorer.HasExact() || scorers_.count(name) != 0) return false;
    scorers_.emplace(std::move(name), std::move(scorer));
    return true;
  }

  /// Add, from a scorer file's registration: a refusal is a build error (two files claim one
  /// name, or one registers no exact implementation), so it aborts with the name.
  void Register(std::string name, Scorer scorer) {
    if (Add(name, std::move(scorer))) return;
    std::fprintf(stderr, "kvtrim: %s scorer '%s' registered twice or without exact code\n",
                 Scorer::kBackend, name.c_str());
    std::abort();
  }

  /// The scorer registered as `name`, or nullptr.
  const Scorer* Find(std::string_view name) const {
    auto it = scorers_.find(name);
    return it == scorers_.end() ? nullptr : &it->second;
  }

  /// Every registered name, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    names.reserve(scorers_.size());
    for (const auto& entry : scorers_) names.push_back(entry.first);
    return names;
  }

  /// The table of every scorer file of the backend (built on first use); each backend
  /// defines it in its table's .cc.
  static const ScorerTable& Builtin();

 private:
  std::map<std::string, Scorer, std::less<>> scorers_;
};

}  // namespace kvtrim

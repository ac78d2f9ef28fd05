#include "kernels/cpu/cpu_scorer_table.h"

#include <cstdio>
#include <cstdlib>

namespace kvtrim {

bool CpuScorerTable::Add(std::string name, CpuScorer scorer) {
  if (scorer.exact == nullptr || scorers_.count(name) != 0) return false;
  scorers_.emplace(std::move(name), scorer);
  return true;
}

void CpuScorerTable::Register(std::string name, CpuScorer scorer) {
  if (Add(name, scorer)) return;
  std::fprintf(stderr, "kvtrim: CPU scorer '%s' registered twice or without an exact scorer\n",
               name.c_str());
  std::abort();
}

const CpuScorer* CpuScorerTable::Find(std::string_view name) const {
  auto it = scorers_.find(name);
  return it == scorers_.end() ? nullptr : &it->second;
}

std::vector<std::string> CpuScorerTable::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, scorer] : scorers_) names.push_back(name);
  return names;
}

const CpuScorerTable& CpuScorerTable::Builtin() {
  static const CpuScorerTable* const table = [] {
    auto* t = new CpuScorerTable();
    RegisterCpuScorerFiles(*t);
    return t;
  }();
  return *table;
}

}  // namespace kvtrim

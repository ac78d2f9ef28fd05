#include "kernels/gpu/kernels/gpu_scorer_table.h"

#include <cstdio>
#include <cstdlib>

namespace kvtrim::gpu {

bool GpuScorerTable::Add(std::string name, GpuScorer scorer) {
  if (scorer.exact.launch == nullptr || scorers_.count(name) != 0) return false;
  scorers_.emplace(std::move(name), scorer);
  return true;
}

void GpuScorerTable::Register(std::string name, GpuScorer scorer) {
  if (Add(name, scorer)) return;
  std::fprintf(stderr, "kvtrim: GPU scorer '%s' registered twice or without exact kernels\n",
               name.c_str());
  std::abort();
}

const GpuScorer* GpuScorerTable::Find(std::string_view name) const {
  auto it = scorers_.find(name);
  return it == scorers_.end() ? nullptr : &it->second;
}

std::vector<std::string> GpuScorerTable::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, scorer] : scorers_) names.push_back(name);
  return names;
}

const GpuScorerTable& GpuScorerTable::Builtin() {
  static const GpuScorerTable* const table = [] {
    auto* t = new GpuScorerTable();
    RegisterGpuScorerFiles(*t);
    return t;
  }();
  return *table;
}

}  // namespace kvtrim::gpu

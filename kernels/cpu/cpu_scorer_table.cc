#include "kernels/cpu/cpu_scorer_table.h"

namespace kvtrim {

template <>
const CpuScorerTable& CpuScorerTable::Builtin() {
  static const CpuScorerTable* const table = [] {
    auto* t = new CpuScorerTable();
    RegisterCpuScorerFiles(*t);
    return t;
  }();
  return *table;
}

}  // namespace kvtrim

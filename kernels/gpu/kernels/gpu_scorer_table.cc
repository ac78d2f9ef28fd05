#include "kernels/gpu/kernels/gpu_scorer_table.h"

namespace kvtrim {

template <>
const gpu::GpuScorerTable& gpu::GpuScorerTable::Builtin() {
  static const gpu::GpuScorerTable* const table = [] {
    auto* t = new gpu::GpuScorerTable();
    gpu::RegisterGpuScorerFiles(*t);
    return t;
  }();
  return *table;
}

}  // namespace kvtrim

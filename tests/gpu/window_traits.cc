// WindowTraitsOf (window_traits.h): read from the GPU scorer table.
#include "tests/gpu/window_traits.h"

#include "gtest/gtest.h"
#include "kernels/gpu/kernels/gpu_scorer_table.h"

namespace kvtrim::gpu::testing {

const WindowAttentionTraits& WindowTraitsOf(const std::string& name) {
  const GpuScorer* scorer = GpuScorerTable::Builtin().Find(name);
  if (scorer == nullptr || scorer->window_attention == nullptr) {
    ADD_FAILURE() << "'" << name << "' is not a window-attention scorer of the GPU table";
    static const WindowAttentionTraits kNone;
    return kNone;
  }
  return *scorer->window_attention;
}

}  // namespace kvtrim::gpu::testing

#include "kernels/cpu/fast/fast_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace kvtrim {

namespace {

constexpr int64_t kDefaultSlabBytes = int64_t{8} << 20;
std::atomic<int64_t> max_slab_bytes{kDefaultSlabBytes};

}  // namespace

int64_t MaxSlabBytes() { return max_slab_bytes.load(std::memory_order_relaxed); }

void SetCpuSlabBytesForTest(int64_t bytes) { max_slab_bytes = bytes; }

void SeenRows(const std::vector<int64_t>& visible, int64_t r0, int64_t rows, int64_t j0,
              int64_t count, float* seen) {
  for (int64_t r = 0; r < rows; ++r) {
    seen[r] = static_cast<float>(std::clamp<int64_t>(visible[r0 + r] - j0, 0, count));
  }
}

void CombineTiles(const float* tile_max, const float* tile_sum, int64_t tiles, int64_t stride,
                  int64_t rows, float* neg_max, float* inv_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float m = -HUGE_VALF;
    for (int64_t t = 0; t < tiles; ++t) m = std::max(m, tile_max[t * stride + r]);
    double z = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const float s = tile_sum[t * stride + r];
      if (s > 0.0f) z += static_cast<double>(s) * std::exp(tile_max[t * stride + r] - m);
    }
    neg_max[r] = z > 0 ? -m : 0.0f;
    inv_sum[r] = z > 0 ? static_cast<float>(1.0 / z) : 0.0f;
  }
}

void TileFactors(const float* tile_max, const float* tile_sum, int64_t tiles, int64_t stride,
                 int64_t rows, const float* neg_max, const float* inv_sum, float* factors) {
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = t * stride + r;
      factors[i] = tile_sum[i] > 0.0f ? std::exp(tile_max[i] + neg_max[r]) * inv_sum[r] : 0.0f;
    }
  }
}

std::string FastCpuTarget() {
  hwy::ChosenTarget& chosen = hwy::GetChosenTarget();
  if (!chosen.IsInitialized()) chosen.Update(hwy::SupportedTargets());
  // The best target both supported and compiled, as the dispatch picks it.
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);
}

void SetCpuSimdLimitForTest(CpuSimdLimit limit) {
  int64_t mask = 0;  // 0: the CPU's own targets
  if (limit == CpuSimdLimit::kAvx2) mask = HWY_AVX2 | HWY_SSE4 | HWY_SSSE3 | HWY_SCALAR;
  if (limit == CpuSimdLimit::kScalar) mask = HWY_SCALAR;
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace kvtrim

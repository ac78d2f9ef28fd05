// FirstNonFinite: the first NaN / Inf index of a host tensor, the same whatever the number
// of threads scanning it and wherever the ranges split.
#include "kernels/finite_scan.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace kvtrim {
namespace {

/// A [1, 1, count] view over `words`.
template <typename Word>
TensorView ViewOf(const std::vector<Word>& words, DType dtype) {
  TensorView t;
  t.data = words.data();
  t.dtype = dtype;
  t.shape = {1, 1, static_cast<int64_t>(words.size())};
  return t;
}

TEST(FiniteScan, FirstBadElementWhateverTheThreads) {
  // Above kParallelScanBytes, an odd length so that the last range is short.
  const int64_t count = (kParallelScanBytes / 2) * 3 + 4097;
  std::vector<uint16_t> bf16(static_cast<size_t>(count), 0x3F80);  // 1.0
  const TensorView view = ViewOf(bf16, DType::kBF16);
  for (int threads : {1, 2, 3, 7, 8}) EXPECT_EQ(FirstNonFinite(view, threads), -1) << threads;
  // Bad elements at range and block edges: the first one is found, later ones ignored.
  for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, count / 3, count / 2 + 1,
                     count - 1}) {
    std::vector<uint16_t> data = bf16;
    data[static_cast<size_t>(at)] = 0x7FC0;  // NaN
    if (at + 5 < count) data[static_cast<size_t>(at + 5)] = 0x7F80;     // +Inf after it
    data[static_cast<size_t>(count - 1)] = data[static_cast<size_t>(count - 1)] == 0x3F80
                                               ? 0xFF80  // -Inf at the very end
                                               : data[static_cast<size_t>(count - 1)];
    const TensorView bad = ViewOf(data, DType::kBF16);
    for (int threads : {1, 2, 3, 7, 8}) {
      EXPECT_EQ(FirstNonFinite(bad, threads), at) << "at " << at << ", " << threads << " threads";
    }
    EXPECT_EQ(FirstNonFinite(bad), at) << "at " << at << ", the host's threads";
  }
}

TEST(FiniteScan, EveryDtypeAndSmallTensors) {
  std::vector<float> f32(100, 1.0f);
  EXPECT_EQ(FirstNonFinite(ViewOf(f32, DType::kF32)), -1);
  f32[42] = std::numeric_limits<float>::infinity();
  f32[77] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(ViewOf(f32, DType::kF32), 4), 42);
  std::vector<uint16_t> f16(static_cast<size_t>(kParallelScanBytes), 0x3C00);  // 1.0, 16 MiB
  f16[f16.size() - 3] = 0x7C00;  // +Inf
  EXPECT_EQ(FirstNonFinite(ViewOf(f16, DType::kF16), 5), static_cast<int64_t>(f16.size()) - 3);
  // The largest finite values are not flagged (exponent not all ones).
  EXPECT_EQ(FirstNonFinite(ViewOf(std::vector<uint16_t>{0x7BFF}, DType::kF16)), -1);
  EXPECT_EQ(FirstNonFinite(ViewOf(std::vector<uint16_t>{0x7F7F}, DType::kBF16)), -1);
  std::vector<float> empty;
  EXPECT_EQ(FirstNonFinite(ViewOf(empty, DType::kF32)), -1);
}

}  // namespace
}  // namespace kvtrim

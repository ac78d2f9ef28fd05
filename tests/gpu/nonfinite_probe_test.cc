// LaunchFindFirstNonFinite (device_inputs.h): the lowest index of a NaN or Inf in a dense
// device tensor, for every dtype, sizes around the 16-byte vectors, starts that are not
// 16-byte aligned, one bad element anywhere or several (the lowest wins), and none.
// Skips without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "base/dtype.h"
#include "kernels/gpu/kernels/device_inputs.h"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

/// Host bytes of `count` elements of `dtype`, all 1.0, with NaN at each of `bad` (or +Inf
/// at odd positions of the list).
std::vector<uint8_t> Elements(DType dtype, int64_t count, const std::vector<int64_t>& bad) {
  const size_t size = DTypeSize(dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * size);
  auto put = [&](int64_t i, float value) {
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + i * size, &value, 4);
      return;
    }
    uint16_t bits;
    if (dtype == DType::kBF16) {
      uint32_t f;
      std::memcpy(&f, &value, 4);
      bits = static_cast<uint16_t>(f >> 16);
    } else {
      bits = std::isnan(value) ? 0x7E00 : (std::isinf(value) ? 0x7C00 : 0x3C00);  // f16 1.0
    }
    std::memcpy(bytes.data() + i * size, &bits, 2);
  };
  for (int64_t i = 0; i < count; ++i) put(i, 1.0f);
  for (size_t k = 0; k < bad.size(); ++k) {
    put(bad[k], k % 2 == 0 ? std::numeric_limits<float>::quiet_NaN()
                           : std::numeric_limits<float>::infinity());
  }
  return bytes;
}

/// Checks every dtype, the sizes `counts`, three alignments and several placements.
void ExpectLowestBadIndex(const std::vector<int64_t>& counts) {
  DeviceBuffer result(sizeof(unsigned long long));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
    for (int64_t count : counts) {
      for (int64_t shift : {0, 1, 3}) {  // elements past a 256-byte aligned allocation
        std::vector<std::vector<int64_t>> cases = {
            {}, {0}, {count - 1}, {count / 2}, {count - 1, count / 3}};
        if (count > 9) cases.push_back({count - 2, 5, 9});
        for (const std::vector<int64_t>& bad : cases) {
          const std::vector<uint8_t> host = Elements(dtype, count, bad);
          DeviceBuffer data(host.size() + 64);
          char* at = data.as<char>() + shift * size;
          ASSERT_EQ(cudaMemcpy(at, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(LaunchFindFirstNonFinite(at, dtype, count,
                                             result.as<unsigned long long>(), nullptr),
                    cudaSuccess);
          unsigned long long got = 0;
          ASSERT_EQ(cudaMemcpy(&got, result.get(), sizeof got, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          unsigned long long want = ~0ull;
          for (int64_t i : bad) want = std::min(want, static_cast<unsigned long long>(i));
          EXPECT_EQ(got, want) << DTypeName(dtype) << " count " << count << " shift " << shift
                               << " bad " << bad.size();
        }
      }
    }
  }
}

TEST(NonFiniteProbe, LowestBadIndexForEveryDtypeSizeAndAlignment) {
  KVTRIM_SKIP_WITHOUT_GPU();
  ExpectLowestBadIndex({1, 7, 8, 9, 31, 1000, (1 << 20) + 3});
}

// Small sizes for compute-sanitizer (scripts/gpu_run.sh).
TEST(NonFiniteProbeSanitizer, SmallSizes) {
  KVTRIM_SKIP_WITHOUT_GPU();
  ExpectLowestBadIndex({1, 9, 77});
}

}  // namespace
}  // namespace kvtrim::gpu::testing

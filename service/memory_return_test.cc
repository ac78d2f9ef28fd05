// MemoryTrimmer trims on its period and stops promptly; TuneAllocator leaves an operator's
// MALLOC_MMAP_THRESHOLD_ alone.
#include "service/memory_return.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace kvtrim::service {
namespace {

TEST(MemoryTrimmerTest, TrimsOnItsPeriodAndStopsAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  {
    MemoryTrimmer trimmer(std::chrono::milliseconds(5));
    for (int i = 0; i < 400 && trimmer.trims() < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(trimmer.trims(), 3);
  }
  {
    MemoryTrimmer idle(std::chrono::hours(1));  // destroyed long before its first trim
    EXPECT_EQ(idle.trims(), 0);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(MemoryTrimmerTest, CallsItsHookBeforeEveryTrim) {
  std::atomic<int> hooks{0};
  MemoryTrimmer trimmer(std::chrono::milliseconds(5), [&hooks] { hooks.fetch_add(1); });
  for (int i = 0; i < 400 && trimmer.trims() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int trims = trimmer.trims();
  EXPECT_GE(trims, 3);
  EXPECT_GE(hooks.load(), trims);  // the hook runs first
}

}  // namespace
}  // namespace kvtrim::service

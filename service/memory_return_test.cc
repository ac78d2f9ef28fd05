// MemoryTrimmer trims on its period, calls its hooks around each trim and stops promptly;
// ReadHeapUsage sees allocations of both kinds (arena and mmap).
#include "service/memory_return.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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

TEST(MemoryTrimmerTest, CallsItsAfterHookAfterEveryTrim) {
  std::atomic<int> after{0};
  MemoryTrimmer trimmer(std::chrono::milliseconds(5), nullptr, [&after] { after.fetch_add(1); });
  for (int i = 0; i < 400 && after.load() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(after.load(), 3);
  EXPECT_LE(after.load(), trimmer.trims() + 1);  // it follows its trim
}

TEST(HeapUsageTest, SeesArenaAndMmapAllocations) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocator replaces glibc malloc, whose figures these are";
#endif
  TuneAllocator();  // allocations of 256 KiB and more are mmapped
  const HeapUsage before = ReadHeapUsage();
  // 4 MiB in 64-byte arena chunks (written, so they are really allocated), and one 8 MiB
  // block (mmapped).
  std::vector<std::unique_ptr<char[]>> small(65536);
  for (auto& chunk : small) {
    chunk.reset(new char[64]);
    std::memset(chunk.get(), 1, 64);
  }
  std::unique_ptr<char[]> large(new char[size_t{8} << 20]);
  std::memset(large.get(), 1, size_t{8} << 20);
  const HeapUsage during = ReadHeapUsage();
  EXPECT_GE(during.in_use_bytes, before.in_use_bytes + (size_t{4} << 20));
  EXPECT_GE(during.mmapped_bytes, before.mmapped_bytes + (size_t{8} << 20));
  large.reset();
  EXPECT_LE(ReadHeapUsage().mmapped_bytes, during.mmapped_bytes - (size_t{8} << 20));
}

}  // namespace
}  // namespace kvtrim::service

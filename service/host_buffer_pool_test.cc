// HostBufferPool: finished layers' buffers are handed to the next ones (same memory), small
// buffers bypass the pool, the idle cap and the fit rule hold, buffers outlive the pool's
// last outside reference, pooled buffers are page-locked once within the lock cap, and the
// buffer given back last is reused first, so that a burst's surplus expires.
#include "service/host_buffer_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

namespace kvtrim::service {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(HostBufferPoolTest, AFinishedBufferIsReusedForTheNextLayer) {
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB);
  const uint32_t* first = nullptr;
  {
    HostBuffer buffer = pool->Acquire(5 * kMiB);
    ASSERT_TRUE(buffer);
    EXPECT_GE(buffer.capacity_bytes(), 5 * kMiB);
    EXPECT_EQ(buffer.capacity_bytes() % HostBufferPool::kGranuleBytes, 0u);
    first = buffer.get();
    EXPECT_EQ(pool->in_use_bytes(), 6 * kMiB);
  }
  EXPECT_EQ(pool->idle_bytes(), 6 * kMiB);  // 5 MiB rounded up to the 2 MiB granule
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  HostBuffer again = pool->Acquire(5 * kMiB + 3);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->reused(), 1u);
  EXPECT_EQ(pool->idle_bytes(), 0u);
  EXPECT_EQ(pool->in_use_bytes(), 6 * kMiB);
}

TEST(HostBufferPoolTest, SmallBuffersComeFromTheHeapAndAreNotKept) {
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB);
  {
    HostBuffer small = pool->Acquire(1000);
    ASSERT_TRUE(small);
    EXPECT_EQ(pool->in_use_bytes(), 0u);  // the pool counts only its own buffers
  }
  EXPECT_EQ(pool->idle_bytes(), 0u);
  HostBuffer none = AcquireHostBuffer(nullptr, 8 * kMiB);  // no pool: the heap
  ASSERT_TRUE(none);
  EXPECT_GE(none.capacity_bytes(), 8 * kMiB);
}

TEST(HostBufferPoolTest, IdleCapAndFitRule) {
  auto pool = std::make_shared<HostBufferPool>(10 * kMiB);
  {
    HostBuffer a = pool->Acquire(8 * kMiB);
    HostBuffer b = pool->Acquire(8 * kMiB);
  }
  EXPECT_EQ(pool->idle_bytes(), 8 * kMiB);  // the second one would pass the 10 MiB cap
  // An 8 MiB idle buffer is not spent on a 2 MiB request (more than twice its size)...
  HostBuffer small = pool->Acquire(2 * kMiB);
  EXPECT_EQ(pool->reused(), 0u);
  EXPECT_EQ(pool->idle_bytes(), 8 * kMiB);
  // ...but serves a 4 MiB one.
  HostBuffer fits = pool->Acquire(4 * kMiB + 1);
  EXPECT_EQ(pool->reused(), 1u);
}

TEST(HostBufferPoolTest, BuffersOutliveThePoolsLastOutsideReference) {
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB);
  HostBuffer kept = pool->Acquire(4 * kMiB);
  pool.reset();  // the buffer still holds the pool
  kept.get()[0] = 7;
  EXPECT_EQ(kept.get()[0], 7u);
}  // released into the pool, then both are freed

TEST(HostBufferPoolTest, ConcurrentLayersShareThePool) {
  auto pool = std::make_shared<HostBufferPool>(256 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([pool, t] {
      for (int i = 0; i < 200; ++i) {
        HostBuffer buffer = pool->Acquire((2 + (i + t) % 5) * kMiB);
        buffer.get()[0] = static_cast<uint32_t>(i);
        HostBuffer moved = std::move(buffer);
        EXPECT_EQ(moved.get()[0], static_cast<uint32_t>(i));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_GT(pool->reused(), 0u);
  EXPECT_LE(pool->idle_bytes(), 256 * kMiB);
  EXPECT_EQ(pool->in_use_bytes(), 0u);  // every buffer given back
}

/// A stand-in for the devices' page-locking: records what is locked; refuses when told to.
struct FakeLocker {
  std::set<void*> locked;
  int locks = 0, unlocks = 0;
  bool refuse = false;
  HostMemoryLocker Locker() {
    return {[this](void* data, size_t) {
              if (refuse) return false;
              ++locks;
              return locked.insert(data).second;
            },
            [this](void* data) {
              ++unlocks;
              EXPECT_EQ(locked.erase(data), 1u) << "unlocking memory that is not locked";
            }};
  }
};

TEST(HostBufferPoolTest, PooledBuffersArePageLockedOnceWithinTheLockCap) {
  FakeLocker fake;
  {
    // Idle cap 16 MiB, lock cap 20 MiB.
    auto pool = std::make_shared<HostBufferPool>(16 * kMiB, kMiB, fake.Locker(), 20 * kMiB);
    HostBuffer small = pool->Acquire(kMiB / 2);  // from the heap: never locked
    EXPECT_FALSE(small.page_locked());
    HostBuffer a = pool->Acquire(8 * kMiB);
    HostBuffer b = pool->Acquire(8 * kMiB);
    HostBuffer c = pool->Acquire(8 * kMiB);  // past the lock cap: pageable
    EXPECT_TRUE(a.page_locked());
    EXPECT_TRUE(b.page_locked());
    EXPECT_FALSE(c.page_locked());
    EXPECT_EQ(pool->locked_bytes(), 16 * kMiB);
    EXPECT_EQ(fake.locks, 2);
    uint32_t* a_words = a.get();
    a = HostBuffer();  // idle, still locked
    HostBuffer again = pool->Acquire(8 * kMiB);
    EXPECT_EQ(again.get(), a_words);
    EXPECT_TRUE(again.page_locked());
    EXPECT_EQ(fake.locks, 2);  // reused, not locked again
    again = HostBuffer();
    b = HostBuffer();
    c = HostBuffer();  // past the idle cap (16 MiB idle already): freed
    EXPECT_EQ(pool->idle_bytes(), 16 * kMiB);
    fake.refuse = true;  // the driver refuses: the buffer stays pageable
    HostBuffer d = pool->Acquire(30 * kMiB);
    EXPECT_FALSE(d.page_locked());
    EXPECT_EQ(pool->locked_bytes(), 16 * kMiB);
  }
  // The pool's idle buffers are unlocked before they are freed.
  EXPECT_EQ(fake.unlocks, 2);
  EXPECT_TRUE(fake.locked.empty());
}

TEST(HostBufferPoolTest, ALockedBufferPastTheIdleCapIsUnlockedWhenFreed) {
  FakeLocker fake;
  auto pool = std::make_shared<HostBufferPool>(4 * kMiB, kMiB, fake.Locker(), 64 * kMiB);
  {
    HostBuffer big = pool->Acquire(8 * kMiB);
    EXPECT_TRUE(big.page_locked());
  }
  EXPECT_EQ(pool->idle_bytes(), 0u);
  EXPECT_EQ(pool->locked_bytes(), 0u);
  EXPECT_EQ(fake.unlocks, 1);
  EXPECT_TRUE(fake.locked.empty());
}

TEST(HostBufferPoolTest, BuffersIdleLongerThanTheLifetimeAreFreedAndUnlocked) {
  FakeLocker fake;
  using Clock = HostBufferPool::Clock;
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB, kMiB, fake.Locker(), 64 * kMiB,
                                               std::chrono::seconds(30));
  HostBuffer old_one = pool->Acquire(4 * kMiB);
  HostBuffer recent = pool->Acquire(8 * kMiB);
  old_one = HostBuffer();
  const auto old_since = Clock::now();
  recent = HostBuffer();
  EXPECT_EQ(pool->idle_bytes(), 12 * kMiB);
  EXPECT_EQ(pool->ExpireIdle(old_since + std::chrono::seconds(29)), 0u);  // not yet
  // Both idle past 30 s by now + 31 s; the 4 MiB one certainly, the 8 MiB one too.
  EXPECT_EQ(pool->ExpireIdle(Clock::now() + std::chrono::seconds(31)), 12 * kMiB);
  EXPECT_EQ(pool->idle_bytes(), 0u);
  EXPECT_EQ(pool->locked_bytes(), 0u);
  EXPECT_EQ(fake.unlocks, 2);
  EXPECT_TRUE(fake.locked.empty());
  // A buffer in use is never expired, and a reused one starts its idle time again.
  HostBuffer in_use = pool->Acquire(2 * kMiB);
  EXPECT_EQ(pool->ExpireIdle(Clock::now() + std::chrono::hours(1)), 0u);
  in_use = HostBuffer();
  EXPECT_EQ(pool->idle_bytes(), 2 * kMiB);
}

TEST(HostBufferPoolTest, ABurstsSurplusExpiresWhileOneBufferStaysInSteadyUse) {
  using Clock = HostBufferPool::Clock;
  const auto lifetime = std::chrono::seconds(1);
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB, kMiB, HostMemoryLocker{}, 0,
                                               lifetime);
  {
    std::vector<HostBuffer> burst;  // four layers at once
    for (int i = 0; i < 4; ++i) burst.push_back(pool->Acquire(4 * kMiB));
  }
  EXPECT_EQ(pool->idle_bytes(), 16 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto steady_from = Clock::now();
  // Then one layer at a time, three times: each takes the buffer given back last, so the
  // same one serves them all and the other three stay idle since the burst.
  std::set<const uint32_t*> used;
  for (int i = 0; i < 3; ++i) {
    HostBuffer one = pool->Acquire(4 * kMiB);
    used.insert(one.get());
  }
  EXPECT_EQ(used.size(), 1u);
  EXPECT_EQ(pool->reused(), 3u);
  EXPECT_EQ(pool->ExpireIdle(steady_from + lifetime), 12 * kMiB);
  EXPECT_EQ(pool->idle_bytes(), 4 * kMiB);
}

TEST(HostBufferPoolTest, ZeroLifetimeKeepsIdleBuffers) {
  auto pool = std::make_shared<HostBufferPool>(64 * kMiB);
  { HostBuffer b = pool->Acquire(4 * kMiB); }
  EXPECT_EQ(pool->ExpireIdle(HostBufferPool::Clock::now() + std::chrono::hours(24)), 0u);
  EXPECT_EQ(pool->idle_bytes(), 4 * kMiB);
}

}  // namespace
}  // namespace kvtrim::service

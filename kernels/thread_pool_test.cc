// ThreadPool: every index runs once, on the pool's threads only (never the caller's), nested
// loops run inline, and concurrent callers each get their whole loop.
#include "kernels/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtrim {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsOnceOnThePoolsThreadsOnly) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads > 1 ? threads : 1);
    for (int64_t count : {1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> calls(count);
      std::mutex mutex;
      std::set<std::thread::id> ran_on;
      pool.ParallelFor(count, [&](int64_t i) {
        calls[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        ran_on.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < count; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
      EXPECT_EQ(ran_on.count(std::this_thread::get_id()), 0u) << "count " << count;
      EXPECT_LE(ran_on.size(), static_cast<size_t>(pool.num_threads()));
    }
  }
}

TEST(ThreadPoolTest, NestedLoopsRunInlineOnTheBodysThread) {
  ThreadPool pool(2);
  std::atomic<int> inner_elsewhere{0};
  std::atomic<int> inner_calls{0};
  pool.ParallelFor(4, [&](int64_t) {
    const auto outer = std::this_thread::get_id();
    pool.ParallelFor(3, [&](int64_t) {
      inner_calls.fetch_add(1);
      if (std::this_thread::get_id() != outer) inner_elsewhere.fetch_add(1);
    });
  });
  EXPECT_EQ(inner_calls.load(), 12);
  EXPECT_EQ(inner_elsewhere.load(), 0);
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirWholeLoop) {
  ThreadPool pool(2);
  std::vector<std::thread> callers;
  std::vector<int64_t> sums(6, 0);
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&pool, &sums, c] {
      for (int round = 0; round < 50; ++round) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(100, [&sum](int64_t i) { sum.fetch_add(i); });
        sums[c] += sum.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int64_t sum : sums) EXPECT_EQ(sum, 50 * 4950);
}

TEST(ThreadPoolTest, OneChunkLoopsOfConcurrentCallersRunAtTheSameTime) {
  // Each body waits (bounded) for the other: a pool running one loop at a time fails this.
  ThreadPool pool(2);
  std::mutex mutex;
  std::condition_variable arrived;
  int inside = 0;
  auto body = [&](int64_t) {
    std::unique_lock<std::mutex> lock(mutex);
    ++inside;
    arrived.notify_all();
    return arrived.wait_for(lock, std::chrono::seconds(5), [&] { return inside == 2; });
  };
  bool met[2] = {false, false};
  std::thread other([&] { pool.ParallelFor(1, [&](int64_t i) { met[0] = body(i); }); });
  pool.ParallelFor(1, [&](int64_t i) { met[1] = body(i); });
  other.join();
  EXPECT_TRUE(met[0]);
  EXPECT_TRUE(met[1]);
}

TEST(ThreadPoolTest, EmptyLoopCallsNothing) {
  ThreadPool pool(2);
  int calls = 0;
  pool.ParallelFor(0, [&calls](int64_t) { ++calls; });
  pool.ParallelFor(-3, [&calls](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace kvtrim

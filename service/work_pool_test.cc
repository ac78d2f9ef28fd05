// WorkPool and SerialLane: order, the thread cap, idle threads exiting, a lane that its
// own task destroys.
#include "service/work_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtrim::service {
namespace {

using std::chrono::milliseconds;

TEST(WorkPoolTest, GrowsToItsCapAndNoFurther) {
  WorkPool pool(3);
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    pool.Post([&] {
      const int now = ++running;
      int seen = peak.load();
      while (now > seen && !peak.compare_exchange_weak(seen, now)) {
      }
      released.wait();
      --running;
      ++done;
    });
  }
  for (int i = 0; i < 200 && peak.load() < 3; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(peak.load(), 3);
  EXPECT_EQ(pool.threads(), 3);
  release.set_value();
  for (int i = 0; i < 400 && done.load() < 8; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(done.load(), 8);
  EXPECT_EQ(peak.load(), 3);
}

TEST(WorkPoolTest, IdleThreadsExit) {
  WorkPool pool(4, milliseconds(20));
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i) pool.Post([&] { ++done; });
  for (int i = 0; i < 400 && (done.load() < 4 || pool.threads() > 0); ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(done.load(), 4);
  EXPECT_EQ(pool.threads(), 0);
  pool.Post([&] { ++done; });  // a fresh thread starts for new work
  for (int i = 0; i < 400 && done.load() < 5; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(done.load(), 5);
}

TEST(WorkPoolTest, DestructorRunsEveryPostedTask) {
  std::atomic<int> done{0};
  {
    WorkPool pool(2);
    for (int i = 0; i < 50; ++i) {
      pool.Post([&] {
        std::this_thread::sleep_for(milliseconds(1));
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 50);
}

TEST(SerialLaneTest, RunsItsTasksInOrderOneAtATime) {
  WorkPool pool(8);
  SerialLane lane(pool);
  std::mutex mutex;
  std::vector<int> order;
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::promise<void> finished;
  constexpr int kTasks = 200;
  for (int i = 0; i < kTasks; ++i) {
    lane.Post([&, i] {
      if (++inside > 1) overlapped = true;
      {
        std::lock_guard<std::mutex> lock(mutex);
        order.push_back(i);
      }
      --inside;
      if (i == kTasks - 1) finished.set_value();
    });
  }
  ASSERT_EQ(finished.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(overlapped.load());
  ASSERT_EQ(order.size(), static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(SerialLaneTest, ATaskMayDestroyItsLane) {
  WorkPool pool(2);
  auto* lane = new SerialLane(pool);
  std::promise<void> finished;
  lane->Post([] {});
  lane->Post([lane, &finished] {
    delete lane;  // as a reactor deleting itself from its last task
    finished.set_value();
  });
  ASSERT_EQ(finished.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

TEST(SerialLaneTest, RunOrPostRunsInlineOnlyWhenIdle) {
  WorkPool pool(2);
  SerialLane lane(pool);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  lane.RunOrPost([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);  // idle: on the calling thread
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> busy_started;
  lane.Post([&] {
    busy_started.set_value();
    released.wait();
  });
  busy_started.get_future().wait();
  std::promise<std::thread::id> second;
  lane.RunOrPost([&] { second.set_value(std::this_thread::get_id()); });  // busy: queued
  release.set_value();
  auto ran = second.get_future();
  ASSERT_EQ(ran.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_NE(ran.get(), caller);
}

}  // namespace
}  // namespace kvtrim::service

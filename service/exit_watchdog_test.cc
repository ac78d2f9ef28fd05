// The drain's last resort: past --drain_timeout and a grace, kvtrimd exits whatever its
// handlers do (a handler blocked in a system call outlives every cancellation).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "gtest/gtest.h"
#include "service/server.h"

namespace kvtrim::service {
namespace {

TEST(ExitWatchdogDeathTest, EndsTheProcessPastItsDeadline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StartExitWatchdog(std::chrono::milliseconds(100), kExitDrainTimeout, std::cerr);
        std::this_thread::sleep_for(std::chrono::seconds(30));  // a handler that never returns
        std::exit(0);
      },
      ::testing::ExitedWithCode(kExitDrainTimeout),
      "calls still running past the drain deadline; exiting without them");
}

}  // namespace
}  // namespace kvtrim::service

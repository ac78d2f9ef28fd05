// Files a test writes live in a directory its own process owns, so tests that run at the same
// time (ctest -j, --schedule-random, --repeat) never read or overwrite each other's files.
#pragma once

#include <string>
#include <string_view>

namespace kvtrim::testing {

/// The directory this test process owns: made with mkdtemp under ::testing::TempDir() on
/// first use ("<TempDir>/kvtrim-test-XXXXXX"), removed with everything in it when the process
/// exits normally. ctest runs each discovered test in its own process, so this is one
/// directory per test. Aborts the process when the directory cannot be made.
const std::string& TestDir();

/// A path inside TestDir() that no other call in this process returns:
/// "<TestDir()>/<n>-<name>" with n counting calls. Nothing is created.
std::string TestPath(std::string_view name);

/// A fresh empty directory inside TestDir() ("<TestDir()>/<n>-<name>"), created.
std::string MakeTestSubdir(std::string_view name);

}  // namespace kvtrim::testing

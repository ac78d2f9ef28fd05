#include "tests/testing/test_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"

namespace kvtrim::testing {

namespace {

/// Owns the per-process directory: made on first use, removed at normal process exit by
/// the owning process only (a forked child that returns must not remove its parent's).
class ProcessTestDir {
 public:
  ProcessTestDir() : owner_(getpid()) {
    std::string base = ::testing::TempDir();
    if (base.empty()) base = "/tmp/";
    if (base.back() != '/') base.push_back('/');
    std::string pattern = base + "kvtrim-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "TestDir: mkdtemp %s: %s\n", pattern.c_str(), std::strerror(errno));
      std::abort();
    }
    path_ = pattern;
  }
  ~ProcessTestDir() {
    if (getpid() != owner_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  pid_t owner_;
  std::string path_;
};

std::atomic<int> next_name{0};

}  // namespace

const std::string& TestDir() {
  static ProcessTestDir dir;
  return dir.path();
}

std::string TestPath(std::string_view name) {
  const int n = ++next_name;
  return TestDir() + "/" + std::to_string(n) + "-" + std::string(name);
}

std::string MakeTestSubdir(std::string_view name) {
  const std::string path = TestPath(name);
  if (mkdir(path.c_str(), 0700) != 0) {
    std::fprintf(stderr, "MakeTestSubdir: mkdir %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  return path;
}

}  // namespace kvtrim::testing

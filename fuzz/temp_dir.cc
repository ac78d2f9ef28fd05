#include "fuzz/temp_dir.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace kvtrim::fuzz {

namespace {

std::string* temp_dir = nullptr;

void RemoveTempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(*temp_dir, ignored);
}

}  // namespace

const std::string& ProcessTempDir() {
  if (temp_dir != nullptr) return *temp_dir;
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                        "/kvtrim-fuzz-XXXXXX";
  std::vector<char> path(pattern.begin(), pattern.end());
  path.push_back('\0');
  if (::mkdtemp(path.data()) == nullptr) {
    std::perror("kvtrim fuzz: mkdtemp");
    std::abort();
  }
  temp_dir = new std::string(path.data());
  std::atexit(RemoveTempDir);
  return *temp_dir;
}

}  // namespace kvtrim::fuzz

// An anonymous in-memory file (memfd) with a path, for production readers that take a path
// (model files, calibration dumps): a fuzz target rewrites it with each input and passes
// Path(). Nothing is written to any file system; the file goes with the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvtrim::fuzz {

/// One memfd per object; not thread-safe.
class MemoryFile {
 public:
  /// Creates the memfd (aborts the process when it cannot: the target cannot run).
  MemoryFile();
  ~MemoryFile();
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  /// Replaces the file's contents with `data` [size] (aborts on an I/O error).
  void Write(const uint8_t* data, size_t size);

  /// "/proc/self/fd/<fd>": opens (a new description of) the file.
  const std::string& Path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace kvtrim::fuzz

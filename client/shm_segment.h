// A POSIX shared-memory segment the worker creates and owns, for the host_shm transport:
// kvtrimd opens it read-only by name (RegionLease::RegisterHostShm) and reads tensors in it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtrim {

/// OK when `name` is a valid segment name: "/" then 1..250 of [A-Za-z0-9._-] (the rule
/// kvtrimd enforces); INVALID_ARGUMENT naming `name` otherwise.
absl::Status ValidateShmName(const std::string& name);

/// A fresh segment name "/kvtrim-<prefix>-<pid>-<counter>", unique within this process
/// (the counter) and across processes of one node (the pid). Characters of `prefix` outside
/// [A-Za-z0-9._-] become '_'.
std::string UniqueShmName(const std::string& prefix);

/// A created, mapped (read-write) shared-memory segment. RAII: the destructor unmaps it and
/// removes its name (shm_unlink); a reader that already opened it keeps its mapping.
class SharedMemorySegment {
 public:
  /// Creates the segment `name` of `bytes` bytes (shm_open O_CREAT | O_EXCL | O_RDWR, mode
  /// 0600, ftruncate, mmap). INVALID_ARGUMENT for a bad name or `bytes` == 0;
  /// ALREADY_EXISTS when a segment of that name exists; the errno text otherwise.
  static absl::StatusOr<std::unique_ptr<SharedMemorySegment>> Create(const std::string& name,
                                                                     size_t bytes);

  ~SharedMemorySegment();
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;

  /// The mapped bytes [size()], zero-filled at creation.
  void* data() const { return data_; }
  /// Size of the segment in bytes.
  size_t size() const { return size_; }
  /// The shm_open name ("/...").
  const std::string& name() const { return name_; }

 private:
  SharedMemorySegment(std::string name, void* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  void* data_;
  size_t size_;
};

}  // namespace kvtrim

#include "client/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvtrim {
namespace {

constexpr size_t kMaxNameChars = 250;  // after the leading '/'

/// True for the characters a segment name may hold after its leading '/'.
bool IsNameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

/// An error status for a failed system call `call` on segment `name`, from errno `error`.
absl::Status ErrnoError(const char* call, const std::string& name, int error) {
  const std::string message = absl::StrCat(call, "(\"", name, "\"): ", std::strerror(error));
  switch (error) {
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::Status ValidateShmName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.size() - 1 > kMaxNameChars) {
    return absl::InvalidArgumentError(absl::StrCat("name: \"", name, "\" must be \"/\" then 1..",
                                                   kMaxNameChars, " of [A-Za-z0-9._-]"));
  }
  for (size_t i = 1; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(absl::StrCat("name: \"", name, "\" has character ",
                                                     static_cast<int>(name[i]), " at ", i,
                                                     "; allowed after \"/\": [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

std::string UniqueShmName(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  std::string clean = prefix;
  for (char& c : clean) {
    if (!IsNameChar(c)) c = '_';
  }
  return absl::StrCat("/kvtrim-", clean, "-", static_cast<int64_t>(getpid()), "-",
                      counter.fetch_add(1));
}

absl::StatusOr<std::unique_ptr<SharedMemorySegment>> SharedMemorySegment::Create(
    const std::string& name, size_t bytes) {
  KVTRIM_RETURN_IF_ERROR(ValidateShmName(name));
  if (bytes == 0) return absl::InvalidArgumentError("bytes: must be positive, got 0");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoError("shm_open", name, errno);
  // From here on the name exists: remove it again on every failure.
  auto fail = [&](const char* call) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoError(call, name, error);
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap");
  close(fd);  // the mapping keeps the segment open
  return std::unique_ptr<SharedMemorySegment>(new SharedMemorySegment(name, data, bytes));
}

SharedMemorySegment::~SharedMemorySegment() {
  munmap(data_, size_);
  shm_unlink(name_.c_str());
}

}  // namespace kvtrim

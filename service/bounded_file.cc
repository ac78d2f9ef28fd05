#include "service/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/client_text.h"

namespace kvtrim::service {

namespace {

/// Closes a descriptor when destroyed.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const char* flag, const std::string& path,
                                            size_t max_bytes) {
  const std::string quoted = QuoteClientText(path, 4096);  // an operator's path: whole
  FileDescriptor fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, ": cannot read ", quoted, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, ": ", quoted, " is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", quoted, " has ",
                                                   st.st_size, " bytes; at most ", max_bytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = read(fd.get(), text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--", flag, ": cannot read ", quoted, ": ",
          got < 0 ? std::strerror(errno) : "the file shrank while it was read"));
    }
    done += static_cast<size_t>(got);
  }
  return text;
}

}  // namespace kvtrim::service

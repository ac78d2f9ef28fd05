#include "service/port_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvtrim::service {

namespace {

/// UNAVAILABLE "--port_file: <what> '<path>': <strerror(errno)>".
absl::Status PortFileError(const char* what, const std::string& path, int error) {
  return absl::UnavailableError(
      absl::StrCat("--port_file: ", what, " '", path, "': ", std::strerror(error)));
}

}  // namespace

std::string FormatPortFile(const PortFileContents& contents) {
  return absl::StrCat("grpc=", contents.grpc_address, "\nmetrics=", contents.metrics_address,
                      "\n");
}

absl::Status WritePortFile(const std::string& path, const PortFileContents& contents) {
  const std::string temporary = absl::StrCat(path, ".tmp.", static_cast<long>(getpid()));
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return PortFileError("cannot create", temporary, errno);
  const std::string text = FormatPortFile(contents);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      close(fd);
      unlink(temporary.c_str());
      return PortFileError("cannot write", temporary, error);
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return PortFileError("cannot write", temporary, error);
  }
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return PortFileError("cannot rename to", path, error);
  }
  return absl::OkStatus();
}

void RemovePortFile(const std::string& path) { unlink(path.c_str()); }

}  // namespace kvtrim::service

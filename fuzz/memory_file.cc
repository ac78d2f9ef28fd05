#include "fuzz/memory_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace kvtrim::fuzz {

MemoryFile::MemoryFile() {
  fd_ = ::memfd_create("kvtrim-fuzz", MFD_CLOEXEC);
  if (fd_ < 0) {
    std::perror("kvtrim fuzz: memfd_create");
    std::abort();
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemoryFile::~MemoryFile() { ::close(fd_); }

void MemoryFile::Write(const uint8_t* data, size_t size) {
  if (::ftruncate(fd_, 0) != 0) {
    std::perror("kvtrim fuzz: ftruncate");
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::perror("kvtrim fuzz: pwrite");
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace kvtrim::fuzz

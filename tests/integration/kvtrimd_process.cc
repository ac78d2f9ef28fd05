#include "tests/integration/kvtrimd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/test_dir.h"

extern char** environ;

namespace kvtrim::testing {

int KvtrimdAddresses::metrics_port() const {
  const size_t colon = metrics.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(metrics.substr(colon + 1), &port)) return 0;
  return port;
}

absl::StatusOr<KvtrimdProcess> KvtrimdProcess::Start(const std::string& binary,
                                                     const std::vector<std::string>& args) {
  const std::string log_path = TestPath("kvtrimd.log");
  const std::string port_file = TestPath("kvtrimd.ports");
  std::vector<std::string> storage;
  storage.push_back(binary);
  storage.insert(storage.end(), args.begin(), args.end());
  storage.push_back(absl::StrCat("--port_file=", port_file));
  std::vector<char*> argv;
  for (std::string& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
  }
  return KvtrimdProcess(pid, log_path, port_file);
}

absl::StatusOr<KvtrimdAddresses> KvtrimdProcess::WaitUntilServing(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    // kvtrimd renames a complete file into place: whatever is there is whole.
    std::ifstream in(port_file_);
    if (in) {
      KvtrimdAddresses addresses;
      std::string line;
      while (std::getline(in, line)) {
        if (absl::StartsWith(line, "grpc=")) addresses.grpc = line.substr(5);
        if (absl::StartsWith(line, "metrics=")) addresses.metrics = line.substr(8);
      }
      if (addresses.grpc.empty()) {
        return absl::InternalError(absl::StrCat("port file ", port_file_, " has no grpc= line"));
      }
      return addresses;
    }
    if (!Running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("kvtrimd exited during start-up:\n", Log()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "kvtrimd not SERVING within ", absl::FormatDuration(timeout), ":\n", Log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

KvtrimdProcess::KvtrimdProcess(KvtrimdProcess&& other) noexcept
    : pid_(other.pid_),
      wait_status_(other.wait_status_),
      log_path_(std::move(other.log_path_)),
      port_file_(std::move(other.port_file_)) {
  other.pid_ = -1;
}

KvtrimdProcess::~KvtrimdProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool KvtrimdProcess::Running() {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, &wait_status_, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

absl::StatusOr<int> KvtrimdProcess::StopWith(int signal, absl::Duration timeout) {
  if (pid_ <= 0) return wait_status_;
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill: ", std::strerror(errno)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (!Running()) return wait_status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return absl::DeadlineExceededError(
      absl::StrCat("kvtrimd did not exit within ", absl::FormatDuration(timeout)));
}

std::string KvtrimdProcess::Log() const {
  std::ifstream in(log_path_);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace kvtrim::testing

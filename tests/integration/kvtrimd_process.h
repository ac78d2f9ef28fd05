// Runs the real kvtrimd binary as a child process for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtrim::testing {

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed).
absl::StatusOr<int> PickFreePort();

/// One kvtrimd child process, its stdout and stderr captured in a log file. The destructor
/// kills (SIGKILL) a child that is still running, so a failing test leaves nothing behind.
class KvtrimdProcess {
 public:
  /// Spawns `binary` with `args` (argv[1..]); output goes to `log_path`.
  static absl::StatusOr<KvtrimdProcess> Start(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              const std::string& log_path);

  KvtrimdProcess(KvtrimdProcess&& other) noexcept;
  KvtrimdProcess& operator=(KvtrimdProcess&&) = delete;
  KvtrimdProcess(const KvtrimdProcess&) = delete;
  ~KvtrimdProcess();

  /// True while the child has not exited (reaps it when it has).
  bool Running();

  /// Sends `signal` and waits up to `timeout` for the exit. Returns the wait status
  /// (for WIFEXITED / WEXITSTATUS); DEADLINE_EXCEEDED when it is still running (it is then
  /// killed with SIGKILL).
  absl::StatusOr<int> StopWith(int signal, absl::Duration timeout);

  /// Everything the child wrote so far.
  std::string Log() const;

  pid_t pid() const { return pid_; }

 private:
  KvtrimdProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_ = -1;    // -1 once reaped
  int wait_status_ = 0;
  std::string log_path_;
};

}  // namespace kvtrim::testing

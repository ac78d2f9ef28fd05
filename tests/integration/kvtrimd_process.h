// Runs the real kvtrimd binary as a child process for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtrim::testing {

/// The addresses a started kvtrimd reported in its --port_file.
struct KvtrimdAddresses {
  std::string grpc;     // what clients dial: "127.0.0.1:PORT" or "unix:PATH"
  std::string metrics;  // the exporter's "HOST:PORT"; empty when it is off
  /// The exporter's port (0 when it is off).
  int metrics_port() const;
};

/// One kvtrimd child process, its stdout and stderr captured in a log file in the test's own
/// directory (tests/testing/test_dir.h). It is started with a --port_file of its own, so a
/// test passes --listen=127.0.0.1:0 (or a unix socket in TestDir()) and learns the address
/// the server bound: no test picks a port and hopes nobody takes it first. The destructor
/// kills (SIGKILL) a child that is still running, so a failing test leaves nothing behind.
class KvtrimdProcess {
 public:
  /// Spawns `binary` with `args` (argv[1..]) and --port_file=<a fresh path in TestDir()>.
  static absl::StatusOr<KvtrimdProcess> Start(const std::string& binary,
                                              const std::vector<std::string>& args);

  /// Waits up to `timeout` for the port file (written once kvtrimd is SERVING) and returns
  /// what it says. FAILED_PRECONDITION (with the log) when the child exits first,
  /// DEADLINE_EXCEEDED (with the log) when the time runs out.
  absl::StatusOr<KvtrimdAddresses> WaitUntilServing(absl::Duration timeout);

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
  KvtrimdProcess(pid_t pid, std::string log_path, std::string port_file)
      : pid_(pid), log_path_(std::move(log_path)), port_file_(std::move(port_file)) {}

  pid_t pid_ = -1;    // -1 once reaped
  int wait_status_ = 0;
  std::string log_path_;
  std::string port_file_;
};

}  // namespace kvtrim::testing

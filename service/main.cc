// kvtrimd: the kvtrim sidecar daemon. Parses and validates flags (exit 2 on a bad flag),
// starts the server (exit 1 when it cannot start, e.g. --backend=gpu with no visible CUDA
// device), serves until SIGTERM/SIGINT, drains and exits 0; after a sticky CUDA error it
// turns NOT_SERVING, drains and exits 3 (kExitDeviceFailure).
#include <iostream>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "service/config.h"
#include "service/memory_return.h"
#include "service/server.h"
#include "version/build_version.h"

int main(int argc, char** argv) {
  using kvtrim::service::KvtrimVersion;
  kvtrim::service::TuneAllocator();
  absl::SetProgramUsageMessage(
      "kvtrimd: the kvtrim KV-cache eviction sidecar. Run `kvtrimd --help` for the flags.");
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return "kvtrimd " + kvtrim::VersionLine() + "\n"; };
  usage.contains_help_flags = [](absl::string_view file) {
    return file.find("service/config.") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);

  if (kvtrim::service::WantsHelp(argc, argv)) {
    std::cout << kvtrim::service::UsageText();
    return 0;
  }
  if (auto st = kvtrim::service::ParseCommandLineStrict(argc, argv); !st.ok()) {
    std::cerr << "kvtrimd: " << st.message() << std::endl;
    return 2;
  }
  absl::ParseCommandLine(argc, argv);  // --helpfull, --version, --flagfile
  auto config = kvtrim::service::ConfigFromFlags();
  if (!config.ok()) {
    std::cerr << "kvtrimd: " << config.status().message() << std::endl;
    return 2;
  }

  kvtrim::service::BlockShutdownSignals();
  auto server = kvtrim::service::Server::Start(*config, std::cout);
  if (!server.ok()) {
    std::cerr << "kvtrimd: cannot start: " << server.status().message() << std::endl;
    return 1;
  }
  // Every 10 s: host buffers idle too long freed, then freed heap memory back to the system
  // (no RSS creep under sustained load), then the memory figures published.
  kvtrim::service::Server* running = server->get();
  running->PublishMemoryMetrics();
  kvtrim::service::MemoryTrimmer trimmer(
      std::chrono::seconds(10), [running] { running->ExpireIdleBuffers(); },
      [running] { running->PublishMemoryMetrics(); });
  return kvtrim::service::RunUntilSignal(**server, std::cout);
}

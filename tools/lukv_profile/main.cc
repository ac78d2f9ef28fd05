// kvtrim-lukv-profile: builds an LU-KV profile offline (lukv.md §5.2) from a model bundle and
// calibration dumps, with the sidecar's own CPU scorers; see profile_command.h.
//
//   kvtrim-lukv-profile --model=BUNDLE --metric=snapkv --dumps=A,B --out=PROFILE.npy
//
// Exit codes, as the kvtrim CLI's: 0 ok, 1 the output could not be written, 2 usage error.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "client/cli/flag_parse.h"
#include "tools/lukv_profile/profile_command.h"

int main(int argc, char** argv) {
  absl::StatusOr<kvtrim::cli::ParsedArgs> args =
      kvtrim::cli::ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) {
    std::cerr << "usage error: " << args.status().message()
              << "\nrun 'kvtrim-lukv-profile --help' for usage\n";
    return kvtrim::cli::kExitUsage;
  }
  if (args->help) {
    std::cout << kvtrim::lukv_profile::ProfileHelp();
    return kvtrim::cli::kExitOk;
  }
  if (!args->positional.empty()) {
    std::cerr << "usage error: kvtrim-lukv-profile takes no arguments, got \""
              << args->positional[0].substr(0, 64)
              << "\"\nrun 'kvtrim-lukv-profile --help' for usage\n";
    return kvtrim::cli::kExitUsage;
  }
  return kvtrim::lukv_profile::RunProfile(kvtrim::lukv_profile::ProfileOptionsFromFlags(),
                                          std::cout, std::cerr);
}

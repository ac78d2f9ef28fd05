// kvtrim: the command-line client of the kvtrim sidecar.
//
//   kvtrim --target=ADDR health
//   kvtrim --target=ADDR policies
//   kvtrim --target=ADDR compress --policy=NAME --keep_fraction=F --input=FILE.safetensors
//   kvtrim --target=ADDR compress ... --summary [--summary_header]   (one table row)
//   kvtrim --target=ADDR register-model --model=BUNDLE.safetensors   (prints the digest)
//   kvtrim --target=ADDR models
//   kvtrim --target=ADDR delete-model DIGEST
//   kvtrim help [COMMAND] | kvtrim COMMAND --help | kvtrim --version
//
// --json: each command prints one JSON object (errors: one on stderr).
// Exit codes: 0 ok, 1 RPC error (code and message printed) or not SERVING, 2 usage error.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command_help.h"
#include "client/cli/commands.h"
#include "client/cli/flags.h"
#include "client/cli/flag_parse.h"
#include "client/cli/tls_files.h"
#include "version/build_version.h"

namespace {

/// The usage error of an unknown command: its name (at most 64 bytes) and, for LU-KV
/// profiling (once `kvtrim profile`), the program that does it now.
std::string UnknownCommand(const std::string& name) {
  std::string message = absl::StrCat("unknown command \"", name.substr(0, 64), "\"");
  if (name == "profile") {
    absl::StrAppend(&message, ": LU-KV profiling is the program kvtrim-lukv-profile");
  }
  return message;
}

/// `kvtrim --version`: "kvtrim 0.1.0 (git <commit>)", or JSON {"version", "git_commit"}.
void PrintVersion(kvtrim::cli::Output& output) {
  if (output.json()) {
    output.Json({{"version", kvtrim::ReleaseVersion()}, {"git_commit", kvtrim::GitCommit()}});
  } else {
    output.out() << "kvtrim " << kvtrim::VersionLine() << "\n";
  }
}

/// The client's options from the connection flags; a usage error message when they are bad.
absl::StatusOr<kvtrim::ClientOptions> ClientOptionsFromFlags(bool waits_for_health) {
  if (absl::GetFlag(FLAGS_target).empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  if (!(absl::GetFlag(FLAGS_timeout_s) > 0)) {
    return absl::InvalidArgumentError("--timeout_s must be positive");
  }
  kvtrim::ClientOptions options;
  options.default_deadline = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.session_deadline = options.default_deadline;
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (waits_for_health) {
    // Each check after an UNAVAILABLE one dials anew (RunHealth): its own connection, not
    // the process's shared one, and no single check outlasts the wait.
    options.own_connection = true;
    options.default_deadline =
        std::min(options.default_deadline, absl::Seconds(absl::GetFlag(FLAGS_wait)));
  }
  if (absl::GetFlag(FLAGS_tls) || !absl::GetFlag(FLAGS_tls_ca).empty() ||
      !absl::GetFlag(FLAGS_tls_cert).empty() || !absl::GetFlag(FLAGS_tls_key).empty() ||
      !absl::GetFlag(FLAGS_tls_server_name).empty()) {
    auto credentials = kvtrim::cli::TlsChannelCredentials(
        absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
    if (!credentials.ok()) return credentials.status();
    options.credentials = *credentials;
    options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    auto token = kvtrim::cli::ReadAuthTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return token.status();
    options.auth_token = *std::move(token);
  }
  return options;
}

/// `kvtrim compress`'s options from its flags.
kvtrim::cli::CompressOptions CompressOptionsFromFlags() {
  kvtrim::cli::CompressOptions compress;
  compress.policy = absl::GetFlag(FLAGS_policy);
  compress.keep_fraction = absl::GetFlag(FLAGS_keep_fraction);
  compress.keep_tokens = absl::GetFlag(FLAGS_keep_tokens);
  compress.max_perturbation = absl::GetFlag(FLAGS_max_perturbation);
  compress.max_keep = absl::GetFlag(FLAGS_max_keep);
  compress.params = absl::GetFlag(FLAGS_param);
  compress.session = absl::GetFlag(FLAGS_session);
  compress.sink_tokens = absl::GetFlag(FLAGS_sink_tokens);
  compress.recent_tokens = absl::GetFlag(FLAGS_recent_tokens);
  compress.output_shape = absl::GetFlag(FLAGS_output_shape);
  compress.seed = absl::GetFlag(FLAGS_seed);
  compress.num_layers = absl::GetFlag(FLAGS_num_layers);
  compress.request_id = absl::GetFlag(FLAGS_request_id);
  compress.input = absl::GetFlag(FLAGS_input);
  compress.show_indices = absl::GetFlag(FLAGS_show_indices);
  compress.model = absl::GetFlag(FLAGS_model);
  compress.numerics = absl::GetFlag(FLAGS_numerics);
  compress.perturbation = absl::GetFlag(FLAGS_perturbation);
  compress.packed_answer = absl::GetFlag(FLAGS_packed_answer);
  compress.summary = absl::GetFlag(FLAGS_summary);
  compress.summary_header = absl::GetFlag(FLAGS_summary_header);
  return compress;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<kvtrim::cli::ParsedArgs> args =
      kvtrim::cli::ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  kvtrim::cli::Output output(std::cout, std::cerr, args.ok() && absl::GetFlag(FLAGS_json));
  const auto usage_error = [&output](const std::string& message) {
    const int code = output.UsageError(message);
    if (!output.json()) std::cerr << "run 'kvtrim help' for usage\n";
    return code;
  };
  if (!args.ok()) return usage_error(std::string(args.status().message()));
  const std::vector<std::string>& positional = args->positional;
  if (args->version) {
    PrintVersion(output);
    return kvtrim::cli::kExitOk;
  }
  // kvtrim help | kvtrim --help | kvtrim help CMD | kvtrim CMD --help (help --help: help's)
  const bool help_command = !positional.empty() && positional[0] == "help";
  if (args->help || help_command) {
    const size_t named = help_command && (positional.size() > 1 || !args->help) ? 1 : 0;
    if (positional.size() <= named) {
      std::cout << kvtrim::cli::GeneralHelp();
      return kvtrim::cli::kExitOk;
    }
    const kvtrim::cli::CommandInfo* command = kvtrim::cli::FindCommand(positional[named]);
    if (command == nullptr) {
      return usage_error(UnknownCommand(positional[named]));
    }
    std::cout << kvtrim::cli::CommandHelp(*command);
    return kvtrim::cli::kExitOk;
  }
  if (positional.empty()) return usage_error("expected a COMMAND");
  const kvtrim::cli::CommandInfo* command = kvtrim::cli::FindCommand(positional[0]);
  if (command == nullptr) {
    return usage_error(UnknownCommand(positional[0]));
  }
  if (positional.size() != 1u + command->arguments) {
    return usage_error(command->arguments == 0
                           ? absl::StrCat(command->name, " takes no arguments")
                           : absl::StrCat("usage: ", command->synopsis));
  }
  const double wait = absl::GetFlag(FLAGS_wait);
  if (!(wait >= 0)) return usage_error("--wait must be >= 0 seconds");
  if (wait > 0 && command->name != "health") return usage_error("--wait is a flag of health");
  if (!absl::GetFlag(FLAGS_client_id).empty() && command->name != "regions") {
    return usage_error("--client_id is a flag of regions");
  }

  absl::StatusOr<kvtrim::ClientOptions> options =
      ClientOptionsFromFlags(command->name == "health" && wait > 0);
  if (!options.ok()) return usage_error(std::string(options.status().message()));
  const auto connect = [&options] {
    return kvtrim::Client::Connect(absl::GetFlag(FLAGS_target), *options);
  };
  if (command->name == "health") {
    return kvtrim::cli::RunHealth(connect, absl::Seconds(wait), output);
  }
  absl::StatusOr<std::unique_ptr<kvtrim::Client>> client = connect();
  if (!client.ok()) return usage_error(std::string(client.status().message()));

  kvtrim::Client& connected = **client;
  if (command->name == "policies") return kvtrim::cli::RunPolicies(connected, output);
  if (command->name == "register-model") {
    return kvtrim::cli::RunRegisterModel(connected, absl::GetFlag(FLAGS_model), output);
  }
  if (command->name == "models") return kvtrim::cli::RunModels(connected, output);
  if (command->name == "regions") {
    connected.SetClientId(absl::GetFlag(FLAGS_client_id));
    return kvtrim::cli::RunRegions(connected, output);
  }
  if (command->name == "delete-model") {
    return kvtrim::cli::RunDeleteModel(connected, positional[1], output);
  }
  return kvtrim::cli::RunCompress(connected, CompressOptionsFromFlags(), output);
}

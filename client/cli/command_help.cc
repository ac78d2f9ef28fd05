#include "client/cli/command_help.h"


#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/flag_parse.h"

namespace kvtrim::cli {

const std::vector<CommandInfo>& Commands() {
  static const std::vector<CommandInfo>* const commands = new std::vector<CommandInfo>{
      {"health",
       "is kvtrimd SERVING? (--wait: until it is)",
       "kvtrim --target=ADDR health [--wait=SECONDS]",
       "grpc.health.v1 check of kvtrim.v1.Kvtrim. Exit 0 only when SERVING. With --wait,\n"
       "retries (kvtrimd not listening yet, warming up, NOT_SERVING) until it is SERVING or the\n"
       "seconds run out.",
       {"wait"}},
      {"policies",
       "list every policy with its parts, inputs and parameters",
       "kvtrim --target=ADDR policies",
       "Lists every policy with its parts, scope, inputs, protected-token defaults, output\n"
       "shapes, numerics modes and parameters (kind, default, range or choices).",
       {}},
      {"compress",
       "compress the layers of a safetensors file and print the decisions",
       "kvtrim --target=ADDR compress --policy=NAME (--keep_fraction=F | --keep_tokens=N |\n"
       "    --max_perturbation=EPS) --input=FILE.safetensors [flags]",
       "Sends the layers of --input (one unary Compress, or one CompressSession with\n"
       "--session) and prints per layer: n, numerics mode, kept tokens and perturbation per\n"
       "KV head, compute and round-trip time, then totals (--summary: one table row instead).\n"
       "With --model=BUNDLE, registers the model first and sends its digest.",
       {"policy", "keep_fraction", "keep_tokens", "max_perturbation", "max_keep", "param",
        "input", "model", "session", "sink_tokens", "recent_tokens", "output_shape", "seed",
        "num_layers", "request_id", "numerics", "perturbation", "packed_answer",
        "show_indices", "summary", "summary_header"}},
      {"register-model",
       "register a model bundle and print its digest",
       "kvtrim --target=ADDR register-model --model=BUNDLE.safetensors",
       "Registers a model bundle (weights and header) and prints its content digest.",
       {"model"}},
      {"models",
       "list the registered models",
       "kvtrim --target=ADDR models",
       "Lists the registered models: digest, name, layout, RoPE and weight names.",
       {}},
      {"regions",
       "show the zero-copy transports' state, or one lease's regions",
       "kvtrim --target=ADDR regions [--client_id=LEASE]",
       "Shows whether kvtrimd accepts regions (--allow_client_shm), its open leases, regions\n"
       "by kind and page-locked shm bytes; with --client_id (a worker's lease id), that\n"
       "lease's regions: id, kind, size, readers now, page-locked. NOT_FOUND: the lease is\n"
       "not open (its Regions stream ended, or kvtrimd restarted).",
       {"client_id"}},
      {"delete-model",
       "delete one registered model",
       "kvtrim --target=ADDR delete-model DIGEST",
       "Deletes one registered model (NOT_FOUND when kvtrimd has no model of that digest).",
       {},
       true,
       1},
      {"help",
       "print this text, or one command's usage and flags",
       "kvtrim help [COMMAND]",
       "Prints the usage of kvtrim, or of one command (also: kvtrim COMMAND --help).",
       {},
       false},
  };
  return *commands;
}

const CommandInfo* FindCommand(absl::string_view name) {
  for (const CommandInfo& command : Commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

const std::vector<std::string>& ConnectionFlags() {
  static const std::vector<std::string>* const flags = new std::vector<std::string>{
      "target", "timeout_s", "max_message_bytes", "tls", "tls_ca", "tls_cert", "tls_key",
      "tls_server_name", "auth_token_file", "json"};
  return *flags;
}

std::string GeneralHelp() {
  std::string out =
      "usage: kvtrim --target=ADDR [flags] COMMAND [ARGS]\n"
      "       kvtrim help [COMMAND] | kvtrim COMMAND --help | kvtrim --version [--json]\n\n"
      "commands:\n";
  for (const CommandInfo& command : Commands()) {
    absl::StrAppend(&out, absl::StrFormat("  %-15s %s\n", command.name, command.summary));
  }
  absl::StrAppend(&out,
                  "\nexit codes: 0 ok, 1 RPC error or not SERVING, 2 usage or input error\n"
                  "--json: every command prints one JSON object on stdout; errors print one\n"
                  "  on stderr as {\"error\": {\"kind\": rpc|usage|input, \"code\", \"message\"}}\n\n"
                  "connection flags (every command that talks to kvtrimd):\n",
                  DescribeFlags(ConnectionFlags()),
                  "\nrun 'kvtrim help COMMAND' for a command's own flags.\n");
  return out;
}

std::string CommandHelp(const CommandInfo& command) {
  std::string out = absl::StrCat("usage: ", command.synopsis, "\n\n", command.description, "\n");
  if (!command.flags.empty()) {
    absl::StrAppend(&out, "\n", command.name, " flags:\n", DescribeFlags(command.flags));
  }
  if (command.needs_target) {
    absl::StrAppend(&out, "\nconnection flags:\n", DescribeFlags(ConnectionFlags()));
  }
  return out;
}

}  // namespace kvtrim::cli

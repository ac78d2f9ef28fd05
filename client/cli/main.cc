// kvtrim: the command-line client of the kvtrim sidecar.
//
//   kvtrim --target=ADDR health
//   kvtrim --target=ADDR policies
//   kvtrim --target=ADDR compress --policy=NAME --keep_fraction=F --input=FILE.safetensors
//   kvtrim --target=ADDR compress ... --summary [--summary_header]   (one table row)
//   kvtrim --target=ADDR register-model --model=BUNDLE.safetensors   (prints the digest)
//   kvtrim --target=ADDR models
//   kvtrim --target=ADDR delete-model DIGEST
//   kvtrim profile --model=BUNDLE --metric=snapkv --dumps=A,B --out=PROFILE.npy  (local)
//
// Exit codes: 0 ok, 1 RPC error (code and message printed) or not SERVING, 2 usage error.
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/commands.h"
#include "client/cli/flag_parse.h"
#include "client/cli/tls_files.h"
#include "client/cli_profile.h"

ABSL_FLAG(std::string, target, "", "Server address, e.g. 127.0.0.1:50051 (required)");
ABSL_FLAG(double, timeout_s, 30.0,
          "Deadline in seconds of each unary call, and of a whole --session stream");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "Largest gRPC message sent or received, in bytes");
ABSL_FLAG(bool, tls, false,
          "Connect with TLS (implied by --tls_ca / --tls_cert); without --tls_ca the system "
          "roots verify kvtrimd");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of the CA(s) that kvtrimd's certificate chains to");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate (mutual TLS; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name kvtrimd's certificate must carry, when it differs from --target's host (e.g. "
          "a probe inside the pod dialing 127.0.0.1); implies --tls");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding this tenant's bearer token (kvtrimd --auth_tokens_file), sent with "
          "every call; a file rather than a flag value keeps it out of the process list");
ABSL_FLAG(std::string, policy, "", "compress: policy preset or SCORER+ALLOCATOR");
ABSL_FLAG(std::optional<double>, keep_fraction, std::nullopt,
          "compress: fraction of the n tokens kept per head, in (0, 1]; sink and recent "
          "tokens count inside it");
ABSL_FLAG(std::optional<int64_t>, keep_tokens, std::nullopt,
          "compress: tokens kept per head (>= 1, clamped to n); instead of --keep_fraction");
ABSL_FLAG(std::optional<double>, max_perturbation, std::nullopt,
          "compress: error target epsilon >= 0 instead of a count: each head keeps the fewest "
          "tokens of its ranking whose output perturbation is <= epsilon (needs values and "
          "queries in --input)");
ABSL_FLAG(std::optional<double>, max_keep, std::nullopt,
          "compress: with --max_perturbation, the cap as a fraction in (0, 1] (default 1)");
ABSL_FLAG(std::string, param, "", "compress: parameter overrides, name=value,name=value");
ABSL_FLAG(bool, session, false, "compress: stream the layers over one CompressSession");
ABSL_FLAG(std::optional<int32_t>, sink_tokens, std::nullopt,
          "compress: protected first tokens (default: the policy's)");
ABSL_FLAG(std::optional<int32_t>, recent_tokens, std::nullopt,
          "compress: protected last tokens (default: the policy's)");
ABSL_FLAG(std::string, output_shape, "per_head", "compress: per_head or shared");
ABSL_FLAG(uint64_t, seed, 0, "compress: RNG seed of the random policy");
ABSL_FLAG(std::optional<int32_t>, num_layers, std::nullopt,
          "compress: layers in the model (PyramidKV); default: max layer id in --input + 1");
ABSL_FLAG(std::string, request_id, "", "compress: free-form id echoed into server logs");
ABSL_FLAG(std::string, input, "",
          "compress: safetensors file with layer.{i}.keys [H_kv,n,d] and optional "
          "layer.{i}.values [H_kv,n,d], layer.{i}.queries [H_q,w,d]");
ABSL_FLAG(bool, show_indices, false, "compress: also print the kept token indices");
ABSL_FLAG(std::string, numerics, "",
          "compress: fast | exact; empty leaves it to the server (kvtrimd --numerics). Each "
          "layer prints the mode that computed it (exact where the policy has no fast path)");
ABSL_FLAG(bool, perturbation, true,
          "compress: compute the output perturbation statistic when values and queries are "
          "sent (--noperturbation skips it: about one attention pass per layer less)");
ABSL_FLAG(bool, packed_answer, true,
          "compress: ask for the kept lists as packed little-endian bytes (answer_encoding "
          "PACKED, read in place by client/kept_lists.h); --nopacked_answer asks for the "
          "repeated offsets / indices fields");
ABSL_FLAG(bool, summary, false,
          "compress: print one table row instead of the per-layer report: policy, keep, kept / "
          "cached tokens over layers and KV heads, mean perturbation over heads and layers, "
          "server compute ms summed over layers");
ABSL_FLAG(bool, summary_header, false,
          "compress: with --summary, print the table's column header before the row");
// --model (a model bundle .safetensors, client/model_bundle.h) is defined in
// client/cli_profile.cc and shared by register-model, compress and profile.
ABSL_DECLARE_FLAG(std::string, model);

namespace {

std::string Usage() {
  return absl::StrCat(
      "usage: kvtrim --target=ADDR [flags] COMMAND\n\n"
      "commands:\n"
      "  health     grpc.health.v1 check of kvtrim.v1.Kvtrim (exit 0 only when SERVING)\n"
      "  policies   list every policy with parts, inputs and parameters\n"
      "  compress   send the layers of --input (unary Compress, or --session) and print\n"
      "             per layer: n, numerics mode, kept and perturbation per head, compute and\n"
      "             round-trip time (--summary: one table row over all layers instead);\n"
      "             with --model=BUNDLE, registers the model first and names its digest\n"
      "  register-model  register --model=BUNDLE.safetensors and print its digest\n"
      "  models     list the registered models\n"
      "  delete-model DIGEST  delete one registered model\n"
      "  profile    build an LU-KV profile locally (see below)\n\n"
      "exit codes: 0 ok, 1 RPC error or not SERVING, 2 usage or input error\n\n"
      "flags:\n",
      kvtrim::cli::FlagsHelp("client/cli/main.cc"), "\n", kvtrim::cli::ProfileHelp());
}

int UsageError(const std::string& message) {
  std::cerr << "usage error: " << message << "\nrun 'kvtrim --help' for usage\n";
  return kvtrim::cli::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<kvtrim::cli::ParsedArgs> args =
      kvtrim::cli::ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) return UsageError(std::string(args.status().message()));
  if (args->help || (args->positional.size() == 1 && args->positional[0] == "help")) {
    std::cout << Usage();
    return kvtrim::cli::kExitOk;
  }
  const bool takes_argument = !args->positional.empty() && args->positional[0] == "delete-model";
  if (args->positional.size() != (takes_argument ? 2u : 1u)) {
    return UsageError(takes_argument ? "delete-model takes exactly one DIGEST"
                                     : "expected exactly one COMMAND");
  }
  const std::string& command = args->positional[0];
  if (command == "profile") {
    return kvtrim::cli::RunProfile(
        kvtrim::cli::ProfileOptionsFromFlags(absl::GetFlag(FLAGS_param)), std::cout, std::cerr);
  }
  if (command != "health" && command != "policies" && command != "compress" &&
      command != "register-model" && command != "models" && command != "delete-model") {
    return UsageError(absl::StrCat("unknown command \"", command, "\""));
  }
  if (absl::GetFlag(FLAGS_target).empty()) return UsageError("--target is required");
  if (!(absl::GetFlag(FLAGS_timeout_s) > 0)) return UsageError("--timeout_s must be positive");

  kvtrim::ClientOptions options;
  options.default_deadline = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.session_deadline = options.default_deadline;
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (absl::GetFlag(FLAGS_tls) || !absl::GetFlag(FLAGS_tls_ca).empty() ||
      !absl::GetFlag(FLAGS_tls_cert).empty() || !absl::GetFlag(FLAGS_tls_key).empty() ||
      !absl::GetFlag(FLAGS_tls_server_name).empty()) {
    auto credentials = kvtrim::cli::TlsChannelCredentials(
        absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key));
    if (!credentials.ok()) return UsageError(std::string(credentials.status().message()));
    options.credentials = *credentials;
    options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  }
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    auto token = kvtrim::cli::ReadAuthTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return UsageError(std::string(token.status().message()));
    options.auth_token = *std::move(token);
  }
  absl::StatusOr<std::unique_ptr<kvtrim::Client>> client =
      kvtrim::Client::Connect(absl::GetFlag(FLAGS_target), options);
  if (!client.ok()) return UsageError(std::string(client.status().message()));

  if (command == "health") return kvtrim::cli::RunHealth(**client, std::cout, std::cerr);
  if (command == "policies") return kvtrim::cli::RunPolicies(**client, std::cout, std::cerr);
  if (command == "register-model") {
    return kvtrim::cli::RunRegisterModel(**client, absl::GetFlag(FLAGS_model), std::cout,
                                         std::cerr);
  }
  if (command == "models") return kvtrim::cli::RunModels(**client, std::cout, std::cerr);
  if (command == "delete-model") {
    return kvtrim::cli::RunDeleteModel(**client, args->positional[1], std::cout, std::cerr);
  }

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
  return kvtrim::cli::RunCompress(**client, compress, std::cout, std::cerr);
}

// The CLI's commands (health, policies, compress, register-model, models, delete-model)
// over a kvtrim::Client.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli/output.h"
#include "client/kvtrim_client.h"

namespace kvtrim::cli {

/// Process exit codes of the CLI.
enum ExitCode : int {
  kExitOk = 0,        // success (health: the service is SERVING)
  kExitRpcError = 1,  // an RPC failed (code and message printed), or health is not SERVING
  kExitUsage = 2,     // bad flags or arguments, or an unreadable / malformed input file
};

/// What `kvtrim compress` was asked to do, as parsed from its flags.
struct CompressOptions {
  std::string policy;                  // preset or "SCORER+ALLOCATOR"
  std::optional<double> keep_fraction;  // in (0, 1]; exactly one of the three budgets
  std::optional<int64_t> keep_tokens;   // >= 1 per head
  std::optional<double> max_perturbation;  // epsilon >= 0: Budget.max_perturbation
  std::optional<double> max_keep;       // its cap in (0, 1]; with max_perturbation only
  std::string params;                  // "name=value,..." overrides
  bool session = false;                // CompressSession instead of unary Compress
  std::optional<int32_t> sink_tokens;   // unset = policy default
  std::optional<int32_t> recent_tokens; // unset = policy default
  std::string output_shape = "per_head";  // per_head | shared
  uint64_t seed = 0;
  std::optional<int32_t> num_layers;   // unset = max layer id in --input + 1
  std::string request_id;
  std::string input;                   // safetensors with layer.{i}.keys|values|queries
  bool show_indices = false;           // also print the kept index lists
  std::string model;                   // model bundle to register first ("" = none); its
                                       // digest goes into settings.model_digest
  std::string numerics;                // "fast" | "exact" | "" (the server's default)
  bool perturbation = true;             // false: PERTURBATION_OFF (skip the statistic)
  bool packed_answer = true;            // answer_encoding PACKED (false: REPEATED)
  bool summary = false;                 // print one summary row instead of the layers
  bool summary_header = false;          // with summary: the table's column header first
};

/// The request settings of `options`. INVALID_ARGUMENT (a usage error) for a missing
/// policy, both or neither budget, a bad --param list, output shape or numerics mode.
absl::StatusOr<v1::CompressionSettings> BuildSettings(const CompressOptions& options);

/// Connects a new client to kvtrimd (the CLI's target and connection flags).
using ClientFactory = std::function<absl::StatusOr<std::unique_ptr<Client>>()>;

/// `kvtrim health`: prints the kvtrim service's serving state. kExitOk only when SERVING.
/// With a positive `wait`, checks again every 100 ms while kvtrimd is unreachable or not
/// SERVING, until it is or `wait` has passed (a check started before then may run for one
/// call's deadline). After an UNAVAILABLE answer the next check dials a new connection
/// through `connect` (a channel that failed to connect waits out gRPC's reconnect backoff,
/// up to seconds, before it tries again). JSON: {"service", "status", "checks",
/// "waited_seconds"}.
int RunHealth(const ClientFactory& connect, absl::Duration wait, Output& output);

/// `kvtrim policies`: prints every policy with its parts, inputs and parameters. JSON: the
/// ListPoliciesResponse (ProtoJson).
int RunPolicies(Client& client, Output& output);

/// `kvtrim compress`: reads the input file, registers --model when given, sends the layers
/// (unary or one session) and prints each layer's result with its compute and round-trip
/// time and the numerics mode that computed it; with `options.summary`, only one table row
/// totalled over the layers (print.h's PrintSummaryRow), after its header with
/// `options.summary_header`. kExitUsage for summary_header without summary. JSON: {"rpc",
/// "policy", "backend", "numerics_asked", "model_digest", "seconds", "layers": [LayerJson],
/// "totals": TotalsJson, "summary": SummaryJson}; with `options.summary` only the summary.
int RunCompress(Client& client, const CompressOptions& options, Output& output);

/// `kvtrim register-model --model FILE`: reads the model bundle (client/model_bundle.h),
/// registers it and prints its digest on one line (JSON: {"digest"}). kExitUsage for an
/// unreadable bundle.
int RunRegisterModel(Client& client, const std::string& model_path, Output& output);

/// `kvtrim models`: prints every registered model (digest, name, layout, weights). JSON:
/// the ListModelsResponse (ProtoJson).
int RunModels(Client& client, Output& output);

/// `kvtrim regions`: the zero-copy transports' state and, with the client's id set (SetClientId,
/// --client_id), that lease's regions. JSON: the ListRegionsResponse (ProtoJson).
int RunRegions(Client& client, Output& output);

/// `kvtrim delete-model DIGEST`: deletes one registered model (JSON: {"deleted"}).
int RunDeleteModel(Client& client, const std::string& digest, Output& output);

}  // namespace kvtrim::cli

// The CLI's commands (health, policies, compress, register-model, models, delete-model)
// over a kvtrim::Client.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
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

/// `kvtrim health`: prints the kvtrim service's serving state. kExitOk only when SERVING.
int RunHealth(Client& client, std::ostream& out, std::ostream& err);

/// `kvtrim policies`: prints every policy with its parts, inputs and parameters.
int RunPolicies(Client& client, std::ostream& out, std::ostream& err);

/// `kvtrim compress`: reads the input file, registers --model when given, sends the layers
/// (unary or one session) and prints each layer's result with its compute and round-trip
/// time and the numerics mode that computed it; with `options.summary`, only one table row
/// totalled over the layers (print.h's PrintSummaryRow), after its header with
/// `options.summary_header`. kExitUsage for summary_header without summary.
int RunCompress(Client& client, const CompressOptions& options, std::ostream& out,
                std::ostream& err);

/// `kvtrim register-model --model FILE`: reads the model bundle (client/model_bundle.h),
/// registers it and prints its digest on one line. kExitUsage for an unreadable bundle.
int RunRegisterModel(Client& client, const std::string& model_path, std::ostream& out,
                     std::ostream& err);

/// `kvtrim models`: prints every registered model (digest, name, layout, weights).
int RunModels(Client& client, std::ostream& out, std::ostream& err);

/// `kvtrim delete-model DIGEST`: deletes one registered model.
int RunDeleteModel(Client& client, const std::string& digest, std::ostream& out,
                   std::ostream& err);

}  // namespace kvtrim::cli

#include "client/cli/commands.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/param_parse.h"
#include "client/cli/print.h"
#include "client/layer_inputs.h"
#include "client/model_bundle.h"
#include "client/numerics.h"
#include "client/safetensors.h"

namespace kvtrim::cli {
namespace {

/// Prints a failed RPC as "error: <rpc>: <CODE>: <message>" and returns kExitRpcError.
int RpcError(std::ostream& err, const char* rpc, const absl::Status& status) {
  err << "error: " << rpc << ": " << absl::StatusCodeToString(status.code()) << ": "
      << status.message() << "\n";
  return kExitRpcError;
}

/// Prints the totals over every printed layer: heads * n in, kept out.
void PrintTotals(const std::vector<v1::LayerResult>& layers, std::ostream& out) {
  int64_t in = 0, kept = 0;
  for (const v1::LayerResult& layer : layers) {
    in += layer.num_tokens() * layer.heads_size();
    for (const v1::HeadStats& head : layer.heads()) kept += head.kept();
  }
  out << absl::StrFormat("total: layers=%d tokens_in=%d tokens_kept=%d (%.2f%%)\n",
                         layers.size(), in, kept, in > 0 ? 100.0 * kept / in : 0.0);
}

/// Prints `layers` as one summary table row, after the table's header when asked.
void PrintSummary(const v1::CompressionSettings& settings,
                  const std::vector<v1::LayerResult>& layers, const CompressOptions& options,
                  std::ostream& out) {
  if (options.summary_header) PrintSummaryHeader(out);
  PrintSummaryRow(Summarize(settings, layers), out);
}

int CompressUnary(Client& client, const v1::CompressionSettings& settings,
                  std::vector<v1::LayerInput> layers, const CompressOptions& options,
                  std::ostream& out, std::ostream& err) {
  v1::CompressRequest request;
  *request.mutable_settings() = settings;
  for (v1::LayerInput& layer : layers) request.add_layers()->Swap(&layer);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CompressResponse> response = client.Compress(request);
  const double rtt = absl::ToDoubleSeconds(absl::Now() - start);
  if (!response.ok()) return RpcError(err, "Compress", response.status());
  if (options.summary) {
    PrintSummary(settings, {response->layers().begin(), response->layers().end()}, options, out);
    return kExitOk;
  }
  out << absl::StrFormat("Compress policy=%s backend=%s numerics_asked=%s layers=%d "
                         "call_rtt=%.6fs\n",
                         settings.policy().name(), response->backend(),
                         NumericsLabel(settings.numerics()), response->layers_size(), rtt);
  // One unary call answers every layer: each layer's round trip is the call's.
  for (const v1::LayerResult& layer : response->layers()) {
    PrintLayer(layer, rtt, options.show_indices, out);
  }
  PrintTotals({response->layers().begin(), response->layers().end()}, out);
  return kExitOk;
}

int CompressStreamed(Client& client, const v1::CompressionSettings& settings,
                     std::vector<v1::LayerInput> layers, const CompressOptions& options,
                     std::ostream& out, std::ostream& err) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Session>> session = client.OpenSession(settings);
  if (!session.ok()) return RpcError(err, "CompressSession", session.status());
  for (v1::LayerInput& layer : layers) {
    absl::Status sent = (*session)->SendLayer(std::move(layer));
    if (!sent.ok()) return RpcError(err, "CompressSession", sent);
  }
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  const double total = absl::ToDoubleSeconds(absl::Now() - start);
  if (!result.ok()) return RpcError(err, "CompressSession", result.status());
  if (options.summary) {
    PrintSummary(settings, result->layers, options, out);
    return kExitOk;
  }
  out << absl::StrFormat("CompressSession policy=%s backend=%s numerics_asked=%s layers=%d "
                         "session_time=%.6fs\n",
                         settings.policy().name(), result->summary.backend(),
                         NumericsLabel(settings.numerics()), result->summary.layers(), total);
  std::sort(result->layers.begin(), result->layers.end(),
            [](const auto& a, const auto& b) { return a.layer_id() < b.layer_id(); });
  for (const v1::LayerResult& layer : result->layers) {
    auto rtt = result->round_trip_seconds.find(layer.layer_id());
    PrintLayer(layer, rtt == result->round_trip_seconds.end() ? 0.0 : rtt->second,
               options.show_indices, out);
  }
  PrintTotals(result->layers, out);
  out << absl::StrFormat("summary: layers=%d tokens_in=%d tokens_kept=%d\n",
                         result->summary.layers(), result->summary.tokens_in(),
                         result->summary.tokens_kept());
  return kExitOk;
}

}  // namespace

absl::StatusOr<v1::CompressionSettings> BuildSettings(const CompressOptions& options) {
  if (options.policy.empty()) return absl::InvalidArgumentError("--policy is required");
  const int budgets = options.keep_fraction.has_value() + options.keep_tokens.has_value() +
                      options.max_perturbation.has_value();
  if (budgets != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --keep_fraction, --keep_tokens and --max_perturbation");
  }
  if (options.max_keep.has_value() && !options.max_perturbation.has_value()) {
    return absl::InvalidArgumentError("--max_keep is the cap of --max_perturbation; give both");
  }
  absl::StatusOr<std::map<std::string, v1::ParamValue>> params = ParseParams(options.params);
  if (!params.ok()) return params.status();
  absl::StatusOr<v1::OutputShape> shape = ParseOutputShape(options.output_shape);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<v1::Numerics> numerics = ParseNumericsFlag(options.numerics);
  if (!numerics.ok()) return numerics.status();

  v1::CompressionSettings settings;
  settings.mutable_policy()->set_name(options.policy);
  for (auto& [name, value] : *params) (*settings.mutable_policy()->mutable_params())[name] = value;
  if (options.keep_fraction.has_value()) {
    settings.mutable_budget()->set_keep_fraction(*options.keep_fraction);
  } else if (options.keep_tokens.has_value()) {
    settings.mutable_budget()->set_keep_tokens(*options.keep_tokens);
  } else {
    v1::PerturbationBudget* target = settings.mutable_budget()->mutable_max_perturbation();
    target->set_epsilon(*options.max_perturbation);
    target->set_max_keep_fraction(options.max_keep.value_or(0.0));  // 0 = 1: no cap
  }
  if (options.sink_tokens.has_value()) settings.set_sink_tokens(*options.sink_tokens);
  if (options.recent_tokens.has_value()) settings.set_recent_tokens(*options.recent_tokens);
  settings.set_output_shape(*shape);
  settings.set_seed(options.seed);
  settings.set_request_id(options.request_id);
  settings.set_numerics(*numerics);
  settings.set_perturbation(options.perturbation ? v1::PERTURBATION_FULL : v1::PERTURBATION_OFF);
  settings.set_answer_encoding(options.packed_answer ? v1::ANSWER_ENCODING_PACKED
                                                     : v1::ANSWER_ENCODING_REPEATED);
  return settings;
}

int RunHealth(Client& client, std::ostream& out, std::ostream& err) {
  absl::StatusOr<HealthState> state = client.Health();
  if (!state.ok()) return RpcError(err, "Health/Check", state.status());
  out << Client::kHealthServiceName << ": " << HealthStateName(*state) << "\n";
  return *state == HealthState::kServing ? kExitOk : kExitRpcError;
}

int RunPolicies(Client& client, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::ListPoliciesResponse> response = client.ListPolicies();
  if (!response.ok()) return RpcError(err, "ListPolicies", response.status());
  PrintPolicies(*response, out);
  return kExitOk;
}

int RunCompress(Client& client, const CompressOptions& options, std::ostream& out,
                std::ostream& err) {
  absl::StatusOr<v1::CompressionSettings> settings = BuildSettings(options);
  if (!settings.ok()) {
    err << "usage error: " << settings.status().message() << "\n";
    return kExitUsage;
  }
  if (options.input.empty()) {
    err << "usage error: --input is required\n";
    return kExitUsage;
  }
  if (options.summary_header && !options.summary) {
    err << "usage error: --summary_header is the header of --summary; give both\n";
    return kExitUsage;
  }
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(options.input);
  if (!file.ok()) {
    err << "input error: " << file.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  if (!layers.ok()) {
    err << "input error: " << options.input << ": " << layers.status().message() << "\n";
    return kExitUsage;
  }
  // PyramidKV needs the model's layer count; a session cannot infer it from one layer.
  settings->set_num_layers(options.num_layers.value_or(layers->back().layer_id() + 1));
  if (!options.model.empty()) {
    absl::StatusOr<ModelBundle> bundle = ReadModelBundle(options.model);
    if (!bundle.ok()) {
      err << "input error: " << bundle.status().message() << "\n";
      return kExitUsage;
    }
    absl::StatusOr<std::string> digest = client.RegisterModel(*std::move(bundle));
    if (!digest.ok()) return RpcError(err, "RegisterModel", digest.status());
    if (!options.summary) out << "model " << *digest << "\n";
    settings->set_model_digest(*digest);
  }
  return options.session
             ? CompressStreamed(client, *settings, *std::move(layers), options, out, err)
             : CompressUnary(client, *settings, *std::move(layers), options, out, err);
}

int RunRegisterModel(Client& client, const std::string& model_path, std::ostream& out,
                     std::ostream& err) {
  if (model_path.empty()) {
    err << "usage error: --model is required\n";
    return kExitUsage;
  }
  absl::StatusOr<ModelBundle> bundle = ReadModelBundle(model_path);
  if (!bundle.ok()) {
    err << "input error: " << bundle.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<std::string> digest = client.RegisterModel(*std::move(bundle));
  if (!digest.ok()) return RpcError(err, "RegisterModel", digest.status());
  out << *digest << "\n";
  return kExitOk;
}

int RunModels(Client& client, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::ListModelsResponse> response = client.ListModels();
  if (!response.ok()) return RpcError(err, "ListModels", response.status());
  PrintModels(*response, out);
  return kExitOk;
}

int RunDeleteModel(Client& client, const std::string& digest, std::ostream& out,
                   std::ostream& err) {
  absl::Status status = client.DeleteModel(digest);
  if (!status.ok()) return RpcError(err, "DeleteModel", status);
  out << "deleted " << digest << "\n";
  return kExitOk;
}

}  // namespace kvtrim::cli

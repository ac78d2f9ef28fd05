#include "client/cli/commands.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/json_print.h"
#include "client/cli/param_parse.h"
#include "client/cli/print.h"
#include "client/layer_inputs.h"
#include "client/model_bundle.h"
#include "client/numerics.h"
#include "formats/safetensors.h"

namespace kvtrim::cli {
namespace {

/// What one compression answered, from either RPC, in layer order.
struct CompressAnswer {
  std::string rpc;                          // "Compress" | "CompressSession"
  std::string backend;                      // "cpu" | "gpu"
  std::vector<v1::LayerResult> layers;      // request order (unary) or by layer id (session)
  std::vector<double> round_trip_seconds;   // [layers]
  double seconds = 0;                       // the whole call or session, client side
  std::optional<v1::SessionSummary> server_summary;  // sessions only
};

/// Prints the totals over every printed layer: heads * n in, kept out.
void PrintTotals(const std::vector<v1::LayerResult>& layers, std::ostream& out) {
  const LayerTotals t = SumLayers(layers);
  out << absl::StrFormat("total: layers=%d tokens_in=%d tokens_kept=%d (%.2f%%)\n", t.layers,
                         t.tokens_in, t.tokens_kept,
                         t.tokens_in > 0 ? 100.0 * t.tokens_kept / t.tokens_in : 0.0);
}

/// Prints `answer` as text (the per-layer report, or the summary row) or as JSON.
void PrintCompressAnswer(const v1::CompressionSettings& settings, const CompressAnswer& answer,
                         const CompressOptions& options, Output& output) {
  const CompressSummary summary = Summarize(settings, answer.layers);
  if (output.json()) {
    if (options.summary) {
      output.Json(SummaryJson(summary));
      return;
    }
    nlohmann::json layers = nlohmann::json::array();
    for (size_t i = 0; i < answer.layers.size(); ++i) {
      layers.push_back(
          LayerJson(answer.layers[i], answer.round_trip_seconds[i], options.show_indices));
    }
    output.Json({{"rpc", answer.rpc},
                 {"policy", settings.policy().name()},
                 {"backend", answer.backend},
                 {"numerics_asked", NumericsLabel(settings.numerics())},
                 {"model_digest", settings.model_digest()},
                 {"seconds", answer.seconds},
                 {"layers", std::move(layers)},
                 {"totals", TotalsJson(answer.layers)},
                 {"summary", SummaryJson(summary)}});
    return;
  }
  std::ostream& out = output.out();
  if (options.summary) {
    if (options.summary_header) PrintSummaryHeader(out);
    PrintSummaryRow(summary, out);
    return;
  }
  out << absl::StrFormat("%s policy=%s backend=%s numerics_asked=%s layers=%d %s=%.6fs\n",
                         answer.rpc, settings.policy().name(), answer.backend,
                         NumericsLabel(settings.numerics()),
                         answer.server_summary.has_value() ? answer.server_summary->layers()
                                                           : answer.layers.size(),
                         answer.server_summary.has_value() ? "session_time" : "call_rtt",
                         answer.seconds);
  for (size_t i = 0; i < answer.layers.size(); ++i) {
    PrintLayer(answer.layers[i], answer.round_trip_seconds[i], options.show_indices, out);
  }
  PrintTotals(answer.layers, out);
  if (answer.server_summary.has_value()) {
    out << absl::StrFormat("summary: layers=%d tokens_in=%d tokens_kept=%d\n",
                           answer.server_summary->layers(), answer.server_summary->tokens_in(),
                           answer.server_summary->tokens_kept());
  }
}

/// One unary Compress of every layer: each layer's round trip is the call's.
absl::StatusOr<CompressAnswer> CompressUnary(Client& client,
                                             const v1::CompressionSettings& settings,
                                             std::vector<v1::LayerInput> layers) {
  v1::CompressRequest request;
  *request.mutable_settings() = settings;
  for (v1::LayerInput& layer : layers) request.add_layers()->Swap(&layer);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CompressResponse> response = client.Compress(request);
  if (!response.ok()) return response.status();
  CompressAnswer answer;
  answer.rpc = "Compress";
  answer.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  answer.backend = response->backend();
  answer.layers.assign(response->layers().begin(), response->layers().end());
  answer.round_trip_seconds.assign(answer.layers.size(), answer.seconds);
  return answer;
}

/// One CompressSession of every layer, the layers' results sorted by layer id.
absl::StatusOr<CompressAnswer> CompressStreamed(Client& client,
                                                const v1::CompressionSettings& settings,
                                                std::vector<v1::LayerInput> layers) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Session>> session = client.OpenSession(settings);
  if (!session.ok()) return session.status();
  for (v1::LayerInput& layer : layers) {
    absl::Status sent = (*session)->SendLayer(std::move(layer));
    if (!sent.ok()) return sent;
  }
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  if (!result.ok()) return result.status();
  CompressAnswer answer;
  answer.rpc = "CompressSession";
  answer.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  answer.backend = result->summary.backend();
  answer.server_summary = result->summary;
  answer.layers = std::move(result->layers);
  std::sort(answer.layers.begin(), answer.layers.end(),
            [](const auto& a, const auto& b) { return a.layer_id() < b.layer_id(); });
  for (const v1::LayerResult& layer : answer.layers) {
    auto rtt = result->round_trip_seconds.find(layer.layer_id());
    answer.round_trip_seconds.push_back(rtt == result->round_trip_seconds.end() ? 0.0
                                                                                : rtt->second);
  }
  return answer;
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

int RunHealth(const ClientFactory& connect, absl::Duration wait, Output& output) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + wait;
  absl::StatusOr<HealthState> state;
  std::unique_ptr<Client> client;
  int checks = 0;
  for (;;) {
    if (client == nullptr) {
      absl::StatusOr<std::unique_ptr<Client>> connected = connect();
      if (!connected.ok()) return output.UsageError(std::string(connected.status().message()));
      client = *std::move(connected);
    }
    state = client->Health();
    ++checks;
    if (state.ok() && *state == HealthState::kServing) break;
    if (!state.ok() && state.status().code() == absl::StatusCode::kUnavailable) client.reset();
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    absl::SleepFor(std::min(absl::Milliseconds(100), deadline - now));
  }
  if (!state.ok()) return output.RpcError("Health/Check", state.status());
  if (output.json()) {
    output.Json({{"service", Client::kHealthServiceName},
                 {"status", HealthStateName(*state)},
                 {"checks", checks},
                 {"waited_seconds", absl::ToDoubleSeconds(absl::Now() - start)}});
  } else {
    output.out() << Client::kHealthServiceName << ": " << HealthStateName(*state) << "\n";
  }
  return *state == HealthState::kServing ? kExitOk : kExitRpcError;
}

int RunPolicies(Client& client, Output& output) {
  absl::StatusOr<v1::ListPoliciesResponse> response = client.ListPolicies();
  if (!response.ok()) return output.RpcError("ListPolicies", response.status());
  if (output.json()) {
    output.Json(ProtoJson(*response));
  } else {
    PrintPolicies(*response, output.out());
  }
  return kExitOk;
}

int RunCompress(Client& client, const CompressOptions& options, Output& output) {
  absl::StatusOr<v1::CompressionSettings> settings = BuildSettings(options);
  if (!settings.ok()) return output.UsageError(std::string(settings.status().message()));
  if (options.input.empty()) return output.UsageError("--input is required");
  if (options.summary_header && !options.summary) {
    return output.UsageError("--summary_header is the header of --summary; give both");
  }
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(options.input);
  if (!file.ok()) return output.InputError(std::string(file.status().message()));
  absl::StatusOr<std::vector<v1::LayerInput>> layers = LayerInputsFromSafetensors(*file);
  if (!layers.ok()) {
    return output.InputError(absl::StrCat(options.input, ": ", layers.status().message()));
  }
  // PyramidKV needs the model's layer count; a session cannot infer it from one layer.
  settings->set_num_layers(options.num_layers.value_or(layers->back().layer_id() + 1));
  if (!options.model.empty()) {
    absl::StatusOr<ModelBundle> bundle = ReadModelBundle(options.model);
    if (!bundle.ok()) return output.InputError(std::string(bundle.status().message()));
    absl::StatusOr<std::string> digest = client.RegisterModel(*std::move(bundle));
    if (!digest.ok()) return output.RpcError("RegisterModel", digest.status());
    if (!options.summary && !output.json()) output.out() << "model " << *digest << "\n";
    settings->set_model_digest(*digest);
  }
  absl::StatusOr<CompressAnswer> answer =
      options.session ? CompressStreamed(client, *settings, *std::move(layers))
                      : CompressUnary(client, *settings, *std::move(layers));
  if (!answer.ok()) {
    return output.RpcError(options.session ? "CompressSession" : "Compress", answer.status());
  }
  PrintCompressAnswer(*settings, *answer, options, output);
  return kExitOk;
}

int RunRegisterModel(Client& client, const std::string& model_path, Output& output) {
  if (model_path.empty()) return output.UsageError("--model is required");
  absl::StatusOr<ModelBundle> bundle = ReadModelBundle(model_path);
  if (!bundle.ok()) return output.InputError(std::string(bundle.status().message()));
  absl::StatusOr<std::string> digest = client.RegisterModel(*std::move(bundle));
  if (!digest.ok()) return output.RpcError("RegisterModel", digest.status());
  if (output.json()) {
    output.Json({{"digest", *digest}});
  } else {
    output.out() << *digest << "\n";
  }
  return kExitOk;
}

int RunModels(Client& client, Output& output) {
  absl::StatusOr<v1::ListModelsResponse> response = client.ListModels();
  if (!response.ok()) return output.RpcError("ListModels", response.status());
  if (output.json()) {
    output.Json(ProtoJson(*response));
  } else {
    PrintModels(*response, output.out());
  }
  return kExitOk;
}

int RunRegions(Client& client, Output& output) {
  absl::StatusOr<v1::ListRegionsResponse> response = client.ListRegions();
  if (!response.ok()) return output.RpcError("ListRegions", response.status());
  if (output.json()) {
    output.Json(ProtoJson(*response));
  } else {
    PrintRegions(*response, !client.client_id().empty(), output.out());
  }
  return kExitOk;
}

int RunDeleteModel(Client& client, const std::string& digest, Output& output) {
  absl::Status status = client.DeleteModel(digest);
  if (!status.ok()) return output.RpcError("DeleteModel", status);
  if (output.json()) {
    output.Json({{"deleted", digest}});
  } else {
    output.out() << "deleted " << digest << "\n";
  }
  return kExitOk;
}

}  // namespace kvtrim::cli

// Compress: decode every layer, resolve the policy once, run the layers (or score them and
// decide model-wide), encode the answers. Runs on the work pool.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/layer_runner.h"
#include "service/reactors.h"
#include "service/rpcs.h"
#include "service/settings_codec.h"
#include "service/tensor_codec.h"

namespace kvtrim::service {

using Clock = std::chrono::steady_clock;

absl::Status CompressRequestLayers(
    ServiceCore& core, const DecodeContext& decode_context,
    const std::function<absl::Status(const std::string&)>& alive,
    const v1::CompressRequest& request, v1::CompressResponse* response) {
  const auto call_start = Clock::now();
  KVTRIM_RETURN_IF_ERROR(alive("decoding the request"));

  // Decode: settings and every layer's tensor views (no copies), proto-level checks.
  int64_t bytes = 0;
  for (const auto& layer : request.layers()) bytes += InlineTensorBytes(layer);
  core.metrics().AddRequestBytes(Rpc::kCompress, bytes);
  if (!request.has_settings()) {
    return absl::InvalidArgumentError(
        "settings: required (policy and budget); see ListPolicies for the policy names");
  }
  auto settings = DecodeSettings(request.settings(), "settings", core.default_numerics());
  if (!settings.ok()) return settings.status();
  if (request.layers_size() == 0) {
    return absl::InvalidArgumentError("layers: empty; send at least one layer");
  }
  std::vector<DecodedLayer> layers(static_cast<size_t>(request.layers_size()));
  std::vector<double> decode_seconds(layers.size(), 0.0);
  std::map<int32_t, int> first_index;  // layer_id -> index of its first occurrence
  int32_t max_layer_id = 0;
  for (int i = 0; i < request.layers_size(); ++i) {
    const std::string field = absl::StrCat("layers[", i, "]");
    const auto decode_start = Clock::now();
    if (auto st = DecodeLayer(request.layers(i), core.engine().limits(), field, decode_context,
                              &layers[i]);
        !st.ok()) {
      return st;
    }
    decode_seconds[static_cast<size_t>(i)] = SecondsSince(decode_start);
    core.CountTransportBytes(layers[i].transport);
    const int32_t id = request.layers(i).layer_id();
    auto [it, inserted] = first_index.emplace(id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: duplicate layer_id ", id,
                                                     " (also layers[", it->second, "])"));
    }
    max_layer_id = std::max(max_layer_id, id);
  }
  if (settings->num_layers == 0) settings->num_layers = max_layer_id + 1;
  core.metrics().ObserveStage(Stage::kDecode, SecondsSince(call_start));

  // Validate: resolve the policy once for the request.
  const auto validate_start = Clock::now();
  auto policy = core.PreparePolicy(*settings, "settings");
  core.metrics().ObserveStage(Stage::kValidate, SecondsSince(validate_start));
  if (!policy.ok()) return policy.status();

  // Compute: layer by layer, stopping on deadline or cancellation.
  LayerRunner runner(core);
  std::vector<LayerDecision> decisions;
  decisions.reserve(layers.size());
  if (policy->model_wide()) {
    // Score every layer (scores only are kept), then one selection over all of them.
    ModelWideScores buffered;
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string field = absl::StrCat("layers[", i, "]");
      KVTRIM_RETURN_IF_ERROR(alive(field));
      KVTRIM_RETURN_IF_ERROR(runner.Score(*policy, layers[i].request, field, &buffered));
    }
    auto decided = runner.DecideModelWide(*policy, &buffered);
    if (!decided.ok()) return decided.status();
    decisions = *std::move(decided);
  } else {
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string field = absl::StrCat("layers[", i, "]");
      KVTRIM_RETURN_IF_ERROR(alive(field));
      auto decision = runner.Compress(*policy, layers[i].request, field);
      if (!decision.ok()) return decision.status();
      if (layers[i].host_output.has_value()) {
        KVTRIM_RETURN_IF_ERROR(WriteHostOutput(*layers[i].host_output, field, &*decision));
      }
      decision->profile.decode = decode_seconds[i];
      decisions.push_back(*std::move(decision));
    }
  }

  // Encode (a unary request's server time counts from the handler's start).
  response->set_backend(std::string(core.engine().backend_name()));
  for (LayerDecision& decision : decisions) {
    runner.Encode(policy->settings, call_start, &decision, response->add_layers());
  }
  const std::string label = core.PolicyLabel(settings->policy);
  const std::string model = policy->model != nullptr ? policy->model->digest : "";
  for (const LayerDecision& decision : decisions) {
    core.metrics().RecordLayer(label, decision, model);
  }
  return absl::OkStatus();
}

namespace {

/// The whole request after admission, with the call's deadline and cancellation checked.
absl::Status CompressLayers(ServiceCore& core, const grpc::CallbackServerContext& context,
                            const std::string& tenant, const v1::CompressRequest& request,
                            v1::CompressResponse* response) {
  return CompressRequestLayers(
      core, core.MakeDecodeContext(context, tenant),
      [&context](const std::string& step) { return CheckCallAlive(context, step); }, request,
      response);
}

}  // namespace

grpc::ServerUnaryReactor* StartCompress(ServiceCore& core, grpc::CallbackServerContext* context,
                                        const v1::CompressRequest* request,
                                        v1::CompressResponse* response) {
  const auto start = Clock::now();
  auto* call = new UnaryCall(core, CallSlot::kInflight, *context);
  auto run = [&core, call, context, request, response, start] {
    const std::string label = core.PolicyLabel(request->settings().policy().name());
    absl::Status status = call->AwaitSlot(*context);
    if (status.ok()) status = CompressLayers(core, *context, call->tenant(), *request, response);
    if (!status.ok()) response->Clear();
    core.LogServerError(Rpc::kCompress, request->settings().request_id(), status);
    core.metrics().RecordRequest(Rpc::kCompress, label, status.code(), SecondsSince(start));
    call->FinishCall(ToGrpcStatus(status));
  };
  if (call->admitted().ok()) {
    core.pool().Post(std::move(run));  // waits there for a slot when every one is taken
  } else {
    run();  // refused: answered at once, on gRPC's thread
  }
  return call;
}

}  // namespace kvtrim::service

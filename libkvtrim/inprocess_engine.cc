#include "libkvtrim/inprocess_engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/backend_factory.h"
#include "service/model_codec.h"
#include "service/response_codec.h"
#include "service/service_core.h"
#include "service/settings_codec.h"
#include "service/tensor_codec.h"

namespace kvtrim::inprocess {

namespace {

using Clock = std::chrono::steady_clock;

/// Seconds since `start`.
double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<InprocessEngine>> InprocessEngine::Create(
    const EngineOptions& options) {
  std::unique_ptr<InprocessEngine> engine(new InprocessEngine());
  engine->options_ = options;
  RegisterBuiltinPolicies(&engine->registry_);
  service::Config config;
  config.backend = options.backend;
  config.workers = std::max(1, options.workers);
  config.devices = {options.device};
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: expected a CUDA ordinal >= 0, got ", options.device));
  }
  std::string detail;
  auto backend = service::CreateBackend(config, &detail);
  if (!backend.ok()) return backend.status();
  engine->backend_ = *std::move(backend);
  engine->engine_ = std::make_unique<PolicyEngine>(engine->registry_, *engine->backend_);
  service::ModelStoreOptions store;
  store.max_models = options.max_models;
  store.max_model_bytes = options.max_model_bytes;
  engine->models_ = std::make_unique<service::ModelStore>(store, engine->quiet_log_);
  engine->ready_events_ = std::make_unique<ReadyEventPool>(options.device);
  return engine;
}

absl::StatusOr<std::string> InprocessEngine::RegisterModel(
    const std::vector<std::string_view>& messages) {
  service::ModelAssembler assembler(options_.max_model_bytes);
  for (size_t i = 0; i < messages.size(); ++i) {
    v1::RegisterModelRequest message;
    if (!message.ParseFromArray(messages[i].data(), static_cast<int>(messages[i].size()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: not a kvtrim.v1.RegisterModelRequest"));
    }
    KVTRIM_RETURN_IF_ERROR(assembler.Add(message));
  }
  auto input = assembler.Finish();
  if (!input.ok()) return input.status();
  return models_->Add(*std::move(input));
}

absl::StatusOr<LayerRequest> InprocessEngine::ToRequest(
    const CallerLayer& layer, const std::string& field,
    std::vector<std::shared_ptr<void>>* keep) const {
  KVTRIM_RETURN_IF_ERROR(CheckLayerId(layer.layer_id, field));
  LayerRequest request;
  request.layer_id = layer.layer_id;
  request.softmax_scale = layer.softmax_scale;
  const bool device_ok = backend_->reads_device_memory();
  auto view_of = [&](const CallerTensor& t, const char* name) -> absl::StatusOr<TensorView> {
    const std::string tensor_field = absl::StrCat(field, ".", name);
    TensorView view;
    if (t.data == nullptr) return view;
    auto dtype = service::DecodeDType(t.dtype, tensor_field);
    if (!dtype.ok()) return dtype.status();
    view.data = t.data;
    view.dtype = *dtype;
    view.shape = t.shape;
    if (t.device < 0) {
      if (!t.dense()) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor_field, ".strides: host tensors must be dense row-major, got [",
                         t.strides[0], ", ", t.strides[1], ", ", t.strides[2], "]"));
      }
      return view;
    }
    if (!device_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor_field, ".device: a CUDA tensor (device ", t.device,
                       ") needs the GPU backend; this engine computes on the ", backend_->name()));
    }
    if (t.device != options_.device) {
      return absl::InvalidArgumentError(
          absl::StrCat(tensor_field, ".device: the tensor is on CUDA device ", t.device,
                       ", the engine on ", options_.device));
    }
    view.space = MemorySpace::kDevice;
    if (!t.dense()) {
      for (int i = 0; i < 3; ++i) {
        if (t.strides[i] < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(tensor_field, ".strides[", i, "]: must be >= 1, got ", t.strides[i]));
        }
      }
      auto layout = std::make_shared<StridedLayout>();
      layout->strides = t.strides;
      view.layout = layout;
      keep->push_back(layout);
    }
    return view;
  };
  auto keys = view_of(layer.keys, "keys");
  if (!keys.ok()) return keys.status();
  auto values = view_of(layer.values, "values");
  if (!values.ok()) return values.status();
  auto queries = view_of(layer.queries, "queries");
  if (!queries.ok()) return queries.status();
  request.keys = *keys;
  request.values = *values;
  request.queries = *queries;
  if (layer.output != nullptr) {
    request.output.present = true;
    request.output.device = layer.output;
    request.output.capacity = layer.output_capacity;
  }
  return request;
}

absl::StatusOr<v1::CompressResponse> InprocessEngine::Compress(
    const v1::CompressionSettings& proto_settings, const std::vector<CallerLayer>& layers,
    void* cuda_stream) const {
  const auto call_start = Clock::now();
  auto settings = service::DecodeSettings(proto_settings, "settings", options_.default_numerics);
  if (!settings.ok()) return settings.status();
  if (layers.empty()) return absl::InvalidArgumentError("layers: empty; send at least one layer");

  // The caller's tensors as layer requests; device tensors wait on the caller's stream.
  std::vector<std::shared_ptr<void>> keep;
  std::vector<LayerRequest> requests;
  std::map<int32_t, size_t> first_index;
  int32_t max_layer_id = 0;
  bool any_device = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string field = absl::StrCat("layers[", i, "]");
    auto request = ToRequest(layers[i], field, &keep);
    if (!request.ok()) return request.status();
    auto [it, inserted] = first_index.emplace(layers[i].layer_id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".layer_id: duplicate layer_id ",
                                                     layers[i].layer_id, " (also layers[",
                                                     it->second, "])"));
    }
    max_layer_id = std::max(max_layer_id, layers[i].layer_id);
    any_device = any_device || request->keys.on_device() || request->values.on_device() ||
                 request->queries.on_device();
    requests.push_back(*std::move(request));
  }
  ReadyEvent ready;
  if (any_device) {
    auto recorded = ready_events_->Record(cuda_stream);
    if (!recorded.ok()) return recorded.status();
    ready = *std::move(recorded);
    for (LayerRequest& request : requests) request.ready_event = ready.get();
  }
  if (settings->num_layers == 0) settings->num_layers = max_layer_id + 1;
  const double decode_seconds = SecondsSince(call_start);

  // The policy, and its registered model when the settings name one.
  const auto policy_start = Clock::now();
  auto policy = service::PreparePolicyWithModel(*engine_, *models_, *settings, "settings");
  if (!policy.ok()) return policy.status();
  const double policy_seconds = SecondsSince(policy_start);

  std::vector<LayerDecision> decisions;
  if (policy->model_wide()) {
    // Model-wide policies answer every layer's lists at the end: no output regions.
    for (LayerRequest& request : requests) request.output = OutputTarget{};
    std::vector<LayerScores> scores;
    std::vector<double> scoring;
    for (size_t i = 0; i < requests.size(); ++i) {
      double compute = 0;
      auto scored =
          engine_->ScoreLayer(*policy, requests[i], absl::StrCat("layers[", i, "]"), &compute);
      if (!scored.ok()) return scored.status();
      scores.push_back(*std::move(scored));
      scoring.push_back(compute);
    }
    const auto select_start = Clock::now();
    auto decided = engine_->DecideModelWide(*policy, scores);
    if (!decided.ok()) return decided.status();
    const double share = SecondsSince(select_start) / static_cast<double>(decided->size());
    decisions = *std::move(decided);
    for (size_t i = 0; i < decisions.size(); ++i) decisions[i].compute_seconds = scoring[i] + share;
  } else {
    for (size_t i = 0; i < requests.size(); ++i) {
      auto decision = engine_->CompressLayer(*policy, requests[i], absl::StrCat("layers[", i, "]"));
      if (!decision.ok()) return decision.status();
      decisions.push_back(*std::move(decision));
    }
  }

  v1::CompressResponse response;
  response.set_backend(backend_->name());
  for (LayerDecision& decision : decisions) {
    v1::LayerResult* out = response.add_layers();
    const auto encode_start = Clock::now();
    service::EncodeLayerResult(decision, out, policy->settings.packed_answer);
    if (policy->settings.profile) {
      // In process: decode = the settings and the caller's tensors (and the ready event),
      // validate = the policy resolved, encode = this LayerResult built.
      decision.profile.decode = decode_seconds;
      decision.profile.validate = policy_seconds;
      decision.profile.encode = SecondsSince(encode_start);
      decision.profile.server = SecondsSince(call_start);
      service::EncodeLayerProfile(decision.profile, out->mutable_profile());
    }
  }
  return response;
}

}  // namespace kvtrim::inprocess

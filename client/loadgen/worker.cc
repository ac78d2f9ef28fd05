#include "client/loadgen/worker.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/kvtrim_client.h"
#include "client/loadgen/layer_source.h"

namespace kvtrim::loadgen {
namespace {

/// The `begin` settings of prefill `prefill` of worker `worker`.
v1::CompressionSettings Settings(const LoadgenConfig& config, int worker, int prefill) {
  v1::CompressionSettings settings;
  settings.mutable_policy()->set_name(config.policy);
  settings.mutable_budget()->set_keep_fraction(config.keep_fraction);
  settings.set_num_layers(config.layers);
  settings.set_seed(config.seed);
  settings.set_request_id(absl::StrCat("loadgen-w", worker, "-p", prefill));
  settings.set_numerics(config.numerics);
  settings.set_answer_encoding(config.packed_answer ? v1::ANSWER_ENCODING_PACKED
                                                    : v1::ANSWER_ENCODING_REPEATED);
  settings.set_profile(config.profile);
  settings.set_perturbation(config.perturbation);
  settings.set_model_digest(config.model_digest);
  return settings;
}

/// One prefill: begin, config.layers layers (each waited for with config.serial), finish.
absl::StatusOr<PrefillSample> RunPrefill(Client& client, LayerSource& source,
                                         const LoadgenConfig& config,
                                         const v1::CompressionSettings& settings,
                                         std::string* backend) {
  const int32_t layers = config.layers;
  PrefillSample sample;
  sample.layer_prepare_s.assign(layers, 0);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Session>> session = client.OpenSession(settings);
  if (!session.ok()) return session.status();
  for (int32_t id = 0; id < layers; ++id) {
    const absl::Time prepare = absl::Now();
    absl::StatusOr<v1::LayerInput> layer = source.Layer(id);
    if (!layer.ok()) return layer.status();
    sample.layer_prepare_s[id] = absl::ToDoubleSeconds(absl::Now() - prepare);
    const LayerTensorBytes bytes = source.Bytes();
    const bool from_memory =
        !bytes.keys.empty() || !bytes.values.empty() || !bytes.queries.empty();
    const absl::Time send = absl::Now();
    absl::Status sent = from_memory ? (*session)->SendLayer(*std::move(layer), bytes)
                                 : (*session)->SendLayer(*std::move(layer));
    const absl::Duration send_time = absl::Now() - send;
    if (!sent.ok()) {
      return absl::Status(sent.code(), absl::StrCat("layer ", id, ": ", sent.message()));
    }
    if (config.serial) {
      if (absl::Status answered = (*session)->WaitForAnswer(id); !answered.ok()) {
        return absl::Status(answered.code(), absl::StrCat("layer ", id, ": ", answered.message()));
      }
      sample.serial_wait_latency_s.push_back(absl::ToDoubleSeconds(absl::Now() - prepare));
      sample.serial_send_s.push_back(absl::ToDoubleSeconds(send_time));
    }
  }
  absl::StatusOr<SessionResult> result = (*session)->Finish();
  if (!result.ok()) return result.status();
  sample.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (static_cast<int32_t>(result->layers.size()) != layers) {
    return absl::InternalError(
        absl::StrCat("the session answered ", result->layers.size(), " layers, not ", layers));
  }
  for (const v1::LayerResult& answer : result->layers) {
    const int32_t id = answer.layer_id();
    auto round_trip = result->round_trip_seconds.find(id);
    if (id < 0 || id >= layers || round_trip == result->round_trip_seconds.end()) {
      return absl::InternalError(absl::StrCat("the session answered unknown layer ", id));
    }
    sample.layer_latency_s.push_back(sample.layer_prepare_s[id] + round_trip->second);
    sample.compute_s.push_back(answer.compute_seconds());
    sample.fast_layers += answer.numerics() == v1::NUMERICS_FAST;
    sample.exact_layers += answer.numerics() == v1::NUMERICS_EXACT;
    if (answer.has_profile()) sample.stages.Add(answer.profile(), round_trip->second);
  }
  sample.wire_bytes = source.WireBytesPerLayer() * layers;
  sample.tokens_in = result->summary.tokens_in();
  sample.tokens_kept = result->summary.tokens_kept();
  *backend = result->summary.backend();
  return sample;
}

}  // namespace

absl::Time StartLine::Arrive() {
  std::unique_lock<std::mutex> lock(mu_);
  if (--waiting_ == 0) {
    start_ = absl::Now();
    all_arrived_.notify_all();
  } else {
    all_arrived_.wait(lock, [this] { return waiting_ == 0; });
  }
  return start_;
}

void RunWorker(int index, const LoadgenConfig& config, const HostLayer& layer,
               StartLine* start_line, WorkerResult* out) {
  out->worker = index;
  bool arrived = false;
  auto fail = [&](absl::Status status) {
    out->status = std::move(status);
    if (!arrived) start_line->Arrive();  // never hold the others back
  };

  ClientOptions options;
  options.session_deadline = absl::Seconds(config.timeout_s);
  options.max_message_bytes = config.max_message_bytes;
  options.session_chunk_bytes = config.transport == Transport::kInline ? config.chunk_bytes : 0;
  options.http2_window_bytes = config.http2_window_bytes;
  options.own_connection = !config.shared_connection;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(config.target, options);
  if (!client.ok()) return fail(client.status());
  absl::StatusOr<std::unique_ptr<LayerSource>> source = MakeLayerSource(config, layer, **client);
  if (!source.ok()) return fail(source.status());
  out->notes = (*source)->notes();

  for (int p = 0; p < config.warmup_prefills; ++p) {
    absl::StatusOr<PrefillSample> warmup =
        RunPrefill(**client, **source, config, Settings(config, index, -1 - p), &out->backend);
    if (!warmup.ok()) {
      return fail(absl::Status(warmup.status().code(), absl::StrCat("warm-up prefill ", p, ": ",
                                                                    warmup.status().message())));
    }
  }
  const absl::Time common_start = start_line->Arrive();
  arrived = true;
  out->start_s = absl::ToDoubleSeconds(absl::Now() - common_start);
  for (int p = 0; p < config.prefills; ++p) {
    absl::StatusOr<PrefillSample> sample =
        RunPrefill(**client, **source, config, Settings(config, index, p), &out->backend);
    if (!sample.ok()) {
      out->end_s = absl::ToDoubleSeconds(absl::Now() - common_start);
      return fail(absl::Status(sample.status().code(),
                               absl::StrCat("prefill ", p, ": ", sample.status().message())));
    }
    out->prefills.push_back(std::move(*sample));
  }
  out->end_s = absl::ToDoubleSeconds(absl::Now() - common_start);
  source->reset();  // close the lease and free the buffers before the client goes
}

}  // namespace kvtrim::loadgen

#include "kvtrim/v1/http2_window.h"
#include "client/kvtrim_client.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kvtrim {

/// The generated stubs of the two services the client talks to.
struct Client::Stubs {
  std::unique_ptr<v1::Kvtrim::Stub> kvtrim;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

const char* HealthStateName(HealthState state) {
  switch (state) {
    case HealthState::kServing:
      return "SERVING";
    case HealthState::kNotServing:
      return "NOT_SERVING";
    case HealthState::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthState::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                       const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("target: must not be empty");
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes: must be positive, got ", options.max_message_bytes));
  }
  if (options.default_deadline <= absl::ZeroDuration() ||
      options.session_deadline <= absl::ZeroDuration() ||
      options.register_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "default_deadline, session_deadline and register_deadline must be positive");
  }
  if (options.register_chunk_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register_chunk_bytes: must be positive, got ", options.register_chunk_bytes));
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  if (options.http2_window_bytes > 0) {
    for (const auto& [name, value] : v1::Http2WindowArguments(options.http2_window_bytes)) {
      args.SetInt(name, value);
    }
  }
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!options.load_balancing_policy.empty()) {
    if (options.load_balancing_policy != "round_robin" &&
        options.load_balancing_policy != "pick_first") {
      return absl::InvalidArgumentError(
          absl::StrCat("load_balancing_policy: expected round_robin or pick_first, got '",
                       options.load_balancing_policy.substr(0, 64), "'"));
    }
    args.SetServiceConfigJSON(absl::StrCat(R"({"loadBalancingConfig": [{")",
                                           options.load_balancing_policy, R"(": {}}]})"));
  }
  if (!options.tls_server_name.empty()) {
    if (options.credentials == nullptr) {
      return absl::InvalidArgumentError("tls_server_name: needs TLS credentials");
    }
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds =
      options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(target, creds, args);
  if (options.connect_timeout > absl::ZeroDuration() &&
      !channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("could not connect to ", target, " within ",
                                               absl::FormatDuration(options.connect_timeout)));
  }
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)), channel_(std::move(channel)), stubs_(new Stubs) {
  stubs_->kvtrim = v1::Kvtrim::NewStub(channel_);
  stubs_->health = grpc::health::v1::Health::NewStub(channel_);
}

Client::~Client() = default;

std::unique_ptr<grpc::ClientContext> Client::UnaryContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.default_deadline));
  if (!options_.auth_token.empty()) {
    context->AddMetadata(kAuthorizationMetadataKey, Authorization());
  }
  return context;
}

absl::StatusOr<HealthState> Client::Health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  auto context = UnaryContext();
  absl::Status status = FromGrpcStatus(stubs_->health->Check(context.get(), request, &response));
  if (!status.ok()) return status;
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return HealthState::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return HealthState::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return HealthState::kServiceUnknown;
    default:
      return HealthState::kUnknown;
  }
}

absl::StatusOr<v1::ListPoliciesResponse> Client::ListPolicies() {
  v1::ListPoliciesResponse response;
  auto context = UnaryContext();
  absl::Status status = FromGrpcStatus(
      stubs_->kvtrim->ListPolicies(context.get(), v1::ListPoliciesRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CompressResponse> Client::Compress(const v1::CompressRequest& request) {
  const std::string client_id = this->client_id();
  auto call = [&]() -> absl::StatusOr<v1::CompressResponse> {
    v1::CompressResponse response;
    auto context = UnaryContext();
    if (!client_id.empty()) context->AddMetadata(kClientIdMetadataKey, client_id);
    absl::Status status =
        FromGrpcStatus(stubs_->kvtrim->Compress(context.get(), request, &response));
    if (!status.ok()) return status;
    return response;
  };
  absl::StatusOr<v1::CompressResponse> response = call();
  const std::string& digest = request.settings().model_digest();
  if (response.ok() || !IsUnknownModelDigest(response.status()) ||
      RememberedBundle(digest) == nullptr) {
    return response;
  }
  // The server lost the model (restart without its data directory, another replica):
  // register it again and retry once.
  if (absl::Status registered = Reregister(digest); !registered.ok()) {
    return absl::Status(registered.code(),
                        absl::StrCat("re-registering the model after \"",
                                     response.status().message(), "\" failed: ",
                                     registered.message()));
  }
  return call();
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession(
    const v1::CompressionSettings& settings) {
  SessionOptions session;
  session.deadline = options_.session_deadline;
  session.chunk_bytes = options_.session_chunk_bytes;
  session.client_id = client_id();
  if (!options_.auth_token.empty()) session.authorization = Authorization();
  const std::string digest = settings.model_digest();
  if (RememberedBundle(digest) != nullptr) {
    session.retry.reregister = [this, digest] { return Reregister(digest); };
    session.retry.max_replay_bytes = options_.session_replay_bytes;
  }
  return Session::Open(channel_, settings, std::move(session));
}

absl::StatusOr<std::unique_ptr<RegionLease>> Client::OpenRegionLease() {
  return RegionLease::Open(stubs_->kvtrim.get(),
                           options_.auth_token.empty() ? std::string() : Authorization());
}

std::string Client::Authorization() const { return "Bearer " + options_.auth_token; }

void Client::SetClientId(std::string id) {
  std::lock_guard<std::mutex> lock(client_id_mutex_);
  client_id_ = std::move(id);
}

std::string Client::client_id() const {
  std::lock_guard<std::mutex> lock(client_id_mutex_);
  return client_id_;
}

absl::StatusOr<std::string> Client::SendRegistration(const ModelBundle& bundle) {
  // Each chunk is one message: leave room for its name, shape and manifest.
  constexpr int kOverhead = 64 << 10;
  const int cap = options_.max_message_bytes > 2 * kOverhead
                      ? options_.max_message_bytes - kOverhead
                      : std::max(1, options_.max_message_bytes / 2);
  const size_t chunk = static_cast<size_t>(std::min(options_.register_chunk_bytes, cap));

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.register_deadline));
  if (!options_.auth_token.empty()) context.AddMetadata(kAuthorizationMetadataKey, Authorization());
  v1::RegisterModelResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::RegisterModelRequest>> writer =
      stubs_->kvtrim->RegisterModel(&context, &response);
  v1::RegisterModelRequest message;
  *message.mutable_header() = bundle.header;
  bool open = writer->Write(message);
  for (auto it = bundle.weights.begin(); open && it != bundle.weights.end(); ++it) {
    const auto& [name, tensor] = *it;
    size_t offset = 0;
    do {  // at least one chunk, even for an empty tensor, so the server sees its shape
      message.Clear();
      v1::ModelWeightChunk* c = message.mutable_weight();
      c->set_name(name);
      c->set_offset_bytes(offset);
      if (offset == 0) {
        c->set_dtype(ToProtoDType(tensor.dtype));
        for (int64_t extent : tensor.shape) c->add_shape(extent);
        auto manifest = bundle.manifests.find(name);
        if (manifest != bundle.manifests.end()) c->set_manifest_json(manifest->second);
      }
      const size_t size = std::min(chunk, tensor.data.size() - offset);
      c->set_data(tensor.data.data() + offset, size);  // into the message's reused buffer
      offset += size;
      open = writer->Write(message);
    } while (open && offset < tensor.data.size());
  }
  if (open) writer->WritesDone();
  // When a write failed the server already ended the call; Finish has its status.
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (!status.ok()) return status;
  if (response.digest().empty()) {
    return absl::InternalError("RegisterModel: the server answered OK without a digest");
  }
  return response.digest();
}

absl::StatusOr<std::string> Client::RegisterModel(const ModelBundle& bundle) {
  return RegisterModel(std::make_shared<const ModelBundle>(bundle));
}

absl::StatusOr<std::string> Client::RegisterModel(ModelBundle&& bundle) {
  return RegisterModel(std::make_shared<const ModelBundle>(std::move(bundle)));
}

absl::StatusOr<std::string> Client::RegisterModel(std::shared_ptr<const ModelBundle> bundle) {
  if (bundle == nullptr) return absl::InvalidArgumentError("RegisterModel: bundle is null");
  absl::StatusOr<std::string> digest = SendRegistration(*bundle);
  if (!digest.ok()) return digest.status();
  std::lock_guard<std::mutex> lock(bundles_mutex_);
  bundles_[*digest] = std::move(bundle);
  return digest;
}

std::shared_ptr<const ModelBundle> Client::RememberedBundle(const std::string& digest) const {
  if (digest.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(bundles_mutex_);
  auto it = bundles_.find(digest);
  return it == bundles_.end() ? nullptr : it->second;
}

absl::Status Client::Reregister(const std::string& digest) {
  std::shared_ptr<const ModelBundle> bundle = RememberedBundle(digest);
  if (bundle == nullptr) {
    return absl::NotFoundError(absl::StrCat("no bundle remembered for model ", digest));
  }
  absl::StatusOr<std::string> again = SendRegistration(*bundle);
  if (!again.ok()) return again.status();
  if (*again != digest) {
    return absl::InternalError(absl::StrCat("the server registered the bundle as ", *again,
                                            ", not as ", digest));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels() {
  v1::ListModelsResponse response;
  auto context = UnaryContext();
  absl::Status status = FromGrpcStatus(
      stubs_->kvtrim->ListModels(context.get(), v1::ListModelsRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::ListRegionsResponse> Client::ListRegions() {
  v1::ListRegionsResponse response;
  auto context = UnaryContext();
  if (const std::string id = client_id(); !id.empty()) {
    context->AddMetadata(kClientIdMetadataKey, id);
  }
  absl::Status status = FromGrpcStatus(
      stubs_->kvtrim->ListRegions(context.get(), v1::ListRegionsRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

absl::Status Client::DeleteModel(const std::string& digest) {
  v1::DeleteModelRequest request;
  request.set_digest(digest);
  v1::DeleteModelResponse response;
  auto context = UnaryContext();
  absl::Status status =
      FromGrpcStatus(stubs_->kvtrim->DeleteModel(context.get(), request, &response));
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(bundles_mutex_);
  bundles_.erase(digest);
  return absl::OkStatus();
}

}  // namespace kvtrim

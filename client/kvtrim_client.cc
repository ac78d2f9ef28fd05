#include "client/kvtrim_client.h"

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
      options.session_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_deadline and session_deadline must be positive");
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
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
  v1::CompressResponse response;
  auto context = UnaryContext();
  absl::Status status =
      FromGrpcStatus(stubs_->kvtrim->Compress(context.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession(
    const v1::CompressionSettings& settings) {
  return Session::Open(stubs_->kvtrim.get(), settings, options_.session_deadline);
}

}  // namespace kvtrim

// The C++ client of the kvtrim sidecar: a channel with per-call deadlines and a StatusOr API
// over the kvtrim.v1.Kvtrim service and the standard grpc.health.v1 health check.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/model_bundle.h"
#include "client/regions.h"
#include "client/session.h"
#include "kvtrim/v1/kvtrim.grpc.pb.h"

namespace kvtrim {

/// Settings of a client's channel and of its calls.
struct ClientOptions {
  /// Deadline of every unary call (Health, ListPolicies, Compress), from the call's start.
  absl::Duration default_deadline = absl::Seconds(30);
  /// Deadline of a whole CompressSession stream, from OpenSession to Finish.
  absl::Duration session_deadline = absl::Minutes(10);
  /// Deadline of one RegisterModel stream (all of a model's weights).
  absl::Duration register_deadline = absl::Minutes(10);
  /// Data bytes per RegisterModel weight chunk (each chunk is one gRPC message, so it is
  /// also capped at max_message_bytes minus 64 KiB for the message's other fields).
  int register_chunk_bytes = 4 << 20;
  /// Session layers kept for a replay after "unknown model digest" (SessionRetry), bytes.
  int64_t session_replay_bytes = int64_t{256} << 20;
  /// Sessions only: inline tensors longer than this many bytes are sent as tensor_chunk
  /// messages of at most this many data bytes after their layer message (SessionOptions).
  /// 0 = every layer as one message, as it is. Each message must fit the server's
  /// --max_message_bytes (and max_message_bytes here).
  int64_t session_chunk_bytes = 0;
  /// Largest message the channel sends or receives, in bytes (gRPC's default cap is 4 MiB;
  /// the server's --max_message_bytes must allow at least as much).
  int max_message_bytes = 64 << 20;
  /// HTTP/2 flow-control window and largest frame, bytes: positive values replace gRPC's
  /// defaults (64 KiB windows grown by its BDP probe; 16 KiB frames) with this window
  /// (frames up to 16 MiB - 1) and turn the probe off. 0 = gRPC's defaults.
  int http2_window_bytes = 0;
  /// True: this client's channel opens its own connection instead of sharing one with the
  /// process's other clients of the same target (gRPC's global subchannel pool), so several
  /// clients (e.g. the load generator's workers) do not queue on one TCP connection.
  bool own_connection = false;
  /// When positive, Connect waits this long for the channel to become ready and fails with
  /// UNAVAILABLE otherwise. Zero: connect lazily on the first call.
  absl::Duration connect_timeout = absl::ZeroDuration();
  /// gRPC load-balancing policy over the addresses the target resolves to: "round_robin"
  /// spreads calls over every replica behind a headless Service
  /// ("dns:///kvtrim-headless.kvtrim.svc:50051"); empty: gRPC's default, pick_first (one
  /// connection). Each call (a whole session too) stays on one replica.
  std::string load_balancing_policy;
  /// Channel credentials; null means insecure (plaintext), the sidecar's default.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  /// With TLS credentials: the name kvtrimd's certificate is checked against instead of the
  /// target's host (e.g. a probe dialing 127.0.0.1 of a certificate for kvtrim.kvtrim.svc).
  /// Empty: the target's host.
  std::string tls_server_name;
  /// Bearer token of kvtrimd's --auth_tokens_file, sent with every call as
  /// `authorization: Bearer <token>`; empty: none.
  std::string auth_token;
};

/// Serving state of a service as grpc.health.v1 reports it.
enum class HealthState { kUnknown, kServing, kNotServing, kServiceUnknown };

/// Name of a HealthState ("SERVING", ...), for printing.
const char* HealthStateName(HealthState state);

/// A connection to one kvtrim server. Thread-safe: calls may run concurrently from several
/// threads. Every method returns the server's gRPC status code and message on failure
/// (converted by FromGrpcStatus), or DEADLINE_EXCEEDED when the call's deadline passes.
///
/// Registered models: the client remembers every bundle it registered (digest -> bundle).
/// When Compress, or a session before any layer answer, fails FAILED_PRECONDITION
/// "unknown model digest" for one of those digests (the server restarted without its data
/// directory, or another replica answered), the client registers the bundle again and
/// retries once by itself.
class Client {
 public:
  /// The health-check service name under which kvtrimd reports its serving state.
  static constexpr char kHealthServiceName[] = "kvtrim.v1.Kvtrim";

  /// Opens a channel to `target` ("host:port", "unix:/path", any gRPC target string).
  /// INVALID_ARGUMENT for an empty target or a non-positive max_message_bytes; UNAVAILABLE
  /// when options.connect_timeout is positive and the channel is not ready in time.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ClientOptions& options = {});

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// grpc.health.v1.Health/Check for `service` (default: the kvtrim service). An unknown
  /// service is the RPC error NOT_FOUND, as the health protocol specifies.
  absl::StatusOr<HealthState> Health(const std::string& service = kHealthServiceName);

  /// Every policy the server serves, with parts, inputs and parameter defaults and ranges.
  absl::StatusOr<v1::ListPoliciesResponse> ListPolicies();

  /// One unary Compress call: the decision for every layer in `request`.
  absl::StatusOr<v1::CompressResponse> Compress(const v1::CompressRequest& request);

  /// Opens a CompressSession stream and sends `settings` as its `begin` message. The
  /// returned Session streams layers (chunked per options().session_chunk_bytes) and
  /// collects the server's answers as they arrive; it must not outlive the client. The
  /// stream carries the client id SetClientId set when it was opened.
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(const v1::CompressionSettings& settings);

  /// Opens a Regions stream: a lease under which this worker registers its shared memory
  /// and CUDA IPC buffers. Pass its client_id() to SetClientId so that calls can use the
  /// regions. The lease must not outlive the client.
  absl::StatusOr<std::unique_ptr<RegionLease>> OpenRegionLease();

  /// From now on, every Compress call and every OpenSession stream carries gRPC metadata
  /// `kvtrim-client-id: <id>` (a RegionLease's client id; the server resolves region
  /// tensors only within that client's regions). An empty id sends none.
  void SetClientId(std::string id);

  /// The id SetClientId set ("" when none).
  std::string client_id() const;

  /// Streams `bundle` to RegisterModel (header, then each weight in register_chunk_bytes
  /// chunks) and returns its digest ("sha256:<hex>"), which compression settings name in
  /// model_digest. Registering the same content again returns the same digest. The bundle
  /// is remembered for automatic re-registration (the first overload copies it, the second
  /// takes it over: a multi-GB bundle is not copied).
  absl::StatusOr<std::string> RegisterModel(const ModelBundle& bundle);
  absl::StatusOr<std::string> RegisterModel(ModelBundle&& bundle);
  absl::StatusOr<std::string> RegisterModel(std::shared_ptr<const ModelBundle> bundle);

  /// Every model the server holds (digest, header, weight names).
  absl::StatusOr<v1::ListModelsResponse> ListModels();

  /// The server's zero-copy state (regions on or off, every client's leases and regions by
  /// kind) and, when SetClientId set a lease id, that lease's regions; NOT_FOUND when that
  /// lease is no longer open.
  absl::StatusOr<v1::ListRegionsResponse> ListRegions();

  /// Deletes the model `digest` on the server and forgets its bundle here.
  absl::Status DeleteModel(const std::string& digest);

  /// The options the client was created with.
  const ClientOptions& options() const { return options_; }

 private:
  struct Stubs;
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  /// A context whose deadline is now + options_.default_deadline.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  /// The `authorization` metadata value of options_.auth_token ("Bearer <token>").
  std::string Authorization() const;
  /// One RegisterModel stream of `bundle`; the digest the server answered.
  absl::StatusOr<std::string> SendRegistration(const ModelBundle& bundle);
  /// Registers the remembered bundle of `digest` again; NOT_FOUND when none is remembered,
  /// INTERNAL when the server answers another digest.
  absl::Status Reregister(const std::string& digest);
  /// The remembered bundle of `digest`, or null.
  std::shared_ptr<const ModelBundle> RememberedBundle(const std::string& digest) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stubs> stubs_;
  mutable std::mutex client_id_mutex_;  // guards client_id_
  std::string client_id_;
  mutable std::mutex bundles_mutex_;  // guards bundles_
  std::map<std::string, std::shared_ptr<const ModelBundle>> bundles_;  // by digest
};

}  // namespace kvtrim

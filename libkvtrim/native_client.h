// The C++ client driven through libkvtrim's C ABI (kvtrim_client_*): the native transport of
// other languages' clients. Python's grpcio adds about a quarter of a millisecond to every
// call over the C++ stack; a worker sending one layer at a time over CUDA IPC pays that per
// layer, so the Python client hands such calls to this one.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/kvtrim_client.h"
#include "client/regions.h"
#include "client/session.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "libkvtrim/caller_layer.h"

namespace kvtrim::inprocess {

class NativeSession;

/// One connection to kvtrimd with its own Regions lease (opened at the first CUDA tensor).
/// Host tensors travel inline (one copy into the request); CUDA tensors as cuda_ipc slices
/// of their allocations, each registered once (by its IPC handle; the oldest released when
/// the lease's limit is reached), read after the work queued on the caller's stream (an
/// interprocess event per device, recorded only when the stream has work pending).
/// Thread-safe.
class NativeClient {
 public:
  /// Connects to `target` (lazily: the first call opens the channel); `auth_token`: the
  /// bearer token sent with every call ("" = none).
  static absl::StatusOr<std::unique_ptr<NativeClient>> Connect(const std::string& target,
                                                               double timeout_seconds,
                                                               int max_message_bytes,
                                                               const std::string& auth_token);
  ~NativeClient();

  /// The Compress RPC over `layers`; the server's status on failure (its code and message),
  /// or INVALID_ARGUMENT "layers[i].<tensor>...." for a tensor this client cannot send.
  absl::StatusOr<v1::CompressResponse> Compress(const v1::CompressionSettings& settings,
                                                const std::vector<CallerLayer>& layers,
                                                void* cuda_stream);

  /// A CompressSession on this connection. With `open_lease` the Regions lease is opened
  /// first (its client id goes on the stream, for CUDA tensors); `*regions` says whether it
  /// is (kvtrimd may refuse it: host tensors only then).
  absl::StatusOr<std::unique_ptr<NativeSession>> OpenSession(
      const v1::CompressionSettings& settings, bool open_lease, bool* regions);

 private:
  friend class NativeSession;

  /// The LayerInput of a caller layer: CUDA tensors as cuda_ipc slices, host tensors inline
  /// or, with `bytes`, as spans of the caller's memory (sent in chunks, copied once); the
  /// output region when given. `*device` receives the CUDA ordinal of device tensors.
  absl::Status BuildLayer(const CallerLayer& layer, const std::string& field, v1::LayerInput* input,
                          LayerTensorBytes* bytes, int* device);
  NativeClient() = default;

  /// The proto tensor of a caller tensor (inline bytes, or a cuda_ipc slice).
  absl::Status FillTensor(const CallerTensor& tensor, const std::string& field, v1::Tensor* out,
                          absl::Span<const char>* host_bytes);
  /// The lease, opened on first use; the client then sends its id with every call.
  absl::StatusOr<RegionLease*> Lease();
  /// The region id of the allocation holding device `pointer` and the pointer's offset in it.
  absl::StatusOr<std::string> RegionOf(const void* pointer, int device, uint64_t* offset);
  /// The ready event id to send for tensors written on `stream` of `device` ("" when the
  /// stream has no pending work).
  absl::StatusOr<std::string> ReadyEvent(int device, void* stream);

  std::unique_ptr<Client> client_;
  std::mutex mu_;  // guards everything below
  std::unique_ptr<RegionLease> lease_;
  std::map<std::string, std::string> regions_;  // IPC handle bytes -> region id
  std::list<std::string> region_order_;         // handles, least recently used first
  /// (device, driver buffer id) -> IPC handle bytes of allocations registered before.
  std::map<std::pair<int, unsigned long long>, std::string> buffer_handles_;
  struct DeviceEvent {
    void* event = nullptr;  // cudaEvent_t (interprocess)
    std::string id;         // its region id on the lease
  };
  std::map<int, DeviceEvent> events_;
};

/// One CompressSession through the C++ client (kvtrim_session_*): layers sent as they come
/// (host tensors framed from the caller's memory, CUDA tensors as region slices), answers
/// read by the session's own thread. Use from one thread.
class NativeSession {
 public:
  /// Sends one layer (returns once written; the server may still read CUDA tensors).
  absl::Status Send(const CallerLayer& layer, void* cuda_stream);
  /// Waits for and returns one layer's answer (per-layer policies).
  absl::StatusOr<v1::LayerResult> Answer(int32_t layer_id) { return session_->Answer(layer_id); }
  /// Ends the session: every answer and the summary.
  absl::StatusOr<SessionResult> Finish() { return session_->Finish(); }

 private:
  friend class NativeClient;
  NativeSession(NativeClient* client, std::unique_ptr<Session> session)
      : client_(client), session_(std::move(session)) {}

  NativeClient* client_;
  std::unique_ptr<Session> session_;
};

}  // namespace kvtrim::inprocess

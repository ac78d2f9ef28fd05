// The C ABI of libkvtrim (kvtrim_c.h) over InprocessEngine: argument checks, statuses as
// codes and messages, answers as malloc'd serialized protobufs. No exception crosses it.
#include "libkvtrim/kvtrim_c.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "libkvtrim/inprocess_engine.h"
#include "libkvtrim/native_client.h"

struct kvtrim_engine {
  std::unique_ptr<kvtrim::inprocess::InprocessEngine> engine;
};

struct kvtrim_client {
  std::unique_ptr<kvtrim::inprocess::NativeClient> client;
};

struct kvtrim_session {
  std::unique_ptr<kvtrim::inprocess::NativeSession> session;
};

namespace {

using kvtrim::inprocess::CallerLayer;
using kvtrim::inprocess::CallerTensor;

/// Writes `message` (truncated, NUL-terminated) into `error` when there is room.
void WriteMessage(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  const size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

/// `status` as the ABI's return value, its message into `error`.
int32_t Report(const absl::Status& status, char* error, size_t error_size) {
  WriteMessage(std::string(status.message()), error, error_size);
  return static_cast<int32_t>(status.code());
}

/// Runs `body` (returning absl::Status), turning any exception into INTERNAL.
template <typename Body>
int32_t Guarded(char* error, size_t error_size, Body body) {
  try {
    return Report(body(), error, error_size);
  } catch (const std::bad_alloc&) {
    return Report(absl::ResourceExhaustedError("out of host memory"), error, error_size);
  } catch (const std::exception& e) {
    return Report(absl::InternalError(absl::StrCat("unexpected exception: ", e.what())), error,
                  error_size);
  } catch (...) {
    return Report(absl::InternalError("unexpected exception"), error, error_size);
  }
}

/// The CallerTensor of an ABI tensor.
CallerTensor ToCaller(const kvtrim_tensor& t) {
  CallerTensor out;
  out.data = t.data;
  out.dtype = static_cast<kvtrim::v1::DType>(t.dtype);
  out.device = t.device;
  for (int i = 0; i < 3; ++i) {
    out.shape[i] = t.shape[i];
    out.strides[i] = t.strides[i];
  }
  return out;
}

/// `message` serialized into a malloc'd buffer (*out, *size).
absl::Status SerializeTo(const google::protobuf::MessageLite& message, void** out, size_t* size) {
  const size_t bytes = message.ByteSizeLong();
  void* buffer = std::malloc(bytes == 0 ? 1 : bytes);
  if (buffer == nullptr) return absl::ResourceExhaustedError("answer: out of host memory");
  message.SerializeWithCachedSizesToArray(static_cast<uint8_t*>(buffer));
  *out = buffer;
  *size = bytes;
  return absl::OkStatus();
}

/// The CallerLayer of an ABI layer.
CallerLayer ToCallerLayer(const kvtrim_layer& layer) {
  CallerLayer out;
  out.layer_id = layer.layer_id;
  out.softmax_scale = layer.softmax_scale;
  out.keys = ToCaller(layer.keys);
  out.values = ToCaller(layer.values);
  out.queries = ToCaller(layer.queries);
  out.output = layer.output;
  out.output_capacity = layer.output_capacity;
  return out;
}

/// The serialized kvtrim.v1.CompressionSettings the caller passed; INVALID_ARGUMENT
/// "settings: ..." when the bytes are not one.
absl::StatusOr<kvtrim::v1::CompressionSettings> ParseSettings(const void* settings,
                                                              size_t settings_size) {
  kvtrim::v1::CompressionSettings parsed;
  if (settings_size > static_cast<size_t>(INT32_MAX) ||
      !parsed.ParseFromArray(settings, static_cast<int>(settings_size))) {
    return absl::InvalidArgumentError("settings: not a serialized kvtrim.v1.CompressionSettings");
  }
  return parsed;
}

/// The body both compress functions share: checks the arguments, parses the settings,
/// converts the layers, runs `compress` and returns its answer as a malloc'd buffer.
template <typename Compress>
absl::Status CompressWith(const void* settings, size_t settings_size, const kvtrim_layer* layers,
                          size_t count, void** answer, size_t* answer_size, Compress compress) {
  if (answer == nullptr || answer_size == nullptr) {
    return absl::InvalidArgumentError("answer: NULL out-pointer");
  }
  *answer = nullptr;
  *answer_size = 0;
  if (count > 0 && layers == nullptr) return absl::InvalidArgumentError("layers: NULL");
  auto parsed = ParseSettings(settings, settings_size);
  if (!parsed.ok()) return parsed.status();
  std::vector<CallerLayer> caller(count);
  for (size_t i = 0; i < count; ++i) caller[i] = ToCallerLayer(layers[i]);
  absl::StatusOr<kvtrim::v1::CompressResponse> response = compress(*parsed, caller);
  if (!response.ok()) return response.status();
  return SerializeTo(*response, answer, answer_size);
}

}  // namespace

extern "C" {

int32_t kvtrim_abi_version(void) { return KVTRIM_ABI_VERSION; }

int32_t kvtrim_engine_create(const char* backend, int32_t device, int32_t workers,
                             const char* numerics, kvtrim_engine** engine, char* error,
                             size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine: NULL out-pointer");
    *engine = nullptr;
    kvtrim::inprocess::EngineOptions options;
    const std::string kind = backend == nullptr ? "auto" : backend;
    if (kind == "cpu") {
      options.backend = kvtrim::service::BackendKind::kCpu;
    } else if (kind == "gpu") {
      options.backend = kvtrim::service::BackendKind::kGpu;
    } else if (kind != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("backend: expected cpu, gpu or auto, got '", kind.substr(0, 64), "'"));
    }
    const std::string mode = numerics == nullptr ? "fast" : numerics;
    if (mode == "exact") {
      options.default_numerics = kvtrim::Numerics::kExact;
    } else if (mode != "fast") {
      return absl::InvalidArgumentError(
          absl::StrCat("numerics: expected fast or exact, got '", mode.substr(0, 64), "'"));
    }
    if (workers < 1) {
      return absl::InvalidArgumentError(absl::StrCat("workers: must be >= 1, got ", workers));
    }
    options.device = device;
    options.workers = workers;
    auto created = kvtrim::inprocess::InprocessEngine::Create(options);
    if (!created.ok()) return created.status();
    *engine = new kvtrim_engine{*std::move(created)};
    return absl::OkStatus();
  });
}

void kvtrim_engine_free(kvtrim_engine* engine) { delete engine; }

const char* kvtrim_engine_backend(const kvtrim_engine* engine) {
  return engine == nullptr ? "" : engine->engine->backend_name();
}

int32_t kvtrim_register_model(kvtrim_engine* engine, const void* const* messages,
                              const size_t* message_sizes, size_t count, char* digest,
                              size_t digest_size, char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine: NULL");
    if (count > 0 && (messages == nullptr || message_sizes == nullptr)) {
      return absl::InvalidArgumentError("messages: NULL");
    }
    std::vector<std::string_view> views;
    for (size_t i = 0; i < count; ++i) {
      views.emplace_back(static_cast<const char*>(messages[i]), message_sizes[i]);
    }
    auto registered = engine->engine->RegisterModel(views);
    if (!registered.ok()) return registered.status();
    if (digest == nullptr || digest_size <= registered->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "digest: the buffer needs ", registered->size() + 1, " bytes, got ", digest_size));
    }
    WriteMessage(*registered, digest, digest_size);
    return absl::OkStatus();
  });
}

int32_t kvtrim_compress(kvtrim_engine* engine, const void* settings, size_t settings_size,
                        const kvtrim_layer* layers, size_t count, void* cuda_stream, void** answer,
                        size_t* answer_size, char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (engine == nullptr) return absl::InvalidArgumentError("engine: NULL");
    return CompressWith(
        settings, settings_size, layers, count, answer, answer_size,
        [&](const kvtrim::v1::CompressionSettings& parsed, const std::vector<CallerLayer>& caller) {
          return engine->engine->Compress(parsed, caller, cuda_stream);
        });
  });
}

int32_t kvtrim_client_connect(const char* target, double timeout_seconds, int32_t max_message_bytes,
                              const char* auth_token, kvtrim_client** client, char* error,
                              size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client: NULL out-pointer");
    *client = nullptr;
    if (target == nullptr || *target == '\0') return absl::InvalidArgumentError("target: empty");
    auto connected =
        kvtrim::inprocess::NativeClient::Connect(target, timeout_seconds, max_message_bytes,
                                                 auth_token == nullptr ? "" : auth_token);
    if (!connected.ok()) return connected.status();
    *client = new kvtrim_client{*std::move(connected)};
    return absl::OkStatus();
  });
}

void kvtrim_client_free(kvtrim_client* client) { delete client; }

int32_t kvtrim_client_compress(kvtrim_client* client, const void* settings, size_t settings_size,
                               const kvtrim_layer* layers, size_t count, void* cuda_stream,
                               void** answer, size_t* answer_size, char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client: NULL");
    return CompressWith(
        settings, settings_size, layers, count, answer, answer_size,
        [&](const kvtrim::v1::CompressionSettings& parsed, const std::vector<CallerLayer>& caller) {
          return client->client->Compress(parsed, caller, cuda_stream);
        });
  });
}

int32_t kvtrim_session_open(kvtrim_client* client, const void* settings, size_t settings_size,
                            int32_t open_lease, int32_t* regions, kvtrim_session** session,
                            char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (client == nullptr) return absl::InvalidArgumentError("client: NULL");
    if (session == nullptr) return absl::InvalidArgumentError("session: NULL out-pointer");
    *session = nullptr;
    auto parsed = ParseSettings(settings, settings_size);
    if (!parsed.ok()) return parsed.status();
    bool granted = false;
    auto opened = client->client->OpenSession(*parsed, open_lease != 0, &granted);
    if (!opened.ok()) return opened.status();
    if (regions != nullptr) *regions = granted ? 1 : 0;
    *session = new kvtrim_session{*std::move(opened)};
    return absl::OkStatus();
  });
}

int32_t kvtrim_session_send(kvtrim_session* session, const kvtrim_layer* layer, void* cuda_stream,
                            char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (session == nullptr) return absl::InvalidArgumentError("session: NULL");
    if (layer == nullptr) return absl::InvalidArgumentError("layer: NULL");
    return session->session->Send(ToCallerLayer(*layer), cuda_stream);
  });
}

int32_t kvtrim_session_answer(kvtrim_session* session, int32_t layer_id, void** answer,
                              size_t* answer_size, char* error, size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (session == nullptr) return absl::InvalidArgumentError("session: NULL");
    if (answer == nullptr || answer_size == nullptr) {
      return absl::InvalidArgumentError("answer: NULL out-pointer");
    }
    *answer = nullptr;
    *answer_size = 0;
    auto result = session->session->Answer(layer_id);
    if (!result.ok()) return result.status();
    return SerializeTo(*result, answer, answer_size);
  });
}

int32_t kvtrim_session_finish(kvtrim_session* session, void** layers, size_t* layers_size,
                              void** summary, size_t* summary_size, char* error,
                              size_t error_size) {
  return Guarded(error, error_size, [&]() -> absl::Status {
    if (session == nullptr) return absl::InvalidArgumentError("session: NULL");
    if (layers == nullptr || layers_size == nullptr || summary == nullptr ||
        summary_size == nullptr) {
      return absl::InvalidArgumentError("layers, summary: NULL out-pointer");
    }
    *layers = *summary = nullptr;
    *layers_size = *summary_size = 0;
    auto result = session->session->Finish();
    if (!result.ok()) return result.status();
    kvtrim::v1::CompressResponse response;
    response.set_backend(result->summary.backend());
    for (kvtrim::v1::LayerResult& layer : result->layers) *response.add_layers() = std::move(layer);
    KVTRIM_RETURN_IF_ERROR(SerializeTo(response, layers, layers_size));
    if (auto st = SerializeTo(result->summary, summary, summary_size); !st.ok()) {
      std::free(*layers);
      *layers = nullptr;
      return st;
    }
    return absl::OkStatus();
  });
}

void kvtrim_session_free(kvtrim_session* session) { delete session; }

void kvtrim_buffer_free(void* buffer) { std::free(buffer); }

}  // extern "C"

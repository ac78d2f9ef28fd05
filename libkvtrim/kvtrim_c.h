/* libkvtrim: kvtrim's engine inside the caller's process, behind a small C ABI.
 *
 * The same policies, backends, validation and answers as the kvtrimd sidecar, without a
 * second process: settings and answers are the sidecar's own protobuf messages
 * (kvtrim.v1.CompressionSettings in, kvtrim.v1.CompressResponse out, serialized), tensors
 * are the caller's host or CUDA device memory, read in place. Every function returns a
 * google.rpc.Code (0 = OK; 3 = INVALID_ARGUMENT, 9 = FAILED_PRECONDITION, 13 = INTERNAL, ...)
 * and writes the status message, NUL-terminated and truncated to `error_size`, into
 * `error` (may be NULL). Nothing throws across this boundary.
 *
 * Thread-safety: an engine may be used from several threads at once; create / free are not
 * concurrent with its other calls. The engine trusts its caller's pointers: a tensor's
 * shape and strides must describe memory the caller owns (in-process is for trusted code).
 */
#ifndef KVTRIM_C_H_
#define KVTRIM_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions (everything else in libkvtrim is hidden). */
#define KVTRIM_C_EXPORT __attribute__((visibility("default")))

/* The ABI version this header describes (kvtrim_abi_version() returns the library's). */
#define KVTRIM_ABI_VERSION 5

/* An engine: backend, policy registry and registered models. */
typedef struct kvtrim_engine kvtrim_engine;

/* One rank-3 tensor in the caller's memory. `data` NULL = absent (values, queries).
 * dtype: kvtrim.v1.DType (1 = f32, 2 = f16, 3 = bf16). device: -1 = host memory (dense
 * row-major only), >= 0 = that CUDA device's memory (the engine's device; any strides).
 * strides: in elements; {0, 0, 0} = dense row-major. */
typedef struct kvtrim_tensor {
  const void* data;
  int32_t dtype;
  int32_t device;
  int64_t shape[3];
  int64_t strides[3];
} kvtrim_tensor;

/* One layer: keys [H_kv, n, d], values [H_kv, n, d], queries [H_q, w, d] (post-RoPE, the
 * last w prompt positions), as LayerInput of the proto. softmax_scale 0 = 1/sqrt(d).
 * output (optional, per-layer policies, CUDA layers on the GPU): device memory of the keys'
 * device, 8-byte aligned, of output_capacity bytes >= 8 (L + 1) + 4 L n (L lists: H_kv, or 1
 * for shared / block-aligned answers), where kvtrim writes the kept lists (int64 offsets
 * [L + 1], then int32 indices) instead of answering them, as LayerInput.output does: the
 * answer's LayerResult then has output_written set. Model-wide policies ignore it (they
 * answer the lists). NULL = the lists in the answer. */
typedef struct kvtrim_layer {
  int32_t layer_id;
  float softmax_scale;
  kvtrim_tensor keys;
  kvtrim_tensor values;
  kvtrim_tensor queries;
  void* output;
  uint64_t output_capacity;
} kvtrim_layer;

/* The library's ABI version (KVTRIM_ABI_VERSION of the header it was built with). */
KVTRIM_C_EXPORT int32_t kvtrim_abi_version(void);

/* Creates an engine. backend: "cpu", "gpu" or "auto" (the GPU when one is visible);
 * device: the CUDA ordinal of the GPU backend; workers: CPU threads or GPU worker contexts
 * (>= 1); numerics: "fast" or "exact", the mode of settings that leave it unspecified. */
KVTRIM_C_EXPORT int32_t kvtrim_engine_create(const char* backend, int32_t device, int32_t workers,
                                             const char* numerics, kvtrim_engine** engine,
                                             char* error, size_t error_size);

/* Frees an engine (NULL is a no-op). */
KVTRIM_C_EXPORT void kvtrim_engine_free(kvtrim_engine* engine);

/* "cpu" or "gpu": the backend the engine computes on (static storage). */
KVTRIM_C_EXPORT const char* kvtrim_engine_backend(const kvtrim_engine* engine);

/* Registers a model from the serialized messages of a RegisterModel stream (header first,
 * then weight chunks) and writes its digest ("sha256:<64 hex>", NUL-terminated) into
 * `digest` (>= 72 bytes). */
KVTRIM_C_EXPORT int32_t kvtrim_register_model(kvtrim_engine* engine, const void* const* messages,
                                              const size_t* message_sizes, size_t count,
                                              char* digest, size_t digest_size, char* error,
                                              size_t error_size);

/* Compresses `count` layers under `settings` (a serialized kvtrim.v1.CompressionSettings),
 * as the Compress RPC does. Device tensors are read after the work queued on `cuda_stream`
 * (a cudaStream_t; NULL = the legacy default stream); the call returns when the answer is on
 * the host. On success *answer holds a serialized kvtrim.v1.CompressResponse of
 * *answer_size bytes, to free with kvtrim_buffer_free. */
KVTRIM_C_EXPORT int32_t kvtrim_compress(kvtrim_engine* engine, const void* settings,
                                        size_t settings_size, const kvtrim_layer* layers,
                                        size_t count, void* cuda_stream, void** answer,
                                        size_t* answer_size, char* error, size_t error_size);

/* --- The native client: the C++ client of kvtrimd, for other languages' clients ---------
 * A connection to a kvtrimd (lazily opened) with its own Regions lease for CUDA tensors:
 * host tensors are sent inline, CUDA tensors as CUDA IPC slices of their allocations (each
 * registered once; kvtrimd must run with --allow_client_shm on this node), read after the
 * work queued on `cuda_stream` when it has any. Errors are the server's own code and
 * message. */
typedef struct kvtrim_client kvtrim_client;

/* Connects to `target` ("host:port", "unix:PATH"); timeout_seconds: deadline of each call
 * (<= 0: 30 s); max_message_bytes: the channel's message cap (<= 0: 64 MiB); auth_token:
 * the bearer token of kvtrimd's --auth_tokens_file sent with every call (NULL or "": none). */
KVTRIM_C_EXPORT int32_t kvtrim_client_connect(const char* target, double timeout_seconds,
                                              int32_t max_message_bytes, const char* auth_token,
                                              kvtrim_client** client, char* error,
                                              size_t error_size);

/* Closes the connection and its lease (NULL is a no-op). */
KVTRIM_C_EXPORT void kvtrim_client_free(kvtrim_client* client);

/* The Compress RPC, with kvtrim_compress's arguments and answer. */
KVTRIM_C_EXPORT int32_t kvtrim_client_compress(kvtrim_client* client, const void* settings,
                                               size_t settings_size, const kvtrim_layer* layers,
                                               size_t count, void* cuda_stream, void** answer,
                                               size_t* answer_size, char* error, size_t error_size);

/* A CompressSession through the native client: layers sent as they come (host tensors framed
 * in chunks from the caller's memory, copied once; CUDA tensors as region slices, with an
 * optional output buffer as in kvtrim_layer), answers read by the session's own thread. */
typedef struct kvtrim_session kvtrim_session;

/* Opens a session with `settings` (serialized kvtrim.v1.CompressionSettings). open_lease != 0
 * opens the client's Regions lease first (needed for CUDA tensors); *regions (may be NULL)
 * is then 1 when kvtrimd granted it, 0 when it refused (host tensors only). */
KVTRIM_C_EXPORT int32_t kvtrim_session_open(kvtrim_client* client, const void* settings,
                                            size_t settings_size, int32_t open_lease,
                                            int32_t* regions, kvtrim_session** session, char* error,
                                            size_t error_size);

/* Sends one layer; returns once it is written (kvtrimd may still read CUDA tensors: keep
 * them until the layer is answered). */
KVTRIM_C_EXPORT int32_t kvtrim_session_send(kvtrim_session* session, const kvtrim_layer* layer,
                                            void* cuda_stream, char* error, size_t error_size);

/* Waits for one layer's answer (per-layer policies): a serialized kvtrim.v1.LayerResult to
 * free with kvtrim_buffer_free. */
KVTRIM_C_EXPORT int32_t kvtrim_session_answer(kvtrim_session* session, int32_t layer_id,
                                              void** answer, size_t* answer_size, char* error,
                                              size_t error_size);

/* Finishes the session: every answer as a serialized kvtrim.v1.CompressResponse (layers in
 * the order answered, backend) and the serialized kvtrim.v1.SessionSummary, both to free with
 * kvtrim_buffer_free. The session can then only be freed. */
KVTRIM_C_EXPORT int32_t kvtrim_session_finish(kvtrim_session* session, void** layers,
                                              size_t* layers_size, void** summary,
                                              size_t* summary_size, char* error, size_t error_size);

/* Frees a session (an unfinished one is cancelled; NULL is a no-op). */
KVTRIM_C_EXPORT void kvtrim_session_free(kvtrim_session* session);

/* Frees a buffer kvtrim_compress or kvtrim_client_compress returned (NULL is a no-op). */
KVTRIM_C_EXPORT void kvtrim_buffer_free(void* buffer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTRIM_C_H_ */

// The content digest that identifies a registered model: "sha256:<64 lower-case hex>" of a
// canonical serialisation of everything the client registered. Independent of how the
// weights were chunked on the wire and of the order they arrived in.
#pragma once

#include <string>

#include "kernels/model.h"

namespace kvtrim::service {

/// Prefix of every model digest.
inline constexpr char kDigestPrefix[] = "sha256:";

/// SHA-256 (OpenSSL libcrypto) over the canonical serialisation of `input`:
///   "kvtrim-model-v2"
///   header: name, num_layers, num_query_heads, num_kv_heads, head_dim, hidden_size,
///           rope_theta (IEEE-754 bits), rope_scaling_json, rope_layout
///   count of tensors, then per tensor in name order: name, dtype ("f32"|"f16"|"bf16"),
///           rank, each extent, byte length, SHA-256 of the bytes (32 raw bytes)
///   count of profiles, then per profile in name order: name, metric, sink, window, dtype,
///           rank, each extent, byte length, SHA-256 of the bytes (32 raw bytes)
/// Integers are 8-byte little-endian; strings are their 8-byte little-endian length followed
/// by their bytes. Each tensor's bytes are hashed on their own, so the tensors are hashed
/// side by side on the host's cores (a 2.2 GB 8B-shaped bundle: one tensor's time, not the
/// sum). Returns "sha256:<hex>".
std::string ComputeModelDigest(const ModelInput& input);

/// The digest of registrations made before v2: SHA-256 over the same fields with
/// "kvtrim-model-v1" first and each tensor's bytes themselves in place of their SHA-256
/// (one serial pass over every byte). Only for recognising model files persisted by
/// earlier servers (ModelStore migrates them to the v2 digest).
std::string ComputeLegacyModelDigest(const ModelInput& input);

/// True when `digest` is "sha256:" followed by exactly 64 lower-case hex digits.
bool IsWellFormedDigest(const std::string& digest);

/// The 64 hex digits of a well-formed digest (no "sha256:").
std::string DigestHex(const std::string& digest);

}  // namespace kvtrim::service

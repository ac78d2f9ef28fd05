// kvtrimd's gRPC server credentials: plaintext, TLS (--tls_cert, --tls_key) or mutual TLS
// (--tls_client_ca). The PEM files are read once at start-up, bounded in size and checked
// (the certificate parses, the key parses and matches it, the CA file holds a certificate),
// so a wrong file is a start-up error naming the flag instead of a port that will not bind.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "service/config.h"

namespace kvtrim::service {

/// Largest PEM file kvtrimd reads for TLS.
inline constexpr int64_t kMaxPemFileBytes = int64_t{1} << 20;

/// The credentials of kvtrim's gRPC port under `config`; INVALID_ARGUMENT /
/// FAILED_PRECONDITION naming the --tls_* flag whose file is missing, too large or wrong.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const Config& config);

/// "plaintext", "tls" or "mtls": what MakeServerCredentials serves for `config`.
const char* TransportSecurityName(const Config& config);

}  // namespace kvtrim::service

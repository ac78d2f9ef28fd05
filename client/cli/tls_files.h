// The CLI's TLS options: channel credentials from PEM files (--tls_ca, --tls_cert,
// --tls_key), for a kvtrimd started with --tls_cert (and --tls_client_ca for mutual TLS);
// and its bearer token file (--auth_token_file) for a kvtrimd with --auth_tokens_file.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"

namespace kvtrim::cli {

/// Largest PEM file the CLI reads.
inline constexpr int64_t kMaxPemFileBytes = int64_t{1} << 20;

/// TLS channel credentials: `ca_file` the CA(s) to verify kvtrimd with (empty = the system
/// roots), `cert_file` and `key_file` this client's certificate and key for mutual TLS (both
/// or neither). INVALID_ARGUMENT / FAILED_PRECONDITION naming the --tls_* flag otherwise.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file);

/// The bearer token in `path` (--auth_token_file: one token, surrounding whitespace
/// ignored, at most 4 KiB); INVALID_ARGUMENT / FAILED_PRECONDITION naming the flag.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

}  // namespace kvtrim::cli

#include "client/cli/tls_files.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvtrim::cli {

namespace {

/// The file `path` of --`flag`, at most `max_bytes` bytes.
absl::StatusOr<std::string> ReadSmallFile(const char* flag, const std::string& path,
                                          int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  const std::streamoff size = in.tellg();
  if (size < 0 || size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' has ", size,
                                                   " bytes; at most ", max_bytes));
  }
  std::string pem(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(pem.data(), size);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  }
  return pem;
}

/// The PEM file `path` of --`flag`, at most kMaxPemFileBytes.
absl::StatusOr<std::string> ReadPemFile(const char* flag, const std::string& path) {
  return ReadSmallFile(flag, path, kMaxPemFileBytes);
}

}  // namespace

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  auto text = ReadSmallFile("auth_token_file", path, 4096);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty() || token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file: '", path, "' must hold one token (", token.size(), " characters)"));
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TlsChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert / --tls_key: give both (mutual TLS) or neither");
  }
  grpc::SslCredentialsOptions options;
  if (!ca_file.empty()) {
    auto ca = ReadPemFile("tls_ca", ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  if (!cert_file.empty()) {
    auto cert = ReadPemFile("tls_cert", cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPemFile("tls_key", key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

}  // namespace kvtrim::cli

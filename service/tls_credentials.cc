#include "service/tls_credentials.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "grpcpp/security/server_credentials.h"
#include "service/bounded_file.h"

namespace kvtrim::service {

namespace {

/// The contents of the PEM file `path` given as --`flag` (a regular file of at most
/// kMaxPemFileBytes, read without blocking).
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  return ReadBoundedFile(flag, path, static_cast<size_t>(kMaxPemFileBytes));
}

/// A read-only OpenSSL memory BIO over `pem`, freed with the object.
class PemBio {
 public:
  explicit PemBio(const std::string& pem)
      : bio_(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))) {}
  ~PemBio() { BIO_free(bio_); }
  PemBio(const PemBio&) = delete;
  PemBio& operator=(const PemBio&) = delete;
  BIO* get() const { return bio_; }

 private:
  BIO* bio_;
};

/// OK when `pem` starts with a certificate (its first one when `key` is null), and when
/// `key` is given, that certificate matches the private key in it.
absl::Status CheckPem(const char* flag, const std::string& path, const std::string& pem,
                      const std::string* key, const char* key_flag) {
  PemBio cert_bio(pem);
  X509* cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", path, "' holds no PEM certificate"));
  }
  absl::Status status;
  if (key != nullptr) {
    PemBio key_bio(*key);
    EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    if (pkey == nullptr) {
      status = absl::InvalidArgumentError(
          absl::StrCat("--", key_flag, ": holds no PEM private key (unencrypted)"));
    } else if (X509_check_private_key(cert, pkey) != 1) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "--", key_flag, ": the private key does not match the certificate of --", flag));
    }
    EVP_PKEY_free(pkey);
  }
  X509_free(cert);
  return status;
}

}  // namespace

const char* TransportSecurityName(const Config& config) {
  if (config.tls_cert.empty()) return "plaintext";
  return config.tls_client_ca.empty() ? "tls" : "mtls";
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const Config& config) {
  if (config.tls_cert.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadPem("tls_cert", config.tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("tls_key", config.tls_key);
  if (!key.ok()) return key.status();
  KVTRIM_RETURN_IF_ERROR(CheckPem("tls_cert", config.tls_cert, *cert, &*key, "tls_key"));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!config.tls_client_ca.empty()) {
    auto ca = ReadPem("tls_client_ca", config.tls_client_ca);
    if (!ca.ok()) return ca.status();
    KVTRIM_RETURN_IF_ERROR(CheckPem("tls_client_ca", config.tls_client_ca, *ca, nullptr, nullptr));
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace kvtrim::service

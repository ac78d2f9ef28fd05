// Per-tenant bearer tokens (--auth_tokens_file): which tenant a call's
// `authorization: Bearer <token>` metadata names, and the tenant-scoped lease keys.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace kvtrim::service {

/// The token table: SHA-256 digest of each token -> its tenant (tokens themselves are not
/// kept). Immutable once loaded; thread-safe.
class BearerTokens {
 public:
  /// Largest token file read (bytes), longest token and tenant name.
  static constexpr size_t kMaxFileBytes = size_t{1} << 20;
  static constexpr size_t kMinTokenBytes = 16;
  static constexpr size_t kMaxTokenBytes = 512;
  static constexpr size_t kMaxTenantBytes = 64;

  /// Reads `path`: one `<token> <tenant>` pair per line (blank lines and lines starting with
  /// '#' skipped). Tokens: 16..512 characters of A-Z a-z 0-9 - . _ ~ + / = (RFC 6750);
  /// tenants: 1..64 characters of A-Z a-z 0-9 - . _. Errors name --auth_tokens_file and the
  /// line, never a token's text: INVALID_ARGUMENT for a malformed line, a duplicate token or
  /// an empty table; NOT_FOUND / FAILED_PRECONDITION for a missing, oversize or irregular file.
  static absl::StatusOr<std::shared_ptr<const BearerTokens>> Load(const std::string& path);
  /// The same from the file's text (`source` names it in messages).
  static absl::StatusOr<std::shared_ptr<const BearerTokens>> Parse(const std::string& text,
                                                                   const std::string& source);

  /// The tenant of the call's `authorization` metadata: UNAUTHENTICATED when it is
  /// missing, not `Bearer <token>`, or an unknown token (the message never quotes it).
  absl::StatusOr<std::string> TenantOf(const grpc::ServerContextBase& context) const;
  /// The tenant of a token, or UNAUTHENTICATED.
  absl::StatusOr<std::string> TenantOfToken(const std::string& token) const;

  /// Tokens in the table.
  size_t size() const { return tenants_.size(); }
  /// Distinct tenants.
  size_t tenants() const;

 private:
  using Digest = std::array<uint8_t, 32>;
  std::map<Digest, std::string> tenants_;
};

/// The gRPC metadata key of the bearer token.
inline constexpr char kAuthorizationMetadata[] = "authorization";

/// The registry key of a lease: `client_id` scoped to `tenant` ("" = no tenants: the id
/// itself), so one tenant's leases and regions are invisible to every other tenant.
std::string TenantScopedId(const std::string& tenant, const std::string& client_id);

}  // namespace kvtrim::service

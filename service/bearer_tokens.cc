#include "service/bearer_tokens.h"

#include <openssl/evp.h>

#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "service/bounded_file.h"

namespace kvtrim::service {

namespace {

constexpr char kFlag[] = "auth_tokens_file";
constexpr std::string_view kBearerPrefix = "Bearer ";

/// SHA-256 of `text`.
std::array<uint8_t, 32> Sha256(std::string_view text) {
  std::array<uint8_t, 32> out{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), out.data(), &size, EVP_sha256(), nullptr);
  return out;
}

/// RFC 6750 b64token characters.
bool IsTokenChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == '=';
}

/// Tenant name characters.
bool IsTenantChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_';
}

/// Whitespace-separated words of `line`.
std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

/// UNAUTHENTICATED with kvtrim's hint.
absl::Status Unauthenticated(const std::string& why) {
  return absl::UnauthenticatedError(absl::StrCat(
      "authorization: ", why,
      "; this kvtrimd needs `authorization: Bearer <token>` metadata on every call"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const BearerTokens>> BearerTokens::Load(const std::string& path) {
  auto text = ReadBoundedFile(kFlag, path, kMaxFileBytes);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

absl::StatusOr<std::shared_ptr<const BearerTokens>> BearerTokens::Parse(
    const std::string& text, const std::string& source) {
  auto tokens = std::make_shared<BearerTokens>();
  std::string_view rest = text;
  int line_number = 0;
  while (!rest.empty()) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    ++line_number;
    const auto words = Words(line);
    if (words.empty() || words[0][0] == '#') continue;
    const std::string where = absl::StrCat("--", kFlag, ": line ", line_number);
    if (words.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected `<token> <tenant>`, got ", words.size(), " words"));
    }
    const std::string_view token = words[0];
    const std::string_view tenant = words[1];
    bool token_ok = token.size() >= kMinTokenBytes && token.size() <= kMaxTokenBytes;
    for (char c : token) token_ok = token_ok && IsTokenChar(c);
    if (!token_ok) {
      // Never quote a token: the file is a secret.
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the token (", token.size(), " characters) must have ", kMinTokenBytes,
          "..", kMaxTokenBytes, " characters of A-Z a-z 0-9 - . _ ~ + / ="));
    }
    bool tenant_ok = !tenant.empty() && tenant.size() <= kMaxTenantBytes;
    for (char c : tenant) tenant_ok = tenant_ok && IsTenantChar(c);
    if (!tenant_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the tenant (", tenant.size(), " characters) must have 1..",
          kMaxTenantBytes, " characters of A-Z a-z 0-9 - . _"));
    }
    if (!tokens->tenants_.emplace(Sha256(token), std::string(tenant)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": this token is already listed on an earlier line"));
    }
  }
  if (tokens->tenants_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", kFlag, ": ", source,
                                                   " lists no token; every call would be "
                                                   "refused"));
  }
  return std::shared_ptr<const BearerTokens>(std::move(tokens));
}

absl::StatusOr<std::string> BearerTokens::TenantOf(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  const auto range = metadata.equal_range(kAuthorizationMetadata);
  if (range.first == range.second) return Unauthenticated("missing");
  if (std::next(range.first) != range.second) return Unauthenticated("given more than once");
  const std::string_view value(range.first->second.data(), range.first->second.size());
  if (value.substr(0, kBearerPrefix.size()) != kBearerPrefix) {
    return Unauthenticated("expected the `Bearer <token>` scheme");
  }
  return TenantOfToken(std::string(value.substr(kBearerPrefix.size())));
}

absl::StatusOr<std::string> BearerTokens::TenantOfToken(const std::string& token) const {
  if (token.empty() || token.size() > kMaxTokenBytes) return Unauthenticated("unknown token");
  auto it = tenants_.find(Sha256(token));
  if (it == tenants_.end()) return Unauthenticated("unknown token");
  return it->second;
}

size_t BearerTokens::tenants() const {
  std::set<std::string> names;
  for (const auto& [digest, tenant] : tenants_) names.insert(tenant);
  return names.size();
}

std::string TenantScopedId(const std::string& tenant, const std::string& client_id) {
  if (tenant.empty() || client_id.empty()) return client_id;
  return absl::StrCat(tenant, "/", client_id);
}

}  // namespace kvtrim::service

#include "service/model_digest.h"

#include <openssl/evp.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"

namespace kvtrim::service {

namespace {

/// Streams the canonical serialisation into one EVP SHA-256 context.
class CanonicalHasher {
 public:
  CanonicalHasher() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }

  void Bytes(const void* data, size_t size) { EVP_DigestUpdate(ctx_.get(), data, size); }

  /// 8-byte little-endian unsigned integer.
  void U64(uint64_t value) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
    Bytes(le, sizeof le);
  }
  void I64(int64_t value) { U64(static_cast<uint64_t>(value)); }

  /// The IEEE-754 bit pattern of `value`, as U64.
  void F64(double value) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    U64(bits);
  }

  /// Length-prefixed bytes.
  void String(const std::string& text) {
    U64(text.size());
    Bytes(text.data(), text.size());
  }

  /// dtype, rank, extents, length-prefixed bytes.
  void Tensor(const RawTensor& tensor) {
    String(DTypeName(tensor.dtype));
    U64(tensor.shape.size());
    for (int64_t extent : tensor.shape) I64(extent);
    String(tensor.bytes);
  }

  /// "sha256:" + 64 lower-case hex digits.
  std::string Finish() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &size);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = kDigestPrefix;
    for (unsigned int i = 0; i < size; ++i) {
      out.push_back(kHex[digest[i] >> 4]);
      out.push_back(kHex[digest[i] & 0xf]);
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

}  // namespace

std::string ComputeModelDigest(const ModelInput& input) {
  CanonicalHasher h;
  h.String("kvtrim-model-v1");
  const ModelLayout& m = input.layout;
  h.String(m.name);
  h.I64(m.num_layers);
  h.I64(m.num_query_heads);
  h.I64(m.num_kv_heads);
  h.I64(m.head_dim);
  h.I64(m.hidden_size);
  h.F64(input.rope_theta);
  h.String(input.rope_scaling_json);
  h.String(input.rope_layout);
  h.U64(input.tensors.size());
  for (const auto& [name, tensor] : input.tensors) {  // std::map: name order
    h.String(name);
    h.Tensor(tensor);
  }
  h.U64(input.profiles.size());
  for (const auto& [name, profile] : input.profiles) {
    h.String(name);
    h.String(profile.metric);
    h.I64(profile.sink);
    h.I64(profile.window);
    h.Tensor(profile.ratios);
  }
  return h.Finish();
}

bool IsWellFormedDigest(const std::string& digest) {
  if (!absl::StartsWith(digest, kDigestPrefix)) return false;
  const size_t prefix = std::strlen(kDigestPrefix);
  if (digest.size() != prefix + 64) return false;
  for (size_t i = prefix; i < digest.size(); ++i) {
    const char c = digest[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string DigestHex(const std::string& digest) {
  return digest.substr(std::strlen(kDigestPrefix));
}

}  // namespace kvtrim::service

#include "service/model_digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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

  /// dtype, rank, extents, then the bytes' length and `content`: the bytes themselves
  /// (v1) or their SHA-256 (v2).
  void Tensor(const RawTensor& tensor, const void* content, size_t content_size) {
    String(DTypeName(tensor.dtype));
    U64(tensor.shape.size());
    for (int64_t extent : tensor.shape) I64(extent);
    U64(tensor.bytes.size());
    Bytes(content, content_size);
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

using ContentHash = std::array<unsigned char, 32>;

/// SHA-256 of each of `blobs`, the blobs spread over the host's cores (one blob per task:
/// each hash is serial by definition).
std::vector<ContentHash> HashEach(const std::vector<const std::string*>& blobs) {
  std::vector<ContentHash> hashes(blobs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < blobs.size(); i = next++) {
      unsigned int size = 0;
      EVP_Digest(blobs[i]->data(), blobs[i]->size(), hashes[i].data(), &size, EVP_sha256(),
                 nullptr);
    }
  };
  const size_t workers = std::min<size_t>(
      blobs.size(), std::max<unsigned>(1, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
  return hashes;
}

/// The canonical serialisation shared by both forms; `content(i, tensor)` feeds the i-th
/// tensor's content (tensors in name order, then the profiles' ratios in name order).
template <typename Content>
std::string Digest(const ModelInput& input, const char* form, Content content) {
  CanonicalHasher h;
  h.String(form);
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
  size_t index = 0;
  h.U64(input.tensors.size());
  for (const auto& [name, tensor] : input.tensors) {  // std::map: name order
    h.String(name);
    content(h, index++, tensor);
  }
  h.U64(input.profiles.size());
  for (const auto& [name, profile] : input.profiles) {
    h.String(name);
    h.String(profile.metric);
    h.I64(profile.sink);
    h.I64(profile.window);
    content(h, index++, profile.ratios);
  }
  return h.Finish();
}

}  // namespace

std::string ComputeModelDigest(const ModelInput& input) {
  std::vector<const std::string*> blobs;
  for (const auto& [name, tensor] : input.tensors) blobs.push_back(&tensor.bytes);
  for (const auto& [name, profile] : input.profiles) blobs.push_back(&profile.ratios.bytes);
  const std::vector<ContentHash> hashes = HashEach(blobs);
  return Digest(input, "kvtrim-model-v2",
                [&](CanonicalHasher& h, size_t i, const RawTensor& tensor) {
                  h.Tensor(tensor, hashes[i].data(), hashes[i].size());
                });
}

std::string ComputeLegacyModelDigest(const ModelInput& input) {
  return Digest(input, "kvtrim-model-v1", [](CanonicalHasher& h, size_t, const RawTensor& t) {
    h.Tensor(t, t.bytes.data(), t.bytes.size());
  });
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

#include "kernels/decide/select.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

namespace kvtrim {

namespace {
// Strict weak order "a ranks before b": higher score, then lower index.
struct RanksBefore {
  const float* scores;
  bool operator()(int32_t a, int32_t b) const {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  }
};

/// An unsigned key with the order of `score` (NaN never comes): larger score, larger key;
/// -0 and +0 share a key, as they compare equal.
uint32_t OrderedKey(float score) {
  if (score == 0.0f) score = 0.0f;  // -0 -> +0
  uint32_t bits = 0;
  std::memcpy(&bits, &score, sizeof(bits));
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

}  // namespace

// Radix selection: the key of the count-th best token is found digit by digit (11, 11 and 10
// bits, a histogram pass each over the tokens still matching the digits found), then one
// pass in index order takes every token above it and the lowest-index ones equal to it:
// exactly the `count` best under RanksBefore, already ascending, in O(n).
void SelectTopK(const float* scores, int64_t n, int64_t count, std::vector<int32_t>* out) {
  count = std::clamp<int64_t>(count, 0, n);
  if (count == 0) return;
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(count));
  int32_t* kept = out->data() + start;
  if (count == n) {
    std::iota(kept, kept + n, 0);
    return;
  }
  std::vector<uint32_t> keys(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) keys[j] = OrderedKey(scores[j]);
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = count;  // how many of the tokens matching prefix are still to take
  for (const auto& [shift, bits] : {std::pair{21, 11}, std::pair{10, 11}, std::pair{0, 10}}) {
    std::array<int64_t, 2048> histogram{};
    const uint32_t digit_mask = (1u << bits) - 1;
    for (int64_t j = 0; j < n; ++j) {
      if ((keys[j] & mask) == prefix) ++histogram[(keys[j] >> shift) & digit_mask];
    }
    uint32_t digit = digit_mask;
    for (;; --digit) {  // from the highest digit down, to the bucket holding the count-th
      if (histogram[digit] >= remaining) break;
      remaining -= histogram[digit];
    }
    prefix |= digit << shift;
    mask |= digit_mask << shift;
  }
  // prefix is now the count-th best key; `remaining` tokens equal to it are kept.
  int64_t filled = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (keys[j] > prefix || (keys[j] == prefix && remaining-- > 0)) {
      kept[filled++] = static_cast<int32_t>(j);
    }
  }
}

void RankTokens(const float* scores, int64_t n, std::vector<int32_t>* ranking) {
  ranking->resize(static_cast<size_t>(n));
  std::iota(ranking->begin(), ranking->end(), 0);
  std::sort(ranking->begin(), ranking->end(), RanksBefore{scores});
}

void SelectSharedRoundRobin(const float* scores, int64_t num_heads, int64_t n, int64_t count,
                            std::vector<int32_t>* out) {
  count = std::clamp<int64_t>(count, 0, n);
  std::vector<std::vector<int32_t>> rankings(static_cast<size_t>(num_heads));
  for (int64_t h = 0; h < num_heads; ++h) RankTokens(scores + h * n, n, &rankings[h]);
  std::vector<char> taken(static_cast<size_t>(n), 0);
  std::vector<int32_t> chosen;
  chosen.reserve(static_cast<size_t>(count));
  for (int64_t rank = 0; rank < n && static_cast<int64_t>(chosen.size()) < count; ++rank) {
    for (int64_t h = 0; h < num_heads && static_cast<int64_t>(chosen.size()) < count; ++h) {
      const int32_t token = rankings[h][rank];
      if (!taken[token]) {
        taken[token] = 1;
        chosen.push_back(token);
      }
    }
  }
  std::sort(chosen.begin(), chosen.end());
  out->insert(out->end(), chosen.begin(), chosen.end());
}

}  // namespace kvtrim

namespace kvtrim {

void SelectBlocks(const float* scores, int64_t num_heads, int64_t n, int64_t block_size,
                  int64_t num_blocks, std::vector<int32_t>* out) {
  const int64_t blocks = (n + block_size - 1) / block_size;
  num_blocks = std::min(num_blocks, blocks);
  // Block scores [H, blocks] = max of the head's token scores in the block.
  std::vector<float> block_scores(static_cast<size_t>(num_heads * blocks));
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t b = 0; b < blocks; ++b) {
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = b * block_size; j < std::min(n, (b + 1) * block_size); ++j) {
        best = std::max(best, scores[h * n + j]);
      }
      block_scores[h * blocks + b] = best;
    }
  }
  std::vector<int32_t> chosen;
  SelectSharedRoundRobin(block_scores.data(), num_heads, blocks, num_blocks, &chosen);
  for (int32_t b : chosen) {
    for (int64_t j = b * block_size; j < std::min(n, (b + 1) * block_size); ++j) {
      out->push_back(static_cast<int32_t>(j));
    }
  }
}

}  // namespace kvtrim

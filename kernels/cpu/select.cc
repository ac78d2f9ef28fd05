#include "kernels/cpu/select.h"

#include <algorithm>
#include <limits>
#include <numeric>

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
}  // namespace

void SelectTopK(const float* scores, int64_t n, int64_t count, std::vector<int32_t>* out) {
  count = std::clamp<int64_t>(count, 0, n);
  if (count == 0) return;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (count < n) {
    std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), RanksBefore{scores});
    // order[0..count) now holds exactly the `count` best under the strict order.
  }
  order.resize(static_cast<size_t>(count));
  std::sort(order.begin(), order.end());
  out->insert(out->end(), order.begin(), order.end());
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

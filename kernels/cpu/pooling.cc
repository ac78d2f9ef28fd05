#include "kernels/cpu/pooling.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtrim {

namespace {

// Sliding-window maximum with a monotone deque of indices: O(n), exact.
void MaxPool(const float* in, int64_t n, int64_t radius, float* out) {
  // deque[head, tail) holds candidate indices in ascending order with strictly decreasing
  // values; every index is pushed once, so a flat array of n entries suffices.
  std::vector<int64_t> deque(static_cast<size_t>(n));
  int64_t head = 0;
  int64_t tail = 0;
  int64_t next = 0;  // next input index to push
  for (int64_t j = 0; j < n; ++j) {
    const int64_t hi = std::min(n - 1, j + radius);
    for (; next <= hi; ++next) {
      while (tail > head && in[deque[tail - 1]] <= in[next]) --tail;
      deque[tail++] = next;
    }
    const int64_t lo = j - radius;
    while (deque[head] < lo) ++head;
    out[j] = in[deque[head]];
  }
}

// Direct windowed sum in double (no running-sum drift), divided by the full kernel.
void AvgPool(const float* in, int64_t n, int64_t radius, int64_t kernel, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - radius);
    const int64_t hi = std::min(n - 1, j + radius);
    double sum = 0;
    for (int64_t i = lo; i <= hi; ++i) sum += in[i];
    out[j] = static_cast<float>(sum / static_cast<double>(kernel));
  }
}

}  // namespace

void Pool1D(PoolKind kind, const float* in, int64_t n, int64_t kernel, float* out) {
  if (n <= 0) return;
  if (kernel <= 1) {
    std::copy(in, in + n, out);
    return;
  }
  const int64_t radius = kernel / 2;
  if (kind == PoolKind::kMax) {
    MaxPool(in, n, radius, out);
  } else {
    AvgPool(in, n, radius, kernel, out);
  }
}

float FirstMax(const float* x, int64_t count) {
  if (count <= 0) return 0.0f;
  float best = x[0];
  for (int64_t j = 1; j < count; ++j) {
    if (x[j] > best) best = x[j];
  }
  return best;
}

void PoolPrefix(PoolKind kind, const float* in, int64_t n, int64_t prefix, int64_t kernel,
                float* out) {
  Pool1D(kind, in, prefix, kernel, out);
  std::fill(out + prefix, out + n, FirstMax(out, prefix));
}

}  // namespace kvtrim

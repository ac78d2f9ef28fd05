// Fast KeyDiff (fast_keys.cuh). A key row is read by a group of L = DP / 8 lanes, lane i
// holding elements [8i, 8i + 8) as fp32 (fast_key_rows.cuh); a warp reads 32 / L rows at once:
//   pass 1  per (split, KV head): |k_j| and u_j = k_j / |k_j| (or k_j for raw_mean) summed
//           into per-lane fp32 partials, reduced over the CTA's groups in a fixed order into
//           partial [H, S, DP];
//   combine per KV head: anchor a = Σ_s partial / n, |a|;
//   pass 2  the splits walked back to front: -(k_j · a) / max(|k_j| |a|, eps).
#include <algorithm>

#include "kernels/gpu/kernels/fast_key_rows.cuh"
#include "kernels/gpu/kernels/fast_keys.cuh"
#include "kernels/gpu/kernels/key_scorers.h"

namespace kvtrim::gpu::fast {

namespace {

constexpr int kThreads = kKeyRowThreads;

/// The KeyDiff launches' token splits and scratch regions.
struct KeyDiffPlan {
  int32_t splits = 0;             // S
  int64_t tokens_per_split = 0;
  int padded_dim = 0;             // DP
  size_t partial_offset = 0;      // [H, S, DP] f32
  size_t anchor_offset = 0;       // [H, DP] f32
  size_t anchor_norm_offset = 0;  // [H] f32
  size_t bytes = 0;
};

/// Splits of about 2 waves of CTAs, at least 256 tokens each.
KeyDiffPlan MakeKeyDiffPlan(const DeviceLayer& layer) {
  KeyDiffPlan p;
  const int64_t n = layer.num_tokens;
  const int64_t heads = std::max<int32_t>(1, layer.num_kv_heads);
  const int64_t want = std::max<int64_t>(1, (2 * SmCount() * 4 + heads - 1) / heads);
  const int64_t most = std::max<int64_t>(1, (n + 255) / 256);
  p.splits = static_cast<int32_t>(std::min<int64_t>(want, most));
  p.tokens_per_split = (n + p.splits - 1) / p.splits;
  p.padded_dim = PaddedDim(layer.head_dim);
  size_t offset = 0;
  p.partial_offset = offset;
  offset += Align256(static_cast<size_t>(heads) * p.splits * p.padded_dim * sizeof(float));
  p.anchor_offset = offset;
  offset += Align256(static_cast<size_t>(heads) * p.padded_dim * sizeof(float));
  p.anchor_norm_offset = offset;
  offset += Align256(static_cast<size_t>(heads) * sizeof(float));
  p.bytes = offset;
  return p;
}

/// Arguments of the key kernels.
struct KeyArgs {
  const void* keys;  // [H, n, d]
  int64_t n;
  int32_t d;
  int64_t tokens_per_split;
  float eps;
  bool raw_mean;
  float* partial;      // [H, S, DP]
  float* anchor;       // [H, DP]
  float* anchor_norm;  // [H]
  float* scores;       // [H, n]
};

/// KeyDiff pass 1: partial[h, s, :] = Σ over the split's tokens of u_j, in a fixed order
/// (each group sums its tokens in order, then the groups in order). Grid (S, H).
template <typename T, int L>
__global__ void __launch_bounds__(kThreads) KeyDiffPartialKernel(KeyArgs a, int32_t splits) {
  constexpr int kGroups = kThreads / L;
  constexpr int DP = 8 * L;
  __shared__ float sums[kGroups][DP];
  const int h = blockIdx.y;
  const int s = blockIdx.x;
  const int group = threadIdx.x / L;
  const int part = threadIdx.x % L;
  const T* head = static_cast<const T*>(a.keys) + static_cast<int64_t>(h) * a.n * a.d;
  const int64_t begin = static_cast<int64_t>(s) * a.tokens_per_split;
  const int64_t end = min(a.n, begin + a.tokens_per_split);
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (int64_t base = begin; base < end; base += kGroups) {
    float x[8];
    LoadRow(head, base + group, end, part, a.d, x);
    float scale = 1.0f;
    if (!a.raw_mean) {
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss = fmaf(x[i], x[i], ss);
      const float nrm = sqrtf(GroupSum<L>(ss));
      scale = nrm > 0.0f ? 1.0f / nrm : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(x[i], scale, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) sums[group][8 * part + i] = acc[i];
  __syncthreads();
  for (int c = threadIdx.x; c < DP; c += kThreads) {
    float total = 0.0f;
    for (int g = 0; g < kGroups; ++g) total += sums[g][c];
    a.partial[(static_cast<int64_t>(h) * splits + s) * DP + c] = total;
  }
}

/// KeyDiff combine: anchor[h, :] = Σ_s partial[h, s, :] / n and its norm. Grid H, DP threads.
__global__ void KeyDiffAnchorKernel(KeyArgs a, int32_t splits, int dp) {
  __shared__ float squares[256];
  const int h = blockIdx.x;
  const int c = threadIdx.x;
  float v = 0.0f;
  for (int s = 0; s < splits; ++s) v += a.partial[(static_cast<int64_t>(h) * splits + s) * dp + c];
  v /= static_cast<float>(a.n);
  a.anchor[static_cast<int64_t>(h) * dp + c] = v;
  squares[c] = v * v;
  __syncthreads();
  for (int stride = dp / 2; stride > 0; stride /= 2) {  // fixed tree (dp is a power of two)
    if (c < stride) squares[c] += squares[c + stride];
    __syncthreads();
  }
  if (c == 0) a.anchor_norm[h] = sqrtf(squares[0]);
}

/// KeyDiff pass 2: scores[h, j] = -(k · a) / max(|k| |a|, eps), 0 when that is 0; the split's
/// tokens from the last group of rows to the first. Grid (S, H).
template <typename T, int L>
__global__ void __launch_bounds__(kThreads) KeyDiffScoreKernel(KeyArgs a) {
  constexpr int kGroups = kThreads / L;
  constexpr int DP = 8 * L;
  const int h = blockIdx.y;
  const int s = blockIdx.x;
  const int group = threadIdx.x / L;
  const int part = threadIdx.x % L;
  const T* head = static_cast<const T*>(a.keys) + static_cast<int64_t>(h) * a.n * a.d;
  float anchor[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) anchor[i] = a.anchor[static_cast<int64_t>(h) * DP + 8 * part + i];
  const float an = a.anchor_norm[h];
  const int64_t begin = static_cast<int64_t>(s) * a.tokens_per_split;
  const int64_t end = min(a.n, begin + a.tokens_per_split);
  const int64_t count = end - begin;
  for (int64_t base = ((count - 1) / kGroups) * kGroups; base >= 0; base -= kGroups) {
    const int64_t j = begin + base + group;
    float x[8];
    LoadRow(head, j, end, part, a.d, x);
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      ss = fmaf(x[i], x[i], ss);
      dot = fmaf(x[i], anchor[i], dot);
    }
    ss = GroupSum<L>(ss);
    dot = GroupSum<L>(dot);
    if (part == 0 && j < end) {
      const float prod = sqrtf(ss) * an;
      const float den = prod < a.eps ? a.eps : prod;
      a.scores[static_cast<int64_t>(h) * a.n + j] = den > 0.0f ? -(dot / den) : 0.0f;
    }
  }
}

}  // namespace

bool FastKeyScorerSupported(ScorerKind kind, DType dtype, int32_t head_dim) {
  (void)dtype;
  return kind == ScorerKind::kKeyDiff && KeyRowsSupported(head_dim);
}

size_t FastKeyScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                                const ScorerParams& params) {
  if (kind != ScorerKind::kKeyDiff || layer.num_tokens <= 0) {
    return IsKeyScorer(kind) ? KeyScorerScratchBytes(kind, layer, params) : 0;
  }
  return MakeKeyDiffPlan(layer).bytes;
}

cudaError_t LaunchFastKeyScores(ScorerKind kind, const DeviceLayer& layer,
                                const ScorerParams& params, float* scores, void* scratch,
                                size_t scratch_bytes, cudaStream_t stream) {
  if (!FastKeyScorerSupported(kind, layer.dtype, layer.head_dim)) return cudaErrorInvalidValue;
  const int64_t n = layer.num_tokens;
  const int32_t heads = layer.num_kv_heads;
  if (n < 0 || heads < 0 || heads > 65535) return cudaErrorInvalidValue;
  if (n == 0 || heads == 0) return cudaSuccess;
  if (scores == nullptr || layer.keys == nullptr) return cudaErrorInvalidValue;
  KeyArgs args{};
  args.keys = layer.keys;
  args.n = n;
  args.d = layer.head_dim;
  args.eps = params.eps;
  args.raw_mean = params.anchor_raw_mean;
  args.scores = scores;
  const KeyDiffPlan plan = MakeKeyDiffPlan(layer);
  if (scratch == nullptr || scratch_bytes < plan.bytes) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(scratch);
  args.tokens_per_split = plan.tokens_per_split;
  args.partial = reinterpret_cast<float*>(base + plan.partial_offset);
  args.anchor = reinterpret_cast<float*>(base + plan.anchor_offset);
  args.anchor_norm = reinterpret_cast<float*>(base + plan.anchor_norm_offset);
  return DispatchKeyRows(layer.dtype, layer.head_dim, [&](auto tag, auto lanes) {
    using T = decltype(tag);
    constexpr int L = decltype(lanes)::value;
    const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(heads));
    KeyDiffPartialKernel<T, L><<<grid, kThreads, 0, stream>>>(args, plan.splits);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    KeyDiffAnchorKernel<<<heads, 8 * L, 0, stream>>>(args, plan.splits, 8 * L);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    KeyDiffScoreKernel<T, L><<<grid, kThreads, 0, stream>>>(args);
    return cudaGetLastError();
  });
}

}  // namespace kvtrim::gpu::fast

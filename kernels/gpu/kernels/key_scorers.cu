// The GPU key-only scorer known by kind (key_scorers.h): KeyDiff, bit for bit equal to the
// CPU scorer. Its canonical definition (8 steps) is documented in
// kernels/cpu/score_keydiff.cc; the mapping of its steps onto kernels is:
//   GroupSumKernel   steps 1-3 and the first three tree levels of step 4: one block per 512
//                    rows (8 aligned chunks of 64): row norms with eight threads per row (one
//                    canonical lane each), then each chunk sum sequential over its rows,
//                    then the 8 chunk sums combined by their aligned tree.
//   AnchorKernel     the rest of step 4 and step 5: the aligned tree over the group sums.
//   CosineKernel     steps 6-8.
// CmTreeSum over M values equals the aligned power-of-two tree over M values padded with
// -0.0 (x + -0.0 == x for every x), so the tree can be cut into aligned subtrees and the
// subtrees computed by different blocks.
#include "kernels/gpu/kernels/key_scorers.h"

#include <algorithm>
#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/gpu/kernels/key_scorers_device.cuh"

namespace kvtrim::gpu {

namespace {

constexpr int kThreads = kKeyThreads;                           // threads per block
constexpr int kGroupChunks = 8;                                 // chunks per GroupSumKernel block
constexpr int64_t kGroupRows = kGroupChunks * kCanonicalChunk;  // 512 rows per group
constexpr int kAnchorSlab = 32;                                 // dimensions per AnchorKernel block
constexpr int kAnchorSegments = 32;                             // row threads per AnchorKernel block

/// Rounds up to a multiple of 256 bytes (scratch region alignment).
constexpr size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The KeyDiff scratch regions, carved from one buffer.
struct KeyDiffScratch {
  float* norms;      // [H, n] fp32: ||k_j||
  float* group_sum;  // [H, G, d] fp32: aligned-tree sum of 8 chunk sums, G = ceil(n / 512)
  float* anchor;     // [H, d] fp32
  size_t bytes;      // total bytes
};

/// The scratch layout for `layer` (pointers relative to `base`).
KeyDiffScratch KeyDiffLayout(const DeviceLayer& layer, void* base) {
  const size_t heads = static_cast<size_t>(std::max<int32_t>(layer.num_kv_heads, 0));
  const size_t n = static_cast<size_t>(std::max<int64_t>(layer.num_tokens, 0));
  const size_t d = static_cast<size_t>(std::max<int32_t>(layer.head_dim, 0));
  const size_t groups = (n + kGroupRows - 1) / kGroupRows;
  const size_t norms_bytes = AlignUp(heads * n * sizeof(float));
  const size_t group_bytes = AlignUp(heads * groups * d * sizeof(float));
  const size_t anchor_bytes = AlignUp(heads * d * sizeof(float));
  char* p = static_cast<char*>(base);
  KeyDiffScratch s;
  s.norms = reinterpret_cast<float*>(p);
  s.group_sum = reinterpret_cast<float*>(p + norms_bytes);
  s.anchor = reinterpret_cast<float*>(p + norms_bytes + group_bytes);
  s.bytes = norms_bytes + group_bytes + anchor_bytes;
  return s;
}

// ---- KeyDiff steps 1-4 ------------------------------------------------------------------

/// One block per (group g of 512 rows, head h), three phases:
///  1. step 1 for the group's rows, eight threads per row (norms to shared memory and to
///     `norms` for CosineKernel);
///  2. steps 2-3: the 8 chunk sums (chunk q covers rows 512g + 64q .. +64) of every
///     dimension, each sequential over its rows; a thread runs up to 8 chunks of one
///     dimension side by side (independent chains, so their loads overlap); absent chunks
///     are -0.0;
///  3. their aligned tree ((P0 + P1) + (P2 + P3)) + ((P4 + P5) + (P6 + P7)).
/// Phase 2 re-reads the rows phase 1 just read (L1/L2 hits), so keys cross HBM once.
///   norms     [H, n] fp32 (written)
///   group_sum [H, G, d] fp32 (written)
/// Dynamic shared memory: kGroupChunks * d floats. blockDim a multiple of 32.
template <typename Keys>
__global__ void __launch_bounds__(kThreads)
    GroupSumKernel(Keys keys, int64_t n, int d, bool raw_mean, float* norms, float* group_sum) {
  extern __shared__ float chunk_sum[];  // [8, d]
  __shared__ float row_norm[kGroupRows];
  const int64_t h = blockIdx.y;
  const int64_t g = blockIdx.x;
  const int64_t groups = gridDim.x;
  const int64_t row0 = g * kGroupRows;
  const int rows = static_cast<int>(n - row0 < kGroupRows ? n - row0 : kGroupRows);
  const int64_t head_base = (h * n + row0) * d;  // element offset of row 0 of the group

  // Phase 1: norms. The loop bound is per warp, so all 32 threads reach the shuffles.
  for (int base = threadIdx.x & ~31; base < kGroupRows * kCanonicalLanes; base += blockDim.x) {
    const int item = base + (threadIdx.x & 31);
    const int r = item / kCanonicalLanes;
    const int lane = item % kCanonicalLanes;
    const bool valid = r < rows;
    const float part =
        valid ? CanonicalSquareLane(keys, head_base + static_cast<int64_t>(r) * d, d, lane) : 0.0f;
    const float nrm = CmSqrt(CombineCanonicalLanes(part));
    if (valid && lane == 0) {
      row_norm[r] = nrm;
      norms[h * n + row0 + r] = nrm;
    }
  }
  __syncthreads();

  // Phase 2: `ways` threads share a dimension (a power of two <= 8 with ways * d <= blockDim
  // when possible); thread (c, p) runs chunks p, p + ways, ... as independent chains.
  int ways = 1;
  while (ways < kGroupChunks && 2 * ways * d <= static_cast<int>(blockDim.x)) ways *= 2;
  const int chains = kGroupChunks / ways;
  for (int unit = threadIdx.x; unit < ways * d; unit += blockDim.x) {
    const int c = unit % d;
    const int p = unit / d;
    float sum[kGroupChunks];
#pragma unroll
    for (int k = 0; k < kGroupChunks; ++k) {
      const int q = p + k * ways;
      sum[k] = k < chains && q * kCanonicalChunk < rows ? 0.0f : -0.0f;
    }
#pragma unroll 2
    for (int r = 0; r < kCanonicalChunk; ++r) {
#pragma unroll
      for (int k = 0; k < kGroupChunks; ++k) {
        const int row = (p + k * ways) * kCanonicalChunk + r;
        if (k < chains && row < rows) {
          const float x = keys[head_base + static_cast<int64_t>(row) * d + c];
          float u = x;
          if (!raw_mean) {
            const float nrm = row_norm[row];
            u = nrm > 0.0f ? CmDiv(x, nrm) : 0.0f;
          }
          sum[k] = CmAdd(sum[k], u);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kGroupChunks; ++k) {
      if (k < chains) chunk_sum[(p + k * ways) * d + c] = sum[k];
    }
  }
  __syncthreads();

  // Phase 3: the aligned tree of the 8 chunk sums.
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    const float* q = chunk_sum + c;
    const float left = CmAdd(CmAdd(q[0], q[d]), CmAdd(q[2 * d], q[3 * d]));
    const float right = CmAdd(CmAdd(q[4 * d], q[5 * d]), CmAdd(q[6 * d], q[7 * d]));
    group_sum[(h * groups + g) * d + c] = CmAdd(left, right);
  }
}

/// CmTreeSum of leaves[0..count) (`stride` floats apart), computed sequentially with a
/// binary-counter stack of perfect subtrees: after i leaves, stack[l] holds the pending
/// subtree of 2^l leaves for every set bit l of i. Padding the leaves to any power of two
/// with -0.0 gives the same value, so the result is also the aligned subtree of a larger
/// tree whose segment [0, count) this is. Returns -0.0 (the padding) for count = 0.
__device__ float AlignedSegmentTree(const float* leaves, int64_t stride, int64_t count) {
  float stack[64];  // stack[l]: the pending perfect subtree of 2^l leaves
  for (int64_t i = 0; i < count; ++i) {
    float v = leaves[i * stride];
    // Merge with every completed left sibling: one per trailing 1 bit of i.
    int level = 0;
    for (int64_t bits = i; bits & 1; bits >>= 1) v = CmAdd(stack[level++], v);
    stack[level] = v;
  }
  // The pending subtrees, left to right, are those of the set bits of count from the
  // highest down; the padded tree adds them right to left: stack[hi] + (... + stack[lo]).
  float acc = -0.0f;
  bool have = false;
  int level = 0;
  for (int64_t bits = count; bits != 0; bits >>= 1, ++level) {
    if (bits & 1) {
      acc = have ? CmAdd(stack[level], acc) : stack[level];
      have = true;
    }
  }
  return acc;
}

/// One block per (slab of 32 dimensions, head): the anchor a[c] = CmDiv(tree over the G
/// group sums, float(n)). Thread (r, c) (r < 32) reduces the aligned segment of
/// span / 32 group sums starting at r * span / 32 (span = the power of two >= G, at least
/// 32; segments past G are -0.0); the 32 segment values are then combined by their
/// aligned tree across a warp.
///   group_sum [H, G, d] fp32
///   anchor    [H, d] fp32 (written)
__global__ void AnchorKernel(const float* group_sum, int64_t groups, int64_t span, int d,
                             float count, float* anchor) {
  __shared__ float seg[kAnchorSegments][kAnchorSlab + 1];
  const int64_t h = blockIdx.y;
  const int c_local = threadIdx.x % kAnchorSlab;
  const int r = threadIdx.x / kAnchorSlab;
  const int c = blockIdx.x * kAnchorSlab + c_local;
  const int64_t seg_len = span / kAnchorSegments;
  const int64_t first = r * seg_len;
  float v = -0.0f;
  if (c < d && first < groups) {
    const int64_t present = groups - first < seg_len ? groups - first : seg_len;
    v = AlignedSegmentTree(group_sum + (h * groups + first) * d + c, d, present);
  }
  seg[r][c_local] = v;
  __syncthreads();
  // Warp w combines the 32 segments of dimension w of the slab: shuffle-down offsets 1, 2,
  // 4, ... pair aligned neighbours, so lane 0 ends with the aligned tree.
  const int w = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float s = seg[lane][w];
  for (int offset = 1; offset < 32; offset <<= 1) {
    s = CmAdd(s, __shfl_down_sync(0xffffffffu, s, offset));
  }
  const int cw = blockIdx.x * kAnchorSlab + w;
  if (lane == 0 && cw < d) anchor[h * d + cw] = CmDiv(s, count);
}

// ---- KeyDiff steps 6-8 ------------------------------------------------------------------

/// Scores of head blockIdx.y: an = CmSqrt(CmDot(a, a)), then for every row the canonical
/// dot with the anchor (eight threads per row) and -CmDiv(dot, max(CmMul(nrm, an), eps)).
///   norms  [H, n] fp32, anchor [H, d] fp32, scores [H, n] fp32 (written)
/// Dynamic shared memory: d floats. blockDim a multiple of 32.
template <typename Keys>
__global__ void CosineKernel(Keys keys, int64_t n, int d, float eps, const float* norms,
                             const float* anchor, float* scores) {
  extern __shared__ float a[];  // [d]
  __shared__ float anchor_norm;
  const int64_t h = blockIdx.y;
  for (int c = threadIdx.x; c < d; c += blockDim.x) a[c] = anchor[h * d + c];
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x % kCanonicalLanes;
    float part = 0.0f;
    for (int c = lane; c < d; c += kCanonicalLanes) part = CmAdd(part, CmMul(a[c], a[c]));
    const float an = CmSqrt(CombineCanonicalLanes(part));
    if (threadIdx.x == 0) anchor_norm = an;
  }
  __syncthreads();
  const float an = anchor_norm;
  const int64_t items = n * kCanonicalLanes;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t warp_base = blockIdx.x * int64_t{blockDim.x} + (threadIdx.x & ~31u);
  for (int64_t base = warp_base; base < items; base += stride) {
    const int64_t item = base + (threadIdx.x & 31u);
    const bool valid = item < items;
    const int64_t j = item / kCanonicalLanes;
    const int lane = static_cast<int>(item % kCanonicalLanes);
    const float part = valid ? CanonicalDotLane(keys, (h * n + j) * d, a, d, lane) : 0.0f;
    const float dot = CombineCanonicalLanes(part);
    if (valid && lane == 0) {
      const float prod = CmMul(norms[h * n + j], an);
      const float denom = prod < eps ? eps : prod;
      scores[h * n + j] = denom > 0.0f ? -CmDiv(dot, denom) : 0.0f;
    }
  }
}

/// Launches the three KeyDiff kernels.
template <typename Keys>
cudaError_t LaunchKeyDiffStages(Keys keys, const DeviceLayer& layer, const ScorerParams& params,
                                const KeyDiffScratch& s, float* scores, cudaStream_t stream) {
  const int64_t n = layer.num_tokens;
  const int d = layer.head_dim;
  const unsigned heads = static_cast<unsigned>(layer.num_kv_heads);
  const int64_t groups = (n + kGroupRows - 1) / kGroupRows;
  const size_t group_smem = sizeof(float) * kGroupChunks * static_cast<size_t>(d);
  if (group_smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        GroupSumKernel<Keys>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(group_smem));
    if (e != cudaSuccess) return e;
  }
  GroupSumKernel<Keys><<<dim3(static_cast<unsigned>(groups), heads), kThreads, group_smem,
                         stream>>>(keys, n, d, params.anchor_raw_mean, s.norms, s.group_sum);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  int64_t span = kAnchorSegments;
  while (span < groups) span <<= 1;
  const unsigned slabs = static_cast<unsigned>((d + kAnchorSlab - 1) / kAnchorSlab);
  AnchorKernel<<<dim3(slabs, heads), kAnchorSlab * kAnchorSegments, 0, stream>>>(
      s.group_sum, groups, span, d, static_cast<float>(n), s.anchor);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  CosineKernel<Keys><<<dim3(KeyBlocksPerHead(n * kCanonicalLanes), heads), kThreads,
                       sizeof(float) * static_cast<size_t>(d), stream>>>(
      keys, n, d, params.eps, s.norms, s.anchor, scores);
  return cudaGetLastError();
}

}  // namespace

bool IsKeyScorer(ScorerKind kind) { return kind == ScorerKind::kKeyDiff; }

size_t KeyScorerScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                             const ScorerParams& params) {
  if (kind != ScorerKind::kKeyDiff) return 0;
  return KeyDiffLayout(layer, nullptr).bytes;
}

cudaError_t LaunchKeyScorer(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                            float* scores, void* scratch, size_t scratch_bytes,
                            cudaStream_t stream) {
  if (!IsKeyScorer(kind)) return cudaErrorInvalidValue;
  const int64_t n = layer.num_tokens;
  const int32_t heads = layer.num_kv_heads;
  if (n < 0 || heads < 0 || heads > 65535) return cudaErrorInvalidValue;
  if (n == 0 || heads == 0) return cudaSuccess;
  if (scores == nullptr) return cudaErrorInvalidValue;
  const int d = layer.head_dim;
  if (d < 1 || layer.keys == nullptr) return cudaErrorInvalidValue;
  const KeyDiffScratch s = KeyDiffLayout(layer, scratch);
  if (scratch == nullptr || scratch_bytes < s.bytes) return cudaErrorInvalidValue;
  return WithKeyReader(layer.dtype, layer.keys, [&](auto keys) {
    return LaunchKeyDiffStages(keys, layer, params, s, scores, stream);
  });
}

}  // namespace kvtrim::gpu

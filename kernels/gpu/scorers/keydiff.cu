// KeyDiff's device kernels (specs/keydiff.md §2.2; docs/policies.md): score[h, j] =
// -cos(k_j, anchor), the anchor the mean (unit) key of the head (KeyDiffDeviceParams: the
// anchor and eps), over keys [H_kv, n, d] of the layer's dtype, written as scores [H_kv, n] fp32.
// A table scorer (kernels/gpu/kernels/gpu_scorer_table.h): registered by
// RegisterGpuScorer_keydiff, with its parameter reader.
//
// Exact: bit for bit the CPU scorer's canonical definition (8 steps, documented in
// kernels/cpu/keydiff_block.cc); the mapping of its steps onto kernels is:
//   GroupSumKernel   steps 1-3 and the first three tree levels of step 4: one block per 512
//                    rows (8 aligned chunks of 64): row norms with eight threads per row (one
//                    canonical lane each), then each chunk sum sequential over its rows,
//                    then the 8 chunk sums combined by their aligned tree.
//   AnchorKernel     the rest of step 4 and step 5: the aligned tree over the group sums.
//   CosineKernel     steps 6-8.
// CmTreeSum over M values equals the aligned power-of-two tree over M values padded with
// -0.0 (x + -0.0 == x for every x), so the tree can be cut into aligned subtrees and the
// subtrees computed by different blocks.
//
// Fast (namespace fast): a key row is read by a group of L = DP / 8 lanes, lane i holding
// elements [8i, 8i + 8) as fp32 (fast_key_rows.cuh); a warp reads 32 / L rows at once:
//   pass 1  per (split, KV head): |k_j| and u_j = k_j / |k_j| (or k_j for raw_mean) summed
//           into per-lane fp32 partials, reduced over the CTA's groups in a fixed order into
//           partial [H, S, DP];
//   combine per KV head: anchor a = Σ_s partial / n, |a|;
//   pass 2  the splits walked back to front (starting on the tiles pass 1 left in L2):
//           -(k_j · a) / max(|k_j| |a|, eps).
// Deterministic: fixed splits and reduction orders, no floating-point atomics.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/canonical_math.h"
#include "kernels/gpu/kernels/fast_key_rows.cuh"
#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/key_scorers_device.cuh"
#include "kernels/params.h"
#include "kernels/scorer_params.h"

namespace kvtrim::gpu {

namespace {

/// KeyDiff's device parameters, kept in ScorerParams::table (TableParams) by ReadKeyDiffParams.
struct KeyDiffDeviceParams {
  float eps = 0;                 // cosine guard: the norms' product is max(|k| |a|, eps)
  uint32_t anchor_raw_mean = 0;  // 1: anchor "raw_mean"; 0: "normalized_mean"
};

/// KeyDiff's parameters of `params` (stored by ReadKeyDiffParams).
KeyDiffDeviceParams KeyDiffParamsOf(const ScorerParams& params) {
  return params.table.Load<KeyDiffDeviceParams>();
}

constexpr int kThreads = kKeyThreads;                           // threads per block
constexpr int kGroupChunks = 8;                                 // chunks per GroupSum block
constexpr int64_t kGroupRows = kGroupChunks * kCanonicalChunk;  // 512 rows per group
constexpr int kAnchorSlab = 32;                                 // dimensions per Anchor block
constexpr int kAnchorSegments = 32;                             // row threads per Anchor block

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
                         stream>>>(keys, n, d, KeyDiffParamsOf(params).anchor_raw_mean != 0,
                                   s.norms, s.group_sum);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  int64_t span = kAnchorSegments;
  while (span < groups) span <<= 1;
  const unsigned slabs = static_cast<unsigned>((d + kAnchorSlab - 1) / kAnchorSlab);
  AnchorKernel<<<dim3(slabs, heads), kAnchorSlab * kAnchorSegments, 0, stream>>>(
      s.group_sum, groups, span, d, static_cast<float>(n), s.anchor);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  CosineKernel<Keys><<<dim3(KeyBlocksPerHead(n * kCanonicalLanes), heads), kThreads,
                       sizeof(float) * static_cast<size_t>(d), stream>>>(
      keys, n, d, KeyDiffParamsOf(params).eps, s.norms, s.anchor, scores);
  return cudaGetLastError();
}

/// The exact kernels' scratch: the norms [H_kv, n], the group sums [H_kv, ceil(n / 512), d]
/// and the anchors [H_kv, d] fp32 (each region 256-byte aligned).
size_t KeyDiffExactScratchBytes(const DeviceLayer& layer, const ScorerParams& params) {
  return KeyDiffLayout(layer, nullptr).bytes;
}

/// The exact kernels' launcher (GpuScorerKernels::launch).
cudaError_t LaunchKeyDiffExact(const DeviceLayer& layer, const ScorerParams& params,
                               float* scores, void* scratch, size_t scratch_bytes,
                               cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/true, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const KeyDiffScratch s = KeyDiffLayout(layer, scratch);
  if (scratch == nullptr || scratch_bytes < s.bytes) return cudaErrorInvalidValue;
  return WithKeyReader(layer.dtype, layer.keys, [&](auto keys) {
    return LaunchKeyDiffStages(keys, layer, params, s, scores, stream);
  });
}

/// KeyDiffDeviceParams from the resolved `anchor` and `eps`, into out->table
/// (GpuScorer::read_params).
void ReadKeyDiffParams(const ResolvedParams& params, DType dtype, ScorerParams* out) {
  KeyDiffDeviceParams kd{};
  kd.eps = static_cast<float>(params.Number("eps"));
  kd.anchor_raw_mean = params.Enum<KeyDiffAnchor>("anchor") == KeyDiffAnchor::kRawMean ? 1 : 0;
  out->table.Store(kd);
}

}  // namespace

namespace fast {

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

/// The fast kernels take d a multiple of 8 from 8 to 256, in every dtype.
bool KeyDiffFastSupports(DType dtype, int32_t head_dim) { return KeyRowsSupported(head_dim); }

/// The fast kernels' scratch: the partial sums [H, S, DP], the anchors [H, DP] and their norms
/// [H] fp32 (each region 256-byte aligned).
size_t KeyDiffFastScratchBytes(const DeviceLayer& layer, const ScorerParams& params) {
  return layer.num_tokens <= 0 ? 0 : MakeKeyDiffPlan(layer).bytes;
}

/// The fast kernels' launcher (GpuScorerKernels::launch): scratch of KeyDiffFastScratchBytes.
cudaError_t LaunchKeyDiffFast(const DeviceLayer& layer, const ScorerParams& params,
                              float* scores, void* scratch, size_t scratch_bytes,
                              cudaStream_t stream) {
  if (!KeyDiffFastSupports(layer.dtype, layer.head_dim)) return cudaErrorInvalidValue;
  bool empty = false;
  if (cudaError_t err = CheckTableLaunch(layer, scores, /*reads_keys=*/true, &empty);
      err != cudaSuccess || empty) {
    return err;
  }
  const int64_t n = layer.num_tokens;
  const int32_t heads = layer.num_kv_heads;
  KeyArgs args{};
  args.keys = layer.keys;
  args.n = n;
  args.d = layer.head_dim;
  const KeyDiffDeviceParams kd = KeyDiffParamsOf(params);
  args.eps = kd.eps;
  args.raw_mean = kd.anchor_raw_mean != 0;
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

}  // namespace

}  // namespace fast

void RegisterGpuScorer_keydiff(GpuScorerTable& table) {
  GpuScorer keydiff;
  keydiff.read_params = &ReadKeyDiffParams;
  keydiff.exact.scratch_bytes = &KeyDiffExactScratchBytes;
  keydiff.exact.launch = &LaunchKeyDiffExact;
  keydiff.fast.supports = &fast::KeyDiffFastSupports;
  keydiff.fast.scratch_bytes = &fast::KeyDiffFastScratchBytes;
  keydiff.fast.launch = &fast::LaunchKeyDiffFast;
  table.Register("keydiff", keydiff);
}

}  // namespace kvtrim::gpu

// LaunchProtectSelectTopK (launchers.h): protection, the NaN probe and the per-head top-k of
// one layer in one kernel launch, bit-identical to LaunchFindFirstNaN + LaunchApplyProtection
// + LaunchSelectTopK (so to the CPU's NaN check, ApplyProtection and SelectTopK).
//
// One thread-block cluster of C CTAs per head (C = 1..8, one per 8192 tokens); CTA r owns the
// tokens [r * chunk, r * chunk + chunk) of its head.
//   load     reads the raw scores once (L2-resident: the scorer has just written them),
//            records the lowest NaN index (integer atomicMin: the result is order-free), counts
//            protected tokens as +inf, keeps the order-preserving 32-bit keys
//            (select_keys.cuh) in shared memory and histograms their top byte.
//   digits   four radix digits of 8 bits, most significant first: after a cluster barrier
//            every CTA sums the C histograms of the digit (256 bins each) through distributed
//            shared memory (integer sums, the same in every CTA), finds the bin of the k-th key
//            and the rank left within it, and histograms the next digit of the keys that
//            match. After the last digit K (the k-th key) and `need` (how many keys == K are
//            kept) are known. 8-bit digits keep the distributed reads at C KiB per CTA and
//            digit (11-bit ones would read 8 C KiB for one barrier fewer).
//   compact  each CTA writes, in index order, its keys < K and its keys == K while fewer than
//            `need` of them precede: a block scan orders the CTA's own, and the counts of the
//            lower-ranked CTAs come from the histograms already read (their bins below each
//            digit found, and the last digit's bin).
// A head that keeps 0 or all of its tokens skips the digits. Slices larger than the shared
// memory (n above about 8 * 40960) re-read the scores from global memory in each pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cooperative_groups.h>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <utility>

#include "kernels/gpu/device_nan_probe.h"
#include "kernels/gpu/launchers.h"
#include "kernels/gpu/select_keys.cuh"

namespace kvtrim::gpu {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;            // threads per CTA
constexpr int kMaxClusterSize = 8;        // CTAs per head at most (the portable cluster size)
constexpr int64_t kTokensPerCta = 8192;   // a head takes one more CTA per this many tokens
constexpr int kLoadItems = 8;             // loads in flight per thread in the load pass
constexpr int kPassItems = 4;             // keys per thread and step in the digit passes
constexpr int kCompactItems = 4;          // consecutive keys per thread in the compaction
constexpr int64_t kCompactTile = int64_t{kThreads} * kCompactItems;
constexpr size_t kMaxCacheBytes = 160 * 1024;  // shared-memory keys per CTA at most (40960)
constexpr int kMaxDevices = 64;           // devices whose kernel limit is remembered

constexpr int kDigits = 4;                // radix digits of the 32-bit key
constexpr int kBins = 256;                // bins of one digit (8 bits)
constexpr int kPeerGroups = kThreads / kBins;  // thread t sums bin t % 256 of CTAs t / 256 + 4i

/// Digit d (0 = most significant) covers key bits [Shift(d), Shift(d) + 8).
__host__ __device__ constexpr int Shift(int digit) { return 8 * (kDigits - 1 - digit); }

/// The kernel's arguments (plain values, see LaunchProtectSelectTopK).
struct FusedArgs {
  const float* scores;             // [H, n] fp32 raw scores
  int64_t n;
  int64_t sink;                    // tokens j < sink are protected (in [0, n])
  int64_t recent_begin;            // tokens j >= recent_begin are protected (n - recent)
  const int64_t* counts;           // [H]
  int64_t* offsets;                // [H + 1]
  int32_t* indices;                // [sum of the clamped counts]
  unsigned long long* first_nan;   // [1]
  int64_t chunk;                   // tokens per CTA (a multiple of 4)
  bool cached;                     // a CTA's keys fit in its dynamic shared memory
};

using BlockScan = cub::BlockScan<unsigned, kThreads>;
using BlockSum64 = cub::BlockReduce<unsigned long long, kThreads>;
using BlockSumCount = cub::BlockReduce<long long, kThreads>;

/// A count clamped to [0, n], as PrepareTopKKernel and SelectTopK clamp it.
__device__ __forceinline__ int64_t ClampCount(int64_t count, int64_t n) {
  return count < 0 ? 0 : (count > n ? n : count);
}

/// True for the sink and recent tokens, which count as +inf.
__device__ __forceinline__ bool IsProtected(const FusedArgs& a, int64_t j) {
  return j < a.sink || j >= a.recent_begin;
}

/// The key of token j of `row` [n] with protection applied, read from global memory.
__device__ __forceinline__ uint32_t GlobalKey(const FusedArgs& a, const float* row, int64_t j) {
  return DescendingScoreKey(IsProtected(a, j) ? INFINITY : __ldg(row + j));
}

/// Adds 1 to hist[bin] for every lane with `match`: lanes with the same bin add once, by their
/// lowest member. Every lane of the warp calls it.
__device__ __forceinline__ void WarpHistAdd(unsigned* hist, bool match, unsigned bin) {
  const unsigned peers = __match_any_sync(0xFFFFFFFFu, match ? bin : 0xFFFFFFFFu);
  if (match && (threadIdx.x & 31u) == static_cast<unsigned>(__ffs(peers) - 1)) {
    atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
  }
}

/// Histograms digit kDigit (1 to 3) of the CTA's keys whose bits above it equal `prefix`'s,
/// into hist [kBins]. cache: [chunk] keys when a.cached.
template <int kDigit>
__device__ __forceinline__ void HistogramDigit(const FusedArgs& a, const float* row,
                                               const uint32_t* cache, int64_t begin,
                                               int64_t len, uint32_t prefix, unsigned* hist) {
  constexpr int kShift = Shift(kDigit);
  constexpr int kHigh = kShift + 8;  // the bits above the digit, resolved before it
  const uint32_t want = prefix >> kHigh;
  for (int64_t step = 0; step < len; step += int64_t{kThreads} * kPassItems) {
    uint32_t key[kPassItems];
#pragma unroll
    for (int u = 0; u < kPassItems; ++u) {
      const int64_t idx = step + u * kThreads + threadIdx.x;
      key[u] = idx >= len ? 0u : (a.cached ? cache[idx] : GlobalKey(a, row, begin + idx));
    }
#pragma unroll
    for (int u = 0; u < kPassItems; ++u) {
      const int64_t idx = step + u * kThreads + threadIdx.x;
      const bool match = idx < len && (key[u] >> kHigh) == want;
      if (__any_sync(0xFFFFFFFFu, match)) {
        WarpHistAdd(hist, match, (key[u] >> kShift) & (kBins - 1));
      }
    }
  }
}

/// Shared memory of one CTA's digit resolution.
struct DigitShared {
  unsigned (*hist)[kBins];     // [kDigits][kBins] this CTA's histograms, read by the cluster
  unsigned (*partial)[kBins];  // [kPeerGroups][kBins] sums over some of the cluster's CTAs
  BlockScan::TempStorage* scan;
  unsigned* digit;             // the bin found
  unsigned* need;              // the rank left within it
};

/// Resolves digit kDigit after a cluster barrier: sums the histograms of the C CTAs of the
/// cluster (distributed shared memory: thread t reads bin t % 256 of CTAs t / 256 + 4i), finds
/// the bin b with before(b) < need <= before(b) + count(b), and updates `prefix` (gains the
/// digit) and `need` (the rank within the bin). `below` gains the keys of lower-ranked CTAs
/// that are now known to be < K (bins under the digit: high 32 bits) or, for the last digit,
/// == K (the digit's bin: low 32 bits), over this thread's (bin, CTAs).
template <int kDigit>
__device__ __forceinline__ void ResolveDigit(const cg::cluster_group& cluster, unsigned rank,
                                             unsigned size, const DigitShared& s,
                                             uint32_t* prefix, unsigned* need,
                                             unsigned long long* below) {
  const unsigned bin = threadIdx.x % kBins;
  const unsigned group = threadIdx.x / kBins;
  unsigned part = 0, low = 0;
#pragma unroll
  for (int i = 0; i < kMaxClusterSize / kPeerGroups; ++i) {
    const unsigned r = group + static_cast<unsigned>(i * kPeerGroups);
    if (r < size) {
      const unsigned v = *cluster.map_shared_rank(&s.hist[kDigit][bin], static_cast<int>(r));
      part += v;
      if (r < rank) low += v;
    }
  }
  s.partial[group][bin] = part;
  __syncthreads();
  unsigned total = 0;
  if (threadIdx.x < kBins) {
#pragma unroll
    for (int g = 0; g < kPeerGroups; ++g) total += s.partial[g][threadIdx.x];
  }
  unsigned before = 0;
  BlockScan(*s.scan).ExclusiveSum(total, before);
  const unsigned want = *need;
  if (threadIdx.x < kBins && before < want && want <= before + total) {
    *s.digit = threadIdx.x;
    *s.need = want - before;
  }
  __syncthreads();
  const unsigned d = *s.digit;
  *need = *s.need;
  *prefix |= d << Shift(kDigit);
  if (bin < d) *below += static_cast<unsigned long long>(low) << 32;
  if (kDigit == kDigits - 1 && bin == d) *below += low;
}

/// Grid (C, H), clusters of (C, 1, 1), kThreads threads; dynamic shared memory: chunk keys
/// when a.cached. CTA r of cluster h selects the kept tokens of head h among
/// [r * chunk, r * chunk + chunk) (see the file comment); CTA 0 writes offsets[h + 1] (and
/// offsets[0] for h = 0).
__global__ void __launch_bounds__(kThreads, 1) ProtectSelectTopKKernel(FusedArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // thread-block clusters: the backend is built for sm_90 and newer
#else
  extern __shared__ uint4 dynamic_shared[];
  __shared__ unsigned hist[kDigits][kBins];
  __shared__ unsigned partial[kPeerGroups][kBins];
  __shared__ union {
    BlockScan::TempStorage scan;
    BlockSum64::TempStorage sum64;
    BlockSumCount::TempStorage count;
  } tmp;
  __shared__ long long s_base;                // indices before this head
  __shared__ unsigned long long s_before;     // (keys < K) << 32 | (keys == K) of lower CTAs
  __shared__ unsigned s_digit, s_need;

  uint32_t* cache = reinterpret_cast<uint32_t*>(dynamic_shared);
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned size = cluster.num_blocks();
  const int head = static_cast<int>(blockIdx.y);
  const int64_t n = a.n;
  const float* row = a.scores + head * n;
  const int64_t first = static_cast<int64_t>(rank) * a.chunk;
  const int64_t begin = first < n ? first : n;
  const int64_t len = (n - begin < a.chunk ? n - begin : a.chunk);
  const int64_t padded = (len + 3) / 4 * 4;  // cached keys, the tail zero
  const int64_t k = ClampCount(a.counts[head], n);

  for (int i = threadIdx.x; i < kDigits * kBins; i += kThreads) hist[i / kBins][i % kBins] = 0;
  long long earlier = 0;  // the clamped counts of heads before this one
  for (int i = threadIdx.x; i < head; i += kThreads) earlier += ClampCount(a.counts[i], n);
  const long long base = BlockSumCount(tmp.count).Sum(earlier);
  if (threadIdx.x == 0) {
    s_base = base;
    if (rank == 0) {
      a.offsets[head + 1] = base + k;
      if (head == 0) a.offsets[0] = 0;
    }
  }
  __syncthreads();

  // Load: NaN probe, protection, keys, histogram of digit 0.
  unsigned long long nan_at = kNoNaN;  // this thread's lowest NaN token (visited ascending)
  for (int64_t step = 0; step < len; step += int64_t{kThreads} * kLoadItems) {
    float raw[kLoadItems];
#pragma unroll
    for (int u = 0; u < kLoadItems; ++u) {
      const int64_t idx = step + u * kThreads + threadIdx.x;
      raw[u] = idx < len ? __ldg(row + begin + idx) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoadItems; ++u) {
      const int64_t idx = step + u * kThreads + threadIdx.x;
      const int64_t j = begin + idx;
      const bool in = idx < len;
      if (in && nan_at == kNoNaN && isnan(raw[u])) nan_at = static_cast<unsigned long long>(j);
      const uint32_t key = DescendingScoreKey(IsProtected(a, j) ? INFINITY : raw[u]);
      if (a.cached && idx < padded) cache[idx] = in ? key : 0u;
      WarpHistAdd(hist[0], in, key >> Shift(0));
    }
  }
  if (nan_at != kNoNaN) {
    atomicMin(a.first_nan, static_cast<unsigned long long>(head) * static_cast<unsigned long long>(n) +
                               nan_at);
  }

  // Every CTA of a cluster sees the same k: the early exits are uniform over the cluster.
  int32_t* dst = a.indices + s_base;
  if (k == 0) return;
  if (k == n) {
    for (int64_t idx = threadIdx.x; idx < len; idx += kThreads) {
      dst[begin + idx] = static_cast<int32_t>(begin + idx);
    }
    return;
  }

  // Digits.
  const DigitShared shared{hist, partial, &tmp.scan, &s_digit, &s_need};
  uint32_t prefix = 0;
  unsigned need = static_cast<unsigned>(k);
  unsigned long long below = 0;
  cluster.sync();
  ResolveDigit<0>(cluster, rank, size, shared, &prefix, &need, &below);
  HistogramDigit<1>(a, row, cache, begin, len, prefix, hist[1]);
  cluster.sync();
  ResolveDigit<1>(cluster, rank, size, shared, &prefix, &need, &below);
  HistogramDigit<2>(a, row, cache, begin, len, prefix, hist[2]);
  cluster.sync();
  ResolveDigit<2>(cluster, rank, size, shared, &prefix, &need, &below);
  HistogramDigit<3>(a, row, cache, begin, len, prefix, hist[3]);
  cluster.sync();
  ResolveDigit<3>(cluster, rank, size, shared, &prefix, &need, &below);
  // The last read of the peers' histograms is done; they must not exit before ours are read.
  auto arrived = cluster.barrier_arrive();

  // Compaction: (keys < K, keys == K) before this CTA, then a block scan per tile.
  const unsigned long long before = BlockSum64(tmp.sum64).Sum(below);
  if (threadIdx.x == 0) s_before = before;
  __syncthreads();
  unsigned long long less = s_before >> 32;
  unsigned long long equal = s_before & 0xFFFFFFFFull;
  const uint32_t kth = prefix;
  const unsigned long long take = need;
  for (int64_t tile = 0; tile < len; tile += kCompactTile) {
    const int64_t idx0 = tile + int64_t{kCompactItems} * threadIdx.x;
    uint32_t key[kCompactItems] = {0u, 0u, 0u, 0u};
    if (a.cached) {
      if (idx0 < len) {
        const uint4 v = *reinterpret_cast<const uint4*>(cache + idx0);
        key[0] = v.x;
        key[1] = v.y;
        key[2] = v.z;
        key[3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kCompactItems; ++i) {
        if (idx0 + i < len) key[i] = GlobalKey(a, row, begin + idx0 + i);
      }
    }
    unsigned flags = 0;  // bit 2i: key < K; bit 2i + 1: key == K
    unsigned mine = 0;   // (keys < K) << 16 | (keys == K); a tile holds 4096 keys
#pragma unroll
    for (int i = 0; i < kCompactItems; ++i) {
      if (idx0 + i >= len) continue;
      if (key[i] < kth) {
        flags |= 1u << (2 * i);
        mine += 1u << 16;
      } else if (key[i] == kth) {
        flags |= 2u << (2 * i);
        mine += 1u;
      }
    }
    unsigned excl = 0, tile_total = 0;
    BlockScan(tmp.scan).ExclusiveSum(mine, excl, tile_total);
    unsigned long long l = less + (excl >> 16);
    unsigned long long e = equal + (excl & 0xFFFFu);
#pragma unroll
    for (int i = 0; i < kCompactItems; ++i) {
      const unsigned f = (flags >> (2 * i)) & 3u;
      const int32_t j = static_cast<int32_t>(begin + idx0 + i);
      if (f == 1u) {
        dst[l + (e < take ? e : take)] = j;
        ++l;
      } else if (f == 2u) {
        if (e < take) dst[l + e] = j;
        ++e;
      }
    }
    less += tile_total >> 16;
    equal += tile_total & 0xFFFFu;
    __syncthreads();  // the scan's storage is reused by the next tile
  }
  cluster.barrier_wait(std::move(arrived));
#endif
}

/// Per device (index < kMaxDevices): 1 + the dynamic shared memory the kernel may take per
/// CTA; 0 until the kernel's limit has been raised on that device.
std::atomic<size_t> g_cache_limit[kMaxDevices];

/// The dynamic shared memory (bytes) the kernel may take per CTA on the current device: at
/// most kMaxCacheBytes and what the device grants beside the kernel's static shared memory.
/// Raises the kernel's limit to it the first time per device.
cudaError_t CacheLimit(size_t* bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const bool remembered = device >= 0 && device < kMaxDevices;
  if (remembered) {
    const size_t known = g_cache_limit[device].load(std::memory_order_acquire);
    if (known != 0) {
      *bytes = known - 1;
      return cudaSuccess;
    }
  }
  int optin = 0;
  if (const cudaError_t e =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess) {
    return e;
  }
  cudaFuncAttributes attr{};
  if (const cudaError_t e = cudaFuncGetAttributes(&attr, ProtectSelectTopKKernel);
      e != cudaSuccess) {
    return e;
  }
  const size_t granted = static_cast<size_t>(std::max(optin, 0));
  size_t limit = granted > attr.sharedSizeBytes ? granted - attr.sharedSizeBytes : 0;
  limit = std::min(limit, kMaxCacheBytes) / 16 * 16;
  if (limit > 0) {
    if (const cudaError_t e = cudaFuncSetAttribute(
            ProtectSelectTopKKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
            static_cast<int>(limit));
        e != cudaSuccess) {
      return e;
    }
  }
  // Every caller computes the same value: a concurrent first call stores it again.
  if (remembered) g_cache_limit[device].store(limit + 1, std::memory_order_release);
  *bytes = limit;
  return cudaSuccess;
}

}  // namespace

size_t ProtectSelectTopKScratchBytes(int32_t num_heads, int64_t n) {
  // Histograms and keys live in shared memory, the first NaN in the caller's slot.
  return 0;
}

cudaError_t LaunchProtectSelectTopK(const float* raw_scores, int32_t num_heads, int64_t n,
                                    int64_t sink, int64_t recent, const int64_t* counts,
                                    int64_t* offsets, int32_t* indices,
                                    unsigned long long* first_nan, void* scratch,
                                    size_t scratch_bytes, cudaStream_t stream) {
  if (num_heads < 0 || num_heads > 65535 || n < 0 || n > INT32_MAX || offsets == nullptr ||
      scratch_bytes < ProtectSelectTopKScratchBytes(num_heads, n)) {
    return cudaErrorInvalidValue;
  }
  if (num_heads == 0) return cudaMemsetAsync(offsets, 0, sizeof(int64_t), stream);
  if (counts == nullptr) return cudaErrorInvalidValue;
  if (n == 0) {
    // Every count clamps to 0 and there is no score to probe.
    return cudaMemsetAsync(offsets, 0, (static_cast<size_t>(num_heads) + 1) * sizeof(int64_t),
                           stream);
  }
  if (raw_scores == nullptr || indices == nullptr || first_nan == nullptr) {
    return cudaErrorInvalidValue;
  }
  size_t cache_limit = 0;
  if (const cudaError_t e = CacheLimit(&cache_limit); e != cudaSuccess) return e;

  const int64_t ctas = std::clamp<int64_t>((n + kTokensPerCta - 1) / kTokensPerCta, 1,
                                           kMaxClusterSize);
  FusedArgs args;
  args.scores = raw_scores;
  args.n = n;
  args.sink = std::clamp<int64_t>(sink, 0, n);
  args.recent_begin = n - std::clamp<int64_t>(recent, 0, n);
  args.counts = counts;
  args.offsets = offsets;
  args.indices = indices;
  args.first_nan = first_nan;
  args.chunk = ((n + ctas - 1) / ctas + 3) / 4 * 4;
  const size_t cache_bytes = static_cast<size_t>(args.chunk) * sizeof(uint32_t);
  args.cached = cache_bytes <= cache_limit;

  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(ctas);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(num_heads));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = args.cached ? cache_bytes : 0;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, ProtectSelectTopKKernel, args);
}

}  // namespace kvtrim::gpu

// LaunchProtectSelectTopK (launchers.h): protection, the NaN probe and the per-head top-k of
// one layer in one kernel launch, bit-identical to LaunchFindFirstNaN + LaunchApplyProtection
// + LaunchSelectTopK (so to the CPU's NaN check, ApplyProtection and SelectTopK).
//
// One thread-block cluster of C CTAs of 512 threads per head (C = 1..8, one per 4096 tokens);
// CTA r owns the tokens [r * chunk, r * chunk + chunk) of its head, and warp w of the CTA the
// contiguous segment [w * chunk / 16, (w + 1) * chunk / 16) of them (lane l holds the tokens
// 32 s + l of its segment at step s), so that index order is segment order, then step, then
// lane. Keys are the order-preserving 32-bit keys of select_keys.cuh; K is the k-th smallest.
//   load     reads the raw scores once (L2-resident: the scorer has just written them; 8 or
//            16 loads per thread and batch, the next batch loaded while one is processed),
//            records the lowest NaN index (integer atomicMin: the result is order-free), counts
//            protected tokens as +inf, keeps the keys in shared memory and histograms their top
//            12 bits (4096 bins, plain shared atomics; a warp whose keys of a batch share one
//            bin adds them with one atomic, so long runs of ties and protected tokens are
//            cheap). A 256-bin histogram of the top 8 bits is summed from it.
//   round 1  after one cluster barrier every CTA reads the C 256-bin histograms through
//            distributed shared memory (DSMEM) and finds the 8-bit bin of the k-th key, then
//            the C 16-bin slices of the 12-bit histograms under it: the 12-bit prefix of K, the
//            rank left within it, and M, the keys of the cluster that share the prefix. Every
//            search (FindBin) is two __syncthreads: per-warp sums (warp reductions), then the
//            warp that holds the boundary scans its lanes with shuffles.
//   rounds   while M > 4096 (a bin holding many keys: ties, a narrow score range), the next 10
//            key bits are histogrammed over the keys that match the prefix (1024 bins) and
//            resolved across the cluster as above: one cluster barrier per 10 bits, at most two.
//   local    otherwise (the common case: the 12-bit bin holds a few percent of the keys) each
//            CTA copies its matching keys into a list, one cluster barrier, and every CTA
//            reads all M of them (at most 8 per thread) and resolves the remaining 10 or 20
//            bits by itself with no further cluster barrier: a 1024-bin shared histogram per
//            10 bits while more than 32 keys match, then the last 32 or fewer go to shared
//            memory and every warp ranks them (one __syncthreads, nothing to broadcast).
//   compact  each warp counts its keys < K and == K (warp reductions); one __syncthreads gives
//            each warp the keys before it (lower CTAs: the bins below each resolved digit and
//            the matching keys of the list exchange; lower warps: their counts); the warp then
//            writes, in index order, its keys < K and its keys == K while fewer than `need` of
//            them precede (ballots and popcounts, no block scan). The same __syncthreads sums
//            the counts of the earlier heads (the head's index base), loaded at the start.
// Every decision (M, the rounds, the early exits) is the same in all CTAs of a cluster, so
// they meet the same cluster barriers. A head that keeps 0 or all of its tokens stops after the
// load. Slices larger than the shared memory (n above 8 * 40960) re-read the scores from global
// memory in each pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cooperative_groups.h>
#include <cstdint>
#include <utility>

#include "kernels/gpu/kernels/cluster_launch.cuh"
#include "kernels/gpu/kernels/device_nan_probe.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/select_keys.cuh"

namespace kvtrim::gpu {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;             // threads per CTA
constexpr int kWarps = kThreads / 32;     // warps per CTA, one token segment each
constexpr int kMaxClusterSize = 8;        // CTAs per head at most (the portable cluster size;
                                          // the H100 holds only 7 clusters of 10-16 CTAs at one
                                          // CTA per SM, so 8 heads would take two waves)
constexpr int64_t kTokensPerCta = 4096;   // a head takes one more CTA per this many tokens
constexpr int kChunkAlign = 32 * kWarps;  // a CTA's chunk is a multiple of this (segments of
                                          // whole steps)
constexpr int kSmallBatch = 8;            // keys per lane and batch for chunks of at most
constexpr int kSmallChunk = 32 * kWarps * kSmallBatch;  // this many tokens (one batch)
constexpr int kLargeBatch = 16;           // and above (16 loads in flight, 16 more prefetched)
constexpr size_t kMaxCacheBytes = 160 * 1024;  // shared-memory keys per CTA at most (40960)
constexpr int kMaxDevices = 64;           // devices whose kernel limit is remembered

constexpr int kTopBits = 12;                            // bits resolved by round 1
constexpr int kFineBins = 1 << kTopBits;                // the 12-bit histogram
constexpr int kCoarseBins = 256;                        // its top 8 bits
constexpr int kFinePerCoarse = kFineBins / kCoarseBins; // 16
constexpr int kDigitBits = 10;                          // bits per later digit
constexpr int kDigitBins = 1 << kDigitBits;             // 1024
constexpr int kMaxCandidates = 4096;                    // M at most for the local resolution
constexpr int kCandidatesPerThread = kMaxCandidates / kThreads;  // 8
constexpr unsigned kFullMask = 0xFFFFFFFFu;

static_assert(32 - kTopBits == 2 * kDigitBits, "two later digits cover the key");
static_assert(kWarps == kFinePerCoarse, "FindBin gives each fine bin of a slice one warp");
static_assert(kCandidatesPerThread * 4 <= 32, "candidate origins pack 4 bits each");

/// The histogram of the 10-bit digit below bit `shift` (20 or 10): 0 or 1. Each digit is
/// resolved once, across the cluster or locally, so each has its own zeroed histogram.
__host__ __device__ constexpr int DigitIndex(int shift) {
  return (2 * kDigitBits - shift) / kDigitBits;
}

/// The kernel's arguments (plain values, see LaunchProtectSelectTopK).
struct FusedArgs {
  const float* scores;             // [H, n] fp32 raw scores
  int n;                           // tokens per head, in [1, 2^31 - 1]
  int sink;                        // tokens j < sink are protected (in [0, n])
  int recent_begin;                // tokens j >= recent_begin are protected (n - recent)
  int chunk;                       // tokens per CTA (a multiple of kChunkAlign)
  const int64_t* counts;           // [H]
  int64_t* offsets;                // [H + 1]
  int32_t* indices;                // [sum of the clamped counts]
  unsigned long long* first_nan;   // [1]
  bool cached;                     // a CTA's keys fit in its dynamic shared memory
};

/// The result of a boundary search (FindBin), the same in every thread of the cluster.
struct Found {
  unsigned bin;        // the bin that holds the sought rank
  unsigned need;       // the rank left within it (1-based)
  unsigned low_below;  // keys of lower-ranked CTAs in the bins below `bin`
  unsigned low_at;     // keys of lower-ranked CTAs in `bin`
  unsigned total;      // keys of the cluster in `bin`
};

/// Static shared memory of one CTA.
struct alignas(16) SelectShared {
  unsigned fine[kFineBins];                   // 12-bit histogram of the keys (read by peers)
  unsigned coarse[kCoarseBins];               // its top 8 bits (read by peers)
  unsigned digit[2][kDigitBins];              // the later digits' histograms (DigitIndex)
  uint32_t list[kMaxCandidates];              // this CTA's keys that match the prefix
  long long warp_base[kWarps];                // per warp: clamped counts of earlier heads
  unsigned warp_total[kWarps];                // FindBin: per-warp sums of the bins
  unsigned warp_low[kWarps];                  //   and of their lower-CTA parts
  unsigned warp_less[kWarps];                 // compaction: per warp, keys < K
  unsigned warp_equal[kWarps];                //   keys == K
  unsigned warp_list_less[kWarps];            //   list keys of lower CTAs < K
  unsigned warp_list_equal[kWarps];           //   list keys of lower CTAs == K
  unsigned cta_count[kMaxClusterSize];        // keys per CTA in the last bin found
  unsigned list_count;                        // entries of `list`
  uint32_t small[32];                         // ResolveSmallSet: the last matching keys
  unsigned small_count;                       //   and how many
  Found found;                                // FindBin's answer
};

/// One warp's tokens: CTA positions [first, first + len); lane l holds first + 32 s + l at
/// step s. Token j = begin + position.
struct WarpSlice {
  const float* row;       // the head's raw scores [n]
  const uint32_t* cache;  // the CTA's keys by position (when cached)
  int begin;              // the CTA's first token
  int first;              // the warp's first position
  int len;                // the warp's positions
};

/// A count clamped to [0, n], as PrepareTopKKernel and SelectTopK clamp it.
__device__ __forceinline__ int ClampCount(int64_t count, int n) {
  return count < 0 ? 0 : (count > n ? n : static_cast<int>(count));
}

/// True for the sink and recent tokens, which count as +inf.
__device__ __forceinline__ bool IsProtected(const FusedArgs& a, int j) {
  return j < a.sink || j >= a.recent_begin;
}

/// The key of token j of `row` with protection applied, read from global memory.
__device__ __forceinline__ uint32_t GlobalKey(const FusedArgs& a, const float* row, int j) {
  return DescendingScoreKey(IsProtected(a, j) ? INFINITY : __ldg(row + j));
}

/// This lane's position at step `step` of its warp's segment.
__device__ __forceinline__ int StepPosition(int step) {
  return 32 * step + static_cast<int>(threadIdx.x & 31u);
}

/// Lanes below this one.
__device__ __forceinline__ unsigned LanesBelow() {
  return (1u << (threadIdx.x & 31u)) - 1u;
}

/// The indices before this head: the sum over the CTA of each thread's share `earlier` of the
/// clamped counts of the earlier heads (below 2^38 per thread: 128 counts below 2^31). Ends
/// with a __syncthreads. Every thread of the CTA calls it.
__device__ __forceinline__ long long HeadBase(long long earlier, SelectShared& s) {
  const unsigned lo = __reduce_add_sync(kFullMask, static_cast<unsigned>(earlier & 0xFFFFFF));
  const unsigned hi = __reduce_add_sync(kFullMask, static_cast<unsigned>(earlier >> 24));
  if ((threadIdx.x & 31u) == 0) {
    s.warp_base[threadIdx.x >> 5] = (static_cast<long long>(hi) << 24) + lo;
  }
  __syncthreads();
  long long base = 0;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) base += s.warp_base[i];
  return base;
}

/// Loads the raw scores of steps [step, step + kBatch) of this lane (0 past the segment).
template <int kBatch>
__device__ __forceinline__ void LoadRaw(const WarpSlice& w, int step, float (&raw)[kBatch]) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int pos = StepPosition(step + u);
    raw[u] = pos < w.len ? __ldg(w.row + w.begin + w.first + pos) : 0.0f;
  }
}

/// Reads the keys of steps [step, step + kBatch) of this lane (from the cache or, with
/// protection, from global memory); bit u of the result: step + u lies in the segment.
template <int kBatch>
__device__ __forceinline__ unsigned ReadKeys(const FusedArgs& a, const WarpSlice& w, int step,
                                             uint32_t (&key)[kBatch]) {
  unsigned valid = 0;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int pos = StepPosition(step + u);
    key[u] = 0;
    if (pos < w.len) {
      valid |= 1u << u;
      key[u] = a.cached ? w.cache[w.first + pos] : GlobalKey(a, w.row, w.begin + w.first + pos);
    }
  }
  return valid;
}

/// Adds 1 to hist[bin[u]] for every u with bit u of `valid`. When the valid keys of the whole
/// warp fall in one bin (a run of ties), one atomic adds them all. Every lane calls it.
template <int N>
__device__ __forceinline__ void AddBatch(unsigned* hist, const unsigned (&bin)[N],
                                         unsigned valid) {
  unsigned lo = 0xFFFFFFFFu, hi = 0;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    if ((valid >> u) & 1u) {
      lo = min(lo, bin[u]);
      hi = max(hi, bin[u]);
    }
  }
  const unsigned warp_lo = __reduce_min_sync(kFullMask, lo);
  const unsigned warp_hi = __reduce_max_sync(kFullMask, hi);
  if (warp_lo == warp_hi) {
    const unsigned count = __reduce_add_sync(kFullMask, static_cast<unsigned>(__popc(valid)));
    if ((threadIdx.x & 31u) == 0) atomicAdd(&hist[warp_lo], count);
  } else if (warp_lo < warp_hi) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      if ((valid >> u) & 1u) atomicAdd(&hist[bin[u]], 1u);
    }
  }
}

/// Finds the bin b of a kBins-bin histogram with before(b) < need <= before(b) + count(b),
/// where the histogram is the sum of the C CTAs' copies at `hist` (read through DSMEM; kLocal:
/// this CTA's copy alone). Also sums the lower-ranked CTAs' part of the bins below b and of b,
/// and (kPerCta) stores each CTA's count of b in s.cta_count. Thread t reads bins
/// [t / kSplit * kPer, + kPer) of the CTAs t % kSplit + kSplit i; per-warp sums meet after one
/// __syncthreads, the warp that holds the boundary scans its lanes, and a second
/// __syncthreads publishes the answer. Every thread of the CTA calls it.
template <int kBins, bool kLocal, bool kPerCta>
__device__ __forceinline__ Found FindBin(const cg::cluster_group& cluster, unsigned rank,
                                         unsigned size, const unsigned* hist, unsigned need,
                                         SelectShared& s) {
  constexpr int kSplit = kBins >= kThreads ? 1 : kThreads / kBins;  // threads per bin
  constexpr int kPer = kBins >= kThreads ? kBins / kThreads : 1;    // bins per thread
  static_assert(kSplit <= 32 && (kSplit & (kSplit - 1)) == 0, "a bin's threads share a warp");
  static_assert(!kLocal || kSplit == 1, "a local search reads each bin once");
  static_assert(!kPerCta || kLocal || kSplit == 1 || kSplit >= kMaxClusterSize,
                "per-CTA counts come from one lane per CTA or from a re-read");
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned sub = threadIdx.x % kSplit;
  const unsigned first = threadIdx.x / kSplit * kPer;
  unsigned tot[kPer], low[kPer];
  unsigned own = 0;  // kSplit >= C: CTA `sub`'s count of this thread's bin
#pragma unroll
  for (int p = 0; p < kPer; ++p) tot[p] = low[p] = 0;
  if constexpr (kLocal) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) tot[p] = hist[first + p];
  } else {
#pragma unroll
    for (int i = 0; i < (kMaxClusterSize + kSplit - 1) / kSplit; ++i) {
      const unsigned q = sub + static_cast<unsigned>(i * kSplit);
      if (q < size) {
        const unsigned* peer = cluster.map_shared_rank(hist, static_cast<int>(q));
#pragma unroll
        for (int p = 0; p < kPer; ++p) {
          const unsigned v = peer[first + p];
          tot[p] += v;
          if (q < rank) low[p] += v;
          own = v;
        }
      }
    }
    if constexpr (kSplit == 32) {
      tot[0] = __reduce_add_sync(kFullMask, tot[0]);
      low[0] = __reduce_add_sync(kFullMask, low[0]);
    } else {
#pragma unroll
      for (int m = 1; m < kSplit; m <<= 1) {
        tot[0] += __shfl_xor_sync(kFullMask, tot[0], m);
        low[0] += __shfl_xor_sync(kFullMask, low[0], m);
      }
    }
  }
  unsigned mine = 0, mine_low = 0;  // this thread's bins (one thread per bin counts them)
  if (sub == 0) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      mine += tot[p];
      mine_low += low[p];
    }
  }
  const unsigned warp_tot = __reduce_add_sync(kFullMask, mine);
  const unsigned warp_low = __reduce_add_sync(kFullMask, mine_low);
  if (lane == 0) {
    s.warp_total[warp] = warp_tot;
    s.warp_low[warp] = warp_low;
  }
  __syncthreads();
  const unsigned xt = lane < kWarps ? s.warp_total[lane] : 0u;
  const unsigned xl = lane < kWarps ? s.warp_low[lane] : 0u;
  unsigned before = __reduce_add_sync(kFullMask, lane < warp ? xt : 0u);
  unsigned before_low = __reduce_add_sync(kFullMask, lane < warp ? xl : 0u);
  if (before < need && need <= before + warp_tot) {  // the same in every lane of the warp
    if constexpr (kSplit < 32) {
      unsigned inc = mine, inc_low = mine_low;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned x = __shfl_up_sync(kFullMask, inc, d);
        const unsigned y = __shfl_up_sync(kFullMask, inc_low, d);
        if (lane >= static_cast<unsigned>(d)) {
          inc += x;
          inc_low += y;
        }
      }
      before += inc - mine;
      before_low += inc_low - mine_low;
    }
    if (sub == 0 && before < need && need <= before + mine) {
      unsigned bin = first, at = tot[0], at_low = low[0];
#pragma unroll
      for (int p = 1; p < kPer; ++p) {
        if (need > before + at) {  // not in the bins so far: move on (false once found)
          before += at;
          before_low += at_low;
          bin = first + p;
          at = tot[p];
          at_low = low[p];
        }
      }
      s.found = Found{bin, need - before, before_low, at_low, at};
      if constexpr (kPerCta && !kLocal && kSplit == 1) {
        for (unsigned q = 0; q < size; ++q) {
          s.cta_count[q] = *cluster.map_shared_rank(hist + bin, static_cast<int>(q));
        }
      }
    }
    if constexpr (kPerCta && !kLocal && kSplit >= kMaxClusterSize) {
      if (sub < size) s.cta_count[sub] = own;  // the warp holds exactly the found bin
    }
  }
  __syncthreads();
  return s.found;
}

/// Histograms the 10-bit digit below bit `shift` of the keys of this warp's segment whose bits
/// from `shift` up equal `prefix`'s, into `hist`.
template <int kBatch>
__device__ __forceinline__ void HistogramDigit(const FusedArgs& a, const WarpSlice& w, int steps,
                                               int shift, uint32_t prefix, unsigned* hist) {
  const uint32_t want = prefix >> shift;
  for (int step = 0; step < steps; step += kBatch) {
    uint32_t key[kBatch];
    unsigned valid = ReadKeys<kBatch>(a, w, step, key);
    unsigned bin[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if ((key[u] >> shift) != want) valid &= ~(1u << u);
      bin[u] = (key[u] >> (shift - kDigitBits)) & (kDigitBins - 1);
    }
    AddBatch(hist, bin, valid);
  }
}

/// Appends the keys of this warp's segment whose bits from `shift` up equal `prefix`'s to
/// s.list (in no particular order: the list is used as a multiset; the CTA holds at most
/// kMaxCandidates of them).
template <int kBatch>
__device__ __forceinline__ void CollectMatches(const FusedArgs& a, const WarpSlice& w, int steps,
                                               int shift, uint32_t prefix, SelectShared& s) {
  const uint32_t want = prefix >> shift;
  for (int step = 0; step < steps; step += kBatch) {
    uint32_t key[kBatch];
    unsigned valid = ReadKeys<kBatch>(a, w, step, key);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if ((key[u] >> shift) != want) valid &= ~(1u << u);
    }
    if (valid == 0) continue;
    unsigned at = atomicAdd(&s.list_count, static_cast<unsigned>(__popc(valid)));
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if ((valid >> u) & 1u) {
        if (at < static_cast<unsigned>(kMaxCandidates)) s.list[at] = key[u];
        ++at;
      }
    }
  }
}

/// Converts one batch of raw scores of this lane (steps [step, step + kBatch)) to keys:
/// protection (kProtect: some token of the batch may be protected or lie past the segment;
/// otherwise none is and all exist), the cache, the 12-bit bins and the valid mask. Returns
/// true when a raw score of the batch is NaN.
template <int kBatch, bool kGeneral>
__device__ __forceinline__ bool BatchKeys(const FusedArgs& a, const WarpSlice& w, int step,
                                          const float (&raw)[kBatch], uint32_t* cache,
                                          unsigned (&bin)[kBatch], unsigned* valid) {
  bool nan = false;
  unsigned mask = 0;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int pos = StepPosition(step + u);
    const bool in = !kGeneral || pos < w.len;
    const bool guard = kGeneral && (!in || IsProtected(a, w.begin + w.first + (in ? pos : 0)));
    const uint32_t key = DescendingScoreKey(guard ? INFINITY : raw[u]);
    nan |= in && isnan(raw[u]);
    if (in) {
      mask |= 1u << u;
      if (a.cached) cache[w.first + pos] = key;
    }
    bin[u] = key >> (32 - kTopBits);
  }
  *valid = mask;
  return nan;
}

/// The k-th smallest of the cluster's `count` (<= 32) keys that match `prefix` from bit
/// `shift` up, `need` the rank sought among them: the matching candidates of all threads go
/// to s.small, one __syncthreads, and every warp ranks them by itself (no broadcast needed).
/// Sets *kth and *need (the keys == kth to keep). Every thread of the CTA calls it.
__device__ __forceinline__ void ResolveSmallSet(const uint32_t (&cand)[kCandidatesPerThread],
                                                unsigned matching, unsigned count, int shift,
                                                uint32_t prefix, SelectShared& s,
                                                uint32_t* kth, unsigned* need) {
  const uint32_t want = prefix >> shift;
#pragma unroll
  for (int i = 0; i < kCandidatesPerThread; ++i) {
    const unsigned g = threadIdx.x + static_cast<unsigned>(i * kThreads);
    if (g < matching && (cand[i] >> shift) == want) {
      s.small[atomicAdd(&s.small_count, 1u)] = cand[i];
    }
  }
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u;
  const uint32_t mine = lane < count ? s.small[lane] : 0xFFFFFFFFu;
  unsigned lt = 0, le = 0;  // the set's keys < mine and <= mine
  for (unsigned i = 0; i < count; ++i) {
    const uint32_t x = s.small[i];
    lt += x < mine ? 1u : 0u;
    le += x <= mine ? 1u : 0u;
  }
  const unsigned hit = __ballot_sync(kFullMask, lane < count && lt < *need && *need <= le);
  const int src = __ffs(hit) - 1;  // lanes that hit hold equal keys: take the lowest
  *kth = __shfl_sync(kFullMask, mine, src);
  *need -= __shfl_sync(kFullMask, lt, src);
}

/// Grid (C, H), clusters of (C, 1, 1), kThreads threads; dynamic shared memory: chunk keys
/// when a.cached. CTA r of cluster h selects the kept tokens of head h among
/// [r * chunk, r * chunk + chunk) (see the file comment); CTA 0 writes offsets[h + 1] (and
/// offsets[0] for h = 0). kBatch: keys per lane and batch (kSmallBatch when the chunk is at
/// most kSmallChunk tokens, so that its one batch carries no empty steps).
template <int kBatch>
__global__ void __launch_bounds__(kThreads, 1) ProtectSelectTopKKernel(FusedArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // thread-block clusters: the backend is built for sm_90 and newer
#else
  extern __shared__ uint4 dynamic_shared[];
  __shared__ SelectShared sh;

  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned size = cluster.num_blocks();
  const int head = static_cast<int>(blockIdx.y);
  const int n = a.n;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;

  WarpSlice w;
  w.row = a.scores + static_cast<int64_t>(head) * n;
  w.cache = reinterpret_cast<const uint32_t*>(dynamic_shared);
  const int64_t cta_first = static_cast<int64_t>(rank) * a.chunk;
  w.begin = cta_first < n ? static_cast<int>(cta_first) : n;
  const int len = min(n - w.begin, a.chunk);
  const int segment = a.chunk / kWarps;
  w.first = static_cast<int>(warp) * segment;
  w.len = max(0, min(len - w.first, segment));
  const int steps = (w.len + 31) / 32;
  uint32_t* cache = reinterpret_cast<uint32_t*>(dynamic_shared);

  // Prologue: the first batch of scores and the counts in flight together; the counts of the
  // earlier heads are summed only where the index base is needed (compaction, early exits).
  float raw[kBatch];
  LoadRaw<kBatch>(w, 0, raw);
  const int k = ClampCount(__ldg(a.counts + head), n);
  long long earlier = 0;  // the clamped counts of heads before this one (this thread's share)
  for (int i = threadIdx.x; i < head; i += kThreads) earlier += ClampCount(__ldg(a.counts + i), n);
  for (int i = threadIdx.x; i < kFineBins / 4; i += kThreads) {
    reinterpret_cast<uint4*>(sh.fine)[i] = make_uint4(0, 0, 0, 0);
  }
  for (int i = threadIdx.x; i < 2 * kDigitBins / 4; i += kThreads) {
    reinterpret_cast<uint4*>(&sh.digit[0][0])[i] = make_uint4(0, 0, 0, 0);
  }
  if (threadIdx.x == 0) {
    sh.list_count = 0;
    sh.small_count = 0;
  }
  __syncthreads();
  // Every CTA of a cluster sees the same k: the early exits are uniform over the cluster.
  const bool trivial = k == 0 || k == n;

  // Load: NaN probe, protection, keys, the 12-bit histogram.
  int nan_at = INT_MAX;  // this thread's lowest NaN token
  for (int step = 0; step < steps; step += kBatch) {
    float next[kBatch];
    const bool more = step + kBatch < steps;
    if (more) LoadRaw<kBatch>(w, step + kBatch, next);
    const int j0 = w.begin + w.first + StepPosition(step);  // this lane's first token
    // Most batches lie inside the segment and outside the sink and recent windows.
    const bool plain = StepPosition(step + kBatch - 1) < w.len && j0 >= a.sink &&
                       j0 + 32 * (kBatch - 1) < a.recent_begin;
    unsigned valid = 0;
    unsigned bin[kBatch];
    const bool nan = plain ? BatchKeys<kBatch, false>(a, w, step, raw, cache, bin, &valid)
                           : BatchKeys<kBatch, true>(a, w, step, raw, cache, bin, &valid);
    if (nan) {  // rare: the lowest NaN token of the batch
#pragma unroll
      for (int u = kBatch - 1; u >= 0; --u) {
        if (StepPosition(step + u) < w.len && isnan(raw[u])) nan_at = min(nan_at, j0 + 32 * u);
      }
    }
    if (!trivial) AddBatch(sh.fine, bin, valid);
    if (more) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) raw[u] = next[u];
    }
  }
  if (nan_at != INT_MAX) {
    atomicMin(a.first_nan,
              static_cast<unsigned long long>(head) * static_cast<unsigned long long>(n) +
                  static_cast<unsigned long long>(nan_at));
  }
  if (trivial) {
    const long long base = HeadBase(earlier, sh);
    if (rank == 0 && threadIdx.x == 0) {
      a.offsets[head + 1] = base + k;
      if (head == 0) a.offsets[0] = 0;
    }
    if (k == n) {
      int32_t* dst = a.indices + base;
      for (int pos = threadIdx.x; pos < len; pos += kThreads) dst[w.begin + pos] = w.begin + pos;
    }
    return;
  }

  // The 8-bit histogram from the 12-bit one: thread t sums fine bins [8t, 8t + 8).
  __syncthreads();
  {
    const uint4* f = reinterpret_cast<const uint4*>(sh.fine) + 2 * threadIdx.x;
    const uint4 x = f[0], y = f[1];
    unsigned v = x.x + x.y + x.z + x.w + y.x + y.y + y.z + y.w;
    v += __shfl_xor_sync(kFullMask, v, 1);
    if ((threadIdx.x & 1u) == 0) sh.coarse[threadIdx.x >> 1] = v;
  }
  static_assert(kThreads * 8 == kFineBins, "the 8-bit sums take every thread once");

  // Round 1: the top 12 bits of K.
  cluster.sync();
  unsigned need = static_cast<unsigned>(k);
  unsigned less_low = 0;   // keys < K of lower-ranked CTAs, found so far
  unsigned equal_low = 0;  // keys == K of lower-ranked CTAs (when the rounds end the search)
  Found f = FindBin<kCoarseBins, false, false>(cluster, rank, size, sh.coarse, need, sh);
  const unsigned coarse_bin = f.bin;
  need = f.need;
  less_low += f.low_below;
  f = FindBin<kFinePerCoarse, false, true>(cluster, rank, size,
                                          sh.fine + coarse_bin * kFinePerCoarse, need, sh);
  int shift = 32 - kTopBits;  // bits of K still unknown
  uint32_t prefix = (coarse_bin * kFinePerCoarse + f.bin) << shift;
  need = f.need;
  less_low += f.low_below;
  unsigned matching = f.total;  // M: keys of the cluster that share the prefix

  // Rounds across the cluster while the prefix's bin is large.
  while (shift > 0 && matching > static_cast<unsigned>(kMaxCandidates)) {
    unsigned* hist = sh.digit[DigitIndex(shift)];
    HistogramDigit<kBatch>(a, w, steps, shift, prefix, hist);
    cluster.sync();
    f = FindBin<kDigitBins, false, true>(cluster, rank, size, hist, need, sh);
    shift -= kDigitBits;
    prefix |= f.bin << shift;
    need = f.need;
    less_low += f.low_below;
    matching = f.total;
    if (shift == 0) equal_low = f.low_at;
  }

  // List exchange: every CTA reads the cluster's M matching keys.
  uint32_t cand[kCandidatesPerThread];
  unsigned origins = 0;  // 4 bits per candidate: its CTA
  const bool local = shift > 0;
  if (local) {
    CollectMatches<kBatch>(a, w, steps, shift, prefix, sh);
    cluster.sync();
    unsigned start[kMaxClusterSize];
    unsigned acc = 0;
#pragma unroll
    for (int q = 0; q < kMaxClusterSize; ++q) {
      start[q] = acc;
      if (q < static_cast<int>(size)) acc += sh.cta_count[q];
    }
#pragma unroll
    for (int i = 0; i < kCandidatesPerThread; ++i) {
      const unsigned g = threadIdx.x + static_cast<unsigned>(i * kThreads);
      cand[i] = 0;
      if (g < matching) {
        unsigned q = 0, q_start = 0;  // the CTA whose list holds g, and its first g
#pragma unroll
        for (int r = 1; r < kMaxClusterSize; ++r) {
          if (r < static_cast<int>(size) && start[r] <= g) {
            q = r;
            q_start = start[r];
          }
        }
        cand[i] = *cluster.map_shared_rank(&sh.list[g - q_start], static_cast<int>(q));
        origins |= q << (4 * i);
      }
    }
  }
  // The last read of the peers' shared memory is done; they must not exit before ours are read.
  auto arrived = cluster.barrier_arrive();

  // Local resolution of the remaining bits over the candidates: 1024-bin rounds while more
  // than 32 keys match, then the small set ranked by every warp.
  unsigned list_less = 0, list_equal = 0;  // this thread's candidates of lower CTAs < K, == K
  if (local) {
    unsigned remaining = matching;  // keys of the cluster that match the prefix
    while (shift > 0) {
      if (remaining <= 32u) {
        ResolveSmallSet(cand, matching, remaining, shift, prefix, sh, &prefix, &need);
        shift = 0;
        break;
      }
      unsigned* hist = sh.digit[DigitIndex(shift)];
      const uint32_t want = prefix >> shift;
      unsigned bin[kCandidatesPerThread];
      unsigned valid = 0;
#pragma unroll
      for (int i = 0; i < kCandidatesPerThread; ++i) {
        const unsigned g = threadIdx.x + static_cast<unsigned>(i * kThreads);
        if (g < matching && (cand[i] >> shift) == want) valid |= 1u << i;
        bin[i] = (cand[i] >> (shift - kDigitBits)) & (kDigitBins - 1);
      }
      AddBatch(hist, bin, valid);
      __syncthreads();
      f = FindBin<kDigitBins, true, false>(cluster, 0, 1, hist, need, sh);
      shift -= kDigitBits;
      prefix |= f.bin << shift;
      need = f.need;
      remaining = f.total;
    }
#pragma unroll
    for (int i = 0; i < kCandidatesPerThread; ++i) {
      const unsigned g = threadIdx.x + static_cast<unsigned>(i * kThreads);
      if (g < matching && ((origins >> (4 * i)) & 15u) < rank) {
        list_less += cand[i] < prefix ? 1u : 0u;
        list_equal += cand[i] == prefix ? 1u : 0u;
      }
    }
  }

  // Compaction: per-warp counts, one __syncthreads, then ballots in index order.
  const uint32_t kth = prefix;
  const unsigned take = need;  // keys == K kept, counted over the whole head
  unsigned less = 0, equal = 0;
  for (int step = 0; step < steps; step += kBatch) {
    uint32_t key[kBatch];
    const unsigned valid = ReadKeys<kBatch>(a, w, step, key);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if ((valid >> u) & 1u) {
        less += key[u] < kth ? 1u : 0u;
        equal += key[u] == kth ? 1u : 0u;
      }
    }
  }
  {
    const unsigned wl = __reduce_add_sync(kFullMask, less);
    const unsigned we = __reduce_add_sync(kFullMask, equal);
    const unsigned pl = __reduce_add_sync(kFullMask, list_less);
    const unsigned pe = __reduce_add_sync(kFullMask, list_equal);
    if (lane == 0) {
      sh.warp_less[warp] = wl;
      sh.warp_equal[warp] = we;
      sh.warp_list_less[warp] = pl;
      sh.warp_list_equal[warp] = pe;
    }
  }
  const long long base = HeadBase(earlier, sh);  // its __syncthreads publishes the counts too
  if (rank == 0 && threadIdx.x == 0) {
    a.offsets[head + 1] = base + k;
    if (head == 0) a.offsets[0] = 0;
  }
  int32_t* dst = a.indices + base;
  {
    const bool in = lane < static_cast<unsigned>(kWarps);
    const bool lower = lane < warp;
    const unsigned xl = in ? sh.warp_less[lane] : 0u;
    const unsigned xe = in ? sh.warp_equal[lane] : 0u;
    const unsigned pl = in ? sh.warp_list_less[lane] : 0u;
    const unsigned pe = in ? sh.warp_list_equal[lane] : 0u;
    less = less_low + __reduce_add_sync(kFullMask, pl) +
           __reduce_add_sync(kFullMask, lower ? xl : 0u);
    equal = equal_low + __reduce_add_sync(kFullMask, pe) +
            __reduce_add_sync(kFullMask, lower ? xe : 0u);
  }
  const unsigned below = LanesBelow();
  for (int step = 0; step < steps; step += kBatch) {
    uint32_t key[kBatch];
    const unsigned valid = ReadKeys<kBatch>(a, w, step, key);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const bool in = (valid >> u) & 1u;
      const bool is_less = in && key[u] < kth;
      const bool is_equal = in && key[u] == kth;
      const unsigned bl = __ballot_sync(kFullMask, is_less);
      const unsigned be = __ballot_sync(kFullMask, is_equal);
      const int32_t j = w.begin + w.first + (in ? StepPosition(step + u) : 0);
      if (be == 0) {  // the common step: no tie with K, the kept ties before it are fixed
        if (is_less) dst[less + min(equal, take) + static_cast<unsigned>(__popc(bl & below))] = j;
      } else {
        const unsigned l = less + static_cast<unsigned>(__popc(bl & below));
        const unsigned e = equal + static_cast<unsigned>(__popc(be & below));
        if (is_less) {
          dst[l + min(e, take)] = j;
        } else if (is_equal && e < take) {
          dst[l + e] = j;
        }
        equal += static_cast<unsigned>(__popc(be));
      }
      less += static_cast<unsigned>(__popc(bl));
    }
  }
  cluster.barrier_wait(std::move(arrived));
#endif
}

/// Per device (index < kMaxDevices): 1 + the dynamic shared memory the kernel may take per
/// CTA; 0 until the kernel's limit has been raised on that device.
std::atomic<size_t> g_cache_limit[kMaxDevices];

/// Raises the dynamic shared memory limit of `kernel` to `bytes` (none when 0).
cudaError_t RaiseLimit(void (*kernel)(FusedArgs), size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

/// The dynamic shared memory (bytes) the kernel may take per CTA on the current device: at
/// most kMaxCacheBytes and what the device grants beside the kernel's static shared memory
/// (the same for both batch sizes). Raises both instantiations' limit to it the first time
/// per device.
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
  if (const cudaError_t e = cudaFuncGetAttributes(&attr, ProtectSelectTopKKernel<kLargeBatch>);
      e != cudaSuccess) {
    return e;
  }
  const size_t granted = static_cast<size_t>(std::max(optin, 0));
  size_t limit = granted > attr.sharedSizeBytes ? granted - attr.sharedSizeBytes : 0;
  limit = std::min(limit, kMaxCacheBytes) / 16 * 16;
  if (const cudaError_t e = RaiseLimit(ProtectSelectTopKKernel<kSmallBatch>, limit);
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e = RaiseLimit(ProtectSelectTopKKernel<kLargeBatch>, limit);
      e != cudaSuccess) {
    return e;
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
  const int64_t per_cta = (n + ctas - 1) / ctas;
  FusedArgs args;
  args.scores = raw_scores;
  args.n = static_cast<int>(n);
  args.sink = static_cast<int>(std::clamp<int64_t>(sink, 0, n));
  args.recent_begin = static_cast<int>(n - std::clamp<int64_t>(recent, 0, n));
  args.chunk = static_cast<int>((per_cta + kChunkAlign - 1) / kChunkAlign * kChunkAlign);
  args.counts = counts;
  args.offsets = offsets;
  args.indices = indices;
  args.first_nan = first_nan;
  const size_t cache_bytes = static_cast<size_t>(args.chunk) * sizeof(uint32_t);
  args.cached = cache_bytes <= cache_limit;

  const size_t smem = args.cached ? cache_bytes : 0;
  if (args.chunk <= kSmallChunk) {
    return LaunchClusterRows(ProtectSelectTopKKernel<kSmallBatch>, ctas, num_heads, kThreads, smem,
                             stream, args);
  }
  return LaunchClusterRows(ProtectSelectTopKKernel<kLargeBatch>, ctas, num_heads, kThreads, smem,
                           stream, args);
}

}  // namespace kvtrim::gpu

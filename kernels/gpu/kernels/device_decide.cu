// The device decisions of device_decide.h: DecideLayer's per-head protection, CriticalKV's
// stage 1 and BLOCK_ALIGNED blocks, and DecideLaProx's normalisation and segmented top-K.
//
// Segmented top-K (LaunchSelectCandidates). Candidates are split into tiles of up to
// kCandidateTile scores of one head; one CTA handles one tile in each pass.
//   digits   four passes, one per 8-bit digit of the 32-bit key (DescendingScoreKey: smaller =
//            ranked first, -0.0 and +0.0 equal), most significant first: each CTA histograms
//            the digit of its keys whose higher digits match the segment's resolved prefix
//            (shared memory, warp-aggregated), then adds its non-zero bins into the segment's
//            histogram (64-bit integer atomics: the sums do not depend on order); one CTA per
//            segment then finds the bin that holds the keep-th key and the rank left in it.
//            After four digits K (the keep-th key) and `take` (how many keys == K are kept)
//            are known per segment.
//   count    each CTA counts its tile's keys < K and == K.
//   plan     one CTA scans the tiles in order: the ties before each tile within its segment
//            give the ties it keeps, and the exclusive scan of the kept counts places every
//            tile's and every head's kept tokens (head_start).
//   write    each CTA writes its kept tokens in index order (a block scan per 1024 keys), and
//            one CTA per head writes its sink and recent tokens around them.
// Every pass reads the candidates once (134 MB at 32 layers x 8 heads x 128K): six passes.
#include "kernels/gpu/kernels/device_decide.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/canonical_math.h"
#include "kernels/gpu/kernels/select_keys.cuh"

namespace kvtrim::gpu {

namespace {

constexpr int kThreads = 256;          // threads of the element-wise and tile kernels
constexpr int64_t kMaxBlocks = 4096;   // grid-stride loops beyond this many CTAs
constexpr int kBins = 256;             // bins of one 8-bit digit (== kThreads)
constexpr int kDigits = 4;
constexpr int kLoadItems = 8;          // keys in flight per thread in the histogram passes
constexpr int kWriteItems = 4;         // consecutive keys per thread in the write pass
constexpr int kPlanThreads = 1024;     // the single CTA of the plan and the tree sum
constexpr size_t kAlign = 256;

static_assert(kBins == kThreads, "one histogram bin per thread");

/// Number of CTAs for `items` work items of `per_block` each, at most kMaxBlocks.
unsigned BlocksFor(int64_t items, int64_t per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + per_block - 1) / per_block, 1,
                                                   kMaxBlocks));
}

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// ---- Steps of DecideLayer ----------------------------------------------------------------------

/// Grid (x, H): +inf at tokens j < sink[h] and j >= n - recent[h] of head blockIdx.y.
__global__ void ProtectHeadsKernel(float* scores, int64_t n, const int64_t* sink,
                                   const int64_t* recent) {
  const int64_t h = blockIdx.y;
  float* row = scores + h * n;
  const int64_t s = sink[h];
  const int64_t r = recent[h];
  const int64_t listed = s > r ? s : r;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < listed;
       t += int64_t{gridDim.x} * blockDim.x) {
    if (t < s) row[t] = INFINITY;
    if (t < r) row[n - 1 - t] = INFINITY;
  }
}

/// One CTA: stage1[h] for every head (LaunchStageOneCounts).
__global__ void StageOneCountsKernel(const int64_t* counts, const int64_t* sink,
                                     const int64_t* recent, int32_t num_heads, int64_t n,
                                     double alpha, int64_t* stage1) {
  for (int h = threadIdx.x; h < num_heads; h += blockDim.x) {
    const int64_t guarded = sink[h] + recent[h];
    const int64_t b = counts[h] - guarded > 0 ? counts[h] - guarded : 0;
    // RoundHalfUp(alpha * b): the product rounded, then + 0.5 rounded, as on the host.
    const double half_up = __dadd_rn(__dmul_rn(alpha, static_cast<double>(b)), 0.5);
    const int64_t rounded = static_cast<int64_t>(floor(half_up));
    const int64_t b1 = rounded < b ? rounded : b;
    stage1[h] = guarded + b1 < n ? guarded + b1 : n;
  }
}

/// Grid (x, H): +inf at the tokens of head blockIdx.y's list.
__global__ void ForceKeepKernel(float* scores, int64_t n, const int64_t* offsets,
                                const int32_t* indices) {
  const int64_t h = blockIdx.y;
  float* row = scores + h * n;
  const int64_t end = offsets[h + 1];
  for (int64_t i = offsets[h] + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < end;
       i += int64_t{gridDim.x} * blockDim.x) {
    row[indices[i]] = INFINITY;
  }
}

/// One thread per (head, block): the block's largest score, left to right from -inf.
__global__ void BlockMaxKernel(const float* scores, int32_t num_heads, int64_t n, int64_t block,
                               int64_t num_blocks, float* block_scores) {
  const int64_t cells = static_cast<int64_t>(num_heads) * num_blocks;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cells;
       c += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = c / num_blocks;
    const int64_t first = (c % num_blocks) * block;
    const int64_t last = first + block < n ? first + block : n;
    const float* row = scores + h * n;
    float best = -INFINITY;
    for (int64_t j = first; j < last; ++j) {
      const float x = row[j];
      best = best < x ? x : best;  // std::max(best, x)
    }
    block_scores[c] = best;
  }
}

/// One thread per (chosen block, position): token r * block + t of the answer.
__global__ void ExpandBlocksKernel(const int32_t* chosen, int64_t count, int64_t block, int64_t n,
                                   int32_t* indices, int64_t* offsets) {
  const int64_t slots = count * block;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < slots;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = static_cast<int64_t>(chosen[i / block]) * block + i % block;
    if (j < n) indices[i] = static_cast<int32_t>(j);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int64_t blocks = (n + block - 1) / block;
    const bool partial_last = chosen[count - 1] == blocks - 1;
    offsets[0] = 0;
    offsets[1] = slots - (partial_last ? blocks * block - n : 0);
  }
}

// ---- LaProx: layer normalisation -------------------------------------------------------------

/// One thread per chunk c: the left-to-right CmAdd chain from +0 over candidates
/// [64 c, 64 c + 64) of the (row, column) order, into chunks[c].
__global__ void ChunkSumKernel(const float* values, int64_t width, int64_t pitch, int64_t count,
                               float* chunks, int64_t num_chunks) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= num_chunks) return;
  int64_t pos = c * kCanonicalChunk;
  const int64_t end = pos + kCanonicalChunk < count ? pos + kCanonicalChunk : count;
  int64_t row = pos / width;
  int64_t col = pos % width;
  float z = 0.0f;
  for (; pos < end; ++pos) {
    z = CmAdd(z, values[row * pitch + col]);
    if (++col == width) {
      col = 0;
      ++row;
    }
  }
  chunks[c] = z;
}

/// One CTA of kPlanThreads: CmTreeSum of chunks[0 .. num_chunks) into *total. CmTreeSum is
/// the aligned pairwise tree over the values padded with zeros to a power of two (a sum of
/// chunk sums is never -0.0, so adding +0.0 changes nothing): thread t sums its aligned group of
/// 2^group_log2 leaves with a carry stack, then the CTA sums the kPlanThreads group sums by
/// the same tree in shared memory.
__global__ void __launch_bounds__(kPlanThreads) TreeSumKernel(const float* chunks,
                                                              int64_t num_chunks, int group_log2,
                                                              float* total) {
  __shared__ float sums[kPlanThreads];
  const int64_t group = int64_t{1} << group_log2;
  const int64_t first = threadIdx.x * group;
  float stack[64];  // stack[level]: a finished subtree of 2^level leaves awaiting its sibling
  for (int64_t i = 0; i < group; ++i) {
    float v = first + i < num_chunks ? chunks[first + i] : 0.0f;
    int level = 0;
    for (int64_t bits = i; bits & 1; bits >>= 1) v = CmAdd(stack[level++], v);
    stack[level] = v;
  }
  sums[threadIdx.x] = stack[group_log2];
  for (int stride = 1; stride < kPlanThreads; stride *= 2) {
    __syncthreads();
    if ((threadIdx.x & (2 * stride - 1)) == 0) {
      sums[threadIdx.x] = CmAdd(sums[threadIdx.x], sums[threadIdx.x + stride]);
    }
  }
  if (threadIdx.x == 0) *total = sums[0];
}

/// Grid (x, rows): v = CmDiv(v, z), or 0 when z is not positive.
__global__ void DivideKernel(float* values, int64_t width, int64_t pitch, const float* total) {
  const float z = *total;
  float* row = values + blockIdx.y * pitch;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < width;
       j += int64_t{gridDim.x} * blockDim.x) {
    row[j] = z > 0.0f ? CmDiv(row[j], z) : 0.0f;
  }
}

// ---- LaProx: segmented top-K ------------------------------------------------------------------

/// A segment between passes: after digit d, `prefix` holds the key's digits 0..d and `need`
/// the rank still sought among the keys that match them (1-based; 0 = nothing kept). After the
/// last digit, prefix = K and need = the keys == K that are kept.
struct SegmentSearch {
  unsigned long long need;
  uint32_t prefix;
};

/// Scratch regions of LaunchSelectCandidates.
struct SelectScratch {
  unsigned long long* hist = nullptr;         // [S, kBins]
  SegmentSearch* search = nullptr;            // [S]
  uint32_t* tile_counts = nullptr;            // [T] (keys < K) << 16 | (keys == K)
  unsigned long long* tie_scan = nullptr;     // [T] exclusive scan of the tiles' keys == K
  unsigned long long* ties_before = nullptr;  // [T] keys == K of the segment before the tile
  unsigned long long* kept_before = nullptr;  // [T + 1] exclusive scan of the kept counts
  unsigned long long* head_kept = nullptr;    // [G] kept candidates before the head
};

/// Lays the scratch regions out from `base` (null: sizes only); returns the bytes used.
size_t LayOutSelectScratch(int32_t num_heads, int32_t num_tiles, int32_t num_segments, char* base,
                           SelectScratch* out) {
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* p = base == nullptr ? nullptr : base + at;
    at += AlignUp(bytes);
    return p;
  };
  const size_t heads = static_cast<size_t>(num_heads);
  const size_t tiles = static_cast<size_t>(num_tiles);
  const size_t segments = static_cast<size_t>(num_segments);
  out->hist = reinterpret_cast<unsigned long long*>(take(segments * kBins * 8));
  out->search = reinterpret_cast<SegmentSearch*>(take(segments * sizeof(SegmentSearch)));
  out->tile_counts = reinterpret_cast<uint32_t*>(take(tiles * 4));
  out->tie_scan = reinterpret_cast<unsigned long long*>(take(tiles * 8));
  out->ties_before = reinterpret_cast<unsigned long long*>(take(tiles * 8));
  out->kept_before = reinterpret_cast<unsigned long long*>(take((tiles + 1) * 8));
  out->head_kept = reinterpret_cast<unsigned long long*>(take(heads * 8));
  return at;
}

/// Everything the selection kernels read (plain values and device pointers).
struct SelectArgs {
  const CandidateHead* heads;
  const CandidateTile* tiles;
  const CandidateSegment* segments;
  int32_t num_heads;
  int32_t num_tiles;
  SelectScratch s;
};

/// Bits of the key above digit kDigit: the part a key must share with the prefix to count.
template <int kDigit>
__device__ __forceinline__ uint32_t HigherDigits() {
  return static_cast<uint32_t>(~0ull << (8 * (kDigits - kDigit)));
}

/// Adds the warp's counted lanes to bins[bin]: lanes with equal bins add once, through their
/// lowest lane. Every lane of the warp calls it.
__device__ __forceinline__ void CountInBins(unsigned* bins, bool counted, unsigned bin) {
  const unsigned same = __match_any_sync(0xFFFFFFFFu, counted ? bin : static_cast<unsigned>(kBins));
  const unsigned lane = threadIdx.x & 31u;
  if (counted && lane == static_cast<unsigned>(__ffs(same) - 1)) {
    atomicAdd(bins + bin, static_cast<unsigned>(__popc(same)));
  }
}

/// Grid T: histogram of digit kDigit over tile blockIdx.x's keys that match the prefix of
/// its segment, added into the segment's histogram.
template <int kDigit>
__global__ void __launch_bounds__(kThreads) CandidateHistogramKernel(SelectArgs a) {
  __shared__ unsigned bins[kBins];
  const CandidateTile tile = a.tiles[blockIdx.x];
  const CandidateHead head = a.heads[tile.head];
  const int32_t segment = head.segment;
  const unsigned long long need =
      kDigit == 0 ? static_cast<unsigned long long>(a.segments[segment].keep)
                  : a.s.search[segment].need;
  if (need == 0) return;  // the segment keeps nothing (the same for the whole CTA)
  bins[threadIdx.x] = 0;
  __syncthreads();
  constexpr int kShift = 8 * (kDigits - 1 - kDigit);
  const uint32_t high = HigherDigits<kDigit>();
  const uint32_t want = (kDigit == 0 ? 0u : a.s.search[segment].prefix) & high;
  const int64_t rest = head.width - tile.begin;
  const int64_t len = rest < kCandidateTile ? rest : kCandidateTile;
  const float* v = head.values + tile.begin;
  for (int64_t step = 0; step < len; step += int64_t{kThreads} * kLoadItems) {
    uint32_t key[kLoadItems];
#pragma unroll
    for (int u = 0; u < kLoadItems; ++u) {
      const int64_t i = step + u * kThreads + threadIdx.x;
      key[u] = i < len ? DescendingScoreKey(v[i]) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kLoadItems; ++u) {
      const int64_t i = step + u * kThreads + threadIdx.x;
      const bool counted = i < len && (key[u] & high) == want;
      CountInBins(bins, counted, (key[u] >> kShift) & (kBins - 1));
    }
  }
  __syncthreads();
  const unsigned count = bins[threadIdx.x];
  if (count != 0) {
    atomicAdd(a.s.hist + static_cast<int64_t>(segment) * kBins + threadIdx.x,
              static_cast<unsigned long long>(count));
  }
}

/// Grid S: resolves digit kDigit of segment blockIdx.x (the bin holding the sought rank) and
/// clears its histogram for the next pass.
template <int kDigit>
__global__ void __launch_bounds__(kThreads) CandidateResolveKernel(SelectArgs a) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int32_t segment = blockIdx.x;
  SegmentSearch* search = a.s.search + segment;
  const unsigned long long need =
      kDigit == 0 ? static_cast<unsigned long long>(a.segments[segment].keep) : search->need;
  const uint32_t prefix = kDigit == 0 ? 0u : search->prefix;
  if (need == 0) {
    if (kDigit == 0 && threadIdx.x == 0) *search = SegmentSearch{0, 0};
    return;
  }
  unsigned long long* bins = a.s.hist + static_cast<int64_t>(segment) * kBins;
  const unsigned long long count = bins[threadIdx.x];
  unsigned long long before = 0;
  Scan(scan).ExclusiveSum(count, before);  // every thread has read `search` before this barrier
  if (before < need && need <= before + count) {
    *search = SegmentSearch{need - before,
                            prefix | (static_cast<uint32_t>(threadIdx.x) << (8 * (kDigits - 1 - kDigit)))};
  }
  bins[threadIdx.x] = 0;
}

/// Grid T: keys < K and == K of tile blockIdx.x, packed as (less << 16) | equal.
__global__ void __launch_bounds__(kThreads) CandidateCountKernel(SelectArgs a) {
  using Sum = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename Sum::TempStorage sum;
  const CandidateTile tile = a.tiles[blockIdx.x];
  const CandidateHead head = a.heads[tile.head];
  const int32_t segment = head.segment;
  uint32_t mine = 0;
  if (a.segments[segment].keep != 0) {
    const uint32_t kth = a.s.search[segment].prefix;
    const int64_t rest = head.width - tile.begin;
    const int64_t len = rest < kCandidateTile ? rest : kCandidateTile;
    const float* v = head.values + tile.begin;
    for (int64_t i = threadIdx.x; i < len; i += kThreads) {
      const uint32_t key = DescendingScoreKey(v[i]);
      mine += key < kth ? (1u << 16) : (key == kth ? 1u : 0u);
    }
  }
  const uint32_t total = Sum(sum).Sum(mine);
  if (threadIdx.x == 0) a.s.tile_counts[blockIdx.x] = total;
}

/// One CTA: the exclusive scan of `value(t)` over the tiles into out[0 .. T) (and out[T] =
/// the total when `with_total`), in order.
template <typename Value>
__device__ void ScanTiles(int32_t num_tiles, Value value, unsigned long long* out,
                          bool with_total) {
  using Scan = cub::BlockScan<unsigned long long, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned long long carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int32_t first = 0; first < num_tiles; first += kPlanThreads) {
    const int32_t t = first + static_cast<int32_t>(threadIdx.x);
    const unsigned long long mine = t < num_tiles ? value(t) : 0ull;
    unsigned long long before = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, before, total);
    if (t < num_tiles) out[t] = carry + before;
    __syncthreads();  // every thread has read `carry`; the scan storage may be reused
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (with_total && threadIdx.x == 0) out[num_tiles] = carry;
  __syncthreads();
}

/// One CTA of kPlanThreads: ties before each tile in its segment, the kept counts' scan and
/// head_start (see the file comment).
__global__ void __launch_bounds__(kPlanThreads) CandidatePlanKernel(SelectArgs a,
                                                                    int64_t protected_total,
                                                                    int64_t* head_start) {
  const SelectScratch& s = a.s;
  ScanTiles(a.num_tiles, [&](int32_t t) -> unsigned long long { return s.tile_counts[t] & 0xFFFFu; },
            s.tie_scan, false);
  ScanTiles(
      a.num_tiles,
      [&](int32_t t) -> unsigned long long {
        const int32_t segment = a.heads[a.tiles[t].head].segment;
        const unsigned long long ties =
            s.tie_scan[t] - s.tie_scan[a.segments[segment].first_tile];
        s.ties_before[t] = ties;
        const unsigned long long take =
            a.segments[segment].keep != 0 ? s.search[segment].need : 0ull;
        const unsigned long long equal = s.tile_counts[t] & 0xFFFFu;
        const unsigned long long less = s.tile_counts[t] >> 16;
        const unsigned long long left = take > ties ? take - ties : 0ull;
        return less + (left < equal ? left : equal);
      },
      s.kept_before, true);
  for (int32_t g = threadIdx.x; g < a.num_heads; g += kPlanThreads) {
    const unsigned long long kept = s.kept_before[a.heads[g].first_tile];
    s.head_kept[g] = kept;
    head_start[g] = a.heads[g].protected_before + static_cast<int64_t>(kept);
  }
  if (threadIdx.x == 0) {
    head_start[a.num_heads] = protected_total + static_cast<int64_t>(s.kept_before[a.num_tiles]);
  }
}

/// Grid T: writes tile blockIdx.x's kept tokens, in index order, at their places.
__global__ void __launch_bounds__(kThreads) CandidateWriteKernel(SelectArgs a,
                                                                 const int64_t* head_start,
                                                                 int32_t* indices) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int32_t t = blockIdx.x;
  const CandidateTile tile = a.tiles[t];
  const CandidateHead head = a.heads[tile.head];
  const int32_t segment = head.segment;
  if (a.segments[segment].keep == 0) return;
  const SegmentSearch search = a.s.search[segment];
  const uint32_t kth = search.prefix;
  const unsigned long long take = search.need;
  const unsigned long long ties = a.s.ties_before[t];
  const unsigned long long taken = ties < take ? ties : take;  // ties kept by earlier tiles
  int32_t* dst = indices + head_start[tile.head] + head.sink +
                 static_cast<int64_t>(a.s.kept_before[t] - a.s.head_kept[tile.head]);
  const int64_t rest = head.width - tile.begin;
  const int64_t len = rest < kCandidateTile ? rest : kCandidateTile;
  const float* v = head.values + tile.begin;
  unsigned long long less = 0, equal = 0;  // keys < K and == K in the tile so far
  for (int64_t step = 0; step < len; step += int64_t{kThreads} * kWriteItems) {
    const int64_t i0 = step + int64_t{kWriteItems} * threadIdx.x;
    unsigned flags = 0;  // bit 2u: key < K; bit 2u + 1: key == K
    uint32_t mine = 0;   // (keys < K) << 16 | (keys == K) of this thread
#pragma unroll
    for (int u = 0; u < kWriteItems; ++u) {
      if (i0 + u >= len) continue;
      const uint32_t key = DescendingScoreKey(v[i0 + u]);
      if (key < kth) {
        flags |= 1u << (2 * u);
        mine += 1u << 16;
      } else if (key == kth) {
        flags |= 2u << (2 * u);
        mine += 1u;
      }
    }
    uint32_t before = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, before, total);
    unsigned long long l = less + (before >> 16);
    unsigned long long e = ties + equal + (before & 0xFFFFu);  // ties of the segment before
#pragma unroll
    for (int u = 0; u < kWriteItems; ++u) {
      const unsigned f = (flags >> (2 * u)) & 3u;
      const int32_t token = static_cast<int32_t>(head.sink + tile.begin + i0 + u);
      if (f == 1u) {
        dst[l + (e < take ? e : take) - taken] = token;
        ++l;
      } else if (f == 2u) {
        if (e < take) dst[l + e - taken] = token;
        ++e;
      }
    }
    less += total >> 16;
    equal += total & 0xFFFFu;
    __syncthreads();  // the scan storage is reused by the next step
  }
}

/// Grid G: head blockIdx.x's sink tokens before its kept ones and its recent tokens after.
__global__ void CandidateProtectedKernel(const CandidateHead* heads, const int64_t* head_start,
                                         int32_t* indices) {
  const int32_t g = blockIdx.x;
  const CandidateHead head = heads[g];
  const int64_t n = head.sink + head.width + head.recent;
  int32_t* first = indices + head_start[g];
  int32_t* last = indices + head_start[g + 1] - head.recent;
  for (int64_t j = threadIdx.x; j < head.sink; j += blockDim.x) first[j] = static_cast<int32_t>(j);
  for (int64_t r = threadIdx.x; r < head.recent; r += blockDim.x) {
    last[r] = static_cast<int32_t>(n - head.recent + r);
  }
}

template <int kDigit>
cudaError_t LaunchDigit(const SelectArgs& args, int32_t num_segments, cudaStream_t stream) {
  CandidateHistogramKernel<kDigit>
      <<<static_cast<unsigned>(args.num_tiles), kThreads, 0, stream>>>(args);
  CandidateResolveKernel<kDigit><<<static_cast<unsigned>(num_segments), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

// ---- Steps of DecideLayer ----------------------------------------------------------------------

cudaError_t LaunchProtectHeads(float* scores, int32_t num_heads, int64_t n, const int64_t* sink,
                               const int64_t* recent, int64_t max_protected, cudaStream_t stream) {
  if (num_heads < 0 || num_heads > 65535 || n < 0 || max_protected < 0) {
    return cudaErrorInvalidValue;
  }
  if (num_heads == 0 || max_protected == 0) return cudaSuccess;
  if (scores == nullptr || sink == nullptr || recent == nullptr) return cudaErrorInvalidValue;
  ProtectHeadsKernel<<<dim3(BlocksFor(max_protected, kThreads), static_cast<unsigned>(num_heads)),
                       kThreads, 0, stream>>>(scores, n, sink, recent);
  return cudaGetLastError();
}

cudaError_t LaunchStageOneCounts(const int64_t* counts, const int64_t* sink, const int64_t* recent,
                                 int32_t num_heads, int64_t n, double alpha, int64_t* stage1,
                                 cudaStream_t stream) {
  if (num_heads < 0 || num_heads > 65535 || n < 0) return cudaErrorInvalidValue;
  if (num_heads == 0) return cudaSuccess;
  if (counts == nullptr || sink == nullptr || recent == nullptr || stage1 == nullptr) {
    return cudaErrorInvalidValue;
  }
  StageOneCountsKernel<<<1, kThreads, 0, stream>>>(counts, sink, recent, num_heads, n, alpha,
                                                   stage1);
  return cudaGetLastError();
}

cudaError_t LaunchForceKeep(float* scores, int32_t num_heads, int64_t n, const int64_t* offsets,
                            const int32_t* indices, int64_t max_list, cudaStream_t stream) {
  if (num_heads < 0 || num_heads > 65535 || n < 0 || max_list < 0) return cudaErrorInvalidValue;
  if (num_heads == 0 || max_list == 0) return cudaSuccess;
  if (scores == nullptr || offsets == nullptr || indices == nullptr) return cudaErrorInvalidValue;
  ForceKeepKernel<<<dim3(BlocksFor(max_list, kThreads), static_cast<unsigned>(num_heads)), kThreads,
                    0, stream>>>(scores, n, offsets, indices);
  return cudaGetLastError();
}

cudaError_t LaunchBlockMax(const float* scores, int32_t num_heads, int64_t n, int64_t block,
                           float* block_scores, cudaStream_t stream) {
  if (num_heads < 0 || num_heads > 65535 || n < 0 || block < 1) return cudaErrorInvalidValue;
  if (num_heads == 0 || n == 0) return cudaSuccess;
  if (scores == nullptr || block_scores == nullptr) return cudaErrorInvalidValue;
  const int64_t num_blocks = (n + block - 1) / block;
  BlockMaxKernel<<<BlocksFor(num_heads * num_blocks, kThreads), kThreads, 0, stream>>>(
      scores, num_heads, n, block, num_blocks, block_scores);
  return cudaGetLastError();
}

cudaError_t LaunchExpandBlocks(const int32_t* chosen, int64_t count, int64_t block, int64_t n,
                               int32_t* indices, int64_t* offsets, cudaStream_t stream) {
  if (count < 1 || block < 1 || n < 1 || chosen == nullptr || indices == nullptr ||
      offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  ExpandBlocksKernel<<<BlocksFor(count * block, kThreads), kThreads, 0, stream>>>(
      chosen, count, block, n, indices, offsets);
  return cudaGetLastError();
}

// ---- LaProx: layer normalisation -------------------------------------------------------------

size_t NormalizeCandidatesScratchBytes(int64_t count) {
  const int64_t chunks = count > 0 ? (count + kCanonicalChunk - 1) / kCanonicalChunk : 0;
  return AlignUp(static_cast<size_t>(chunks) * sizeof(float)) + AlignUp(sizeof(float));
}

cudaError_t LaunchNormalizeCandidates(float* values, int32_t rows, int64_t width, int64_t pitch,
                                      void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (rows < 0 || rows > 65535 || width < 0 || pitch < width) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(rows) * width;
  if (count == 0) return cudaSuccess;
  if (values == nullptr || scratch == nullptr ||
      scratch_bytes < NormalizeCandidatesScratchBytes(count)) {
    return cudaErrorInvalidValue;
  }
  const int64_t num_chunks = (count + kCanonicalChunk - 1) / kCanonicalChunk;
  float* chunks = static_cast<float*>(scratch);
  float* total = reinterpret_cast<float*>(static_cast<char*>(scratch) +
                                          AlignUp(static_cast<size_t>(num_chunks) * sizeof(float)));
  int group_log2 = 0;
  while ((int64_t{kPlanThreads} << group_log2) < num_chunks) ++group_log2;
  ChunkSumKernel<<<static_cast<unsigned>((num_chunks + kThreads - 1) / kThreads), kThreads, 0,
                   stream>>>(values, width, pitch, count, chunks, num_chunks);
  TreeSumKernel<<<1, kPlanThreads, 0, stream>>>(chunks, num_chunks, group_log2, total);
  DivideKernel<<<dim3(BlocksFor(width, kThreads), static_cast<unsigned>(rows)), kThreads, 0,
                 stream>>>(values, width, pitch, total);
  return cudaGetLastError();
}

// ---- LaProx: segmented top-K ------------------------------------------------------------------

size_t SelectCandidatesScratchBytes(int32_t num_heads, int32_t num_tiles, int32_t num_segments) {
  SelectScratch unused;
  return LayOutSelectScratch(std::max(num_heads, 0), std::max(num_tiles, 0),
                             std::max(num_segments, 0), nullptr, &unused);
}

cudaError_t LaunchSelectCandidates(const CandidateHead* heads, int32_t num_heads,
                                   const CandidateTile* tiles, int32_t num_tiles,
                                   const CandidateSegment* segments, int32_t num_segments,
                                   int64_t protected_total, int64_t* head_start, int32_t* indices,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (num_heads < 0 || num_tiles < 0 || num_segments < 0 || protected_total < 0 ||
      head_start == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (num_heads == 0) return cudaMemsetAsync(head_start, 0, sizeof(int64_t), stream);
  if (heads == nullptr || indices == nullptr || scratch == nullptr || num_segments == 0 ||
      (num_tiles > 0 && (tiles == nullptr || segments == nullptr)) ||
      scratch_bytes < SelectCandidatesScratchBytes(num_heads, num_tiles, num_segments)) {
    return cudaErrorInvalidValue;
  }
  SelectArgs args;
  args.heads = heads;
  args.tiles = tiles;
  args.segments = segments;
  args.num_heads = num_heads;
  args.num_tiles = num_tiles;
  LayOutSelectScratch(num_heads, num_tiles, num_segments, static_cast<char*>(scratch), &args.s);
  if (num_tiles > 0) {
    if (const cudaError_t e = cudaMemsetAsync(
            args.s.hist, 0, static_cast<size_t>(num_segments) * kBins * sizeof(unsigned long long),
            stream);
        e != cudaSuccess) {
      return e;
    }
    if (const cudaError_t e = LaunchDigit<0>(args, num_segments, stream); e != cudaSuccess) return e;
    if (const cudaError_t e = LaunchDigit<1>(args, num_segments, stream); e != cudaSuccess) return e;
    if (const cudaError_t e = LaunchDigit<2>(args, num_segments, stream); e != cudaSuccess) return e;
    if (const cudaError_t e = LaunchDigit<3>(args, num_segments, stream); e != cudaSuccess) return e;
    CandidateCountKernel<<<static_cast<unsigned>(num_tiles), kThreads, 0, stream>>>(args);
  }
  CandidatePlanKernel<<<1, kPlanThreads, 0, stream>>>(args, protected_total, head_start);
  if (num_tiles > 0) {
    CandidateWriteKernel<<<static_cast<unsigned>(num_tiles), kThreads, 0, stream>>>(
        args, head_start, indices);
  }
  CandidateProtectedKernel<<<static_cast<unsigned>(num_heads), kThreads, 0, stream>>>(
      heads, head_start, indices);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu

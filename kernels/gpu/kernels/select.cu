// GPU selectors and the AdaKV allocator (launchers.h): SelectScratchBytes, LaunchSelectTopK,
// LaunchAdaKVCounts and LaunchSelectShared, identical to SelectTopK, AllocateAdaKV and
// SelectSharedRoundRobin of the CPU backend (kernels/decide/select.cc, allocate.cc).
//
//   top-k    3 radix passes over the 32-bit score key find each head's k-th key K; a
//            stable compaction keeps key < K and the first (k - #less) keys == K, ascending.
//   AdaKV    per head, the safeguard's boundary (key score << 32 | token, unique); then one
//            pool-wide selection of the `extra`-th candidate on the key
//            score << 32 | token << head_bits | head (the CPU's order) and a count per head.
//   shared   a stable radix sort of (head, score key) gives every head's ranking; each token
//            takes key min over heads of rank * H + head (its round-robin turn); the `count`
//            smallest keys are the round-robin union, compacted in ascending order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/select_keys.cuh"
#include "kernels/gpu/kernels/select_radix.cuh"

namespace kvtrim::gpu {

namespace {

constexpr int kPrepareThreads = 1024;
constexpr int kMaxPrepareBlocks = 1024;

/// Number of bits needed to write values 0..v (0 for v = 0).
int BitWidth(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

/// Carves aligned regions out of one scratch buffer; with a null base it only measures.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  /// The next region of `count` elements of T (256-byte aligned).
  template <typename T>
  T* Take(size_t count) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  /// Bytes taken so far.
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

/// The selection bookkeeping of `segments` segments and `rows` x `tiles` tile counts.
struct RadixScratch {
  SegmentState* state;       // [segments]
  unsigned long long* hist;  // [segments, kRadixBins]
  unsigned* done;            // [segments]
  TileCount* tile_count;     // [rows, tiles]
};

/// Takes a RadixScratch from `carver`.
RadixScratch TakeRadix(ScratchCarver& carver, int64_t segments, int64_t rows, int64_t tiles) {
  RadixScratch r;
  r.state = carver.Take<SegmentState>(static_cast<size_t>(segments));
  r.hist = carver.Take<unsigned long long>(static_cast<size_t>(segments) * kRadixBins);
  r.done = carver.Take<unsigned>(static_cast<size_t>(segments));
  r.tile_count = carver.Take<TileCount>(static_cast<size_t>(rows * tiles));
  return r;
}

/// Tiles per row of n elements.
int64_t TilesPerRow(int64_t n) { return std::max<int64_t>(1, (n + kSelectTile - 1) / kSelectTile); }

/// Blocks for a grid-stride loop over `items`.
unsigned PrepareBlocks(int64_t items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((items + kPrepareThreads - 1) / kPrepareThreads, 1, kMaxPrepareBlocks));
}

/// Zeroes hist [segments, kRadixBins] and done [segments] (grid-stride, every block).
__device__ void ZeroRadix(const RadixScratch& r, int64_t segments) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t i = first; i < segments * kRadixBins; i += stride) r.hist[i] = 0;
  for (int64_t i = first; i < segments; i += stride) r.done[i] = 0;
}

/// Top-k set-up: zeroes the radix bookkeeping; warp 0 of block 0 sets state[h] =
/// {clamp(counts[h], 0, n), 0} and offsets [H + 1] = the exclusive scan of the clamped
/// counts, 32 heads at a time.
__global__ void __launch_bounds__(kPrepareThreads)
    PrepareTopKKernel(const int64_t* counts, int32_t heads, int64_t n, RadixScratch r,
                      int64_t* offsets) {
  ZeroRadix(r, heads);
  if (blockIdx.x != 0 || threadIdx.x >= 32) return;
  const unsigned lane = threadIdx.x;
  int64_t carry = 0;
  if (lane == 0) offsets[0] = 0;
  for (int64_t base = 0; base < heads; base += 32) {
    const int64_t h = base + lane;
    int64_t k = h < heads ? counts[h] : 0;
    k = k < 0 ? 0 : (k > n ? n : k);
    if (h < heads) r.state[h] = SegmentState{static_cast<unsigned long long>(k), 0ull};
    int64_t inclusive = k;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int64_t up = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
      if (lane >= static_cast<unsigned>(offset)) inclusive += up;
    }
    if (h < heads) offsets[h + 1] = carry + inclusive;
    carry += __shfl_sync(0xFFFFFFFFu, inclusive, 31);
  }
}

/// AdaKV set-up: zeroes the bookkeeping of the H head segments and the pool segment; sets
/// head states {safeguard, 0} (idle when safeguard = 0), the pool state {extra, 0} and
/// counts [H] = safeguard.
__global__ void __launch_bounds__(kPrepareThreads)
    PrepareAdaKVKernel(int32_t heads, int64_t safeguard, int64_t extra, RadixScratch head,
                       RadixScratch pool, int64_t* counts) {
  ZeroRadix(head, heads);
  ZeroRadix(pool, 1);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; h < heads; h += stride) {
    head.state[h] = SegmentState{static_cast<unsigned long long>(safeguard), 0ull};
    counts[h] = safeguard;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    pool.state[0] = SegmentState{static_cast<unsigned long long>(extra), 0ull};
  }
}

/// Zeroes the radix bookkeeping of `segments` segments and sets every state to {rank, 0}.
__global__ void __launch_bounds__(kPrepareThreads)
    PrepareUniformKernel(RadixScratch r, int64_t segments, int64_t rank) {
  ZeroRadix(r, segments);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < segments; i += stride) {
    r.state[i] = SegmentState{static_cast<unsigned long long>(rank), 0ull};
  }
}

/// counts [H] = value (grid-stride).
__global__ void FillCountsKernel(int64_t* counts, int32_t heads, int64_t value) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t h = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; h < heads; h += stride) {
    counts[h] = value;
  }
}

/// AdaKV final step: counts[h] += the candidates of head h with pool key <= the pool's
/// selected key. Grid (tiles, H).
__global__ void __launch_bounds__(kSelectThreads)
    PoolCountKernel(PoolKeys keys, const SegmentState* pool_state, int64_t* counts) {
  using BlockReduce = cub::BlockReduce<unsigned, kSelectThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const int row = blockIdx.y;
  const unsigned long long last = pool_state[0].prefix;
  const int64_t tile0 = blockIdx.x * kSelectTile;
  unsigned mine = 0;
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    const int64_t j = tile0 + i * kSelectThreads + threadIdx.x;
    unsigned long long key;
    if (j < keys.n && keys.Key(row, j, &key) && key <= last) ++mine;
  }
  const unsigned total = BlockReduce(storage).Sum(mine);
  if (threadIdx.x == 0 && total != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(counts + row),
              static_cast<unsigned long long>(total));
  }
}

/// Shared set-up: sort_key [H, n] = h << 32 | DescendingScoreKey(score), sort_value [H, n]
/// = j, and token_key [n] = all ones (no turn yet). Grid-stride over H * n.
__global__ void SharedKeysKernel(const float* scores, int32_t heads, int64_t n,
                                 unsigned long long* sort_key, int32_t* sort_value,
                                 unsigned long long* token_key) {
  const int64_t total = heads * n;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += stride) {
    const int64_t h = i / n;
    const int64_t j = i - h * n;
    sort_key[i] = (static_cast<unsigned long long>(h) << 32) | DescendingScoreKey(scores[i]);
    sort_value[i] = static_cast<int32_t>(j);
    if (h == 0) token_key[j] = ~0ull;
  }
}

/// Shared turns: the token at sorted position p = h * n + rank gets
/// token_key = min(token_key, rank * H + h) for rank < count (later turns never win).
__global__ void SharedTurnKernel(const int32_t* sorted_value, int32_t heads, int64_t n,
                                 int64_t count, unsigned long long* token_key) {
  const int64_t total = heads * n;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < total; p += stride) {
    const int64_t h = p / n;
    const int64_t rank = p - h * n;
    if (rank < count) {
      atomicMin(&token_key[sorted_value[p]], static_cast<unsigned long long>(rank * heads + h));
    }
  }
}

/// Runs the digit passes of `digits` for `Keys` over a grid of (tiles, rows).
template <typename Keys>
cudaError_t RunRadixPasses(const Keys& keys, int64_t n, int64_t rows, const RadixScratch& r,
                           const std::vector<RadixDigit>& digits, unsigned blocks_per_segment,
                           cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(TilesPerRow(n)), static_cast<unsigned>(rows));
  for (const RadixDigit& digit : digits) {
    RadixHistogramKernel<Keys><<<grid, kSelectThreads, 0, stream>>>(
        keys, n, r.state, r.hist, r.done, digit.shift, digit.bits, blocks_per_segment);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/// Counts then compacts the selected elements of every row (rows are segments).
template <typename Keys>
cudaError_t RunCompaction(const Keys& keys, int64_t n, int64_t rows, const RadixScratch& r,
                          const int64_t* row_offset, int32_t* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(TilesPerRow(n)), static_cast<unsigned>(rows));
  TileCountKernel<Keys><<<grid, kSelectThreads, 0, stream>>>(keys, n, r.state, r.tile_count);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  CompactKernel<Keys><<<grid, kSelectThreads, 0, stream>>>(keys, n, r.state, r.tile_count,
                                                           row_offset, out);
  return cudaGetLastError();
}

/// The shared selector's regions (the CUB sort's temporary storage last).
struct SharedScratch {
  RadixScratch radix;
  unsigned long long* sort_key[2];  // [H * n] each
  int32_t* sort_value[2];           // [H * n] each
  unsigned long long* token_key;    // [n]
  void* sort_temp;
  size_t sort_temp_bytes;
  size_t bytes;  // total; 0 when the sort's storage could not be sized
};

/// Bits of the shared sort key: 32 score bits plus the head bits.
int SharedSortBits(int32_t heads) { return 32 + BitWidth(static_cast<uint64_t>(heads - 1)); }

/// The shared layout for [H, n] at `base` (null: measure only).
SharedScratch SharedLayout(int32_t heads, int64_t n, void* base) {
  ScratchCarver carver(base);
  SharedScratch s;
  const size_t total = static_cast<size_t>(heads) * static_cast<size_t>(n);
  s.radix = TakeRadix(carver, 1, 1, TilesPerRow(n));
  for (int i = 0; i < 2; ++i) s.sort_key[i] = carver.Take<unsigned long long>(total);
  for (int i = 0; i < 2; ++i) s.sort_value[i] = carver.Take<int32_t>(total);
  s.token_key = carver.Take<unsigned long long>(static_cast<size_t>(n));
  s.sort_temp_bytes = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, s.sort_temp_bytes, static_cast<const unsigned long long*>(nullptr),
      static_cast<unsigned long long*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int64_t>(total), 0, SharedSortBits(heads));
  s.sort_temp = carver.Take<char>(s.sort_temp_bytes);
  s.bytes = e == cudaSuccess ? carver.used() : 0;
  return s;
}

/// Argument checks shared by the launchers: sizes the kernels can index.
bool ValidShape(int32_t heads, int64_t n) {
  return heads >= 0 && heads <= 65535 && n >= 0 && n <= INT32_MAX;
}

}  // namespace

size_t SelectTopKScratchBytes(int32_t num_heads, int64_t n) {
  if (!ValidShape(num_heads, n)) return 0;
  ScratchCarver topk(nullptr);
  TakeRadix(topk, num_heads, num_heads, TilesPerRow(n));
  ScratchCarver adakv(nullptr);
  TakeRadix(adakv, num_heads, 0, 0);
  TakeRadix(adakv, 1, 0, 0);
  return std::max(topk.used(), adakv.used());
}

size_t SelectSharedScratchBytes(int32_t num_heads, int64_t n) {
  if (!ValidShape(num_heads, n)) return 0;
  if (num_heads == 0 || n == 0) return 0;
  return SharedLayout(num_heads, n, nullptr).bytes;  // 0: the sort could not be sized
}

size_t SelectScratchBytes(int32_t num_heads, int64_t n) {
  if (!ValidShape(num_heads, n)) return 0;
  size_t bytes = SelectTopKScratchBytes(num_heads, n);
  if (num_heads > 0 && n > 0) {
    const size_t shared = SelectSharedScratchBytes(num_heads, n);
    if (shared == 0) return 0;  // the sort's storage could not be sized (no device)
    bytes = std::max(bytes, shared);
  }
  return bytes;
}

cudaError_t LaunchSelectTopK(const float* scores, int32_t num_heads, int64_t n,
                             const int64_t* counts, int64_t* offsets, int32_t* indices,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (!ValidShape(num_heads, n) || offsets == nullptr) return cudaErrorInvalidValue;
  if (num_heads == 0) return cudaMemsetAsync(offsets, 0, sizeof(int64_t), stream);
  const int64_t tiles = TilesPerRow(n);
  ScratchCarver carver(scratch);
  const RadixScratch r = TakeRadix(carver, num_heads, num_heads, tiles);
  if (scratch == nullptr || scratch_bytes < carver.used() || counts == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (n > 0 && (scores == nullptr || indices == nullptr)) return cudaErrorInvalidValue;
  PrepareTopKKernel<<<PrepareBlocks(int64_t{num_heads} * kRadixBins), kPrepareThreads, 0,
                      stream>>>(counts, num_heads, n, r, offsets);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  const TopKKeys keys{scores, n};
  const unsigned blocks = static_cast<unsigned>(tiles);
  if (const cudaError_t e = RunRadixPasses(keys, n, num_heads, r, RadixDigits(32, 64), blocks,
                                           stream);
      e != cudaSuccess) {
    return e;
  }
  return RunCompaction(keys, n, num_heads, r, offsets, indices, stream);
}

cudaError_t LaunchAdaKVCounts(const float* scores, int32_t num_heads, int64_t n, int64_t k,
                              int64_t safeguard, int64_t* counts, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream) {
  if (!ValidShape(num_heads, n)) return cudaErrorInvalidValue;
  if (num_heads == 0) return cudaSuccess;
  if (counts == nullptr) return cudaErrorInvalidValue;
  const int64_t s = std::clamp<int64_t>(safeguard, 0, n);  // AllocateAdaKV: min(n, floor(a*k))
  const int64_t heads = num_heads;
  const int64_t extra = heads * k - heads * s;
  const int64_t candidates = heads * (n - s);
  if (extra <= 0 || extra >= candidates) {
    // Nothing to share out, or every candidate is taken: each head keeps s, or all n.
    FillCountsKernel<<<PrepareBlocks(heads), kPrepareThreads, 0, stream>>>(
        counts, num_heads, extra <= 0 ? s : n);
    return cudaGetLastError();
  }
  // The pool key packs token << head_bits | head into 32 bits.
  const int head_bits = BitWidth(static_cast<uint64_t>(heads - 1));
  const int token_bits = BitWidth(static_cast<uint64_t>(n - 1));
  if (head_bits + token_bits > 32 || scores == nullptr) return cudaErrorInvalidValue;
  ScratchCarver carver(scratch);
  const RadixScratch head = TakeRadix(carver, heads, 0, 0);
  const RadixScratch pool = TakeRadix(carver, 1, 0, 0);
  if (scratch == nullptr || scratch_bytes < carver.used()) return cudaErrorInvalidValue;

  PrepareAdaKVKernel<<<PrepareBlocks(heads * kRadixBins), kPrepareThreads, 0, stream>>>(
      num_heads, s, extra, head, pool, counts);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const unsigned tiles = static_cast<unsigned>(TilesPerRow(n));
  if (s > 0) {
    // Step 1: each head's s-th key (score, then token) bounds its safeguard.
    std::vector<RadixDigit> digits = RadixDigits(32, 64);
    const std::vector<RadixDigit> token = RadixDigits(0, token_bits);
    digits.insert(digits.end(), token.begin(), token.end());
    if (const cudaError_t e = RunRadixPasses(HeadRankKeys{scores, n}, n, heads, head, digits,
                                             tiles, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  // Step 2: the extra-th candidate of the pool, then the count per head.
  const PoolKeys keys{scores, n, head.state, s > 0, head_bits};
  std::vector<RadixDigit> digits = RadixDigits(32, 64);
  const std::vector<RadixDigit> low = RadixDigits(0, token_bits + head_bits);
  digits.insert(digits.end(), low.begin(), low.end());
  if (const cudaError_t e = RunRadixPasses(keys, n, heads, pool, digits, tiles * num_heads, stream);
      e != cudaSuccess) {
    return e;
  }
  PoolCountKernel<<<dim3(tiles, static_cast<unsigned>(num_heads)), kSelectThreads, 0, stream>>>(
      keys, pool.state, counts);
  return cudaGetLastError();
}

cudaError_t LaunchSelectShared(const float* scores, int32_t num_heads, int64_t n, int64_t count,
                               int32_t* indices, void* scratch, size_t scratch_bytes,
                               cudaStream_t stream) {
  if (!ValidShape(num_heads, n)) return cudaErrorInvalidValue;
  count = std::clamp<int64_t>(count, 0, n);
  // No heads: the round robin visits nothing and the list is empty, as on the CPU.
  if (num_heads == 0 || count == 0) return cudaSuccess;
  const int64_t heads = num_heads;
  if (scores == nullptr || indices == nullptr || scratch == nullptr) return cudaErrorInvalidValue;
  const SharedScratch s = SharedLayout(num_heads, n, scratch);
  if (s.bytes == 0 || scratch_bytes < s.bytes) return cudaErrorInvalidValue;

  const int64_t total = heads * n;
  const unsigned blocks = PrepareBlocks(total);
  SharedKeysKernel<<<blocks, kPrepareThreads, 0, stream>>>(scores, num_heads, n, s.sort_key[0],
                                                           s.sort_value[0], s.token_key);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // A stable LSD radix sort: equal keys keep index order, so ties rank the lower index first.
  size_t temp_bytes = s.sort_temp_bytes;
  if (const cudaError_t e = cub::DeviceRadixSort::SortPairs(
          s.sort_temp, temp_bytes, s.sort_key[0], s.sort_key[1], s.sort_value[0],
          s.sort_value[1], total, 0, SharedSortBits(num_heads), stream);
      e != cudaSuccess) {
    return e;
  }
  SharedTurnKernel<<<blocks, kPrepareThreads, 0, stream>>>(s.sort_value[1], num_heads, n, count,
                                                           s.token_key);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  // The `count` smallest token keys (all distinct and below count * H), ascending by token.
  PrepareUniformKernel<<<1, kPrepareThreads, 0, stream>>>(s.radix, 1, count);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const TokenKeys keys{s.token_key};
  const int key_bits = BitWidth(static_cast<uint64_t>(count * heads - 1));
  if (const cudaError_t e = RunRadixPasses(keys, n, 1, s.radix, RadixDigits(0, key_bits),
                                           static_cast<unsigned>(TilesPerRow(n)), stream);
      e != cudaSuccess) {
    return e;
  }
  return RunCompaction(keys, n, 1, s.radix, nullptr, indices, stream);
}

}  // namespace kvtrim::gpu

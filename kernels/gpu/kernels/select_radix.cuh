// Multi-block radix selection and stable compaction, the building blocks of the GPU
// selectors (select.cu). Elements are (row, j) with j in [0, n); a key functor `Keys`
// (select_keys.cuh) gives each element's 64-bit key (smaller = ranked first) or excludes it,
// and maps rows to selection segments.
//
// Selection finds, per segment, the key K of the element of 1-based rank r: one
// RadixHistogramKernel launch per digit (most significant first), each histogramming the
// keys that match the bits resolved so far; the last block of a segment to finish (atomic
// ticket) scans the histogram, fixes the digit and the remaining rank, and clears the
// histogram for the next pass. Compaction then writes, in ascending j, every element with
// key < K plus the first `rank` (remaining) elements with key == K: exactly the r best
// with ties to the lower index, without sorting.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <vector>

#include "kernels/gpu/kernels/select_keys.cuh"

namespace kvtrim::gpu {

constexpr int kRadixBits = 11;                           // bits per digit (at most)
constexpr int kRadixBins = 1 << kRadixBits;              // 2048 histogram bins
constexpr int kSelectThreads = 512;                      // threads per block
constexpr int kSelectItems = 16;                         // elements per thread
constexpr int64_t kSelectTile = kSelectThreads * kSelectItems;  // 8192 elements per block

/// One digit of a radix selection: key bits [shift, shift + bits).
struct RadixDigit {
  int shift;
  int bits;
};

/// The digits covering key bits [low, high), most significant first, kRadixBits at most
/// each (host).
inline std::vector<RadixDigit> RadixDigits(int low, int high) {
  std::vector<RadixDigit> digits;
  for (int top = high; top > low; top -= kRadixBits) {
    const int bits = top - low < kRadixBits ? top - low : kRadixBits;
    digits.push_back({top - bits, bits});
  }
  return digits;
}

/// The (less, eq) counts of one tile relative to its segment's final key.
struct TileCount {
  unsigned less;  // keys < K
  unsigned eq;    // keys == K
};

/// One digit pass. Grid (tiles per row, rows); block kSelectThreads. Each block histograms
/// the digit of the keys of its tile whose bits above the digit equal the segment's prefix,
/// adds the histogram to hist[segment] and takes a ticket; the block that takes ticket
/// blocks_per_segment - 1 resolves the digit: state.prefix gains it and state.rank becomes
/// the rank within it. Idle segments (rank 0) are skipped.
///   state [segments] SegmentState; hist [segments, kRadixBins] (zero on entry, left zero);
///   done [segments] tickets (zero on entry, left zero).
template <typename Keys>
__global__ void __launch_bounds__(kSelectThreads)
    RadixHistogramKernel(Keys keys, int64_t n, SegmentState* state, unsigned long long* hist,
                         unsigned* done, int shift, int bits, unsigned blocks_per_segment) {
  using BlockScan = cub::BlockScan<unsigned long long, kSelectThreads>;
  __shared__ unsigned block_hist[kRadixBins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ bool is_last;
  const int row = blockIdx.y;
  const int seg = keys.Segment(row);
  const SegmentState st = state[seg];
  if (st.rank == 0) return;  // uniform over the block
  const int num_bins = 1 << bits;
  for (int b = threadIdx.x; b < num_bins; b += blockDim.x) block_hist[b] = 0;
  __syncthreads();

  const int top = shift + bits;
  const unsigned long long high_mask = top >= 64 ? 0ull : (~0ull << top);
  const unsigned long long want = st.prefix & high_mask;
  const int64_t tile0 = blockIdx.x * kSelectTile;
  unsigned long long key[kSelectItems];
  bool in[kSelectItems];
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    const int64_t j = tile0 + i * kSelectThreads + threadIdx.x;
    in[i] = j < n && keys.Key(row, j, &key[i]);
  }
  const unsigned lane = threadIdx.x & 31u;
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    const bool match = in[i] && (key[i] & high_mask) == want;
    const unsigned bin = match ? static_cast<unsigned>((key[i] >> shift) & (num_bins - 1))
                               : 0xFFFFFFFFu;
    // Threads of the warp with the same bin add once, by their lowest member.
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, bin);
    if (match && lane == static_cast<unsigned>(__ffs(peers) - 1)) {
      atomicAdd(&block_hist[bin], static_cast<unsigned>(__popc(peers)));
    }
  }
  __syncthreads();
  unsigned long long* seg_hist = hist + static_cast<int64_t>(seg) * kRadixBins;
  for (int b = threadIdx.x; b < num_bins; b += blockDim.x) {
    if (block_hist[b] != 0) atomicAdd(&seg_hist[b], static_cast<unsigned long long>(block_hist[b]));
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&done[seg], 1u) == blocks_per_segment - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // The last block: find the bin b with before(b) < rank <= before(b) + hist[b].
  constexpr int kPerThread = kRadixBins / kSelectThreads;  // 4 bins per thread
  unsigned long long count[kPerThread];
  unsigned long long sum = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int b = threadIdx.x * kPerThread + q;
    count[q] = b < num_bins ? __ldcg(&seg_hist[b]) : 0ull;
    sum += count[q];
  }
  unsigned long long before = 0;
  BlockScan(scan_storage).ExclusiveSum(sum, before);
  if (before < st.rank && st.rank <= before + sum) {
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      if (st.rank <= before + count[q]) {
        const unsigned long long b = threadIdx.x * kPerThread + q;
        state[seg] = SegmentState{st.rank - before, st.prefix | (b << shift)};
        break;
      }
      before += count[q];
    }
  }
  // Leave the histogram and the ticket zero for the next pass.
  for (int b = threadIdx.x; b < num_bins; b += blockDim.x) seg_hist[b] = 0;
  if (threadIdx.x == 0) done[seg] = 0;
}

/// Per tile: the counts of keys < K and == K, K = state[row].prefix (rows are segments).
/// Grid (tiles per row, rows). Writes tile_count [rows, tiles].
template <typename Keys>
__global__ void __launch_bounds__(kSelectThreads)
    TileCountKernel(Keys keys, int64_t n, const SegmentState* state, TileCount* tile_count) {
  using BlockReduce = cub::BlockReduce<unsigned long long, kSelectThreads>;
  __shared__ typename BlockReduce::TempStorage storage;
  const int row = blockIdx.y;
  const SegmentState st = state[row];
  if (st.rank == 0) return;
  const int64_t tile0 = blockIdx.x * kSelectTile;
  unsigned long long key[kSelectItems];
  bool in[kSelectItems];
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    const int64_t j = tile0 + i * kSelectThreads + threadIdx.x;
    in[i] = j < n && keys.Key(row, j, &key[i]);
  }
  unsigned long long packed = 0;  // less << 32 | eq
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    if (in[i] && key[i] < st.prefix) packed += 1ull << 32;
    if (in[i] && key[i] == st.prefix) packed += 1ull;
  }
  const unsigned long long total = BlockReduce(storage).Sum(packed);
  if (threadIdx.x == 0) {
    tile_count[static_cast<int64_t>(row) * gridDim.x + blockIdx.x] =
        TileCount{static_cast<unsigned>(total >> 32), static_cast<unsigned>(total)};
  }
}

/// Writes, in ascending j, the selected elements of row blockIdx.y: key < K, or key == K
/// and among the first state.rank such elements of the row. Output position of a selected
/// element = (# key < K before it) + min(# key == K before it, rank), after
/// row_offset[row] (0 when row_offset is null). Grid (tiles per row, rows).
///   tile_count [rows, tiles] from TileCountKernel; out: device int32.
template <typename Keys>
__global__ void __launch_bounds__(kSelectThreads)
    CompactKernel(Keys keys, int64_t n, const SegmentState* state, const TileCount* tile_count,
                  const int64_t* row_offset, int32_t* out) {
  using BlockReduce = cub::BlockReduce<unsigned long long, kSelectThreads>;
  using BlockScan = cub::BlockScan<unsigned, kSelectThreads>;
  __shared__ union {
    typename BlockReduce::TempStorage reduce;
    typename BlockScan::TempStorage scan;
  } storage;
  __shared__ unsigned long long tiles_before;
  const int row = blockIdx.y;
  const SegmentState st = state[row];
  if (st.rank == 0) return;

  // The counts of all earlier tiles of the row.
  unsigned long long packed_before = 0;  // less << 32 | eq
  const TileCount* counts = tile_count + static_cast<int64_t>(row) * gridDim.x;
  for (unsigned t = threadIdx.x; t < blockIdx.x; t += blockDim.x) {
    packed_before += (static_cast<unsigned long long>(counts[t].less) << 32) | counts[t].eq;
  }
  const unsigned long long sum_before = BlockReduce(storage.reduce).Sum(packed_before);
  if (threadIdx.x == 0) tiles_before = sum_before;
  __syncthreads();

  // This thread's kSelectItems consecutive elements, in index order.
  const int64_t first = blockIdx.x * kSelectTile + static_cast<int64_t>(threadIdx.x) * kSelectItems;
  unsigned flags = 0;  // bit 2i: key < K; bit 2i + 1: key == K
  unsigned mine = 0;   // less << 16 | eq (a tile holds at most 8192 elements)
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    unsigned long long key;
    const int64_t j = first + i;
    if (j < n && keys.Key(row, j, &key)) {
      if (key < st.prefix) {
        flags |= 1u << (2 * i);
        mine += 1u << 16;
      } else if (key == st.prefix) {
        flags |= 2u << (2 * i);
        mine += 1u;
      }
    }
  }
  unsigned excl = 0;
  BlockScan(storage.scan).ExclusiveSum(mine, excl);
  unsigned long long less = (tiles_before >> 32) + (excl >> 16);
  unsigned long long eq = (tiles_before & 0xFFFFFFFFull) + (excl & 0xFFFFu);
  const unsigned long long need = st.rank;
  int32_t* dst = out + (row_offset != nullptr ? row_offset[row] : 0);
#pragma unroll
  for (int i = 0; i < kSelectItems; ++i) {
    const unsigned f = (flags >> (2 * i)) & 3u;
    if (f == 1u) {
      dst[less + (eq < need ? eq : need)] = static_cast<int32_t>(first + i);
      ++less;
    } else if (f == 2u) {
      if (eq < need) dst[less + eq] = static_cast<int32_t>(first + i);
      ++eq;
    }
  }
}

}  // namespace kvtrim::gpu

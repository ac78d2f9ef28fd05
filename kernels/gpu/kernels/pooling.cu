// 1-D pooling of score rows on the GPU (pooling.cuh).
#include "kernels/gpu/kernels/pooling.cuh"

#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/gpu/kernels/cluster_launch.cuh"

namespace kvtrim::gpu {

namespace {

constexpr int kPoolThreads = 256;
constexpr int kPoolPerThread = 4;                           // outputs per thread (tiled)
constexpr int kPoolTile = kPoolThreads * kPoolPerThread;    // outputs per CTA (tiled)
constexpr int kMaxTiledRadius = 256;                        // larger windows: one per thread

/// The pooled value of position j of `row` (a length-n vector) from `at(i)` = row[i]: max over
/// the clipped window [j - radius, j + radius], or the double sum over it in index order
/// divided by the kernel (kvtrim::Pool1D).
template <typename At>
__device__ __forceinline__ float PoolAt(At at, int64_t j, int64_t n, int32_t radius,
                                        int32_t kernel, bool max_pool) {
  const int64_t lo = j - radius < 0 ? 0 : j - radius;
  const int64_t hi = j + radius > n - 1 ? n - 1 : j + radius;
  if (max_pool) {
    float m = at(lo);
    for (int64_t i = lo + 1; i <= hi; ++i) {
      const float x = at(i);
      m = x > m ? x : m;
    }
    return m;
  }
  double sum = 0.0;
  for (int64_t i = lo; i <= hi; ++i) sum = __dadd_rn(sum, static_cast<double>(at(i)));
  return __double2float_rn(__ddiv_rn(sum, static_cast<double>(kernel)));
}

/// One thread per output element; grid (ceil(n / 256), rows). Rows lie in_stride / out_stride
/// floats apart; the window is clipped to [0, n). For radii above kMaxTiledRadius.
__global__ void __launch_bounds__(kPoolThreads)
    Pool1DKernel(const float* __restrict__ in, int64_t in_stride, int64_t n, int32_t radius,
                 int32_t kernel, bool max_pool, float* __restrict__ out, int64_t out_stride) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kPoolThreads + threadIdx.x;
  if (j >= n) return;
  const float* row = in + static_cast<int64_t>(blockIdx.y) * in_stride;
  out[static_cast<int64_t>(blockIdx.y) * out_stride + j] =
      PoolAt([&](int64_t i) { return row[i]; }, j, n, radius, kernel, max_pool);
}

/// Pool1DKernel with the CTA's kPoolTile outputs and their window margins staged once in
/// shared memory (coalesced loads; each input is read from global memory about once instead
/// of `kernel` times); grid (ceil(n / kPoolTile), rows), radius <= kMaxTiledRadius.
__global__ void __launch_bounds__(kPoolThreads)
    Pool1DTiledKernel(const float* __restrict__ in, int64_t in_stride, int64_t n, int32_t radius,
                      int32_t kernel, bool max_pool, float* __restrict__ out,
                      int64_t out_stride) {
  __shared__ float tile[kPoolTile + 2 * kMaxTiledRadius];
  const float* row = in + static_cast<int64_t>(blockIdx.y) * in_stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kPoolTile;  // first output
  const int64_t base = first - radius;                                 // tile[0]'s position
  const int span = kPoolTile + 2 * radius;
  for (int i = threadIdx.x; i < span; i += kPoolThreads) {
    const int64_t at = base + i;
    tile[i] = at >= 0 && at < n ? row[at] : 0.0f;  // outside [0, n): never read (clipped)
  }
  __syncthreads();
  float* dst = out + static_cast<int64_t>(blockIdx.y) * out_stride;
#pragma unroll
  for (int u = 0; u < kPoolPerThread; ++u) {
    const int64_t j = first + threadIdx.x + u * kPoolThreads;
    if (j < n) {
      dst[j] = PoolAt([&](int64_t i) { return tile[i - base]; }, j, n, radius, kernel, max_pool);
    }
  }
}

/// Launches the tiled kernel, or the per-thread one for very wide windows.
cudaError_t LaunchPoolRows(const float* in, int64_t in_stride, int32_t rows, int64_t len,
                           int32_t kernel, bool max_pool, float* out, int64_t out_stride,
                           cudaStream_t stream) {
  const int32_t radius = kernel / 2;
  if (radius <= kMaxTiledRadius) {
    const dim3 grid(static_cast<unsigned>((len + kPoolTile - 1) / kPoolTile),
                    static_cast<unsigned>(rows));
    Pool1DTiledKernel<<<grid, kPoolThreads, 0, stream>>>(in, in_stride, len, radius, kernel,
                                                         max_pool, out, out_stride);
  } else {
    const dim3 grid(static_cast<unsigned>((len + kPoolThreads - 1) / kPoolThreads),
                    static_cast<unsigned>(rows));
    Pool1DKernel<<<grid, kPoolThreads, 0, stream>>>(in, in_stride, len, radius, kernel, max_pool,
                                                    out, out_stride);
  }
  return cudaGetLastError();
}

constexpr int kFillThreads = 1024;  // wide CTAs, so the row's read is not latency-bound
constexpr int kFillUnroll = 4;      // independent loads in flight per thread
constexpr int kFillMaxCluster = 8;  // CTAs per row at most (the portable cluster size)
constexpr int64_t kFillPerCta = 16384;  // a row takes one more CTA per this many prefix entries

/// One thread-block cluster of C CTAs per row of out [rows, n] (grid (C, rows)): the first
/// maximum of out[row, 0..prefix) (strictly larger replaces; equal values, +0 and -0
/// included, go to the lower index, as FirstMax's left-to-right scan) is written to
/// out[row, prefix..n); 0 when prefix == 0. CTA r scans the r-th of C equal parts of the
/// prefix: each thread its strided subset in ascending order (kFillUnroll loads issued before
/// they are compared), then a tree over (value, index) with the same order; after a cluster
/// barrier every CTA combines the C partial results in rank (= index) order through
/// distributed shared memory and fills its share of the window columns.
__global__ void __launch_bounds__(kFillThreads)
    FillWithPrefixMaxKernel(float* __restrict__ out, int64_t n, int64_t prefix) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned size = cluster.num_blocks();
  __shared__ float best_value[kFillThreads];
  __shared__ int64_t best_index[kFillThreads];
  __shared__ float fill;
  float* row = out + static_cast<int64_t>(blockIdx.y) * n;
  const int64_t part = (prefix + size - 1) / size;
  const int64_t begin = min(prefix, static_cast<int64_t>(rank) * part);
  const int64_t end = min(prefix, begin + part);
  float value = 0.0f;
  int64_t index = prefix;  // prefix = "none yet"; every real index is smaller
  constexpr int64_t kStep = int64_t{kFillThreads} * kFillUnroll;
  for (int64_t base = begin + threadIdx.x; base < end; base += kStep) {
    float x[kFillUnroll];
#pragma unroll
    for (int u = 0; u < kFillUnroll; ++u) {
      const int64_t j = base + u * kFillThreads;
      x[u] = j < end ? row[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kFillUnroll; ++u) {
      const int64_t j = base + u * kFillThreads;
      if (j < end && (index == prefix || x[u] > value)) {
        value = x[u];
        index = j;
      }
    }
  }
  best_value[threadIdx.x] = value;
  best_index[threadIdx.x] = index;
  __syncthreads();
  for (int stride = kFillThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = best_value[threadIdx.x + stride];
      const int64_t other_index = best_index[threadIdx.x + stride];
      const int64_t mine = best_index[threadIdx.x];
      const bool take = other_index < prefix &&
                        (mine == prefix || other > best_value[threadIdx.x] ||
                         (other == best_value[threadIdx.x] && other_index < mine));
      if (take) {
        best_value[threadIdx.x] = other;
        best_index[threadIdx.x] = other_index;
      }
    }
    __syncthreads();
  }
  cluster.sync();  // every CTA's partial result is in its best_*[0]
  if (threadIdx.x == 0) {
    float v = 0.0f;
    int64_t at = prefix;
    for (unsigned r = 0; r < size; ++r) {
      const float other = *cluster.map_shared_rank(&best_value[0], static_cast<int>(r));
      const int64_t other_index = *cluster.map_shared_rank(&best_index[0], static_cast<int>(r));
      if (other_index < prefix &&
          (at == prefix || other > v || (other == v && other_index < at))) {
        v = other;
        at = other_index;
      }
    }
    fill = at < prefix ? v : 0.0f;
  }
  cluster.sync();  // the peers' partial results are read; `fill` is set
  const float f = fill;
  for (int64_t j = prefix + static_cast<int64_t>(rank) * kFillThreads + threadIdx.x; j < n;
       j += static_cast<int64_t>(size) * kFillThreads) {
    row[j] = f;
  }
}

}  // namespace

cudaError_t LaunchPool1D(const float* in, int32_t rows, int64_t n, int32_t kernel, bool max_pool,
                         float* out, cudaStream_t stream) {
  if (kernel < 1 || kernel % 2 == 0 || rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  if (kernel == 1) {
    return cudaMemcpyAsync(out, in, static_cast<size_t>(rows) * n * sizeof(float),
                           cudaMemcpyDeviceToDevice, stream);
  }
  if (rows > 65535) return cudaErrorInvalidValue;  // grid.y
  return LaunchPoolRows(in, n, rows, n, kernel, max_pool, out, n, stream);
}

cudaError_t LaunchPool1DStrided(const float* in, int64_t in_stride, int32_t rows, int64_t len,
                                int32_t kernel, bool max_pool, float* out, int64_t out_stride,
                                cudaStream_t stream) {
  if (kernel < 1 || kernel % 2 == 0 || rows < 0 || len < 0 || in_stride < len ||
      out_stride < len) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || len == 0) return cudaSuccess;
  if (rows > 65535) return cudaErrorInvalidValue;  // grid.y
  // kernel == 1 runs the kernel with radius 0: a copy.
  return LaunchPoolRows(in, in_stride, rows, len, kernel, max_pool, out, out_stride, stream);
}

cudaError_t LaunchPoolPrefix(const float* in, int32_t rows, int64_t n, int64_t prefix,
                             int32_t kernel, bool max_pool, float* out, cudaStream_t stream) {
  if (kernel < 1 || kernel % 2 == 0 || rows < 0 || n < 0 || prefix < 0 || prefix > n ||
      (in == out && kernel != 1)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0 || n == 0) return cudaSuccess;
  if (in != out) {
    const cudaError_t err =
        LaunchPool1DStrided(in, n, rows, prefix, kernel, max_pool, out, n, stream);
    if (err != cudaSuccess) return err;
  }
  if (prefix == n) return cudaSuccess;  // no window columns to fill
  if (rows > 65535) return cudaErrorInvalidValue;  // grid.y
  const int64_t ctas =
      std::clamp<int64_t>((prefix + kFillPerCta - 1) / kFillPerCta, 1, kFillMaxCluster);
  return LaunchClusterRows(FillWithPrefixMaxKernel, ctas, rows, kFillThreads, 0, stream, out, n,
                           prefix);
}

}  // namespace kvtrim::gpu

// 1-D pooling of score rows on the GPU (pooling.cuh).
#include "kernels/gpu/kernels/pooling.cuh"

namespace kvtrim::gpu {

namespace {

constexpr int kPoolThreads = 256;

/// One thread per output element; grid (ceil(n / 256), rows). Rows lie in_stride / out_stride
/// floats apart; the window is clipped to [0, n).
__global__ void __launch_bounds__(kPoolThreads)
    Pool1DKernel(const float* __restrict__ in, int64_t in_stride, int64_t n, int32_t radius,
                 int32_t kernel, bool max_pool, float* __restrict__ out, int64_t out_stride) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kPoolThreads + threadIdx.x;
  if (j >= n) return;
  const float* row = in + static_cast<int64_t>(blockIdx.y) * in_stride;
  const int64_t lo = j - radius < 0 ? 0 : j - radius;
  const int64_t hi = j + radius > n - 1 ? n - 1 : j + radius;
  float result;
  if (max_pool) {
    float m = row[lo];
    for (int64_t i = lo + 1; i <= hi; ++i) {
      const float x = row[i];
      m = x > m ? x : m;
    }
    result = m;
  } else {
    double sum = 0.0;
    for (int64_t i = lo; i <= hi; ++i) sum = __dadd_rn(sum, static_cast<double>(row[i]));
    result = __double2float_rn(__ddiv_rn(sum, static_cast<double>(kernel)));
  }
  out[static_cast<int64_t>(blockIdx.y) * out_stride + j] = result;
}

constexpr int kFillThreads = 1024;  // one CTA per row: wide, so the row's read is not latency-bound
constexpr int kFillUnroll = 4;      // independent loads in flight per thread

/// One CTA per row of out [rows, n]: the first maximum of out[row, 0..prefix) (strictly
/// larger replaces; equal values, +0 and -0 included, go to the lower index, as FirstMax's
/// left-to-right scan) is written to out[row, prefix..n); 0 when prefix == 0. Each thread
/// scans its strided subset in ascending order (kFillUnroll loads issued before they are
/// compared), then a tree over (value, index) with the same order.
__global__ void __launch_bounds__(kFillThreads)
    FillWithPrefixMaxKernel(float* __restrict__ out, int64_t n, int64_t prefix) {
  __shared__ float best_value[kFillThreads];
  __shared__ int64_t best_index[kFillThreads];
  float* row = out + static_cast<int64_t>(blockIdx.x) * n;
  float value = 0.0f;
  int64_t index = prefix;  // prefix = "none yet"; every real index is smaller
  constexpr int64_t kStep = int64_t{kFillThreads} * kFillUnroll;
  for (int64_t base = threadIdx.x; base < prefix; base += kStep) {
    float x[kFillUnroll];
#pragma unroll
    for (int u = 0; u < kFillUnroll; ++u) {
      const int64_t j = base + u * kFillThreads;
      x[u] = j < prefix ? row[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kFillUnroll; ++u) {
      const int64_t j = base + u * kFillThreads;
      if (j < prefix && (index == prefix || x[u] > value)) {
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
  const float fill = best_index[0] < prefix ? best_value[0] : 0.0f;
  for (int64_t j = prefix + threadIdx.x; j < n; j += kFillThreads) row[j] = fill;
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
  const dim3 grid(static_cast<unsigned>((n + kPoolThreads - 1) / kPoolThreads),
                  static_cast<unsigned>(rows));
  Pool1DKernel<<<grid, kPoolThreads, 0, stream>>>(in, n, n, kernel / 2, kernel, max_pool, out, n);
  return cudaGetLastError();
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
  const dim3 grid(static_cast<unsigned>((len + kPoolThreads - 1) / kPoolThreads),
                  static_cast<unsigned>(rows));
  // kernel == 1 runs the kernel with radius 0: a copy.
  Pool1DKernel<<<grid, kPoolThreads, 0, stream>>>(in, in_stride, len, kernel / 2, kernel, max_pool,
                                                  out, out_stride);
  return cudaGetLastError();
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
  FillWithPrefixMaxKernel<<<static_cast<unsigned>(rows), kFillThreads, 0, stream>>>(out, n,
                                                                                   prefix);
  return cudaGetLastError();
}

}  // namespace kvtrim::gpu

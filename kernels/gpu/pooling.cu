// 1-D pooling of score rows on the GPU (pooling.cuh).
#include "kernels/gpu/pooling.cuh"

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

}  // namespace kvtrim::gpu

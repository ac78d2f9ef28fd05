// Row reads of the fast key kernels (kernels/gpu/scorers/): a key row of d
// elements is read by a group of L = DP / 8 lanes (DP: d rounded up to 64, 128 or 256), lane
// i holding elements [8i, 8i + 8) as fp32 (f16 / bf16 widened, f32 as it is; zeros past d)
// from 16-byte loads; a warp reads 32 / L rows at once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "base/dtype.h"

namespace kvtrim::gpu::fast {

/// Threads per block of the fast key kernels.
constexpr int kKeyRowThreads = 256;

/// DP: d rounded up to 64, 128 or 256.
inline int PaddedDim(int d) { return d <= 64 ? 64 : (d <= 128 ? 128 : 256); }

/// True when the row reads take head dimension d: a multiple of 8 from 8 to 256.
inline bool KeyRowsSupported(int32_t d) { return d >= 8 && d <= 256 && d % 8 == 0; }

/// Streaming multiprocessors of the current device (132, an H100 SXM's, when unknown); also
/// sizes the fast attention plans (fast_attention_plan.cu).
inline int SmCount() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    cudaGetLastError();
    return 132;
  }
  return count;
}

/// Lane `part`'s 8 elements [8 part, 8 part + 8) of row `row` (d elements), fp32, zeros past d.
template <typename T>
__device__ __forceinline__ void LoadEight(const T* __restrict__ row, int part, int d,
                                          float (&x)[8]) {
  const int c0 = 8 * part;
  if (c0 >= d) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0.0f;
    return;
  }
  if constexpr (std::is_same<T, float>::value) {
    const float4 a = *reinterpret_cast<const float4*>(row + c0);
    const float4 b = *reinterpret_cast<const float4*>(row + c0 + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + c0);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (std::is_same<T, __half>::value) {
        x[i] = __half2float(v[i]);
      } else {
        x[i] = __bfloat162float(v[i]);
      }
    }
  }
}

/// Sum of `v` over the L lanes of a row group (xor shuffles); every lane gets it.
template <int L>
__device__ __forceinline__ float GroupSum(float v) {
#pragma unroll
  for (int x = 1; x < L; x *= 2) v += __shfl_xor_sync(0xffffffffu, v, x);
  return v;
}

/// Lane `part`'s 8 elements of row j of `head` [n, d], zeros when j >= end (the whole warp
/// keeps iterating together: the group sums shuffle across every lane).
template <typename T>
__device__ __forceinline__ void LoadRow(const T* head, int64_t j, int64_t end, int part, int d,
                                        float (&x)[8]) {
  if (j < end) {
    LoadEight(head + j * d, part, d, x);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = 0.0f;
  }
}

/// Runs launch(T{}, std::integral_constant<int, L>{}) for the layer's element type T (float,
/// __half, __nv_bfloat16) and row group size L = DP / 8; cudaErrorInvalidValue otherwise.
template <typename Launch>
cudaError_t DispatchKeyRows(DType dtype, int d, Launch&& launch) {
  const int l = PaddedDim(d) / 8;
  auto for_type = [&](auto tag) -> cudaError_t {
    switch (l) {
      case 8: return launch(tag, std::integral_constant<int, 8>{});
      case 16: return launch(tag, std::integral_constant<int, 16>{});
      case 32: return launch(tag, std::integral_constant<int, 32>{});
      default: return cudaErrorInvalidValue;
    }
  };
  switch (dtype) {
    case DType::kF32: return for_type(float{});
    case DType::kF16: return for_type(__half{});
    case DType::kBF16: return for_type(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu::fast

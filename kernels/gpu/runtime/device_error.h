// CUDA errors of the GPU backend as absl::Status: the one place a cudaError_t becomes a
// Status, and the rule that tells a recoverable error from a sticky one.
#pragma once

#include <cuda_runtime.h>

#include <optional>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace kvtrim::gpu {

/// True for the errors that leave the CUDA context unusable: every later call in the
/// process fails the same way (illegal address, launch failure, trap/assert, uncorrectable
/// ECC or NVLink errors, a destroyed context). Only a process restart recovers.
bool IsStickyCudaError(cudaError_t err);

/// Converts the result of the CUDA call or launcher `what` (e.g. "LaunchScore(dropkv)"):
///   cudaSuccess               -> OK
///   cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED (the request was too large for the
///                                device memory left; the caller stays usable)
///   anything else             -> INTERNAL
/// The message names `what`, the error's enum name and its text. Non-OK statuses carry the
/// numeric cudaError_t as a payload, read back by CudaErrorOf().
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

/// The cudaError_t a CudaStatus() status was built from; nullopt for other statuses.
std::optional<cudaError_t> CudaErrorOf(const absl::Status& status);

}  // namespace kvtrim::gpu

/// Evaluates the cudaError_t expression `expr`; returns CudaStatus(err, what) from the
/// enclosing function (which returns absl::Status) unless it is cudaSuccess.
#define KVTRIM_CUDA_RETURN_IF_ERROR(expr, what)                                  \
  do {                                                                           \
    const cudaError_t kvtrim_cuda_err_ = (expr);                                 \
    if (kvtrim_cuda_err_ != cudaSuccess) {                                       \
      return ::kvtrim::gpu::CudaStatus(kvtrim_cuda_err_, (what));                \
    }                                                                            \
  } while (0)

/// Returns the absl::Status expression `expr` from the enclosing function unless it is OK.
#define KVTRIM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    const ::absl::Status kvtrim_status_ = (expr);    \
    if (!kvtrim_status_.ok()) return kvtrim_status_; \
  } while (0)

#include "kernels/gpu/runtime/device_error.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/cord.h"

namespace kvtrim::gpu {

namespace {

/// Payload key under which CudaStatus() stores the numeric cudaError_t.
constexpr char kCudaErrorPayload[] = "type.kvtrim.dev/cuda_error";

}  // namespace

bool IsStickyCudaError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorExternalDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCudartUnloading:
    case cudaErrorInitializationError:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": CUDA error ", cudaGetErrorName(err), " (",
                                           static_cast<int>(err), "): ", cudaGetErrorString(err));
  absl::Status status = err == cudaErrorMemoryAllocation
                            ? absl::ResourceExhaustedError(absl::StrCat(
                                  message, "; the request needs more device memory than is "
                                           "free, retry later or send a smaller layer"))
                            : absl::InternalError(message);
  status.SetPayload(kCudaErrorPayload, absl::Cord(absl::StrCat(static_cast<int>(err))));
  return status;
}

std::optional<cudaError_t> CudaErrorOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kCudaErrorPayload);
  if (!payload.has_value()) return std::nullopt;
  int code = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &code)) return std::nullopt;
  return static_cast<cudaError_t>(code);
}

}  // namespace kvtrim::gpu

// The fast-numerics key scorer known by kind (design.md "Numerics"): KeyDiff with FMA and
// 16-byte loads, a group of d / 8 lanes per key row (8 elements per lane). KeyDiff takes two
// passes over K like its exact twin (the anchor, then the cosines), the second walked back to
// front so that it starts on the tiles the first left in L2. Deterministic: fixed splits and
// reduction orders, no floating-point atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu::fast {

/// True when `kind` has fast key-scorer kernels for `dtype` and `head_dim`: keydiff with d a
/// multiple of 8 up to 256.
bool FastKeyScorerSupported(ScorerKind kind, DType dtype, int32_t head_dim);

/// Device scratch bytes of LaunchFastKeyScores (0 when none is needed or the layer is not
/// valid for `kind`).
size_t FastKeyScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                                const ScorerParams& params);

/// Writes scores [H_kv, n] fp32 (device) without protection: keydiff -cos(k_j, anchor) with
/// the anchor of params.anchor_raw_mean and the guard params.eps
/// (kernels/cpu/score_keydiff.cc's definition in FMA arithmetic). cudaErrorInvalidValue for
/// unsupported kinds or shapes, null pointers or too little scratch.
cudaError_t LaunchFastKeyScores(ScorerKind kind, const DeviceLayer& layer,
                                const ScorerParams& params, float* scores, void* scratch,
                                size_t scratch_bytes, cudaStream_t stream);

}  // namespace kvtrim::gpu::fast

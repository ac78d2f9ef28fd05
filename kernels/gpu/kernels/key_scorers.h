// GPU launcher of the key-only scorer known by kind: KeyDiff (the others are table scorers,
// kernels/gpu/scorers/). It writes scores [H_kv, n] fp32 bit-identical to the CPU scorer of
// kernels/cpu/scorers.h for every input dtype (f16/bf16 keys convert to fp32 exactly on load,
// as on the CPU), because both follow the canonical arithmetic of kernels/canonical_math.h
// in the same order.
// Kernels know nothing of the service: the caller validates shapes; these only check what
// would make a launch unsafe. Called by LaunchScore (kernels/gpu/kernels/score_dispatch.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

/// True for the scorer this file implements (kKeyDiff).
bool IsKeyScorer(ScorerKind kind);

/// Device scratch bytes LaunchKeyScorer needs: for KeyDiff (0 for other kinds), the norms
/// [H_kv, n] fp32, the group sums [H_kv, ceil(n / 512), d] fp32 and the anchors
/// [H_kv, d] fp32 plus their norms [H_kv] fp32 (each region 256-byte aligned).
size_t KeyScorerScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                             const ScorerParams& params);

/// Writes scores [H_kv, n] fp32 (device, row-major) of a key-only scorer, without
/// protection, on `stream`:
///   kKeyDiff       the canonical definition in kernels/cpu/score_keydiff.cc, with
///                  params.anchor_raw_mean and params.eps
/// Reads layer.keys [H_kv, n, d] (layer.dtype) for kKeyDiff. Returns
/// cudaErrorInvalidValue for a kind that is not a key scorer, negative sizes, d < 1 or
/// null pointers where data is needed, or scratch smaller than KeyScorerScratchBytes;
/// otherwise the first launch error. n = 0 or H_kv = 0 launches nothing.
cudaError_t LaunchKeyScorer(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                            float* scores, void* scratch, size_t scratch_bytes,
                            cudaStream_t stream);

}  // namespace kvtrim::gpu

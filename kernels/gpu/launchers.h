// CUDA launchers of the GPU backend. Kernels know nothing of the service: every launcher
// takes an explicit stream and device scratch, returns cudaError_t, and never allocates.
// Scratch is sized by the matching *ScratchBytes query (CUB's two-phase pattern).
// Every score is bit-identical to the CPU backend's for fp32 inputs (canonical_math.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace kvtrim::gpu {

/// One layer's tensors in device memory.
struct DeviceLayer {
  const void* keys = nullptr;     // [H_kv, n, d] dtype, row-major
  const void* values = nullptr;   // [H_kv, n, d] dtype, or nullptr
  const void* queries = nullptr;  // [H_q, w, d] dtype, or nullptr
  DType dtype = DType::kF32;
  int32_t num_kv_heads = 0;       // H_kv
  int32_t num_query_heads = 0;    // H_q (0 without queries)
  int32_t window_rows = 0;        // w (0 without queries); row t sits at position n - w + t
  int32_t head_dim = 0;           // d
  int64_t num_tokens = 0;         // n
  float softmax_scale = 0;        // resolved, never 0
  int32_t layer_id = 0;
  uint64_t seed = 0;              // random scorer
};

/// Which scorer to launch.
enum class ScorerKind { kStreamingLlm, kRandom, kKnorm, kKeyDiff, kSnapKV, kH2O, kTova, kDropKV };

/// Scorer parameters as plain values (built from ResolvedParams by the backend).
struct ScorerParams {
  int32_t window = 0;            // snapkv, dropkv: the last `window` query rows
  int32_t kernel = 1;            // pooling kernel (odd)
  bool pool_max = true;          // max (true) or avg (false) pooling
  float eps = 0;                 // dropkv: 1 - p + eps; keydiff: cosine guard
  bool bf16_prob_round = false;  // dropkv: p rounded to bf16 (resolved "auto")
  bool causal_normalize = false; // h2o
  bool anchor_raw_mean = false;  // keydiff
};

/// Device scratch bytes LaunchScore needs for this layer.
size_t ScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params);

/// Writes scores [H_kv, n] fp32 (device) for the scorer, without protection.
cudaError_t LaunchScore(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                        float* scores, void* scratch, size_t scratch_bytes, cudaStream_t stream);

/// Sets scores [H, n] of the first `sink` and last `recent` tokens of every head to +inf.
cudaError_t LaunchApplyProtection(float* scores, int32_t num_heads, int64_t n, int64_t sink,
                                  int64_t recent, cudaStream_t stream);

/// Device scratch bytes of the selection launchers for [H, n] scores.
size_t SelectScratchBytes(int32_t num_heads, int64_t n);

/// Per-head top-k. counts [H] (device int64) tokens per head; writes offsets [H+1] (device
/// int64, CSR) and indices (device int32, capacity sum(counts)), ascending per head. Ties:
/// higher score first, then lower index (identical to SelectTopK on the CPU).
cudaError_t LaunchSelectTopK(const float* scores, int32_t num_heads, int64_t n,
                             const int64_t* counts, int64_t* offsets, int32_t* indices,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream);

/// AdaKV counts (rule 4, identical to AllocateAdaKV): scores [H, n] with protected tokens
/// +inf, uniform per-head budget k, safeguard = floor(alpha*k). Writes counts [H] (device).
cudaError_t LaunchAdaKVCounts(const float* scores, int32_t num_heads, int64_t n, int64_t k,
                              int64_t safeguard, int64_t* counts, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream);

/// Shared output (identical to SelectSharedRoundRobin): one ascending list of `count`
/// tokens into indices (device int32).
cudaError_t LaunchSelectShared(const float* scores, int32_t num_heads, int64_t n, int64_t count,
                               int32_t* indices, void* scratch, size_t scratch_bytes,
                               cudaStream_t stream);

/// Device scratch bytes of LaunchPerturbation.
size_t PerturbationScratchBytes(const DeviceLayer& layer);

/// The relative output perturbation per KV head (see kernels/cpu/perturbation.h for the
/// definition). offsets: [num_lists + 1] device int64 (num_lists = H_kv, or 1 for a shared
/// list), indices: device int32 ascending per list. Writes out [H_kv] (device double).
/// Matches the CPU to 1e-9 relative (a statistic, not a decision: order may differ).
cudaError_t LaunchPerturbation(const DeviceLayer& layer, const int64_t* offsets, int32_t num_lists,
                               const int32_t* indices, double* out, void* scratch,
                               size_t scratch_bytes, cudaStream_t stream);

}  // namespace kvtrim::gpu

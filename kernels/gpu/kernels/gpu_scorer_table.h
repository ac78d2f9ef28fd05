// The device implementations of the table scorers (ScorerKind::kTable), found by the
// scorer's registered name: the GPU twin of kernels/cpu/cpu_scorer_table.h. Every file
// kernels/gpu/scorers/<stem>.cu defines
//   void RegisterGpuScorer_<stem>(GpuScorerTable& table);
// which adds its scorer; the build generates the one function that calls them all
// (RegisterGpuScorerFiles, kernels/gpu/CMakeLists.txt), so a new file needs no other edit.
// Launchers follow launchers.h: explicit stream and scratch, cudaError_t, no allocation.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gpu/kernels/launchers.h"
#include "kernels/scorer_table.h"

namespace kvtrim::gpu {

/// One numerics' kernels of a table scorer (CUB's two-phase pattern, as LaunchScore).
struct GpuScorerKernels {
  /// True when the kernels take a layer of `dtype` and `head_dim`; nullptr: every layer.
  bool (*supports)(DType dtype, int32_t head_dim) = nullptr;
  /// Device scratch bytes `launch` needs for the layer; nullptr: none.
  size_t (*scratch_bytes)(const DeviceLayer& layer, const ScorerParams& params) = nullptr;
  /// Writes scores [H_kv, n] fp32 (device, row-major) without protection on `stream`;
  /// cudaErrorInvalidValue for a layer it cannot take, null pointers where data is needed or
  /// too little scratch. nullptr: no kernels in this numerics.
  cudaError_t (*launch)(const DeviceLayer& layer, const ScorerParams& params, float* scores,
                        void* scratch, size_t scratch_bytes, cudaStream_t stream) = nullptr;

  /// True when `launch` exists and takes the layer's dtype and head_dim.
  bool Supports(DType dtype, int32_t head_dim) const {
    return launch != nullptr && (supports == nullptr || supports(dtype, head_dim));
  }
  /// scratch_bytes(layer, params), or 0 without it.
  size_t ScratchBytes(const DeviceLayer& layer, const ScorerParams& params) const {
    return scratch_bytes == nullptr ? 0 : scratch_bytes(layer, params);
  }
};

/// The checks a table scorer's launcher starts with: cudaErrorInvalidValue for negative sizes
/// or more than 65535 KV heads (the grids' y), and, when there is something to score, null
/// scores or, for a scorer that `reads_keys`, null keys or d < 1. *empty: n = 0 or H_kv = 0
/// (cudaSuccess, launch nothing).
inline cudaError_t CheckTableLaunch(const DeviceLayer& layer, const float* scores,
                                    bool reads_keys, bool* empty) {
  const int64_t n = layer.num_tokens;
  const int32_t heads = layer.num_kv_heads;
  if (n < 0 || heads < 0 || heads > 65535) return cudaErrorInvalidValue;
  *empty = n == 0 || heads == 0;
  if (*empty) return cudaSuccess;
  if (scores == nullptr) return cudaErrorInvalidValue;
  if (reads_keys && (layer.keys == nullptr || layer.head_dim < 1)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

/// One table scorer's device implementations.
struct GpuScorer {
  GpuScorerKernels exact;  // the canonical arithmetic: bit-identical to the CPU's exact scorer
  GpuScorerKernels fast;   // fast numerics, within docs/numerics.md's tolerance of exact
  /// Fills the ScorerParams fields the launchers read from the policy's resolved parameters
  /// (read as the CPU scorer reads them, with the layer's input `dtype`); nullptr: none.
  void (*read_params)(const ResolvedParams& params, DType dtype, ScorerParams* out) = nullptr;
  /// A window-attention scorer's traits (window_attention_scorer.h): its kernels are the
  /// shared LaunchScore's, whose fast pass A also checks K (and V) for NaN / Inf and leaves
  /// the rows' outputs the perturbation statistic can reuse (device_pipeline.h). nullptr for
  /// a scorer with kernels of its own.
  const WindowAttentionTraits* window_attention = nullptr;

  /// The kernels of one numerics: fast ones for `fast_numerics` (the plan sets it only where
  /// fast.Supports the layer, HasFastPath), exact ones otherwise.
  const GpuScorerKernels& For(bool fast_numerics) const { return fast_numerics ? fast : exact; }
  /// A scorer whose exact kernels also serve fast numerics (nothing to gain from fast
  /// arithmetic: positions, hashes).
  static GpuScorer SameInBothNumerics(GpuScorerKernels kernels) {
    GpuScorer scorer;
    scorer.exact = kernels;
    scorer.fast = kernels;
    return scorer;
  }

  static constexpr const char* kBackend = "GPU";  // names the backend in ScorerTable's messages
  /// True when the exact kernels are set (ScorerTable refuses an entry without them).
  bool HasExact() const { return exact.launch != nullptr; }
};

/// Scorer name -> GpuScorer (kernels/scorer_table.h).
using GpuScorerTable = ScorerTable<GpuScorer>;

/// Calls RegisterGpuScorer_<stem>(table) for every kernels/gpu/scorers/<stem>.cu (generated).
void RegisterGpuScorerFiles(GpuScorerTable& table);

}  // namespace kvtrim::gpu

namespace kvtrim {
/// The table of every file in kernels/gpu/scorers/ (built on first use).
template <>
const gpu::GpuScorerTable& gpu::GpuScorerTable::Builtin();
}  // namespace kvtrim

// CUDA launchers of the GPU backend. Kernels know nothing of the service: every launcher
// takes an explicit stream and device scratch, returns cudaError_t, and never allocates.
// Scratch is sized by the matching *ScratchBytes query (CUB's two-phase pattern).
// Every score is bit-identical to the CPU backend's for fp32 inputs (canonical_math.h).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/dtype.h"
#include "kernels/policy_kind.h"
#include "kernels/scorer_params.h"
#include "kernels/gpu/kernels/window_attention_traits.h"

namespace kvtrim::gpu {

/// `bytes` rounded up to a multiple of 256: the alignment of every region a launcher carves
/// out of its scratch (and of the arena's regions).
constexpr size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

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
  /// A word of page-locked host memory that the fast attention scorers' pass A sets to 1 when
  /// an element of K (DropKV: or V) it reads is NaN / Inf, for 16-bit inputs
  /// (FusedFiniteInputs, kernels/gpu/runtime, says which a launch covers); null: no check.
  unsigned int* finite_flag = nullptr;
};

/// The scorer kinds (kernels/policy_kind.h): the model scorers (which read a registered model,
/// DeviceModelInputs) run through LaunchModelScore, the table scorers through their GpuScorer
/// (gpu_scorer_table.h); the window-attention ones among them through LaunchScore, with the
/// traits their GPU file declares (window_attention_traits.h).
using kvtrim::IsModelScorer;
using kvtrim::ScorerKind;
using kvtrim::WindowAttentionTraits;
using kvtrim::WindowNormalize;

/// LaProx's GQA combination (params "gqa"; kernels/scorer_params.h).
using kvtrim::LaProxGqa;

/// A table scorer's own device parameters (ScorerKind::kTable): its GPU file's read_params
/// (GpuScorer, gpu_scorer_table.h) stores the scorer's parameter struct here and its
/// launchers load it back, so a parameter of a new kind is a field of that struct, in the
/// scorer's file, not of ScorerParams. The struct is trivially copyable, at most kBytes and
/// without padding, so equal parameters are equal bytes (the launch-graph key reads words()).
class TableParams {
 public:
  static constexpr size_t kWords = 4;
  static constexpr size_t kBytes = kWords * sizeof(uint64_t);

  /// Stores `value` (the bytes past it zero).
  template <typename T>
  void Store(const T& value) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kBytes,
                  "a table scorer's device parameters: trivially copyable, at most kBytes");
    words_ = {};
    std::memcpy(words_.data(), &value, sizeof(T));
  }
  /// The value Store kept (all-zero bytes when nothing was stored).
  template <typename T>
  T Load() const {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kBytes,
                  "a table scorer's device parameters: trivially copyable, at most kBytes");
    T value;
    // Trivially copyable (asserted), so bytes make the value even when T has default member
    // initialisers (the void* says so to -Wclass-memaccess).
    std::memcpy(static_cast<void*>(&value), words_.data(), sizeof(T));
    return value;
  }
  /// The stored bytes as words (the launch-graph key).
  const std::array<uint64_t, kWords>& words() const { return words_; }

 private:
  std::array<uint64_t, kWords> words_{};
};

/// Scorer parameters as plain values (built from ResolvedParams by the backend).
struct ScorerParams {
  int32_t window = 0;            // snapkv, dropkv: the last `window` query rows
  int32_t kernel = 1;            // pooling kernel (odd)
  bool pool_max = true;          // max (true) or avg (false) pooling
  float eps = 0;                 // dropkv: 1 - p + eps
  bool bf16_prob_round = false;  // dropkv: p rounded to bf16 (resolved "auto")
  bool causal_normalize = false; // h2o
  // Model-aware scorers (eps above is also CriticalKV's and Expected Attention's eps).
  bool norm_l2 = false;          // criticalkv: norm "l2" (Gram matrices) instead of "l1" (W_O)
  LaProxGqa gqa = LaProxGqa::kMean;  // laprox
  bool use_vnorm = true;         // expected_attention: multiply by ||v||
  /// Fast numerics (design.md "Numerics"): the tensor-core kernels of fast_attention.cuh for
  /// the scorers and shapes they take (FastAttentionSupported); the canonical kernels
  /// otherwise, and always when false.
  bool fast = false;
  TableParams table;  // a table scorer's own parameters (its GpuScorer::read_params)
};

// ---- Lane-major vectors ------------------------------------------------------------------
// The model-aware kernels read d-vectors (rows of W_O slices, Gram and covariance matrices,
// query means) in "lane-major" order: a vector takes 8 * E floats, canonical lane l
// (kernels/canonical_math.h CmDot) holding elements l, l + 8, l + 16, ... at [l * E, l * E + E),
// zero past d. E = LaneElems(d) (8, 16 or 32: d <= 64, 128, 256). Host conversion: ToLaneMajor.

/// Elements per canonical lane of a lane-major vector of dimension d (1 <= d <= 256).
inline int LaneElems(int64_t d) { return d <= 64 ? 8 : (d <= 128 ? 16 : 32); }

/// Floats of one lane-major vector of dimension d: 8 * LaneElems(d).
inline int64_t LaneMajorFloats(int64_t d) { return 8 * static_cast<int64_t>(LaneElems(d)); }

/// Writes `count` row-major vectors rows[count, d] (row r at rows + r * row_stride) as lane-major
/// vectors out[count, LaneMajorFloats(d)].
inline void ToLaneMajor(const float* rows, int64_t count, int64_t d, int64_t row_stride,
                        float* out) {
  const int64_t e = LaneElems(d);
  for (int64_t r = 0; r < count; ++r) {
    float* o = out + r * 8 * e;
    const float* in = rows + r * row_stride;
    for (int64_t l = 0; l < 8; ++l) {
      for (int64_t m = 0; m < e; ++m) {
        const int64_t i = l + 8 * m;
        o[l * e + m] = i < d ? in[i] : 0.0f;
      }
    }
  }
}

/// The registered model's tensors of one layer on the device (fp32, lane-major rows), for the
/// model-aware scorers. Only the members the scorer reads must be set:
///   criticalkv l1         w_o          [H_q, D, 8E]: row (q, e) = w_o[e, q*d : q*d + d]
///   criticalkv l2, laprox head_gram    [H_q, d, 8E]: row (q, i) = Gram_q[i, :]
///   laprox summed_wo      group_gram   [H_kv, d, 8E]: row (h, i) = GroupGram_h[i, :]
///   expected_attention    ea_mean      [H_q, 8E] and ea_cov [H_q, d, 8E] (row (q, i) =
///                         Sigma_q[i, :]) from ComputeExpectedQueryStats, half_scale2 from it
struct DeviceModelInputs {
  const float* w_o = nullptr;
  const float* head_gram = nullptr;
  const float* group_gram = nullptr;
  const float* ea_mean = nullptr;
  const float* ea_cov = nullptr;
  int32_t hidden = 0;            // D (criticalkv l1)
  int32_t num_query_heads = 0;   // the model's H_q (expected_attention: G = H_q / H_kv)
  float half_scale2 = 0;         // expected_attention: 0.5 * scale^2 as the stats rounded it
};

/// Device scratch bytes LaunchScore needs for this layer (0 when it refuses the layer).
size_t ScoreScratchBytes(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                         const ScorerParams& params);

/// Writes scores [H_kv, n] fp32 (device) of the window-attention scorer of `traits` (the
/// traits its GPU file registers, window_attention_scorer.h), without protection.
cudaError_t LaunchScore(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                        const ScorerParams& params, float* scores, void* scratch,
                        size_t scratch_bytes, cudaStream_t stream);

/// Device scratch bytes LaunchModelScore needs (0 when the layer, parameters or model inputs
/// are not valid for `kind`).
size_t ModelScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                              const ScorerParams& params, const DeviceModelInputs& model);

/// The model-aware scorers, bit-identical to the CPU's canonical definitions
/// (kernels/cpu/scorers.h, "MODEL-AWARE SCORERS"), without protection:
///   kCriticalKV          scores = attention [H_kv, n], critical [H_kv, n] (0 for j >= n - window)
///   kLaProx              scores = p [H_kv, n] (0 for j >= n - window); critical unused
///   kExpectedAttention   scores [H_kv, n]; critical unused
/// Reads K, V (and Q for criticalkv / laprox). Returns cudaErrorInvalidValue for invalid
/// shapes, parameters, missing model inputs or scratch smaller than ModelScoreScratchBytes.
cudaError_t LaunchModelScore(ScorerKind kind, const DeviceLayer& layer, const ScorerParams& params,
                             const DeviceModelInputs& model, float* scores, float* critical,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream);

/// Sets scores [H, n] of the first `sink` and last `recent` tokens of every head to +inf.
cudaError_t LaunchApplyProtection(float* scores, int32_t num_heads, int64_t n, int64_t sink,
                                  int64_t recent, cudaStream_t stream);

/// Device scratch bytes of every selection launcher below for [H, n] scores: the largest of
/// SelectTopKScratchBytes and SelectSharedScratchBytes.
size_t SelectScratchBytes(int32_t num_heads, int64_t n);

/// Device scratch bytes of LaunchSelectTopK and LaunchAdaKVCounts for [H, n] scores (radix
/// histograms and states: O(H · n / tile)).
size_t SelectTopKScratchBytes(int32_t num_heads, int64_t n);

/// Device scratch bytes of LaunchSelectShared for [H, n] scores (the sort's keys, values and
/// temporary storage: O(H · n)); 0 when there is nothing to sort, or when the sort could not be
/// sized (no device).
size_t SelectSharedScratchBytes(int32_t num_heads, int64_t n);

/// Per-head top-k. counts [H] (device int64) tokens per head; writes offsets [H+1] (device
/// int64, CSR) and indices (device int32, capacity sum(counts)), ascending per head. Ties:
/// higher score first, then lower index (identical to SelectTopK on the CPU).
cudaError_t LaunchSelectTopK(const float* scores, int32_t num_heads, int64_t n,
                             const int64_t* counts, int64_t* offsets, int32_t* indices,
                             void* scratch, size_t scratch_bytes, cudaStream_t stream);

/// Device scratch bytes of LaunchProtectSelectTopK for [H, n] scores: 0 today (its histograms
/// and keys live in shared memory); asked all the same, as for every launcher.
size_t ProtectSelectTopKScratchBytes(int32_t num_heads, int64_t n);

/// Protection, NaN probe and per-head top-k of one layer in one kernel launch (select_fused.cu),
/// bit-identical to LaunchFindFirstNaN + LaunchApplyProtection + LaunchSelectTopK:
///   raw_scores [H, n] fp32 (device, read only): the scorer's scores before protection; tokens
///     j < sink and j >= n - recent count as +inf (sink, recent clamped to [0, n]; rule 3's
///     clamps are the caller's);
///   counts [H] (device int64): tokens kept per head, clamped to [0, n];
///   offsets [H + 1] (device int64, CSR): written, the exclusive scan of the clamped counts;
///   indices (device int32, capacity sum of the clamped counts): ascending per head; ties:
///     higher score first, then lower index (identical to SelectTopK on the CPU);
///   first_nan (device, one unsigned long long): lowered (integer atomicMin) to the flat index
///     h * n + j of the first NaN raw score, protected tokens included; it must hold kNoNaN
///     (device_nan_probe.h) beforehand, and keeps it when there is no NaN. With a NaN the lists
///     are still written, in bounds, but mean nothing (the caller reports the NaN).
/// Errors: cudaErrorInvalidValue for H outside [0, 65535], n outside [0, 2^31 - 1], a null
/// offsets, counts (H > 0), raw_scores, indices or first_nan (H > 0, n > 0), or scratch_bytes
/// below ProtectSelectTopKScratchBytes. H = 0 or n = 0 writes the offsets only.
cudaError_t LaunchProtectSelectTopK(const float* raw_scores, int32_t num_heads, int64_t n,
                                    int64_t sink, int64_t recent, const int64_t* counts,
                                    int64_t* offsets, int32_t* indices,
                                    unsigned long long* first_nan, void* scratch,
                                    size_t scratch_bytes, cudaStream_t stream);

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

/// Device scratch bytes of LaunchFastPerturbation over the last `rows` window rows of every
/// query head (0 when the fast kernels do not take the layer, or rows is not in [1, w]).
size_t FastPerturbationScratchBytes(const DeviceLayer& layer, int32_t rows);

/// What a caller of LaunchFastPerturbation may already know.
struct FastPerturbationHints {
  /// No kept list is longer (the host's counts); the kept run's splits cover this many list
  /// positions. < 0: n.
  int64_t kept_bound = -1;
  /// The full outputs of the rows, as the fast DropKV scorer left them in its scratch
  /// (FastScorerRowsBytes bytes from its offset there, copied before anything reuses that
  /// scratch); null: LaunchFastPerturbation computes them.
  const void* full_rows = nullptr;
};

/// Bytes of the row statistics and outputs a fast scorer of `traits` that forms them
/// (WindowTerm::kEvictionCost, DropKV; LaunchScore with `params`, fast numerics) leaves in its
/// scratch, which LaunchFastPerturbation over `rows` rows can take as its full outputs
/// (FastPerturbationHints::full_rows), and their byte offset in the scorer's scratch; 0 when
/// the scorer forms none, its rows are not the statistic's (its window differs) or the fast
/// kernels do not take the layer.
size_t FastScorerRowsBytes(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                           const ScorerParams& params, int32_t rows, size_t* scratch_offset);

/// LaunchPerturbation's statistic in fast numerics (fast_perturbation.cu): the full and the
/// kept attention output of every window row on tensor cores (the fast DropKV pass A, fp32
/// accumulation, the kept softmax with its own maximum over the kept tokens only, gathered),
/// the per-row ratios and their mean per KV head in fp64. Same arguments and definition as
/// LaunchPerturbation, but the mean runs over the last `rows` window rows of every query head
/// (w: every row, as LaunchPerturbation; fewer: the sampled statistic); cudaErrorNotSupported
/// for the layers the fast attention kernels do not take (d not a multiple of 8, d > 256, f32
/// with d > 128), cudaErrorInvalidValue for bad arguments (rows outside [1, w] among them). A
/// list longer than hints.kept_bound is read only up to the bound's tiles (the caller's bound
/// must hold).
cudaError_t LaunchFastPerturbation(const DeviceLayer& layer, int32_t rows, const int64_t* offsets,
                                   int32_t num_lists, const int32_t* indices, double* out,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream,
                                   const FastPerturbationHints& hints = {});

/// The relative output perturbation per KV head (see kernels/cpu/perturbation.h for the
/// definition). offsets: [num_lists + 1] device int64 (num_lists = H_kv, or 1 for a shared
/// list), indices: device int32 ascending per list. Writes out [H_kv] (device double).
/// Matches the CPU to 1e-9 relative (a statistic, not a decision: order may differ).
cudaError_t LaunchPerturbation(const DeviceLayer& layer, const int64_t* offsets, int32_t num_lists,
                               const int32_t* indices, double* out, void* scratch,
                               size_t scratch_bytes, cudaStream_t stream);

}  // namespace kvtrim::gpu

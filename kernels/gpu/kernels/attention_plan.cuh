// Host-side plan of one window-attention launch (the window-attention scorers, as their
// WindowAttentionTraits describe them, and the model scorers' window rows): which
// window rows are scored, how the device scratch is carved up, and the kernel variant. Shared
// by score_dispatch.cu and the attention kernels so that sizing and launching always agree.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/canonical_attention.h"
#include "kernels/gpu/kernels/attention_common.cuh"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/window_attention_traits.h"

namespace kvtrim::gpu::attn {

/// Per-row statistics written by the combine kernel (canonical step 3).
struct RowStats {
  float neg_max;   // -M (0 when the row sees nothing)
  float inv_sum;   // 1/Z (0 when the row sees nothing)
  float out_sq;    // |a|^2 = CmDot(a, a, d) (DropKV; 0 otherwise)
  int32_t visible; // V_r
};

/// How the score kernel reduces a token's per-row terms (rows of KV head h in order; the
/// model-aware scorers of kernels/cpu/scorers.h use the last three):
///  kSum        one seq sum over every row, then the scorer's finish (SnapKV, H2O, TOVA, DropKV)
///  kPerQMean   per query head q: CmDiv(seq_t p, T) into out [H_q, n]        (CriticalKV)
///  kPerQSq     per query head q: CmSqrt(seq_t CmMul(p, p)) into out [H_q, n] (LaProx head_bound)
///  kGroupSq    rows walked t-major: m_t = CmDiv(seq_g p, G); CmSqrt(seq_t CmMul(m_t, m_t))
///              into out [H_kv, n]                                            (LaProx mean, summed_wo)
enum class Reduce : int { kSum, kPerQMean, kPerQSq, kGroupSq };

/// Everything the attention kernels need to know about one launch.
struct AttentionPlan {
  /// How the kSum reduction's sum becomes a score (WindowAttentionTraits::NormalizeWith).
  WindowNormalize finish = WindowNormalize::kRowMean;
  bool all_heads = false;  // one score over every KV head (kEveryHeadMean)
  int32_t num_kv_heads = 0;     // H_kv
  int32_t group = 0;            // G = H_q / H_kv
  int32_t head_dim = 0;         // d
  int32_t window_rows = 0;      // w (rows sent)
  int64_t num_tokens = 0;       // n
  int32_t rows_per_qhead = 0;   // T: window rows scored per query head
  int32_t first_row = 0;        // t0: the first scored window row (T rows t0 .. t0+T-1)
  int32_t rows_per_head = 0;    // R = G * T; row r <-> (g = r / T, t = t0 + r % T)
  int32_t padded_rows = 0;      // R rounded up to a multiple of 8
  int64_t num_segments = 0;     // ceil(n / kAttnSegment)
  int lane_elems = 0;           // E: 8, 16 or 32 (d <= 8E)
  bool with_output = false;     // WindowTerm::kEvictionCost: the combine also forms a, |a|^2
  bool pooled = false;          // pooling with kernel > 1: scores go through pooling
  Reduce reduce = Reduce::kSum; // LaunchAttentionScores' per-token reduction

  // Scratch regions (byte offsets from the scratch base, each 256-byte aligned).
  size_t seg_max_offset = 0;    // [H_kv, R, num_segments] f32 m_s
  size_t seg_sum_offset = 0;    // [H_kv, R, num_segments] f32 z_s
  size_t seg_out_offset = 0;    // [H_kv, R, num_segments, d] f32 o_s (with_output)
  size_t row_stats_offset = 0;  // [H_kv, R] RowStats
  size_t row_out_offset = 0;    // [H_kv, R, d] f32 a (with_output)
  size_t pre_pool_offset = 0;   // [H_kv, n] f32 pre-pooling scores (pooled)
  size_t scratch_bytes = 0;     // total
};

/// The window rows a scorer of `traits` reads, the same in both numerics modes: T rows per
/// query head starting at row t0 (kLastWindow the last `window`, kAllRows all w, kLastRow the
/// last). False when the parameters are not valid (window outside [1, w], or an even or
/// non-positive kernel for a scorer that reads window and pooling).
bool ScoredWindowRows(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                      const ScorerParams& params, int32_t* rows_per_qhead, int32_t* first_row);

/// Builds the plan, or returns cudaErrorInvalidValue when the layer or the parameters are
/// not valid for `traits` (no queries, G < 1, window outside [1, w], no values for a scorer
/// that reads them, even or non-positive kernel, d outside [1, kMaxHeadDim], negative sizes),
/// or when the kernels have no variant for the traits (kEvictionCost with kEveryHeadMean).
cudaError_t MakeAttentionPlan(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                              const ScorerParams& params, AttentionPlan* plan);

}  // namespace kvtrim::gpu::attn

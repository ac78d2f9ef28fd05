// The fast-numerics window-attention scorers (SnapKV, H2O, TOVA, DropKV) on tensor cores
// (design.md "Numerics", docs/numerics.md). Two passes over K (and V), no [H_q, w, n] matrix:
//   pass A  per (KV head, token split, row chunk): Q·Kᵀ on mma.sync (bf16/f16 as they arrive,
//           f32 split into bf16 hi + lo), logits in the log2 domain (scale·log2 e folded in),
//           online max / sum per window row; DropKV also o = Σ 2^(x-m) v (P·V on mma.sync,
//           P split hi + lo).
//   combine per row: M, 1/Z (and a = o / Z, |a|²) over the splits, in a fixed order.
//   pass B  the same splits walked back to front (the tiles pass A read last are still in L2):
//           p = 2^(x - M) / Z, DropKV's term with a·v on mma.sync (a split hi + lo), summed
//           over the rows of each token; finished per scorer (or partial sums when the rows
//           span several chunks, or for TOVA's mean over every head, then a finish kernel).
// The result is the pre-pooling score [H_kv, n] of the exact path (attention_score.cu), so
// pooling and protection follow unchanged. Deterministic: fixed splits, fixed reduction
// orders, no atomics.
//
// The model-aware scorers (fast_model.cu) take the same passes with another per-token
// reduction in pass B (Reduce, the fast counterparts of attn::Reduce): the per-query-head
// window mean (CriticalKV), the per-query-head sqrt(sum_t p^2) (LaProx head_bound) and
// sqrt(sum_t m_t^2) of the group mean m_t (LaProx mean / summed_wo). Their rows are ordered
// so that every reduction segment (a query head's T rows, or the G rows of one window row t)
// is an aligned block of S = 2^k rows, reduced first in registers, then across lanes, then
// across warps (see FastAttentionPlan::seg_log2 and fast_attention.cu's RowSourceOf).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/window_attention_traits.h"

namespace kvtrim::gpu::fast {

/// Tokens per tile (one K / V tile in shared memory).
constexpr int kTileTokens = 64;

/// The per-token reduction of pass B.
///  kSum       the scorer's sum over every row, then its finish: out [H_kv, n] (SnapKV, H2O,
///             TOVA, DropKV)
///  kPerQMean  per query head q: (sum_t p) / T into out [H_q, n]                 (CriticalKV)
///  kPerQSq    per query head q: sqrt(sum_t p^2) into out [H_q, n]         (LaProx head_bound)
///  kGroupSq   sqrt(sum_t m_t^2), m_t = (sum_g p_{g,t}) / G, into out [H_kv, n]
///                                                                (LaProx mean, summed_wo)
/// The last three take SnapKV's rows (the last `window` rows of every query head) and no
/// pooling; they need d <= 128.
enum class Reduce : int { kSum, kPerQMean, kPerQSq, kGroupSq };

/// Per-row statistics of the combine, read by pass B.
struct RowInfo {
  float max2;    // M: max of the row's log2-domain logits
  float inv_z;   // 1 / Σ 2^(x - M); 0 for padding rows
  float out_sq;  // |a|² (DropKV)
  float pad;
};

/// Everything the fast launches of one layer need.
struct FastAttentionPlan {
  /// How the kSum reduction's sum becomes a score (WindowAttentionTraits::NormalizeWith).
  WindowNormalize finish = WindowNormalize::kRowMean;
  bool all_heads = false;     // one score over every KV head (kEveryHeadMean)
  DType dtype = DType::kBF16;
  int32_t num_kv_heads = 0;   // H_kv
  int32_t group = 0;          // G
  int32_t head_dim = 0;       // d
  int32_t padded_dim = 0;     // DP: 64, 128 or 256 (d rounded up)
  int32_t window_rows = 0;    // w
  int64_t num_tokens = 0;     // n
  int32_t rows_per_qhead = 0; // T: window rows scored per query head
  int32_t first_row = 0;      // t0
  /// Rows per KV head. kSum: R = G * T, row r <-> (g = r / T, t0 + r % T). The other modes:
  /// R = (segments * S) rounded up to block_rows, row r <-> a segment and a member of it
  /// (fast_attention.cu RowSourceOf); rows whose g >= G or t >= T are padding (p = 0).
  int32_t rows = 0;
  Reduce reduce = Reduce::kSum;
  /// Reduction segments (modes other than kSum): S = 2^seg_log2 rows, a query head's T rows
  /// (kPerQ*: S = T rounded up to a power of two) or the G rows of one window row
  /// (kGroupSq: S = G rounded up, at most 32).
  int32_t seg_log2 = 0;
  int32_t block_rows = 0;     // B = 16 * MG: the rows of one warp of pass B (16 or 32)
  int32_t in_bits = 0;        // log2 of a segment's rows that one thread holds (<= log2(B / 8))
  int32_t lane_bits = 0;      // log2 of the lanes (row groups of 8) a segment spans in a warp
  /// Rows per chunk RC and the warp layout (fast_attention.cu LaunchForDim): 16 (R <= 16, a
  /// warp per 16 rows x 16 tokens), 32 (R <= 32 and DropKV, 16 rows x 32 tokens) or 128 (32
  /// rows x 64 tokens).
  int32_t chunk_rows = 0;
  int32_t num_chunks = 0;     // ceil(R / RC)
  int32_t slices = 0;         // token slices per tile in pass A: 64 / tokens per warp
  int64_t num_tiles = 0;      // ceil(n / kTileTokens)
  int32_t tiles_per_split = 0;
  int32_t num_splits = 0;     // S
  int32_t parts = 0;          // S * slices partial statistics per row
  bool with_values = false;   // WindowTerm::kEvictionCost (DropKV)
  /// Pass B writes finished scores: kSum one chunk and not all_heads; kGroupSq one chunk; kPerQ*
  /// a segment within a chunk (S <= RC). Else partial row sums and the finish kernel.
  bool direct_finish = false;
  // Scratch regions (byte offsets, 256-byte aligned).
  size_t part_max_offset = 0;  // [H, chunks * RC, parts] f32
  size_t part_sum_offset = 0;  // [H, chunks * RC, parts] f32
  size_t part_out_offset = 0;  // [H, chunks * RC, parts, DP] f32 (DropKV)
  size_t row_info_offset = 0;  // [H, chunks * RC] RowInfo
  size_t row_out_offset = 0;   // [2, H, chunks * RC, DP] 16-bit a hi and lo planes (DropKV)
  size_t partial_offset = 0;   // [chunks, H, n] f32 row sums (unless direct_finish)
  size_t scratch_bytes = 0;    // total
  /// The part regions' bytes (up to row_info_offset) of the plan of any token count with this
  /// geometry (the finest split any n gets): room for a run whose tiles count list positions.
  size_t part_bytes_any_n = 0;
};

/// True when the fast kernels take this dtype and head dimension (any window-attention
/// traits): d a multiple of 8 (16-byte rows), d <= 256 (f16 / bf16) or d <= 128 (f32).
bool FastAttentionSupported(DType dtype, int32_t head_dim);

/// Builds the plan of a scorer of `traits` (validation as attn::MakeAttentionPlan);
/// cudaErrorInvalidValue when the layer, the parameters or the shape are not valid or not
/// supported. `reduce` other than kSum: only for kLastWindowProbabilities (nothing is pooled,
/// params.kernel is only validated), d <= 128, and for kGroupSq G <= 32.
cudaError_t MakeFastAttentionPlan(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                                  const ScorerParams& params, FastAttentionPlan* plan,
                                  Reduce reduce = Reduce::kSum);

/// Runs pass A, combine, pass B (and the finish kernel when needed) into `out` fp32
/// (device): kSum and kGroupSq [H_kv, n] (kSum: the pre-pooling scores), kPerQMean and
/// kPerQSq [H_q, n] (query head h * G + g). `scratch` holds plan.scratch_bytes.
cudaError_t LaunchFastAttentionScores(const FastAttentionPlan& plan, const DeviceLayer& layer,
                                      const ScorerParams& params, void* scratch, float* out,
                                      cudaStream_t stream);

/// Pass A and the combine of a DropKV plan (plan.with_values, Reduce::kSum) only: for every
/// row r of KV head h the statistics into row_info [H, chunks * RC] and the attention output
/// a = softmax(q Kᵀ) V as 16-bit hi and lo planes into row_out [2, H, chunks * RC, DP] (the
/// layout of plan.row_info_offset / row_out_offset, which these pointers replace). The
/// softmax runs over every visible token (list_indices null), or over the kept tokens only:
/// list_indices[list_offsets[l] .. list_offsets[l + 1]) for head h (l = h, or 0 when
/// num_lists is 1; ascending token ids), gathered from K and V tile by tile. The gathered
/// run's tiles count list positions: `plan` is then made for a token count at least as large
/// as every list (its splits cover it) over the layer's real n, which the causal mask reads
/// from `layer`. A row that sees no token gets a = 0. `scratch` holds the plan's part regions
/// (plan.part_*_offset). The output perturbation statistic in fast numerics runs it for the
/// full and the kept outputs (fast_perturbation.cu).
cudaError_t LaunchFastAttentionRows(const FastAttentionPlan& plan, const DeviceLayer& layer,
                                    const int64_t* list_offsets, const int32_t* list_indices,
                                    int32_t num_lists, void* scratch, RowInfo* row_info,
                                    void* row_out, cudaStream_t stream);

}  // namespace kvtrim::gpu::fast

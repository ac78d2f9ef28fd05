// AttentionPlan construction: validation of the layer and parameters, row selection per
// scorer, and the scratch layout (attention_plan.cuh).
#include "kernels/gpu/kernels/attention_plan.cuh"

namespace kvtrim::gpu::attn {

bool ScoredWindowRows(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                      const ScorerParams& params, int32_t* rows_per_qhead, int32_t* first_row) {
  if (traits.ReadsWindowPooling() && (params.kernel < 1 || params.kernel % 2 == 0)) {
    return false;
  }
  switch (traits.rows) {
    case WindowRowSpan::kLastWindow:
      if (params.window < 1 || params.window > layer.window_rows) return false;
      *rows_per_qhead = params.window;
      *first_row = layer.window_rows - params.window;
      return true;
    case WindowRowSpan::kAllRows:
      *rows_per_qhead = layer.window_rows;
      *first_row = 0;
      return true;
    case WindowRowSpan::kLastRow:
      *rows_per_qhead = 1;
      *first_row = layer.window_rows - 1;
      return true;
  }
  return false;
}

cudaError_t MakeAttentionPlan(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                              const ScorerParams& params, AttentionPlan* plan) {
  if (plan == nullptr) return cudaErrorInvalidValue;
  if (layer.num_kv_heads < 0 || layer.num_tokens < 0 || layer.head_dim < 1 ||
      layer.head_dim > kMaxHeadDim || layer.window_rows < 1 || layer.num_kv_heads == 0 ||
      layer.num_query_heads < layer.num_kv_heads ||
      layer.num_query_heads % layer.num_kv_heads != 0 || layer.queries == nullptr ||
      layer.keys == nullptr) {
    return cudaErrorInvalidValue;
  }
  AttentionPlan p;
  p.finish = traits.NormalizeWith(params.causal_normalize);
  p.all_heads = p.finish == WindowNormalize::kEveryHeadMean;
  p.num_kv_heads = layer.num_kv_heads;
  p.group = layer.num_query_heads / layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.window_rows = layer.window_rows;
  p.num_tokens = layer.num_tokens;
  if (!ScoredWindowRows(traits, layer, params, &p.rows_per_qhead, &p.first_row)) {
    return cudaErrorInvalidValue;
  }
  p.pooled = traits.pooling != PoolingSpan::kNone && params.kernel > 1;
  p.with_output = traits.ReadsValues();
  if (p.with_output && layer.values == nullptr) return cudaErrorInvalidValue;
  // The score kernel's variants (attention_score.cu): no eviction cost shared by every head.
  if (p.with_output && p.all_heads) return cudaErrorInvalidValue;
  p.rows_per_head = p.group * p.rows_per_qhead;
  p.padded_rows = (p.rows_per_head + 7) / 8 * 8;
  p.num_segments = (p.num_tokens + kAttnSegment - 1) / kAttnSegment;
  p.lane_elems = p.head_dim <= 64 ? 8 : (p.head_dim <= 128 ? 16 : 32);

  const size_t rows = static_cast<size_t>(p.num_kv_heads) * p.rows_per_head;
  const size_t seg_cells = rows * static_cast<size_t>(p.num_segments);
  size_t offset = 0;
  p.seg_max_offset = offset;
  offset += Align256(seg_cells * sizeof(float));
  p.seg_sum_offset = offset;
  offset += Align256(seg_cells * sizeof(float));
  p.seg_out_offset = offset;
  if (p.with_output) offset += Align256(seg_cells * p.head_dim * sizeof(float));
  p.row_stats_offset = offset;
  offset += Align256(rows * sizeof(RowStats));
  p.row_out_offset = offset;
  if (p.with_output) offset += Align256(rows * p.head_dim * sizeof(float));
  p.pre_pool_offset = offset;
  if (p.pooled) {
    offset += Align256(static_cast<size_t>(p.num_kv_heads) * p.num_tokens * sizeof(float));
  }
  p.scratch_bytes = offset;
  *plan = p;
  return cudaSuccess;
}

}  // namespace kvtrim::gpu::attn

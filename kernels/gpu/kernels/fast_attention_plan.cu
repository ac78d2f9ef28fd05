// FastAttentionPlan construction (fast_attention.cuh): validation, row chunks and reduction
// segments, token splits and the scratch layout.
#include <algorithm>

#include "kernels/gpu/kernels/fast_attention.cuh"

#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/fast_key_rows.cuh"  // SmCount

namespace kvtrim::gpu::fast {

namespace {

/// The segments of a model-aware reduction (plan->reduce != kSum; rows_per_qhead and group
/// set): S = 2^seg_log2 rows per segment (kPerQ*: a query head's T rows, kGroupSq: the G rows
/// of one window row, each rounded up to a power of two), the chunk layout by the padded row
/// count (as kSum's; kGroupSq with S = 32 takes 128-row chunks, whose warps hold 32 rows), the
/// rows rounded up to a whole warp block B, and how a segment lies in a warp: 2^in_bits of its
/// rows in each thread (a thread holds B / 8 rows), over 2^lane_bits row groups of 8 lanes.
/// False when a segment of kGroupSq would span warps (G > 32) or the rows are out of range.
bool PlanSegments(FastAttentionPlan* p) {
  const bool by_row = p->reduce == Reduce::kGroupSq;
  const int32_t members = by_row ? p->group : p->rows_per_qhead;
  const int32_t segments = by_row ? p->rows_per_qhead : p->group;
  int32_t seg_log2 = 0;
  while ((int64_t{1} << seg_log2) < members) ++seg_log2;
  if (by_row && seg_log2 > 5) return false;
  const int64_t raw = static_cast<int64_t>(segments) << seg_log2;
  if (raw > (int64_t{1} << 24)) return false;
  if (by_row && seg_log2 > 4) {
    p->chunk_rows = 128;
  } else {
    p->chunk_rows = raw <= 16 ? 16 : (raw <= 32 ? 32 : 128);
  }
  const int32_t block_log2 = p->chunk_rows == 128 ? 5 : 4;
  p->block_rows = 1 << block_log2;
  p->rows = static_cast<int32_t>((raw + p->block_rows - 1) / p->block_rows * p->block_rows);
  p->seg_log2 = seg_log2;
  const int32_t thread_log2 = block_log2 - 3;  // rows per thread: B / 8
  if (seg_log2 <= block_log2) {
    p->in_bits = std::min(seg_log2, thread_log2);
    p->lane_bits = seg_log2 - p->in_bits;
  } else {
    p->in_bits = thread_log2;
    p->lane_bits = 3;
  }
  return true;
}

}  // namespace

bool FastAttentionSupported(DType dtype, int32_t head_dim) {
  // f32 runs as bf16 hi + lo planes (twice the shared memory: d <= 128); f16 and bf16 as
  // they arrive (d <= 256).
  const int32_t max_dim = dtype == DType::kF32 ? 128 : 256;
  return head_dim >= 8 && head_dim <= max_dim && head_dim % 8 == 0;
}

cudaError_t MakeFastAttentionPlan(const WindowAttentionTraits& traits, const DeviceLayer& layer,
                                  const ScorerParams& params, FastAttentionPlan* plan,
                                  Reduce reduce) {
  if (plan == nullptr || !FastAttentionSupported(layer.dtype, layer.head_dim)) {
    return cudaErrorInvalidValue;
  }
  // The model-aware reductions: the last window's probabilities, pass B instantiated for
  // DP <= 128 only.
  if (reduce != Reduce::kSum &&
      (traits.rows != WindowRowSpan::kLastWindow || traits.ReadsValues() ||
       layer.head_dim > 128)) {
    return cudaErrorInvalidValue;
  }
  if (layer.num_kv_heads < 1 || layer.num_tokens < 0 || layer.window_rows < 1 ||
      layer.num_query_heads < layer.num_kv_heads ||
      layer.num_query_heads % layer.num_kv_heads != 0 || layer.queries == nullptr ||
      layer.keys == nullptr || layer.num_tokens > (int64_t{1} << 36)) {
    return cudaErrorInvalidValue;
  }
  FastAttentionPlan p;
  p.finish = traits.NormalizeWith(params.causal_normalize);
  p.all_heads = p.finish == WindowNormalize::kEveryHeadMean;
  p.dtype = layer.dtype;
  p.num_kv_heads = layer.num_kv_heads;
  p.group = layer.num_query_heads / layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.padded_dim = layer.head_dim <= 64 ? 64 : (layer.head_dim <= 128 ? 128 : 256);
  p.window_rows = layer.window_rows;
  p.num_tokens = layer.num_tokens;
  if (!attn::ScoredWindowRows(traits, layer, params, &p.rows_per_qhead, &p.first_row)) {
    return cudaErrorInvalidValue;
  }
  p.with_values = traits.ReadsValues();
  if (p.with_values && layer.values == nullptr) return cudaErrorInvalidValue;
  // The kernels' variants (fast_attention.cu): no eviction cost shared by every head.
  if (p.with_values && p.all_heads) return cudaErrorInvalidValue;
  p.reduce = reduce;
  if (reduce == Reduce::kSum) {
    p.rows = p.group * p.rows_per_qhead;
    // DropKV keeps a [16, DP] output accumulator per warp: 32-row chunks. Others take 128
    // rows (4 warps x 32) once there are more than 32.
    p.chunk_rows = p.with_values ? 32 : (p.rows <= 16 ? 16 : (p.rows <= 32 ? 32 : 128));
  } else if (!PlanSegments(&p)) {
    return cudaErrorInvalidValue;
  }
  // Token slices per tile in pass A (fast_attention.cu LaunchForDim): 64 tokens per warp in
  // 128-row chunks, 32 in 32-row chunks, 16 in 16-row chunks.
  p.slices = p.chunk_rows == 128 ? 1 : (p.chunk_rows == 32 ? 2 : 4);
  p.num_chunks = (p.rows + p.chunk_rows - 1) / p.chunk_rows;
  p.num_tiles = std::max<int64_t>(1, (p.num_tokens + kTileTokens - 1) / kTileTokens);
  // Enough CTAs for a few waves, at least one tile each.
  const int64_t target_ctas = 4 * static_cast<int64_t>(SmCount());
  const int64_t per_split = static_cast<int64_t>(p.num_kv_heads) * p.num_chunks;
  const int64_t wanted_splits = std::max<int64_t>(1, (target_ctas + per_split - 1) / per_split);
  int64_t splits = std::min(wanted_splits, p.num_tiles);
  p.tiles_per_split = static_cast<int32_t>((p.num_tiles + splits - 1) / splits);
  splits = (p.num_tiles + p.tiles_per_split - 1) / p.tiles_per_split;
  if (splits > 65535 || p.num_kv_heads > 65535) return cudaErrorInvalidValue;  // grid y, z
  p.num_splits = static_cast<int32_t>(splits);
  p.parts = p.num_splits * p.slices;
  if (reduce == Reduce::kSum) {
    p.direct_finish = p.num_chunks == 1 && !p.all_heads;
  } else if (reduce == Reduce::kGroupSq) {
    p.direct_finish = p.num_chunks == 1;
  } else {
    p.direct_finish = (int64_t{1} << p.seg_log2) <= p.chunk_rows;
  }

  const size_t rows_total =
      static_cast<size_t>(p.num_kv_heads) * static_cast<size_t>(p.num_chunks) * p.chunk_rows;
  // The part regions for `parts` partial statistics per row.
  const auto part_bytes = [&](int64_t parts) {
    const size_t cells = rows_total * static_cast<size_t>(parts);
    return 2 * Align256(cells * sizeof(float)) +
           (p.with_values ? Align256(cells * p.padded_dim * sizeof(float)) : 0);
  };
  // No token count splits finer than wanted_splits (splits = ceil(tiles / ceil(tiles / s))
  // <= s), so this bounds the part regions of any n with this geometry.
  p.part_bytes_any_n = part_bytes(std::min<int64_t>(wanted_splits, 65535) * p.slices);
  const size_t cells = rows_total * static_cast<size_t>(p.parts);
  size_t offset = 0;
  p.part_max_offset = offset;
  offset += Align256(cells * sizeof(float));
  p.part_sum_offset = offset;
  offset += Align256(cells * sizeof(float));
  p.part_out_offset = offset;
  if (p.with_values) offset += Align256(cells * p.padded_dim * sizeof(float));
  p.row_info_offset = offset;
  offset += Align256(rows_total * sizeof(RowInfo));
  p.row_out_offset = offset;
  if (p.with_values) offset += Align256(2 * rows_total * p.padded_dim * sizeof(uint16_t));
  p.partial_offset = offset;
  if (!p.direct_finish) {
    offset += Align256(static_cast<size_t>(p.num_chunks) * p.num_kv_heads *
                       static_cast<size_t>(p.num_tokens) * sizeof(float));
  }
  p.scratch_bytes = offset;
  *plan = p;
  return cudaSuccess;
}

}  // namespace kvtrim::gpu::fast

// FastAttentionPlan construction (fast_attention.cuh): validation, row chunks, token splits
// and the scratch layout.
#include <algorithm>

#include "kernels/gpu/fast_attention.cuh"

#include "kernels/gpu/attention_plan.cuh"

namespace kvtrim::gpu::fast {

namespace {

/// Rounds `bytes` up to a multiple of 256.
size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// Streaming multiprocessors of the current device (132 on an H100 SXM when unknown).
int CurrentSmCount() {
  int device = 0;
  int count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    cudaGetLastError();
    return 132;
  }
  return count;
}

}  // namespace

bool FastAttentionSupported(ScorerKind kind, DType dtype, int32_t head_dim) {
  const bool scorer = kind == ScorerKind::kSnapKV || kind == ScorerKind::kH2O ||
                      kind == ScorerKind::kTova || kind == ScorerKind::kDropKV;
  // f32 runs as bf16 hi + lo planes (twice the shared memory: d <= 128); f16 and bf16 as
  // they arrive (d <= 256).
  const int32_t max_dim = dtype == DType::kF32 ? 128 : 256;
  return scorer && head_dim >= 8 && head_dim <= max_dim && head_dim % 8 == 0;
}

cudaError_t MakeFastAttentionPlan(ScorerKind kind, const DeviceLayer& layer,
                                  const ScorerParams& params, FastAttentionPlan* plan) {
  if (plan == nullptr || !FastAttentionSupported(kind, layer.dtype, layer.head_dim)) {
    return cudaErrorInvalidValue;
  }
  if (layer.num_kv_heads < 1 || layer.num_tokens < 0 || layer.window_rows < 1 ||
      layer.num_query_heads < layer.num_kv_heads ||
      layer.num_query_heads % layer.num_kv_heads != 0 || layer.queries == nullptr ||
      layer.keys == nullptr || layer.num_tokens > (int64_t{1} << 36)) {
    return cudaErrorInvalidValue;
  }
  FastAttentionPlan p;
  p.kind = kind;
  p.dtype = layer.dtype;
  p.num_kv_heads = layer.num_kv_heads;
  p.group = layer.num_query_heads / layer.num_kv_heads;
  p.head_dim = layer.head_dim;
  p.padded_dim = layer.head_dim <= 64 ? 64 : (layer.head_dim <= 128 ? 128 : 256);
  p.window_rows = layer.window_rows;
  p.num_tokens = layer.num_tokens;
  if (!attn::ScoredWindowRows(kind, layer, params, &p.rows_per_qhead, &p.first_row)) {
    return cudaErrorInvalidValue;
  }
  p.with_values = kind == ScorerKind::kDropKV;
  if (p.with_values && layer.values == nullptr) return cudaErrorInvalidValue;
  p.rows = p.group * p.rows_per_qhead;
  // DropKV keeps a [16, DP] output accumulator per warp: 32-row chunks. Others take 128 rows
  // (4 warps x 32) once there are more than 32.
  p.chunk_rows = p.with_values ? 32 : (p.rows <= 16 ? 16 : (p.rows <= 32 ? 32 : 128));
  // Token slices per tile in pass A (fast_attention.cu LaunchForDim): 64 tokens per warp in
  // 128-row chunks, 32 in 32-row chunks, 16 in 16-row chunks.
  p.slices = p.chunk_rows == 128 ? 1 : (p.chunk_rows == 32 ? 2 : 4);
  p.num_chunks = (p.rows + p.chunk_rows - 1) / p.chunk_rows;
  p.num_tiles = std::max<int64_t>(1, (p.num_tokens + kTileTokens - 1) / kTileTokens);
  // Enough CTAs for a few waves, at least one tile each.
  const int64_t target_ctas = 4 * static_cast<int64_t>(CurrentSmCount());
  const int64_t per_split = static_cast<int64_t>(p.num_kv_heads) * p.num_chunks;
  int64_t splits = std::clamp<int64_t>((target_ctas + per_split - 1) / per_split, 1, p.num_tiles);
  p.tiles_per_split = static_cast<int32_t>((p.num_tiles + splits - 1) / splits);
  splits = (p.num_tiles + p.tiles_per_split - 1) / p.tiles_per_split;
  if (splits > 65535) return cudaErrorInvalidValue;
  p.num_splits = static_cast<int32_t>(splits);
  p.parts = p.num_splits * p.slices;
  p.direct_finish = p.num_chunks == 1 && kind != ScorerKind::kTova;

  const size_t rows_total =
      static_cast<size_t>(p.num_kv_heads) * static_cast<size_t>(p.num_chunks) * p.chunk_rows;
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

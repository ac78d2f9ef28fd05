// Test helper shared by the CPU attention tests: an oracle problem as a CpuLayer.
#pragma once

#include "kernels/cpu/cpu_layer.h"
#include "tests/oracle/attention_oracle.h"

namespace kvtrim {

/// Wraps an oracle problem as the fp32 layer the CPU scorers read: keys/values
/// [H_kv, n, d], queries [H_q, w, d], both present.
inline CpuLayer MakeLayer(const oracle::AttentionProblem& pb) {
  CpuLayer layer;
  layer.shape.num_kv_heads = pb.num_kv_heads;
  layer.shape.num_tokens = pb.num_tokens;
  layer.shape.head_dim = pb.head_dim;
  layer.shape.num_query_heads = pb.num_query_heads;
  layer.shape.window_rows = pb.window_rows;
  layer.shape.has_values = true;
  layer.shape.has_queries = true;
  layer.keys = F32Tensor::Owning(pb.keys, {pb.num_kv_heads, pb.num_tokens, pb.head_dim});
  layer.values = F32Tensor::Owning(pb.values, {pb.num_kv_heads, pb.num_tokens, pb.head_dim});
  layer.queries = F32Tensor::Owning(pb.queries, {pb.num_query_heads, pb.window_rows, pb.head_dim});
  layer.softmax_scale = static_cast<float>(pb.scale);
  return layer;
}

}  // namespace kvtrim

// Fast numerics of the model-aware scorers (design.md "Numerics", docs/gpu.md "Model-aware
// scorers"): CriticalKV, LaProx and Expected Attention with their o_proj-sized and d x d
// products on tensor cores (mma.sync m16n8k16, f16 operands, fp32 accumulate), within the
// tolerance of the canonical kernels of model_scorers.cu. See fast_model.cu for the kernels
// and the error bounds.
//
// What runs fast, per scorer (everything else as in model_scorers.cu, in plain fp32):
//   CriticalKV l1   ||v W_O^q||_1: a [P, d] x [d, D] GEMM per query head with |.| and the row
//                   sum in the epilogue (FastL1Kernel), reading the f16 W_O image below.
//   CriticalKV l2,  sqrt(v Gram v): a [P, d] x [d, d] GEMM per matrix with the row-wise dot in
//   LaProx          the epilogue (FastQuadKernel).
//   CriticalKV,     the window statistics (per-query-head means; per-query-head
//   LaProx          sqrt(sum_t p^2); sqrt(sum_t m_t^2) of the group mean m_t): one run of the
//                   fast attention passes of fast_attention.cuh with the matching Reduce
//                   (one pass over K for every query head of a group).
//   Expected        the logits mu.k * scale + k Sigma k * half_scale2 by the same GEMM, then a
//   Attention       softmax over n and the score in fp32 with the hardware exp2.
// Deterministic: fixed tiles, fixed reduction orders, no atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/gpu/kernels/launchers.h"

namespace kvtrim::gpu {

/// Where the parts of the f16 W_O image of one layer lie (ModelTensor::kWoF16):
///   [0, header_bytes)        float inv_scale[H_q]: 2^-k_q, the inverse of head q's scale
///   [header_bytes, bytes)    f16 [H_q, D, DP]: row (q, e) = 2^k_q * w_o[e, q*d : q*d + d]
///                            rounded to nearest even, zero past d
/// with DP = 64 for d <= 64, else 128, and k_q the power of two that takes the largest
/// |w_o| of head q into [2^14, 2^15) (0 for an all-zero head; clamped to [-126, 126]).
struct FastWoLayout {
  int32_t num_query_heads = 0;  // H_q
  int32_t head_dim = 0;         // d
  int32_t hidden = 0;           // D
  int32_t padded_dim = 0;       // DP
  size_t header_bytes = 0;      // H_q floats rounded up to 256 bytes
  size_t bytes = 0;             // the whole image
};

/// The layout of the image of a model with H_q query heads, head dimension d (8 <= d <= 128)
/// and hidden size D.
FastWoLayout MakeFastWoLayout(int32_t num_query_heads, int32_t head_dim, int32_t hidden);

/// Builds the image on the host from o_proj.weight w_o [D, H_q * d] fp32, row-major
/// (RegisteredModel::w_o of one layer). Empty for shapes the fast kernels do not take (d not
/// a multiple of 8 in [8, 128], H_q or D < 1).
std::vector<uint8_t> FastWoImage(const float* w_o, int32_t num_query_heads, int32_t head_dim,
                                 int32_t hidden);

/// Builds the same image on the device from the lane-major fp32 copy that the canonical
/// kernels read (DeviceModelInputs::w_o [H_q, D, 8E]) into `image` (device,
/// MakeFastWoLayout(...).bytes), bit-identical to FastWoImage. For callers that hold only the
/// lane-major copy (benchmarks). cudaErrorInvalidValue for null pointers or bad shapes.
cudaError_t LaunchBuildFastWo(const float* w_o_lane_major, int32_t num_query_heads,
                              int32_t head_dim, int32_t hidden, void* image, cudaStream_t stream);

/// Model inputs the fast kernels read besides DeviceModelInputs.
struct FastModelInputs {
  const void* w_o16 = nullptr;  // criticalkv l1: the FastWoImage of the layer (device)
};

/// True when LaunchFastModelScore takes `kind` in `dtype` at head dimension `head_dim`:
/// criticalkv (l1 and l2), laprox (every gqa) and expected_attention, d a multiple of 8 in
/// [8, 128], f32 / f16 / bf16.
bool FastModelSupported(ScorerKind kind, DType dtype, int32_t head_dim);

/// Device scratch bytes LaunchFastModelScore needs (0 when the layer, parameters or model
/// inputs are not valid for `kind`, or the fast kernels do not take it). Reads shapes only
/// (pointers must be non-null where the scorer reads them).
size_t FastModelScoreScratchBytes(ScorerKind kind, const DeviceLayer& layer,
                                  const ScorerParams& params, const DeviceModelInputs& model,
                                  const FastModelInputs& fast_inputs);

/// The fast model-aware scorers, outputs as LaunchModelScore (launchers.h), without protection:
///   kCriticalKV          scores = attention [H_kv, n], critical [H_kv, n] (0 for j >= n - window)
///   kLaProx              scores = p [H_kv, n] (0 for j >= n - window)
///   kExpectedAttention   scores [H_kv, n]
/// Model inputs: criticalkv l1 fast_inputs.w_o16 and model.hidden; criticalkv l2 and laprox
/// mean / head_bound model.head_gram; laprox summed_wo model.group_gram; expected_attention
/// model.ea_mean, ea_cov, half_scale2, num_query_heads. Returns cudaErrorInvalidValue for
/// invalid shapes or parameters, a dtype / d the fast kernels do not take, missing inputs or
/// scratch smaller than FastModelScoreScratchBytes; n = 0 launches nothing.
cudaError_t LaunchFastModelScore(ScorerKind kind, const DeviceLayer& layer,
                                 const ScorerParams& params, const DeviceModelInputs& model,
                                 const FastModelInputs& fast_inputs, float* scores,
                                 float* critical, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream);

}  // namespace kvtrim::gpu

// The CriticalKV l1 norm kernels of fast_l1.cuh.
//
//  FastL1Kernel     mma.sync: CTA = 8 warps, one (KV head h, tile of BM tokens, query head q
//                   of the group): each warp holds 16 * MT token rows of V as A fragments for
//                   the whole run and streams W_O^q in chunks of BN rows through a 4-stage
//                   cp.async ring in shared memory (16-byte padded rows: ldmatrix without bank
//                   conflicts); per chunk MT x BN/8 accumulators over d / 16 k-steps, then |.|
//                   summed into per-row registers.
//  WgmmaL1Kernel    wgmma (sm_90a): CTA = 3 warpgroups for 16-bit rows at d = 128, else 2;
//                   warpgroup w holds MT tiles of 64 token rows as A fragments (warp i of it
//                   rows 16 i .. 16 i + 15 of each), and the CTA streams W_O^q in chunks of
//                   64 rows through a 6-stage cp.async ring in
//                   the 128-byte swizzled K-major layout of wgmma.cuh. Each (chunk, row tile)
//                   is one group of d / 16 asynchronous m64n64k16 steps into one of two
//                   accumulator sets; the |.| row sums of one group run while the next group
//                   computes. A stage is refilled two chunks after it was last read, once the
//                   group reading it has been waited for by every warpgroup.
// Work items of both are ordered (h, tile, q) so that the CTAs on the device at one time
// share the G W_O slices of one KV head (4 MiB at D = 4096) and each V tile, in L2.
#include "kernels/gpu/kernels/fast_l1.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/gpu/kernels/fast_mma.cuh"
#include "kernels/gpu/kernels/fast_model_tiles.cuh"
#include "kernels/gpu/kernels/wgmma.cuh"

namespace kvtrim::gpu {

namespace {

using namespace fast_tiles;  // CpAsync*, LdMatrixX4, SmemAddress, tiles

constexpr int kL1Stages = 4;   // cp.async ring of W_O chunks (mma.sync)
constexpr int kWgStages = 6;   // cp.async ring of W_O chunks (wgmma)
constexpr int kWgDepth = kWgStages - 2;  // chunks in flight ahead of the one computed
constexpr int kWgBN = 64;      // W_O rows per wgmma chunk (the n of m64n64k16)

/// Writes the norms of this warp's rows: row j = row0 + m_stride m + g + 8 hf (lane = 4 g + t)
/// gets the quad's sum of rs[m][hf], unscaled by the row's and W_O^q's powers of two; rows at
/// or past the prefix count are left alone.
template <int MT>
__device__ __forceinline__ void WriteNorms(const L1FastArgs& a, int q, int64_t row0,
                                           int m_stride, int lane, const float (&rs)[MT][2],
                                           const float (&inv)[MT][2]) {
  const float w_inv = a.w_inv[q];
  const int g = lane >> 2;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float sum = SumOverQuad(rs[m][hf]);
      const int64_t j = row0 + static_cast<int64_t>(m_stride) * m + g + 8 * hf;
      if ((lane & 3) == 0 && j < a.count) {
        a.out[static_cast<int64_t>(q) * a.n + j] = sum * inv[m][hf] * w_inv;
      }
    }
  }
}

// ---- mma.sync ----------------------------------------------------------------------------------

/// Tile shape of FastL1Kernel for input T and DP: MT row tiles per warp, BN W_O rows per
/// chunk, PL planes of A (2 for f32 inputs). A fragments take PL * MT * DP / 4 registers.
template <typename T, int DP>
struct L1Shape {
  static constexpr int PL = std::is_same<T, float>::value ? 2 : 1;
  static constexpr int MT = (DP == 128 ? 2 : 4) / PL;
  static constexpr int BN = DP == 128 ? 64 : 32;
  static constexpr int BM = kWarps * 16 * MT;  // tokens per CTA
  static constexpr int kStride = DP + 8;      // f16 elements per shared row
  static constexpr size_t kSmem = static_cast<size_t>(kL1Stages) * BN * kStride * 2;
};

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads, 1) FastL1Kernel(L1FastArgs a) {
  using S = L1Shape<T, DP>;
  constexpr int PL = S::PL;
  constexpr int MT = S::MT;
  constexpr int BN = S::BN;
  constexpr int NT = BN / 8;
  constexpr int KC = DP / 16;
  constexpr int kStride = S::kStride;
  constexpr int kPieces = BN * DP / 8;  // 16-byte pieces per chunk
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* sw = reinterpret_cast<__half*>(smem_raw);  // [kL1Stages][BN][kStride]

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const WorkItem item = CurrentWorkItem(a.num_tiles, a.group);
  const int h = item.h;
  const int64_t tile = item.part;
  const int q = h * a.group + item.sub;
  const __half* wq = a.w16 + static_cast<int64_t>(q) * a.hidden * DP;
  const int chunks = (a.hidden + BN - 1) / BN;

  auto stage = [&](int c) {
    __half* dst = sw + (c % kL1Stages) * BN * kStride;
    for (int idx = tid; idx < kPieces; idx += kThreads) {
      const int r = idx / (DP / 8);
      const int col = (idx % (DP / 8)) * 8;
      const int64_t e = static_cast<int64_t>(c) * BN + r;
      const bool valid = e < a.hidden;
      CpAsync16(SmemAddress(dst + r * kStride + col), valid ? wq + e * DP + col : wq,
                valid ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kL1Stages - 1; ++s) {
    if (s < chunks) stage(s);
    CpAsyncCommit();
  }

  // V rows of this warp as A fragments, for the whole run.
  uint32_t af[PL][MT][KC][4];
  float inv[MT][2];
  const T* head = static_cast<const T*>(a.values) + static_cast<int64_t>(h) * a.n * a.d;
  const int64_t row0 = tile * S::BM + warp * 16 * MT;
  LoadTokenFragments<T, DP, MT, PL>(head, row0, a.count, a.d, lane, af, inv);

  float rs[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) rs[m][0] = rs[m][1] = 0.0f;

  for (int c = 0; c < chunks; ++c) {
    CpAsyncWait<kL1Stages - 2>();
    __syncthreads();  // chunk c is in; every warp is done with the stage reloaded next
    if (c + kL1Stages - 1 < chunks) stage(c + kL1Stages - 1);
    CpAsyncCommit();
    const __half* ws = sw + (c % kL1Stages) * BN * kStride;
    float acc[MT][NT][4];
    ZeroAccumulators(acc);
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) AddTileProducts<kStride, PL>(acc, af, ws, 0, kc, lane);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        rs[m][0] += fabsf(acc[m][nt][0]);
        rs[m][0] += fabsf(acc[m][nt][1]);
        rs[m][1] += fabsf(acc[m][nt][2]);
        rs[m][1] += fabsf(acc[m][nt][3]);
      }
    }
  }
  CpAsyncWait<0>();  // only empty groups remain; nothing may be in flight at exit

  WriteNorms(a, q, row0, 16, lane, rs, inv);
}

// ---- wgmma -------------------------------------------------------------------------------------

/// Tile shape of WgmmaL1Kernel for input T and DP: kWG warpgroups of MT row tiles of 64, PL
/// planes of A (2 for f32 inputs); A fragments take PL * MT * DP / 4 registers, the two
/// accumulator sets 64. 16-bit rows at d = 128 take three warpgroups of one tile (122
/// registers: while one warpgroup drains its groups the other two keep the tensor pipe busy;
/// H100, FastL1Timing: 2.17-2.19 ms against 2.32 ms for two of two tiles, 2.27 ms for four of
/// one, which spills); elsewhere two.
template <typename T, int DP>
struct WgL1Shape {
  static constexpr int PL = std::is_same<T, float>::value ? 2 : 1;
  static constexpr bool kThree = PL == 1 && DP == 128;
  static constexpr int kWG = kThree ? 3 : 2;
  static constexpr int MT = kThree ? 1 : (DP == 128 ? 2 : 4) / PL;
  static constexpr int KC = DP / 16;
  static constexpr int kThreadsWg = 128 * kWG;  // threads per CTA
  static constexpr int BM = kWG * 64 * MT;      // tokens per CTA
  static constexpr uint32_t kSlabBytes = kWgBN * 128;  // one 64-wide k slab of a chunk
  static constexpr uint32_t kStageBytes = (DP / 64) * kSlabBytes;
  static constexpr size_t kSmem = static_cast<size_t>(kWgStages) * kStageBytes + 1024;
};

/// Issues one group: acc (+)= A(row tile m, planes) x B(chunk at `stage`) over every k-step.
template <int PL, int MT, int KC>
__device__ __forceinline__ void IssueL1Group(float (&acc)[32], const uint32_t (&af)[PL][MT][KC][4],
                                             int m, uint32_t stage, uint32_t slab_bytes) {
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < KC; ++kk) {
    const uint64_t desc =
        wgmma::DescriptorSw128(stage + static_cast<uint32_t>(kk >> 2) * slab_bytes + (kk & 3) * 32);
#pragma unroll
    for (int pl = 0; pl < PL; ++pl) wgmma::MmaM64N64K16(acc, af[pl][m][kk], desc, kk > 0 || pl > 0);
  }
  wgmma::Commit();
}

/// Adds |acc| of the group's rows to the row sums rs[0] (row g) and rs[1] (row g + 8).
__device__ __forceinline__ void AddAbsRows(const float (&acc)[32], float (&rs)[2]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    rs[0] += fabsf(acc[4 * i]);
    rs[0] += fabsf(acc[4 * i + 1]);
    rs[1] += fabsf(acc[4 * i + 2]);
    rs[1] += fabsf(acc[4 * i + 3]);
  }
}

template <typename T, int DP>
__global__ void __launch_bounds__(WgL1Shape<T, DP>::kThreadsWg, 1) WgmmaL1Kernel(L1FastArgs a) {
#if !KVTRIM_HAS_WGMMA
  __trap();  // never launched: L1UsesWgmma is false where the sm_90a code does not run
#endif
  using S = WgL1Shape<T, DP>;
  constexpr int PL = S::PL;
  constexpr int MT = S::MT;
  constexpr int KC = S::KC;
  constexpr int kPieces = kWgBN * DP / 8;  // 16-byte pieces per chunk
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;  // slabs 1024-aligned

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const WorkItem item = CurrentWorkItem(a.num_tiles, a.group);
  const int h = item.h;
  const int q = h * a.group + item.sub;
  const __half* wq = a.w16 + static_cast<int64_t>(q) * a.hidden * DP;
  constexpr int kPairChunks = 2;  // chunks per loop iteration
  const int chunks = (a.hidden + kWgBN * kPairChunks - 1) / (kWgBN * kPairChunks) * kPairChunks;

  // Chunk c -> stage c % kWgStages, row r's piece p at slab p / 8, swizzled piece p % 8 ^ r % 8.
  auto stage = [&](int c) {
    const uint32_t dst = smem + static_cast<uint32_t>(c % kWgStages) * S::kStageBytes;
    for (int idx = tid; idx < kPieces; idx += S::kThreadsWg) {
      const int r = idx / (DP / 8);
      const int p = idx % (DP / 8);
      const int64_t e = static_cast<int64_t>(c) * kWgBN + r;
      const bool valid = e < a.hidden;
      const uint32_t to = dst + static_cast<uint32_t>(p >> 3) * S::kSlabBytes +
                          static_cast<uint32_t>(r) * 128u +
                          (static_cast<uint32_t>((p & 7) ^ (r & 7)) << 4);
      CpAsync16(to, valid ? wq + e * DP + 8 * p : wq, valid ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < kWgDepth; ++s) {
    if (s < chunks) stage(s);
    CpAsyncCommit();
  }

  // V rows of this warp as A fragments, for the whole run: row tile m of warpgroup wg starts
  // at row0 + 64 m.
  uint32_t af[PL][MT][KC][4];
  float inv[MT][2];
  const T* head = static_cast<const T*>(a.values) + static_cast<int64_t>(h) * a.n * a.d;
  const int64_t row0 = item.part * S::BM + (warp >> 2) * 64 * MT + (warp & 3) * 16;
  LoadTokenFragments<T, DP, MT, PL>(head, row0, a.count, a.d, lane, af, inv, 64);

  float rs[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) rs[m][0] = rs[m][1] = 0.0f;
  float acc0[32], acc1[32];  // groups alternate between the two sets

  // Groups run in the order (chunk, m), kPairChunks chunks per iteration, group i of an
  // iteration in set i % 2; every group is waited for within its iteration (ptxas keeps the
  // wgmma asynchronous only when no group is in flight across the loop's back edge), and the
  // chunk count is rounded up to whole iterations (the extra chunk reads zero rows).
  constexpr int kGroups = kPairChunks * MT;
#pragma unroll 1
  for (int c0 = 0; c0 < chunks; c0 += kPairChunks) {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const int m = i % MT;
      if (m == 0) {
        const int c = c0 + i / MT;
        CpAsyncWait<kWgDepth - 1>();
        wgmma::FenceProxyAsyncShared();
        __syncthreads();  // chunk c is in; every group that read chunk c - 2 is done
        if (c + kWgDepth < chunks) stage(c + kWgDepth);
        CpAsyncCommit();
      }
      const uint32_t at =
          smem + static_cast<uint32_t>((c0 + i / MT) % kWgStages) * S::kStageBytes;
      if ((i & 1) != 0) {
        IssueL1Group<PL, MT, KC>(acc1, af, m, at, S::kSlabBytes);
        wgmma::Wait<1>();
        wgmma::Pin(acc0);
        AddAbsRows(acc0, rs[(i - 1) % MT]);
      } else {
        IssueL1Group<PL, MT, KC>(acc0, af, m, at, S::kSlabBytes);
        if (i > 0) {
          wgmma::Wait<1>();
          wgmma::Pin(acc1);
          AddAbsRows(acc1, rs[(i - 1) % MT]);
        }
      }
    }
    wgmma::Wait<0>();
    wgmma::Pin(acc1);
    AddAbsRows(acc1, rs[(kGroups - 1) % MT]);
  }
  CpAsyncWait<0>();  // only empty groups remain; nothing may be in flight at exit

  WriteNorms(a, q, row0, 64, lane, rs, inv);
}

// ---- Launch ------------------------------------------------------------------------------------

template <typename T, int DP>
cudaError_t LaunchL1Typed(L1FastArgs args, int32_t num_kv_heads, bool use_wgmma,
                          cudaStream_t stream) {
  if (use_wgmma) {
    using S = WgL1Shape<T, DP>;
    static_assert(S::kSmem <= 227 * 1024, "shared memory of one CTA");
    args.num_tiles = (args.count + S::BM - 1) / S::BM;
    return LaunchWithSmem(WgmmaL1Kernel<T, DP>, args.num_tiles * args.group * num_kv_heads,
                          S::kSmem, args, stream, S::kThreadsWg);
  }
  using S = L1Shape<T, DP>;
  static_assert(S::kSmem <= 227 * 1024, "shared memory of one CTA");
  args.num_tiles = (args.count + S::BM - 1) / S::BM;
  return LaunchWithSmem(FastL1Kernel<T, DP>, args.num_tiles * args.group * num_kv_heads,
                        S::kSmem, args, stream);
}

template <typename T>
cudaError_t LaunchL1ForType(const L1FastArgs& args, int dp, int32_t h, bool use_wgmma,
                            cudaStream_t stream) {
  if (dp == 64) return LaunchL1Typed<T, 64>(args, h, use_wgmma, stream);
  if (dp == 128) return LaunchL1Typed<T, 128>(args, h, use_wgmma, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchL1(const L1FastArgs& args, DType dtype, int dp, int32_t num_kv_heads,
                     cudaStream_t stream, MmaKernel kernel) {
  bool use_wgmma = false;
  if (!ResolveMmaKernel(kernel, &use_wgmma)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kF32: return LaunchL1ForType<float>(args, dp, num_kv_heads, use_wgmma, stream);
    case DType::kF16: return LaunchL1ForType<__half>(args, dp, num_kv_heads, use_wgmma, stream);
    case DType::kBF16:
      return LaunchL1ForType<__nv_bfloat16>(args, dp, num_kv_heads, use_wgmma, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu

// The quadratic-form kernels of fast_quad.cuh.
//
//  FastQuadKernel   mma.sync: CTA = 8 warps over tiles of BM token rows of one matrix (its KV
//                   head's rows): the matrix's hi and lo planes stay in shared memory, y = x M^T
//                   runs in groups of 16 columns and x . y is taken in the epilogue from the
//                   A fragments themselves (the C layout of column tile 2k + s is the A layout
//                   of k-step k, half s).
//  WgmmaQuadKernel  wgmma (sm_90a): CTA = 2 warpgroups over tiles of 128 token rows (64 per
//                   warpgroup, warp i rows 16 i .. 16 i + 15) of one matrix, whose planes stay
//                   in shared memory in the 128-byte swizzled K-major layout of wgmma.cuh; per
//                   tile one group of m64n64k16 steps per 64 columns (x M_hi over every plane of
//                   x, then x_hi M_lo) into its own accumulator set, the first group's epilogue
//                   running while the second computes; every group is waited for within its
//                   tile (ptxas keeps wgmma asynchronous only when none is in flight across the
//                   loop's back edge), two tiles per iteration for 16-bit inputs so that the
//                   pipe drains once per two tiles.
//                   Two CTAs per SM at d <= 64, one at d = 128 (registers).
// Work items of both are ordered (h, tile group, matrix) so that the CTAs on the device at one
// time share their KV head's token rows in L2.
#include "kernels/gpu/kernels/fast_quad.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/gpu/kernels/fast_mma.cuh"
#include "kernels/gpu/kernels/fast_model_tiles.cuh"
#include "kernels/gpu/kernels/wgmma.cuh"

namespace kvtrim::gpu {

namespace {

using namespace fast_tiles;  // CpAsync*, LdMatrixX4, SmemAddress, tiles

constexpr int kQuadGroup = 2;        // n8 column tiles per epilogue group of FastQuadKernel
constexpr int kQuadTilesPerCta = 4;     // tiles per CTA of FastQuadKernel
constexpr int kWgQuadTilesPerCta = 32;  // of WgmmaQuadKernel: each CTA stages its matrix once
                                        // (H100, 128K x 32 matrices: 0.865 ms at 4 tiles,
                                        // 0.787 at 16, 0.765 at 32)

/// Adds column tile ct (8 columns, with y's values `acc` of rows g, g + 8 in the m16n8 C
/// layout) to the row sums: quad[hf] += x . y over those columns, and (kEA) lin[hf] +=
/// mu . x. The x values of column tile ct are A fragment k-step ct / 2, registers
/// 2 (ct % 2) (row g) and 2 (ct % 2) + 1 (row g + 8); f32 inputs add their lo plane.
template <int PL, int MT, int KC, bool kEA>
__device__ __forceinline__ void AddColumnTile(const uint32_t (&af)[PL][MT][KC][4], int m, int ct,
                                              const float* acc, const float* smu, int t,
                                              float (&quad)[2], float (&lin)[2]) {
  const int kc = ct / 2;
  const int r = 2 * (ct % 2);
  float2 x0 = HalfPair(af[0][m][kc][r]);
  float2 x1 = HalfPair(af[0][m][kc][r + 1]);
  if constexpr (PL > 1) {
    const float2 l0 = HalfPair(af[PL - 1][m][kc][r]);
    const float2 l1 = HalfPair(af[PL - 1][m][kc][r + 1]);
    x0 = make_float2(x0.x + l0.x, x0.y + l0.y);
    x1 = make_float2(x1.x + l1.x, x1.y + l1.y);
  }
  quad[0] = fmaf(x0.x, acc[0], quad[0]);
  quad[0] = fmaf(x0.y, acc[1], quad[0]);
  quad[1] = fmaf(x1.x, acc[2], quad[1]);
  quad[1] = fmaf(x1.y, acc[3], quad[1]);
  if constexpr (kEA) {
    const float2 mu = *reinterpret_cast<const float2*>(smu + 8 * ct + 2 * t);
    lin[0] = fmaf(x0.x, mu.x, lin[0]);
    lin[0] = fmaf(x0.y, mu.y, lin[0]);
    lin[1] = fmaf(x1.x, mu.x, lin[1]);
    lin[1] = fmaf(x1.y, mu.y, lin[1]);
  }
}

/// Writes the forms of this warp's rows: row j = row0 + m_stride m + g + 8 hf (lane = 4 g + t)
/// from the quad's sums, the scales undone one power of two at a time (no intermediate under-
/// or overflow); rows at or past the count are left alone.
template <int MT, bool kEA>
__device__ __forceinline__ void WriteForms(const QuadFastArgs& a, int mat, int64_t row0,
                                           int m_stride, int lane, float m_inv,
                                           const float (&quad)[MT][2], const float (&lin)[MT][2],
                                           const float (&inv)[MT][2]) {
  const int g = lane >> 2;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float q = SumOverQuad(quad[m][hf]) * inv[m][hf] * inv[m][hf] * m_inv;
      float value;
      if constexpr (kEA) {
        const float l = SumOverQuad(lin[m][hf]) * inv[m][hf];
        value = l * a.scale + q * a.half_scale2;
      } else {
        value = sqrtf(fmaxf(q, 0.0f));
      }
      const int64_t j = row0 + static_cast<int64_t>(m_stride) * m + g + 8 * hf;
      if ((lane & 3) == 0 && j < a.count) a.out[static_cast<int64_t>(mat) * a.n + j] = value;
    }
  }
}

// ---- mma.sync ----------------------------------------------------------------------------------

/// Tile shape of FastQuadKernel: MT row tiles per warp, PL planes of x (2 for f32 inputs).
template <typename T, int DP>
struct QuadShape {
  static constexpr int PL = std::is_same<T, float>::value ? 2 : 1;
  static constexpr int MT = 2 / PL;
  static constexpr int BM = kWarps * 16 * MT;
  static constexpr int kStride = DP + 8;
  static constexpr size_t kSmem = 2 * static_cast<size_t>(DP) * kStride * 2 + DP * sizeof(float);
};

template <typename T, int DP, bool kEA>
__global__ void __launch_bounds__(kThreads, DP == 128 ? 1 : 2) FastQuadKernel(QuadFastArgs a) {
  using S = QuadShape<T, DP>;
  constexpr int PL = S::PL;
  constexpr int MT = S::MT;
  constexpr int KC = DP / 16;
  constexpr int kStride = S::kStride;
  constexpr int kGroups = DP / 8 / kQuadGroup;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* sm = reinterpret_cast<__half*>(smem_raw);  // [2][DP][kStride]: hi, lo
  float* smu = reinterpret_cast<float*>(sm + 2 * DP * kStride);  // [DP] (EA)

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int t = lane & 3;
  const int g = lane >> 2;
  const WorkItem item = CurrentWorkItem(a.tile_groups, a.mats_per_kv);
  const int h = item.h;
  const int64_t tile_group = item.part;
  const int mat = h * a.mats_per_kv + item.sub;

  const __half* src = a.planes + static_cast<int64_t>(mat) * 2 * DP * DP;
  for (int idx = tid; idx < 2 * DP * DP / 8; idx += kThreads) {
    const int r = idx / (DP / 8);  // plane * DP + row
    const int col = (idx % (DP / 8)) * 8;
    CpAsync16(SmemAddress(sm + r * kStride + col), src + r * DP + col, 16);
  }
  CpAsyncCommit();
  if constexpr (kEA) {
    for (int c = tid; c < DP; c += kThreads) smu[c] = a.mean[static_cast<int64_t>(mat) * DP + c];
  }
  CpAsyncWait<0>();
  __syncthreads();
  const float m_inv = a.mat_inv[mat];
  const T* head = static_cast<const T*>(a.x) + static_cast<int64_t>(h) * a.n * a.d;

  for (int64_t tile = tile_group; tile < a.num_tiles; tile += a.tile_groups) {
    uint32_t af[PL][MT][KC][4];
    float inv[MT][2];
    const int64_t row0 = tile * S::BM + warp * 16 * MT;
    LoadTokenFragments<T, DP, MT, PL>(head, row0, a.count, a.d, lane, af, inv);
    float quad[MT][2];
    float lin[MT][2];  // EA: mu . x, formed with x . y from the same converted pairs
#pragma unroll
    for (int m = 0; m < MT; ++m) quad[m][0] = quad[m][1] = lin[m][0] = lin[m][1] = 0.0f;
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) {
      float acc[MT][kQuadGroup][4];
      ZeroAccumulators(acc);
      // x M_hi over every plane of x, then x_hi M_lo (the lo x lo product is below 2^-33).
      const int r0 = 8 * kQuadGroup * grp;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        AddTileProducts<kStride, PL>(acc, af, sm, r0, kc, lane);
        AddTileProducts<kStride, 1>(acc, af, sm + DP * kStride, r0, kc, lane);
      }
      // x . y over the group's columns.
#pragma unroll
      for (int nt = 0; nt < kQuadGroup; ++nt) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          AddColumnTile<PL, MT, KC, kEA>(af, m, kQuadGroup * grp + nt, acc[m][nt], smu, t,
                                         quad[m], lin[m]);
        }
      }
    }
    WriteForms<MT, kEA>(a, mat, row0, 16, lane, m_inv, quad, lin, inv);
  }
}

// ---- wgmma -------------------------------------------------------------------------------------

/// Tile shape of WgmmaQuadKernel: PL planes of x, one row tile of 64 per warpgroup and tile,
/// kTiles tiles per loop iteration, DP / 64 column groups of 64.
template <typename T, int DP>
struct WgQuadShape {
  static constexpr int PL = std::is_same<T, float>::value ? 2 : 1;
  static constexpr int KC = DP / 16;
  static constexpr int kGroups = DP / 64;
  static constexpr int kTiles = PL == 1 ? 2 : 1;  // tiles per loop iteration (registers)
  static constexpr int BM = 128;  // tokens per tile (two warpgroups)
  static constexpr uint32_t kSlabBytes = DP * 128;                 // one 64-wide k slab
  static constexpr uint32_t kPlaneBytes = (DP / 64) * kSlabBytes;  // DP x DP f16
  static constexpr size_t kSmem = 2 * static_cast<size_t>(kPlaneBytes) + DP * sizeof(float) + 1024;
};

/// Issues one group: acc = x (M_hi columns [64 grp, 64 grp + 64)) over every plane of row tile
/// m's x, plus x_hi (M_lo, the same columns).
template <int PL, int MT, int KC>
__device__ __forceinline__ void IssueQuadGroup(float (&acc)[32],
                                               const uint32_t (&af)[PL][MT][KC][4], int m,
                                               uint32_t planes, uint32_t plane_bytes,
                                               uint32_t slab_bytes, int grp) {
  wgmma::Fence();
#pragma unroll
  for (int mat = 0; mat < 2; ++mat) {
#pragma unroll
    for (int kk = 0; kk < KC; ++kk) {
      const uint32_t at = planes + static_cast<uint32_t>(mat) * plane_bytes +
                          static_cast<uint32_t>(kk >> 2) * slab_bytes +
                          static_cast<uint32_t>(grp) * 64u * 128u + (kk & 3) * 32;
      const uint64_t desc = wgmma::DescriptorSw128(at);
      const int planes_used = mat == 0 ? PL : 1;
#pragma unroll
      for (int pl = 0; pl < planes_used; ++pl) {
        wgmma::MmaM64N64K16(acc, af[pl][m][kk], desc, mat > 0 || kk > 0 || pl > 0);
      }
    }
  }
  wgmma::Commit();
}

/// The epilogue of row tile m's group `grp`: its 8 column tiles into the row sums.
template <int PL, int MT, int KC, bool kEA>
__device__ __forceinline__ void AddQuadGroup(const float (&acc)[32],
                                             const uint32_t (&af)[PL][MT][KC][4], int m, int grp,
                                             const float* smu, int t, float (&quad)[2],
                                             float (&lin)[2]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    AddColumnTile<PL, MT, KC, kEA>(af, m, 8 * grp + i, acc + 4 * i, smu, t, quad, lin);
  }
}

template <typename T, int DP, bool kEA>
__global__ void __launch_bounds__(kThreads, DP == 128 ? 1 : 2) WgmmaQuadKernel(QuadFastArgs a) {
#if !KVTRIM_HAS_WGMMA
  __trap();  // never launched: WgmmaAvailable is false where the sm_90a code does not run
#endif
  using S = WgQuadShape<T, DP>;
  constexpr int PL = S::PL;
  constexpr int KC = S::KC;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t planes = (SmemAddress(smem_raw) + 1023u) & ~1023u;  // slabs 1024-aligned
  float* smu = reinterpret_cast<float*>(smem_raw + (planes - SmemAddress(smem_raw)) +
                                        2 * S::kPlaneBytes);  // [DP] (EA)

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int t = lane & 3;
  const WorkItem item = CurrentWorkItem(a.tile_groups, a.mats_per_kv);
  const int h = item.h;
  const int mat = h * a.mats_per_kv + item.sub;

  // Both planes, row r (an output column) piece p (8 k values) at slab p / 8, swizzled piece
  // p % 8 ^ r % 8.
  const __half* src = a.planes + static_cast<int64_t>(mat) * 2 * DP * DP;
  for (int idx = tid; idx < 2 * DP * DP / 8; idx += kThreads) {
    const int row = idx / (DP / 8);  // plane * DP + r
    const int r = row % DP;
    const int p = idx % (DP / 8);
    const uint32_t to = planes + static_cast<uint32_t>(row / DP) * S::kPlaneBytes +
                        static_cast<uint32_t>(p >> 3) * S::kSlabBytes +
                        static_cast<uint32_t>(r) * 128u +
                        (static_cast<uint32_t>((p & 7) ^ (r & 7)) << 4);
    CpAsync16(to, src + static_cast<int64_t>(row) * DP + 8 * p, 16);
  }
  CpAsyncCommit();
  if constexpr (kEA) {
    for (int c = tid; c < DP; c += kThreads) smu[c] = a.mean[static_cast<int64_t>(mat) * DP + c];
  }
  CpAsyncWait<0>();
  wgmma::FenceProxyAsyncShared();
  __syncthreads();
  const float m_inv = a.mat_inv[mat];
  const T* head = static_cast<const T*>(a.x) + static_cast<int64_t>(h) * a.n * a.d;

  // kTiles tiles per iteration (tile, tile + tile_groups), their groups in the order (tile,
  // column group), group i in set i % 2: the pipe drains once per iteration. A tile past the
  // last reads zero rows and writes nothing.
  constexpr int kTiles = S::kTiles;
  constexpr int kGroupsPerIter = kTiles * S::kGroups;
  const int64_t row_in_tile = (warp >> 2) * 64 + (warp & 3) * 16;
  const int64_t tile_stride = a.tile_groups * S::BM;  // rows between an iteration's tiles
  for (int64_t tile = item.part; tile < a.num_tiles; tile += kTiles * a.tile_groups) {
    uint32_t af[PL][kTiles][KC][4];
    float inv[kTiles][2];
    const int64_t row0 = tile * S::BM + row_in_tile;
    LoadTokenFragments<T, DP, kTiles, PL>(head, row0, a.count, a.d, lane, af, inv, tile_stride);
    float quad[kTiles][2], lin[kTiles][2];
#pragma unroll
    for (int m = 0; m < kTiles; ++m) quad[m][0] = quad[m][1] = lin[m][0] = lin[m][1] = 0.0f;
    float acc0[32], acc1[32];
#pragma unroll
    for (int i = 0; i < kGroupsPerIter; ++i) {
      const int m = i / S::kGroups;
      const int grp = i % S::kGroups;
      if ((i & 1) == 0) {
        IssueQuadGroup<PL, kTiles, KC>(acc0, af, m, planes, S::kPlaneBytes, S::kSlabBytes, grp);
        if (i > 0) {
          wgmma::Wait<1>();
          wgmma::Pin(acc1);
          const int pm = (i - 1) / S::kGroups;
          AddQuadGroup<PL, kTiles, KC, kEA>(acc1, af, pm, (i - 1) % S::kGroups, smu, t, quad[pm],
                                            lin[pm]);
        }
      } else {
        IssueQuadGroup<PL, kTiles, KC>(acc1, af, m, planes, S::kPlaneBytes, S::kSlabBytes, grp);
        wgmma::Wait<1>();
        wgmma::Pin(acc0);
        const int pm = (i - 1) / S::kGroups;
        AddQuadGroup<PL, kTiles, KC, kEA>(acc0, af, pm, (i - 1) % S::kGroups, smu, t, quad[pm],
                                          lin[pm]);
      }
    }
    wgmma::Wait<0>();
    {
      constexpr int last = kGroupsPerIter - 1;
      if constexpr ((last & 1) == 0) {
        wgmma::Pin(acc0);
        AddQuadGroup<PL, kTiles, KC, kEA>(acc0, af, last / S::kGroups, last % S::kGroups, smu, t,
                                          quad[last / S::kGroups], lin[last / S::kGroups]);
      } else {
        wgmma::Pin(acc1);
        AddQuadGroup<PL, kTiles, KC, kEA>(acc1, af, last / S::kGroups, last % S::kGroups, smu, t,
                                          quad[last / S::kGroups], lin[last / S::kGroups]);
      }
    }
    WriteForms<kTiles, kEA>(a, mat, row0, static_cast<int>(tile_stride), lane, m_inv, quad, lin,
                            inv);
  }
}

// ---- Launch ------------------------------------------------------------------------------------

template <typename T, int DP>
cudaError_t LaunchQuadTyped(QuadFastArgs args, int32_t num_kv_heads, bool ea, bool use_wgmma,
                            cudaStream_t stream) {
  const int64_t bm = use_wgmma ? WgQuadShape<T, DP>::BM : QuadShape<T, DP>::BM;
  args.num_tiles = (args.count + bm - 1) / bm;
  const int64_t per_cta = use_wgmma ? kWgQuadTilesPerCta : kQuadTilesPerCta;
  args.tile_groups = std::max<int64_t>(1, (args.num_tiles + per_cta - 1) / per_cta);
  const int64_t blocks = args.tile_groups * args.mats_per_kv * num_kv_heads;
  if (use_wgmma) {
    constexpr size_t smem = WgQuadShape<T, DP>::kSmem;
    if (ea) return LaunchWithSmem(WgmmaQuadKernel<T, DP, true>, blocks, smem, args, stream);
    return LaunchWithSmem(WgmmaQuadKernel<T, DP, false>, blocks, smem, args, stream);
  }
  constexpr size_t smem = QuadShape<T, DP>::kSmem;
  if (ea) return LaunchWithSmem(FastQuadKernel<T, DP, true>, blocks, smem, args, stream);
  return LaunchWithSmem(FastQuadKernel<T, DP, false>, blocks, smem, args, stream);
}

template <typename T>
cudaError_t LaunchQuadForType(const QuadFastArgs& args, int dp, int32_t h, bool ea,
                              bool use_wgmma, cudaStream_t stream) {
  if (dp == 64) return LaunchQuadTyped<T, 64>(args, h, ea, use_wgmma, stream);
  if (dp == 128) return LaunchQuadTyped<T, 128>(args, h, ea, use_wgmma, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchQuad(const QuadFastArgs& args, DType dtype, int dp, int32_t num_kv_heads,
                       bool ea, cudaStream_t stream, MmaKernel kernel) {
  bool use_wgmma = false;
  if (!ResolveMmaKernel(kernel, &use_wgmma)) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kF32:
      return LaunchQuadForType<float>(args, dp, num_kv_heads, ea, use_wgmma, stream);
    case DType::kF16:
      return LaunchQuadForType<__half>(args, dp, num_kv_heads, ea, use_wgmma, stream);
    case DType::kBF16:
      return LaunchQuadForType<__nv_bfloat16>(args, dp, num_kv_heads, ea, use_wgmma, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu

// Fast-numerics window attention (fast_attention.cuh): pass A, combine, pass B, finish.
//
// CTA = 4 warps over one (split, KV head, row chunk). A tile of 64 tokens of K (and V) is
// double-buffered in shared memory by cp.async (f32 inputs are split into bf16 hi + lo
// planes on the way in); the chunk's query rows (and, in DropKV's pass B, the a rows) stay
// in shared memory for the CTA's life. Warp w owns rows [rb, rb + 16*MG) of the chunk and
// tokens [ts, ts + NSL) of every tile: wide chunks (128 rows) MG = 2, NSL = 64; narrow chunks
// (32 rows) MG = 1, NSL = 32. Shared-memory rows are padded by 16 bytes so that ldmatrix
// reads are free of bank conflicts.
//
// Model-aware reductions (Reduce other than kSum; the kModel variants). A warp of pass B
// holds B = 16 MG rows; thread (g = lane / 4) holds rows 16 mg + 8 hf + g, i.e. slot
// i = 2 mg + hf of its 2 MG slots. Physical row r of a KV head (block b = r / B, L = r % B) is
// logical row Lambda = b B + (L / 8) + (B / 8) (L % 8): the slots of a thread are consecutive
// logical rows, then the lanes. Logical row Lambda is member Lambda % S of segment
// Lambda / S (S = 2^seg_log2): kPerQ* segment = query head g, member = window row t;
// kGroupSq segment = window row t, member = query head g. A segment's rows are therefore
// summed first in registers (2^in_bits slots), then over 2^lane_bits lane groups by xor
// shuffles, then, when it is wider than a warp, over the row groups in shared memory and
// over the chunks in the finish kernel. kGroupSq squares each segment's sum (the group sum
// of one window row) and then adds the squares like kSum adds rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/gpu/kernels/attention_common.cuh"
#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/fast_attention.cuh"
#include "kernels/gpu/kernels/fast_mma.cuh"

namespace kvtrim::gpu::fast {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;

/// Kernel arguments (device pointers into the layer and the scratch).
struct FastArgs {
  const void* keys;     // [H, n, d] T
  const void* values;   // [H, n, d] T (DropKV)
  const void* queries;  // [H_q, w, d] T
  int64_t n;
  int32_t d, w, group, rows_per_qhead, first_row, rows, num_kv_heads;
  int32_t rows_total;   // chunks * RC per KV head
  int32_t tiles_per_split, parts;
  int64_t num_tiles;
  float scale2;         // softmax scale * log2(e)
  float eps;            // DropKV
  bool bf16_round;      // DropKV
  bool direct_finish;
  WindowNormalize finish;
  float* part_max;      // [H, rows_total, parts]
  float* part_sum;      // [H, rows_total, parts]
  float* part_out;      // [H, rows_total, parts, DP]
  RowInfo* row_info;    // [H, rows_total]
  void* row_out;        // [2, H, rows_total, DP] 16-bit
  float* partial;       // [chunks, H, n]
  float* out;           // [H, n] ([H_q, n] for kPerQMean / kPerQSq)
  // The model-aware reductions (after the scorers' fields, which keep their offsets).
  Reduce reduce;        // kSum: the scorer's finish; else a model-aware reduction
  int32_t seg_log2;     // S = 2^seg_log2 rows per segment (reduce != kSum)
  int32_t block_rows;   // B: rows of one warp of pass B (reduce != kSum)
  int32_t in_bits;      // log2 of a segment's rows in one thread
  int32_t lane_bits;    // log2 of the lane groups a segment spans in a warp
  // Pass A with values over the kept tokens only (LaunchFastAttentionRows): KV head h attends
  // to list_indices[list_offsets[l] .. list_offsets[l + 1]) (l = h, or 0 with one_list),
  // gathered 64 at a time; the tiles then count list positions, not tokens. Null: every token.
  const int64_t* list_offsets = nullptr;
  const int32_t* list_indices = nullptr;
  bool one_list = false;
  // Pass A over every token with 16-bit inputs (DeviceLayer::finite_flag): set to 1 when a
  // K (or, for DropKV, V) element it loads is NaN / Inf. Null: no check.
  unsigned int* nonfinite = nullptr;
};

/// Where a row of a KV head comes from: query head g of the group, window row offset t
/// (row t0 + t); padding rows (r >= rows, or g >= G / t >= T in the model-aware orders)
/// are not valid.
struct RowSource {
  int32_t g;
  int32_t t;
  bool valid;
};

/// The source of row r in the model-aware orders (a.reduce != kSum; the file comment).
__device__ __forceinline__ RowSource RowSourceOf(const FastArgs& a, int r) {
  if (r >= a.rows) return {0, 0, false};
  const int l = r & (a.block_rows - 1);
  const int logical = (r - l) + (l >> 3) + (a.block_rows >> 3) * (l & 7);
  const int seg = logical >> a.seg_log2;
  const int member = logical & ((1 << a.seg_log2) - 1);
  const bool by_row = a.reduce == Reduce::kGroupSq;
  const int g = by_row ? member : seg;
  const int t = by_row ? seg : member;
  return {g, t, g < a.group && t < a.rows_per_qhead};
}

/// A model-aware score from its segment sum x (plain fp32): kPerQMean x / T, kPerQSq
/// sqrt(x), kGroupSq sqrt(x) / G (x = sum_t (sum_g p)^2; the 1 / G of m_t taken out).
__device__ __forceinline__ float FinishModel(const FastArgs& a, float x) {
  switch (a.reduce) {
    case Reduce::kPerQMean: return x / static_cast<float>(a.rows_per_qhead);
    case Reduce::kPerQSq: return sqrtf(x);
    case Reduce::kGroupSq:
    default: return sqrtf(x) / static_cast<float>(a.group);
  }
}

/// The 16-bit type the tensor cores multiply for input type T (f32 -> bf16 hi + lo).
template <typename T>
struct ComputeOf {
  using type = __nv_bfloat16;
};
template <>
struct ComputeOf<__half> {
  using type = __half;
};

/// Shared-memory planes of an input tile: 2 (hi, lo) for f32 inputs, else 1.
template <typename T>
constexpr int PlanesOf() {
  return std::is_same<T, float>::value ? 2 : 1;
}

/// Warp layout of a pass: each warp owns MG row tiles (16 rows each) and NSL tokens of every
/// 64-token tile; 64 / NSL warps share a row group, and the row groups cover RC rows.
template <int MG, int NSL>
struct WarpLayout {
  static constexpr int kSlices = kTileTokens / NSL;     // warps per row group
  static constexpr int kRowGroups = kWarps / kSlices;
  static constexpr int kRows = kRowGroups * MG * 16;   // RC: rows of a chunk
  static constexpr int kTiles = NSL / 8;               // n8 tiles per warp
};

/// Shared-memory sizes (in CT elements unless stated) of one kernel variant.
template <typename T, int DP, int MG, int NSL, int kStages, bool kDrop, bool kStats>
struct SmemLayout {
  using W = WarpLayout<MG, NSL>;
  static constexpr int kStride = DP + 8;  // CT elements per row (16 bytes of padding)
  static constexpr int kRows = W::kRows;
  static constexpr int kPlanes = PlanesOf<T>();
  /// Query A fragments in registers (rows staged once through the K stages) only where the
  /// warp holds few logits: 16-bit inputs, DP <= 128, 16-token slices. Elsewhere occupancy
  /// (registers per warp) is worth more than the shared-memory reads they save.
  static constexpr bool kQRegs = kPlanes == 1 && DP <= 128 && NSL <= 16;
  static constexpr size_t kQ = kQRegs ? 0 : static_cast<size_t>(kPlanes) * kRows * kStride;
  static constexpr size_t kA = (kDrop && !kStats) ? 2 * static_cast<size_t>(kRows) * kStride : 0;
  static constexpr size_t kStage = static_cast<size_t>(kPlanes) * kTileTokens * kStride;
  static constexpr size_t kK = kStages * kStage;
  static constexpr size_t kV = kDrop ? kStages * kStage : 0;
  static constexpr size_t kFloats = static_cast<size_t>(W::kRowGroups) * kTileTokens;
  static constexpr size_t kBytes = (kQ + kA + kK + kV) * 2 + kFloats * sizeof(float);
  static_assert(!kQRegs || static_cast<size_t>(kRows) * kStride <= kK,
                "the query rows are staged through the K stages");
};

/// The score of a token from its sum over rows (the exact path's FinishScore, plain fp32).
__device__ __forceinline__ float FinishFast(const FastArgs& a, float sum, int64_t j) {
  switch (a.finish) {
    case WindowNormalize::kRowMean:
      return sum / static_cast<float>(static_cast<int64_t>(a.group) * a.rows_per_qhead);
    case WindowNormalize::kVisibleRowMean: {
      const int64_t first = max(static_cast<int64_t>(0), j - (a.n - a.w));
      const int64_t rows = max(static_cast<int64_t>(0), static_cast<int64_t>(a.w) - first);
      return rows > 0 ? sum / static_cast<float>(a.group * rows) : 0.0f;
    }
    case WindowNormalize::kEveryHeadMean:
      return sum / static_cast<float>(static_cast<int64_t>(a.group) * a.num_kv_heads);
    case WindowNormalize::kGroupMean:
    default:
      return sum / static_cast<float>(a.group);
  }
}

/// Copies `rows` rows of DP elements into shared memory planes [planes][rows][kStride]:
/// row r comes from row_ptr(r) (nullptr = zeros), elements >= d are zero. 16-bit inputs go
/// by cp.async; f32 inputs are split into bf16 hi (plane 0) and lo (plane 1) synchronously.
template <typename T, int DP, typename RowPtr>
__device__ __forceinline__ void LoadRows(RowPtr row_ptr, int rows, int d,
                                         typename ComputeOf<T>::type* dst, const void* any_valid) {
  using CT = typename ComputeOf<T>::type;
  constexpr int kStride = DP + 8;
  constexpr int kChunks = DP / 8;  // 8 elements per chunk
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
    const int r = idx / kChunks;
    const int col = (idx % kChunks) * 8;
    const T* src = row_ptr(r);
    const bool valid = src != nullptr && col < d;
    CT* at = dst + r * kStride + col;
    if constexpr (std::is_same<T, float>::value) {
      float4 lo4 = make_float4(0.f, 0.f, 0.f, 0.f), hi4 = lo4;
      if (valid) {
        lo4 = *reinterpret_cast<const float4*>(src + col);
        hi4 = *reinterpret_cast<const float4*>(src + col + 4);
      }
      uint32_t h[4], l[4];
      SplitPair<CT>(lo4.x, lo4.y, &h[0], &l[0]);
      SplitPair<CT>(lo4.z, lo4.w, &h[1], &l[1]);
      SplitPair<CT>(hi4.x, hi4.y, &h[2], &l[2]);
      SplitPair<CT>(hi4.z, hi4.w, &h[3], &l[3]);
      *reinterpret_cast<uint4*>(at) = make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(at + static_cast<size_t>(rows) * kStride) =
          make_uint4(l[0], l[1], l[2], l[3]);
    } else {
      CpAsync16(SmemAddress(at), valid ? static_cast<const void*>(src + col) : any_valid,
                valid ? 16 : 0);
    }
  }
}

/// True when one of the 16-bit elements of the 64-token tile `tile` in shared memory (rows
/// of kStride elements, DP columns; padding is zero) is NaN or Inf: this thread's share of
/// its 16-byte chunks, tested by their exponent bits.
template <typename CT, int DP>
__device__ __forceinline__ bool TileHasNonFinite(const CT* tile) {
  constexpr int kStride = DP + 8;
  constexpr int kChunks = DP / 8;
  constexpr uint32_t kExp = std::is_same<CT, __half>::value ? 0x7C00u : 0x7F80u;
  constexpr uint32_t kMask = kExp | (kExp << 16);
  bool bad = false;
  for (int idx = threadIdx.x; idx < kTileTokens * kChunks; idx += kThreads) {
    const uint4 v = *reinterpret_cast<const uint4*>(tile + (idx / kChunks) * kStride +
                                                    (idx % kChunks) * 8);
    for (uint32_t w : {v.x, v.y, v.z, v.w}) {
      const uint32_t e = w & kMask;
      bad |= (e & 0xFFFFu) == kExp || (e >> 16) == kExp;
    }
  }
  return bad;
}

/// Loads tile `tile` (64 tokens of KV head h) of `tensor` [H, n, d] into `dst` planes.
template <typename T, int DP>
__device__ __forceinline__ void LoadTile(const FastArgs& a, const void* tensor, int h, int64_t tile,
                                         typename ComputeOf<T>::type* dst) {
  const T* head = static_cast<const T*>(tensor) + static_cast<int64_t>(h) * a.n * a.d;
  const int64_t tok0 = tile * kTileTokens;
  LoadRows<T, DP>(
      [&](int r) -> const T* {
        const int64_t j = tok0 + r;
        return j < a.n ? head + j * a.d : nullptr;
      },
      kTileTokens, a.d, dst, tensor);
}

/// Loads the tile `tile` of a kept list (positions 64 * tile .. + 63 of `list`, `len` long:
/// token ids of KV head h) of `tensor` [H, n, d] into `dst` planes; positions past the list
/// load zeros.
template <typename T, int DP>
__device__ __forceinline__ void LoadGatheredTile(const FastArgs& a, const void* tensor, int h,
                                                 int64_t tile, const int32_t* list, int64_t len,
                                                 typename ComputeOf<T>::type* dst) {
  const T* head = static_cast<const T*>(tensor) + static_cast<int64_t>(h) * a.n * a.d;
  const int64_t pos0 = tile * kTileTokens;
  LoadRows<T, DP>(
      [&](int r) -> const T* {
        const int64_t p = pos0 + r;
        return p < len ? head + static_cast<int64_t>(__ldg(list + p)) * a.d : nullptr;
      },
      kTileTokens, a.d, dst, tensor);
}

/// A fragments (16 rows x 16 columns starting at column 16 * kc) of `mg` row tiles at `row0`.
template <int MG, int kStride, typename CT>
__device__ __forceinline__ void LoadA(const CT* base, int row0, int kc, int lane,
                                      uint32_t (&frag)[MG][4]) {
#pragma unroll
  for (int mg = 0; mg < MG; ++mg) {
    const int row = row0 + 16 * mg + (lane & 7) + ((lane >> 3) & 1) * 8;
    LdMatrixX4(frag[mg], SmemAddress(base + row * kStride + 16 * kc + (lane >> 4) * 8));
  }
}

/// B fragments of two n8 tiles (tokens tok0 .. tok0 + 15, columns 16 * kc .. + 15) of a
/// token-major tile: {b0, b1} of the first tile in r[0], r[1], of the second in r[2], r[3].
template <int kStride, typename CT>
__device__ __forceinline__ void LoadB(const CT* base, int tok0, int kc, int lane, uint32_t (&r)[4]) {
  const int tok = tok0 + (lane >> 4) * 8 + (lane & 7);
  LdMatrixX4(r, SmemAddress(base + tok * kStride + 16 * kc + ((lane >> 3) & 1) * 8));
}

/// acc[mg][nt] += rows(A) · tokens(B)ᵀ over DP columns. A: with kRegs, the fragments qf
/// [MG][DP / 16][4] held in registers; else ldmatrix from shared planes a_smem
/// [kPlanesA][rows][kStride] at rows row0 .. row0 + 16 MG. B planes [kPlanesB][64][kStride],
/// tokens tok0 .. tok0 + 8 NT. f32 inputs add hi·hi + hi·lo + lo·hi. With few accumulators
/// (MG * NT <= 8) the k16 steps alternate between two accumulator sets, added at the end, so
/// that consecutive mma.sync do not wait on each other (the tensor pipe's latency).
template <typename CT, int DP, int MG, int NT, int kPlanesA, int kPlanesB, bool kRegs, int QM,
          int QK>
__device__ __forceinline__ void RowTokenProducts(const uint32_t (&qf)[QM][QK][4],
                                                 const CT* a_smem, size_t a_plane, int row0,
                                                 const CT* b_base, size_t b_plane, int tok0,
                                                 int lane, float (&acc)[MG][NT][4]) {
  constexpr int kStride = DP + 8;
  constexpr int kSets = MG * NT <= 8 ? 2 : 1;
  static_assert(!kRegs || (QM == MG && QK == DP / 16 && kPlanesA == 1), "register A operand");
  float part[kSets][MG][NT][4];
#pragma unroll
  for (int set = 0; set < kSets; ++set)
#pragma unroll
    for (int mg = 0; mg < MG; ++mg)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[set][mg][nt][e] = set == 0 ? acc[mg][nt][e] : 0.0f;
#pragma unroll
  for (int kc = 0; kc < DP / 16; ++kc) {
    float (&sum)[MG][NT][4] = part[kc % kSets];
    uint32_t af[kPlanesA][MG][4];
    if constexpr (kRegs) {
#pragma unroll
      for (int mg = 0; mg < MG; ++mg)
#pragma unroll
        for (int e = 0; e < 4; ++e) af[0][mg][e] = qf[mg][kc][e];
    } else {
#pragma unroll
      for (int pl = 0; pl < kPlanesA; ++pl) {
        LoadA<MG, kStride>(a_smem + pl * a_plane, row0, kc, lane, af[pl]);
      }
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[kPlanesB][4];
#pragma unroll
      for (int pl = 0; pl < kPlanesB; ++pl) {
        LoadB<kStride>(b_base + pl * b_plane, tok0 + 16 * np, kc, lane, bf[pl]);
      }
#pragma unroll
      for (int mg = 0; mg < MG; ++mg) {
        Mma16816<CT>(sum[mg][2 * np], af[0][mg], bf[0][0], bf[0][1]);
        Mma16816<CT>(sum[mg][2 * np + 1], af[0][mg], bf[0][2], bf[0][3]);
        if constexpr (kPlanesB > 1) {
          Mma16816<CT>(sum[mg][2 * np], af[0][mg], bf[1][0], bf[1][1]);
          Mma16816<CT>(sum[mg][2 * np + 1], af[0][mg], bf[1][2], bf[1][3]);
        }
        if constexpr (kPlanesA > 1) {
          Mma16816<CT>(sum[mg][2 * np], af[1][mg], bf[0][0], bf[0][1]);
          Mma16816<CT>(sum[mg][2 * np + 1], af[1][mg], bf[0][2], bf[0][3]);
        }
      }
    }
  }
#pragma unroll
  for (int mg = 0; mg < MG; ++mg)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float total = part[0][mg][nt][e];
#pragma unroll
        for (int set = 1; set < kSets; ++set) total += part[set][mg][nt][e];
        acc[mg][nt][e] = total;
      }
}

/// Sum of squares of 8 consecutive CT values at p (16-byte aligned), in fp32.
template <typename CT>
__device__ __forceinline__ float SquaresOf8(const CT* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const CT* v = reinterpret_cast<const CT*>(&raw);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(AsFloat(v[i]), AsFloat(v[i]), acc);
  return acc;
}

/// |v_j|² (fp32) of the warp's NSL tokens from tok0 of a shared tile: kLanes = 32 / NSL lanes
/// share a token (lane l sums part l % kLanes of token tok0 + l / kLanes), the parts are
/// exchanged, and every lane of the group returns the token's norm. Planes add hi + lo.
template <typename CT, int DP, int kPlanes, int NSL>
__device__ __forceinline__ float SliceSquaredNorm(const CT* tile, size_t plane, int tok0, int lane) {
  constexpr int kStride = DP + 8;
  constexpr int kLanes = 32 / NSL;
  constexpr int kPart = DP / kLanes;
  const int tok = tok0 + lane / kLanes;
  const int part = lane % kLanes;
  float acc = 0.0f;
#pragma unroll
  for (int c = part * kPart; c < (part + 1) * kPart; c += 8) {
    if constexpr (kPlanes == 1) {
      acc += SquaresOf8(tile + tok * kStride + c);
    } else {
      const uint4 hi_raw = *reinterpret_cast<const uint4*>(tile + tok * kStride + c);
      const uint4 lo_raw = *reinterpret_cast<const uint4*>(tile + plane + tok * kStride + c);
      const CT* hi = reinterpret_cast<const CT*>(&hi_raw);
      const CT* lo = reinterpret_cast<const CT*>(&lo_raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x = AsFloat(hi[i]) + AsFloat(lo[i]);
        acc = fmaf(x, x, acc);
      }
    }
  }
#pragma unroll
  for (int x = 1; x < kLanes; x *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
  return acc;
}

/// Stores a warp's per-token values tok [NT][2] of the tile at tok0 (tokens ts + 8 nt + 2 t
/// + e, the same value in every lane g; lanes g == 0 store): with one row group finished by
/// finish(value, j) into out [H, n] (direct_finish) or as the chunk's partial [chunks, H, n];
/// else into spartial [kRowGroups][64] for the CTA's sum over the row groups.
template <int NT, int kRowGroups, typename FinishFn>
__device__ __forceinline__ void StoreTokenValues(const FastArgs& a, const float (&tok)[NT][2],
                                                 int h, int chunk, int rowgroup, int ts,
                                                 int64_t tok0, int g, int t, float* spartial,
                                                 FinishFn finish) {
  if (g != 0) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int local = ts + 8 * nt + 2 * t + e;
      if constexpr (kRowGroups == 1) {
        const int64_t j = tok0 + local;
        if (j < a.n) {
          if (a.direct_finish) {
            a.out[static_cast<int64_t>(h) * a.n + j] = finish(tok[nt][e], j);
          } else {
            a.partial[(static_cast<int64_t>(chunk) * a.num_kv_heads + h) * a.n + j] = tok[nt][e];
          }
        }
      } else {
        spartial[rowgroup * kTileTokens + local] = tok[nt][e];
      }
    }
  }
}

/// Calls fn(v, i, nt, e2) on the values of this thread's slots i that hold a segment's sum
/// after its slots were folded (i a multiple of 2^in_bits, in_mask = 2^in_bits - 1), in slot
/// order; v = s[i / 2][nt][2 (i % 2) + e2] by reference.
template <int MG, int NT, typename Fn>
__device__ __forceinline__ void ForLeadingSlots(float (&s)[MG][NT][4], int in_mask, Fn fn) {
#pragma unroll
  for (int i = 0; i < 2 * MG; ++i) {
    if (i & in_mask) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) fn(s[i / 2][nt][2 * (i % 2) + e2], i, nt, e2);
  }
}

/// Pass B of a model-aware reduction (kModel) for one tile: s [MG][NT][4] holds the warp's
/// log2-domain logits (rows 16 mg + 8 hf + g from warp_row0, tokens ts + 8 nt + 2 t + e % 2
/// of the tile at tok0). Forms p (kPerQSq: p^2), sums each segment over the thread's slots
/// and its lane groups, then: kGroupSq squares the segment sums and adds them over the warp
/// into the token's value (written as kSum writes its row sum: finished, partial or to
/// spartial [kRowGroups][64]); kPerQ* with segments within a warp writes each segment's
/// finished value to out [H_q, n] from its leading lane; wider segments leave the warp's sum
/// in spartial for the CTA (ModelRowGroups).
template <int MG, int NT, int kRowGroups>
__device__ __forceinline__ void ModelTile(const FastArgs& a, float (&s)[MG][NT][4],
                                          const float (&row_max2)[MG][2],
                                          const float (&row_inv)[MG][2], int h, int chunk,
                                          int rowgroup, int warp_row0, int ts, int64_t tok0,
                                          int lane, float* spartial) {
  static_assert(MG == 1 || MG == 2, "warps of 16 or 32 rows");
  constexpr int kSlots = 2 * MG;  // rows per thread: slot i = 2 mg + hf
  constexpr int kBlockLog2 = MG == 2 ? 5 : 4;
  const int g = lane / 4;
  const int t = lane % 4;
  const bool squares = a.reduce == Reduce::kPerQSq;
  const int in_mask = (1 << a.in_bits) - 1;
#pragma unroll
  for (int mg = 0; mg < MG; ++mg)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = Exp2(s[mg][nt][e] - row_max2[mg][e >> 1]) * row_inv[mg][e >> 1];
        s[mg][nt][e] = squares ? p * p : p;
      }
  // The segment's slots in this thread: slot 2 mg += slot 2 mg + 1, then slot 0 += slot 2.
  if (a.in_bits >= 1) {
#pragma unroll
    for (int mg = 0; mg < MG; ++mg)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) s[mg][nt][e2] += s[mg][nt][2 + e2];
  }
  if constexpr (MG == 2) {
    if (a.in_bits >= 2) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) s[0][nt][e2] += s[1][nt][e2];
    }
  }
  // Its lane groups: xor over the low lane_bits bits of g (lane bits 2 ..).
#pragma unroll
  for (int b = 0; b < 3; ++b) {
    if (b >= a.lane_bits) continue;
    ForLeadingSlots(s, in_mask, [&](float& v, int, int, int) {
      v += __shfl_xor_sync(0xffffffffu, v, 4 << b);
    });
  }

  if (a.reduce == Reduce::kGroupSq) {
    // Squares of the segment sums (slots of the segments' first rows), added over the slots
    // in order, then over the lane groups that hold other segments.
    float tok[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) tok[nt][0] = tok[nt][1] = 0.0f;
    ForLeadingSlots(s, in_mask, [&](float& m, int, int nt, int e2) {
      tok[nt][e2] = fmaf(m, m, tok[nt][e2]);
    });
#pragma unroll
    for (int b = 0; b < 3; ++b) {
      if (b < a.lane_bits) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          tok[nt][e2] += __shfl_xor_sync(0xffffffffu, tok[nt][e2], 4 << b);
        }
    }
    StoreTokenValues<NT, kRowGroups>(a, tok, h, chunk, rowgroup, ts, tok0, g, t, spartial,
                                     [&](float x, int64_t) { return FinishModel(a, x); });
  } else if (a.seg_log2 <= kBlockLog2) {
    // Segments within the warp: the lane group's first lane writes each segment it leads.
    if ((g & ((1 << a.lane_bits) - 1)) != 0) return;
    ForLeadingSlots(s, in_mask, [&](float& v, int i, int nt, int e2) {
      const int seg = (warp_row0 + i + kSlots * g) >> a.seg_log2;
      const int64_t j = tok0 + ts + 8 * nt + 2 * t + e2;
      if (seg < a.group && j < a.n) {
        a.out[(static_cast<int64_t>(h) * a.group + seg) * a.n + j] = FinishModel(a, v);
      }
    });
  } else if constexpr (kRowGroups > 1) {
    // A segment wider than the warp: every slot and lane was summed; the warp's sum goes to
    // the CTA.
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          spartial[rowgroup * kTileTokens + ts + 8 * nt + 2 * t + e2] = s[0][nt][e2];
        }
    }
  }
}

/// True when pass B's model-aware reduction combines its row groups in shared memory
/// (ModelRowGroups): kGroupSq, and kPerQ* segments wider than a warp of B rows.
__device__ __forceinline__ bool ModelCombinesRowGroups(const FastArgs& a, int block_log2) {
  return a.reduce == Reduce::kGroupSq || a.seg_log2 > block_log2;
}

/// The CTA's part of a model-aware reduction for token j (one thread per token of the tile,
/// after ModelTile wrote spartial [kRowGroups][64] at `local`): kGroupSq adds the row groups'
/// squared sums (finished, or a partial of the chunk); kPerQ* adds the row groups of each
/// segment and writes its finished value to out [H_q, n] (segments within the chunk) or the
/// chunk's sum to the partials (segments of several chunks, finished by FinishKernel).
template <int kRowGroups, int kBlockRows, int kChunkRows>
__device__ __forceinline__ void ModelRowGroups(const FastArgs& a, const float* spartial, int h,
                                               int chunk, int local, int64_t j) {
  const int chunk_row0 = chunk * kChunkRows;
  const int64_t partial_at = (static_cast<int64_t>(chunk) * a.num_kv_heads + h) * a.n + j;
  if (a.reduce == Reduce::kGroupSq) {
    float sum = 0.0f;
    for (int rg = 0; rg < kRowGroups; ++rg) {
      if (chunk_row0 + rg * kBlockRows < a.rows) sum += spartial[rg * kTileTokens + local];
    }
    if (a.direct_finish) {
      a.out[static_cast<int64_t>(h) * a.n + j] = FinishModel(a, sum);
    } else {
      a.partial[partial_at] = sum;
    }
    return;
  }
  const int seg_rows = 1 << a.seg_log2;
  if (seg_rows <= kChunkRows) {
    const int groups = seg_rows / kBlockRows;  // row groups per segment (>= 2)
    for (int rg0 = 0; rg0 < kRowGroups; rg0 += groups) {
      const int seg = (chunk_row0 + rg0 * kBlockRows) >> a.seg_log2;
      if (seg >= a.group) break;
      float sum = 0.0f;
      for (int rg = rg0; rg < rg0 + groups; ++rg) sum += spartial[rg * kTileTokens + local];
      a.out[(static_cast<int64_t>(h) * a.group + seg) * a.n + j] = FinishModel(a, sum);
    }
  } else {
    float sum = 0.0f;  // the chunk lies inside one segment: every row group is active
    for (int rg = 0; rg < kRowGroups; ++rg) sum += spartial[rg * kTileTokens + local];
    a.partial[partial_at] = sum;
  }
}

/// The two passes. kStats: pass A (row maxima, sums and DropKV's outputs per split); else
/// pass B (token scores). Grid: (chunks, splits, H_kv); 128 threads. Warp layout MG x NSL
/// (WarpLayout), kStages-deep cp.async pipeline over 64-token tiles (each stage is reloaded
/// only after the barrier that follows its last use). kModel (not DropKV): the model-aware
/// row order (RowSourceOf) and, in pass B, reductions (ModelTile, ModelRowGroups) instead of
/// the scorer's row sum.
template <typename T, int DP, int MG, int NSL, int kStages, bool kDrop, bool kStats,
          bool kModel = false>
__global__ void __launch_bounds__(kThreads) FastPassKernel(FastArgs a) {
  using CT = typename ComputeOf<T>::type;
  using L = SmemLayout<T, DP, MG, NSL, kStages, kDrop, kStats>;
  using W = WarpLayout<MG, NSL>;
  constexpr int kP = L::kPlanes;
  constexpr int kStride = L::kStride;
  constexpr int NT = W::kTiles;
  constexpr int kSlices = W::kSlices;
  constexpr int kRowGroups = W::kRowGroups;
  constexpr int RC = L::kRows;
  constexpr int KC = DP / 16;
  constexpr bool kQRegs = L::kQRegs;
  static_assert(NSL == 16 || NSL == 32 || NSL == 64, "token slices of 16, 32 or 64");
  static_assert(kStages >= 2, "double buffering at least");
  static_assert(!kModel || !kDrop, "model-aware reductions: without values");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  CT* sq = reinterpret_cast<CT*>(smem_raw);
  CT* sa = sq + L::kQ;
  CT* sk = sa + L::kA;
  CT* sv = sk + L::kK;
  float* spartial = reinterpret_cast<float*>(sv + L::kV);  // [kRowGroups][64]

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // Row chunks innermost: the CTAs that read the same K / V tiles for different rows run
  // side by side, so the tiles come from L2 for all but the first of them.
  const int chunk = blockIdx.x;
  const int split = blockIdx.y;
  const int h = blockIdx.z;
  const int rowgroup = warp / kSlices;
  const int slice = warp % kSlices;
  const int rb = rowgroup * MG * 16;
  const int ts = slice * NSL;
  const int chunk_row0 = chunk * RC;
  const bool active = chunk_row0 + rb < a.rows;

  const int64_t tile_begin = static_cast<int64_t>(split) * a.tiles_per_split;
  int64_t tile_end = min(a.num_tiles, tile_begin + a.tiles_per_split);
  // The gathered pass A (a.list_indices): this head's kept list; its tiles end with the list,
  // and a CTA past the end still writes its (empty) partial statistics for the combine.
  bool gathered = false;
  const int32_t* list = nullptr;
  int64_t list_len = 0;
  if constexpr (kDrop && kStats) {
    if (a.list_indices != nullptr) {
      gathered = true;
      const int64_t l = a.one_list ? 0 : h;
      const int64_t begin = a.list_offsets[l];
      list_len = a.list_offsets[l + 1] - begin;
      list = a.list_indices + begin;
      tile_end = min(tile_end, (list_len + kTileTokens - 1) / kTileTokens);
    }
  }
  const int count = static_cast<int>(max(int64_t{0}, tile_end - tile_begin));
  if (count <= 0 && !gathered) return;
  auto load_tile = [&](const void* tensor, int64_t tile, CT* dst) {
    if (gathered) {
      LoadGatheredTile<T, DP>(a, tensor, h, tile, list, list_len, dst);
    } else {
      LoadTile<T, DP>(a, tensor, h, tile, dst);
    }
  };

  // This thread's rows: (mg, half) -> chunk row rb + 16 mg + g + 8 half.
  int64_t vis[MG][2];
  float row_max2[MG][2], row_inv[MG][2], row_aa[MG][2];
#pragma unroll
  for (int mg = 0; mg < MG; ++mg) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = chunk_row0 + rb + 16 * mg + g + 8 * hf;
      if constexpr (kModel) {
        const RowSource src = RowSourceOf(a, r);
        vis[mg][hf] = src.valid ? attn::VisibleCount(a.n, a.w, a.first_row + src.t) : a.n;
      } else {
        vis[mg][hf] = r < a.rows ? attn::VisibleCount(a.n, a.w, a.first_row + r % a.rows_per_qhead)
                                 : a.n;
      }
      row_max2[mg][hf] = 0.0f;
      row_inv[mg][hf] = 0.0f;
      row_aa[mg][hf] = 0.0f;
      if constexpr (!kStats) {
        if (r < a.rows) {
          const RowInfo info = a.row_info[static_cast<int64_t>(h) * a.rows_total + r];
          row_max2[mg][hf] = info.max2;
          row_inv[mg][hf] = info.inv_z;
          row_aa[mg][hf] = info.out_sq;
        }
      }
    }
  }
  const int64_t min_vis = attn::VisibleCount(a.n, a.w, a.first_row);

  // Query rows of the chunk (staged through the K stages when they go to registers) and, in
  // DropKV's pass B, the a rows.
  {
    const T* queries = static_cast<const T*>(a.queries);
    LoadRows<T, DP>(
        [&](int rr) -> const T* {
          const int r = chunk_row0 + rr;
          if constexpr (kModel) {
            const RowSource src = RowSourceOf(a, r);
            if (!src.valid) return nullptr;
            const int64_t qh = static_cast<int64_t>(h) * a.group + src.g;
            return queries + (qh * a.w + a.first_row + src.t) * a.d;
          } else {
            if (r >= a.rows) return nullptr;
            const int64_t qh = static_cast<int64_t>(h) * a.group + r / a.rows_per_qhead;
            const int64_t row = a.first_row + r % a.rows_per_qhead;
            return queries + (qh * a.w + row) * a.d;
          }
        },
        RC, a.d, kQRegs ? sk : sq, a.queries);
    if constexpr (kDrop && !kStats) {
      const size_t plane = static_cast<size_t>(a.num_kv_heads) * a.rows_total * DP;
      const CT* hi = static_cast<const CT*>(a.row_out) +
                     (static_cast<size_t>(h) * a.rows_total + chunk_row0) * DP;
      for (int pl = 0; pl < 2; ++pl) {
        for (int idx = tid; idx < RC * (DP / 8); idx += kThreads) {
          const int rr = idx / (DP / 8);
          const int col = (idx % (DP / 8)) * 8;
          CpAsync16(SmemAddress(sa + (pl * RC + rr) * kStride + col),
                    hi + pl * plane + rr * DP + col, 16);
        }
      }
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();
  }
  uint32_t qf[kQRegs ? MG : 1][kQRegs ? KC : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      uint32_t frag[MG][4];
      LoadA<MG, kStride>(sk, rb, kc, lane, frag);
#pragma unroll
      for (int mg = 0; mg < MG; ++mg)
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[mg][kc][e] = frag[mg][e];
    }
    __syncthreads();  // the stages are overwritten by the tiles next
  }

  // Tile `it` of this CTA's range: pass A front to back, pass B back to front.
  auto tile_of = [&](int it) -> int64_t { return kStats ? tile_begin + it : tile_end - 1 - it; };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) {
      load_tile(a.keys, tile_of(s), sk + s * L::kStage);
      if constexpr (kDrop) load_tile(a.values, tile_of(s), sv + s * L::kStage);
    }
    CpAsyncCommit();
  }

  // Pass A state: per row, the running max (log2 domain) and this thread's partial sum;
  // DropKV: o [16 * MG rows, DP] as C fragments of DP / 8 n8 tiles.
  float run_max[MG][2], run_sum[MG][2];
  float o[kDrop && kStats ? MG : 1][kDrop && kStats ? DP / 8 : 1][4];
#pragma unroll
  for (int mg = 0; mg < MG; ++mg) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      run_max[mg][hf] = kNegInf;
      run_sum[mg][hf] = 0.0f;
    }
  }
  if constexpr (kDrop && kStats) {
#pragma unroll
    for (int mg = 0; mg < MG; ++mg)
#pragma unroll
      for (int dt = 0; dt < DP / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mg][dt][e] = 0.0f;
  }

  const bool check_finite = kStats && a.nonfinite != nullptr && !gathered && chunk == 0;
  bool nonfinite = false;
  for (int it = 0; it < count; ++it) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile `it` is in; every warp is done with the stage reloaded next
    {
      const int next = it + kStages - 1;
      if (next < count) {
        const int stage = next % kStages;
        load_tile(a.keys, tile_of(next), sk + stage * L::kStage);
        if constexpr (kDrop) load_tile(a.values, tile_of(next), sv + stage * L::kStage);
      }
      CpAsyncCommit();
    }
    const int stage = it % kStages;
    const CT* kt = sk + stage * L::kStage;
    const CT* vt = sv + stage * L::kStage;
    const int64_t tok0 = tile_of(it) * kTileTokens;
    if constexpr (kStats && !std::is_same<T, float>::value) {
      // The inputs' finiteness, checked where they are read anyway (the first row chunk of
      // every split reads each K / V tile once) instead of by a separate pass over them.
      if (check_finite) {
        nonfinite |= TileHasNonFinite<CT, DP>(kt);
        if constexpr (kDrop) nonfinite |= TileHasNonFinite<CT, DP>(vt);
      }
    }

    if (active) {
      float s[MG][NT][4];
#pragma unroll
      for (int mg = 0; mg < MG; ++mg)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mg][nt][e] = 0.0f;
      RowTokenProducts<CT, DP, MG, NT, kP, kP, kQRegs>(
          qf, sq, static_cast<size_t>(RC) * kStride, rb, kt,
          static_cast<size_t>(kTileTokens) * kStride, ts, lane, s);
      // Logits in the log2 domain; masked (causal / past n) entries -> -inf. Gathered: the
      // token of each list position (none past the list's end).
      const bool needs_mask = gathered || tok0 + kTileTokens > min_vis;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int64_t j = tok0 + ts + 8 * nt + 2 * t + c;
          if (gathered) j = j < list_len ? __ldg(list + j) : INT64_MAX;
#pragma unroll
          for (int mg = 0; mg < MG; ++mg)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              float x = s[mg][nt][2 * hf + c] * a.scale2;
              if (needs_mask && j >= vis[mg][hf]) x = kNegInf;
              s[mg][nt][2 * hf + c] = x;
            }
        }

      if constexpr (kStats) {
        bool rescale = false;
        float alpha[MG][2];
#pragma unroll
        for (int mg = 0; mg < MG; ++mg) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            float mx = kNegInf;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              mx = fmaxf(mx, fmaxf(s[mg][nt][2 * hf], s[mg][nt][2 * hf + 1]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(run_max[mg][hf], mx);
            const float base = m_new == kNegInf ? 0.0f : m_new;
            alpha[mg][hf] = Exp2(run_max[mg][hf] - base);
            rescale = rescale || m_new != run_max[mg][hf];
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
              for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
                const float p = Exp2(s[mg][nt][e] - base);
                s[mg][nt][e] = p;
                sum += p;
              }
            }
            run_sum[mg][hf] = run_sum[mg][hf] * alpha[mg][hf] + sum;
            run_max[mg][hf] = m_new;
          }
        }
        if constexpr (kDrop) {
          // The outputs are rescaled only when some row of the warp found a new maximum.
          if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int mg = 0; mg < MG; ++mg)
#pragma unroll
              for (int dt = 0; dt < DP / 8; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mg][dt][e] *= alpha[mg][e >> 1];
          }
          // o += P · V: P (16 rows x NSL tokens) as A fragments (hi + lo), V by ldmatrix.trans.
#pragma unroll
          for (int kc = 0; kc < NSL / 16; ++kc) {
            uint32_t p_hi[MG][4], p_lo[MG][4];
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
              SplitPair<CT>(s[mg][2 * kc][0], s[mg][2 * kc][1], &p_hi[mg][0], &p_lo[mg][0]);
              SplitPair<CT>(s[mg][2 * kc][2], s[mg][2 * kc][3], &p_hi[mg][1], &p_lo[mg][1]);
              SplitPair<CT>(s[mg][2 * kc + 1][0], s[mg][2 * kc + 1][1], &p_hi[mg][2], &p_lo[mg][2]);
              SplitPair<CT>(s[mg][2 * kc + 1][2], s[mg][2 * kc + 1][3], &p_hi[mg][3], &p_lo[mg][3]);
            }
            const int tok = ts + 16 * kc + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
            for (int dp = 0; dp < DP / 16; ++dp) {
              uint32_t bv[kP][4];
#pragma unroll
              for (int pl = 0; pl < kP; ++pl) {
                LdMatrixX4Trans(bv[pl], SmemAddress(vt + pl * (L::kStage / kP) + tok * kStride +
                                                    16 * dp + (lane >> 4) * 8));
              }
#pragma unroll
              for (int mg = 0; mg < MG; ++mg) {
                Mma16816<CT>(o[mg][2 * dp], p_hi[mg], bv[0][0], bv[0][1]);
                Mma16816<CT>(o[mg][2 * dp + 1], p_hi[mg], bv[0][2], bv[0][3]);
                Mma16816<CT>(o[mg][2 * dp], p_lo[mg], bv[0][0], bv[0][1]);
                Mma16816<CT>(o[mg][2 * dp + 1], p_lo[mg], bv[0][2], bv[0][3]);
                if constexpr (kP > 1) {
                  Mma16816<CT>(o[mg][2 * dp], p_hi[mg], bv[1][0], bv[1][1]);
                  Mma16816<CT>(o[mg][2 * dp + 1], p_hi[mg], bv[1][2], bv[1][3]);
                }
              }
            }
          }
        }
      } else if constexpr (kModel) {
        ModelTile<MG, NT, kRowGroups>(a, s, row_max2, row_inv, h, chunk, rowgroup,
                                      chunk_row0 + rb, ts, tok0, lane, spartial);
      } else {
        // Pass B: p, DropKV's term, then each token's sum over this warp's rows.
        float av[kDrop ? MG : 1][kDrop ? NT : 1][4];
        float vv_slice = 0.0f;  // |v|² of the warp's token lane / (32 / NSL) (DropKV)
        if constexpr (kDrop) {
#pragma unroll
          for (int mg = 0; mg < MG; ++mg)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) av[mg][nt][e] = 0.0f;
          RowTokenProducts<CT, DP, MG, NT, 2, kP, false>(
              qf, sa, static_cast<size_t>(RC) * kStride, rb, vt,
              static_cast<size_t>(kTileTokens) * kStride, ts, lane, av);
          vv_slice = SliceSquaredNorm<CT, DP, kP, NSL>(vt, L::kStage / kP, ts, lane);
        }
        float tok_sum[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) tok_sum[nt][0] = tok_sum[nt][1] = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            float vv = 0.0f;
            if constexpr (kDrop) {
              vv = __shfl_sync(0xffffffffu, vv_slice, (32 / NSL) * (8 * nt + 2 * t + e2));
            }
#pragma unroll
            for (int mg = 0; mg < MG; ++mg) {
#pragma unroll
              for (int hf = 0; hf < 2; ++hf) {
                const int e = 2 * hf + e2;
                float p = Exp2(s[mg][nt][e] - row_max2[mg][hf]) * row_inv[mg][hf];
                if constexpr (kDrop) {
                  if (a.bf16_round) p = __bfloat162float(__float2bfloat16_rn(p));
                  const float wgt = __fdividef(p, 1.0f - p + a.eps);
                  const float dist = fmaxf(0.0f, row_aa[mg][hf] + vv - 2.0f * av[mg][nt][e]);
                  p = dist > 0.0f ? wgt * wgt * dist : 0.0f;  // 0 * inf guard (eps = 0)
                }
                tok_sum[nt][e2] += p;
              }
            }
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float v = tok_sum[nt][e];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            tok_sum[nt][e] = v;
          }
        }
        StoreTokenValues<NT, kRowGroups>(
            a, tok_sum, h, chunk, rowgroup, ts, tok0, g, t, spartial,
            [&](float x, int64_t j) { return FinishFast(a, x, j); });
      }
    }

    if constexpr (kModel && !kStats && kRowGroups > 1) {
      if (ModelCombinesRowGroups(a, MG == 2 ? 5 : 4)) {  // uniform over the CTA
        __syncthreads();
        if (tid < kTileTokens) {
          const int64_t j = tok0 + tid;
          if (j < a.n) ModelRowGroups<kRowGroups, MG * 16, RC>(a, spartial, h, chunk, tid, j);
        }
      }
    } else if constexpr (!kStats && kRowGroups > 1) {
      __syncthreads();
      if (tid < kTileTokens) {
        const int64_t j = tok0 + tid;
        if (j < a.n) {
          float sum = 0.0f;
          for (int rg = 0; rg < kRowGroups; ++rg) {
            if (chunk_row0 + rg * MG * 16 < a.rows) sum += spartial[rg * kTileTokens + tid];
          }
          if (a.direct_finish) {
            a.out[static_cast<int64_t>(h) * a.n + j] = FinishFast(a, sum, j);
          } else {
            a.partial[(static_cast<int64_t>(chunk) * a.num_kv_heads + h) * a.n + j] = sum;
          }
        }
      }
    }
  }

  if (nonfinite) *reinterpret_cast<volatile unsigned int*>(a.nonfinite) = 1u;  // pinned host word

  if constexpr (kStats) {
    if (!active) return;
    const int part = split * kSlices + slice;
#pragma unroll
    for (int mg = 0; mg < MG; ++mg) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float z = run_sum[mg][hf];
        z += __shfl_xor_sync(0xffffffffu, z, 1);
        z += __shfl_xor_sync(0xffffffffu, z, 2);
        const int r = chunk_row0 + rb + 16 * mg + g + 8 * hf;
        if (r >= a.rows) continue;
        const int64_t cell = (static_cast<int64_t>(h) * a.rows_total + r) * a.parts + part;
        if (t == 0) {
          a.part_max[cell] = run_max[mg][hf];
          a.part_sum[cell] = z;
        }
        if constexpr (kDrop) {
#pragma unroll
          for (int dt = 0; dt < DP / 8; ++dt) {
            float2 v = make_float2(o[mg][dt][2 * hf], o[mg][dt][2 * hf + 1]);
            *reinterpret_cast<float2*>(a.part_out + cell * DP + 8 * dt + 2 * t) = v;
          }
        }
      }
    }
  }
}

constexpr int kCombineThreads = 128;

/// Deterministic block sum (fixed tree over kCombineThreads values); every thread gets it.
__device__ float BlockSum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kCombineThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) red[threadIdx.x] += red[threadIdx.x + stride];
    __syncthreads();
  }
  const float out = red[0];
  __syncthreads();
  return out;
}

/// Block maximum; every thread gets it.
__device__ float BlockMax(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kCombineThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + stride]);
    __syncthreads();
  }
  const float out = red[0];
  __syncthreads();
  return out;
}

/// Parts whose weights 2^(m_p - M) the combine holds in shared memory at once.
constexpr int kCombineChunk = 512;

/// Per row (grid (rows_total, H)): M, 1/Z over the parts in part order and, for DropKV,
/// a = Σ o_p 2^(m_p - M) / Z as hi + lo 16-bit planes and |a|² in fp32. The part weights
/// 2^(m_p - M) are computed once per part into shared memory, kCombineChunk at a time.
/// kModel: padding rows of the model-aware orders (RowSourceOf not valid) get zero
/// statistics too, so that pass B's p is 0 on them.
template <typename CT, int DP, bool kDrop, bool kModel = false>
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(FastArgs a) {
  constexpr int kCols = (DP + kCombineThreads - 1) / kCombineThreads;  // columns per thread
  __shared__ float red[kCombineThreads];
  __shared__ float weight[kCombineChunk];
  const int r = blockIdx.x;
  const int h = blockIdx.y;
  const int64_t row = static_cast<int64_t>(h) * a.rows_total + r;
  const size_t plane = static_cast<size_t>(a.num_kv_heads) * a.rows_total * DP;
  CT* out_hi = static_cast<CT*>(a.row_out) + row * DP;
  if (kModel ? !RowSourceOf(a, r).valid : r >= a.rows) {
    if (threadIdx.x == 0) a.row_info[row] = RowInfo{0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kDrop) {
      for (int c = threadIdx.x; c < DP; c += kCombineThreads) {
        out_hi[c] = CT(0.0f);
        out_hi[plane + c] = CT(0.0f);
      }
    }
    return;
  }
  const float* pm = a.part_max + row * a.parts;
  const float* ps = a.part_sum + row * a.parts;
  float m = kNegInf;
  for (int p = threadIdx.x; p < a.parts; p += kCombineThreads) m = fmaxf(m, pm[p]);
  m = BlockMax(m, red);
  const float base = m == kNegInf ? 0.0f : m;
  float z = 0.0f;
  float acc[kCols];
#pragma unroll
  for (int i = 0; i < kCols; ++i) acc[i] = 0.0f;
  for (int p0 = 0; p0 < a.parts; p0 += kCombineChunk) {
    const int count = min(kCombineChunk, a.parts - p0);
    __syncthreads();  // the previous chunk's weights are read
    for (int p = threadIdx.x; p < count; p += kCombineThreads) {
      const float w = exp2f(pm[p0 + p] - base);
      weight[p] = w;
      z += ps[p0 + p] * w;
    }
    __syncthreads();
    if constexpr (kDrop) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int c = threadIdx.x + i * kCombineThreads;
        if (c >= DP) continue;
        const float* o = a.part_out + (row * a.parts + p0) * DP + c;
        for (int p = 0; p < count; ++p) acc[i] += o[static_cast<int64_t>(p) * DP] * weight[p];
      }
    }
  }
  z = BlockSum(z, red);
  const float inv = z > 0.0f ? 1.0f / z : 0.0f;
  float aa = 0.0f;
  if constexpr (kDrop) {
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int c = threadIdx.x + i * kCombineThreads;
      if (c >= DP) continue;
      const float v = acc[i] * inv;
      const CT hi(v);
      out_hi[c] = hi;
      out_hi[plane + c] = CT(v - AsFloat(hi));
      sq = fmaf(v, v, sq);
    }
    aa = BlockSum(sq, red);
  }
  if (threadIdx.x == 0) a.row_info[row] = RowInfo{m, inv, aa, 0.0f};
}

/// Sums the chunks' partial row sums (and, for kEveryHeadMean, every head) in order and
/// finishes.
__global__ void FinishKernel(FastArgs a, int32_t chunks) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.n) return;
  const bool all_heads = a.finish == WindowNormalize::kEveryHeadMean;
  const int h_lo = all_heads ? 0 : blockIdx.y;
  const int h_hi = all_heads ? a.num_kv_heads : h_lo + 1;
  float sum = 0.0f;
  for (int h = h_lo; h < h_hi; ++h) {
    for (int c = 0; c < chunks; ++c) sum += a.partial[(static_cast<int64_t>(c) * a.num_kv_heads + h) * a.n + j];
  }
  const float score = FinishFast(a, sum, j);
  if (all_heads) {
    for (int h = 0; h < a.num_kv_heads; ++h) a.out[static_cast<int64_t>(h) * a.n + j] = score;
  } else {
    a.out[static_cast<int64_t>(blockIdx.y) * a.n + j] = score;
  }
}

/// FinishKernel of the model-aware reductions: kGroupSq (grid.y = H_kv) adds the chunks'
/// squared sums of KV head h in order; kPerQ* (grid.y = H_q) query head q = h G + g adds the
/// S / RC chunks of its segment g in order; then FinishModel.
__global__ void FinishModelKernel(FastArgs a, int32_t chunks) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.n) return;
  const bool per_q = a.reduce != Reduce::kGroupSq;
  const int q = blockIdx.y;
  const int h = per_q ? q / a.group : q;
  const int per_seg = per_q ? (1 << a.seg_log2) / (a.rows_total / chunks) : chunks;
  const int c0 = per_q ? (q % a.group) * per_seg : 0;
  float sum = 0.0f;
  for (int c = c0; c < c0 + per_seg; ++c) {
    sum += a.partial[(static_cast<int64_t>(c) * a.num_kv_heads + h) * a.n + j];
  }
  a.out[static_cast<int64_t>(q) * a.n + j] = FinishModel(a, sum);
}

/// Launches one pass kernel with its dynamic shared memory.
template <typename T, int DP, int MG, int NSL, int kStages, bool kDrop, bool kStats,
          bool kModel = false>
cudaError_t LaunchPass(const FastAttentionPlan& plan, const FastArgs& args, cudaStream_t stream) {
  auto* kernel = FastPassKernel<T, DP, MG, NSL, kStages, kDrop, kStats, kModel>;
  constexpr size_t smem = SmemLayout<T, DP, MG, NSL, kStages, kDrop, kStats>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of one CTA");
  static_assert(WarpLayout<MG, NSL>::kRows == 16 || WarpLayout<MG, NSL>::kRows == 32 ||
                    WarpLayout<MG, NSL>::kRows == 128,
                "chunks of 16, 32 or 128 rows (FastAttentionPlan::chunk_rows)");
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.num_chunks), static_cast<unsigned>(plan.num_splits),
                  static_cast<unsigned>(plan.num_kv_heads));
  kernel<<<grid, kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

/// Pass A (layout MG_A x NSL_A, kStagesA stages), combine, pass B (MG_B x NSL_B, kStagesB;
/// kModel: the model-aware reductions), finish. Both layouts cover the same rows per chunk.
template <typename T, int DP, bool kDrop, int MG_A, int NSL_A, int kStagesA, int MG_B, int NSL_B,
          int kStagesB, bool kModel = false>
cudaError_t LaunchAll(const FastAttentionPlan& plan, const FastArgs& args, cudaStream_t stream) {
  using CT = typename ComputeOf<T>::type;
  static_assert(WarpLayout<MG_A, NSL_A>::kRows == WarpLayout<MG_B, NSL_B>::kRows,
                "both passes see the same chunk rows");
  // The row order of the model-aware reductions is that of pass B's warps.
  if (kModel && plan.block_rows != 16 * MG_B) return cudaErrorInvalidValue;
  cudaError_t err =
      LaunchPass<T, DP, MG_A, NSL_A, kStagesA, kDrop, true, kModel>(plan, args, stream);
  if (err != cudaSuccess) return err;
  const dim3 rows_grid(static_cast<unsigned>(plan.num_chunks * plan.chunk_rows),
                       static_cast<unsigned>(plan.num_kv_heads));
  CombineKernel<CT, DP, kDrop, kModel><<<rows_grid, kCombineThreads, 0, stream>>>(args);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = LaunchPass<T, DP, MG_B, NSL_B, kStagesB, kDrop, false, kModel>(plan, args, stream);
  if (err != cudaSuccess || plan.direct_finish) return err;
  if constexpr (kModel) {
    const bool per_q = plan.reduce != Reduce::kGroupSq;
    const dim3 grid(static_cast<unsigned>((plan.num_tokens + 255) / 256),
                    static_cast<unsigned>(plan.num_kv_heads * (per_q ? plan.group : 1)));
    FinishModelKernel<<<grid, 256, 0, stream>>>(args, plan.num_chunks);
    return cudaGetLastError();
  }
  const dim3 finish_grid(static_cast<unsigned>((plan.num_tokens + 255) / 256),
                         plan.all_heads ? 1u
                                                        : static_cast<unsigned>(plan.num_kv_heads));
  FinishKernel<<<finish_grid, 256, 0, stream>>>(args, plan.num_chunks);
  return cudaGetLastError();
}

/// Pass A (DropKV's layout for T and DP) and the combine only: the rows' statistics and
/// outputs a (LaunchFastAttentionRows).
template <typename T, int DP>
cudaError_t LaunchRowsForDim(const FastAttentionPlan& plan, const FastArgs& args,
                             cudaStream_t stream) {
  using CT = typename ComputeOf<T>::type;
  constexpr bool kRoomy = PlanesOf<T>() == 1 && DP <= 128;
  cudaError_t err = LaunchPass<T, DP, 1, 32, kRoomy ? 3 : 2, true, true>(plan, args, stream);
  if (err != cudaSuccess) return err;
  const dim3 rows_grid(static_cast<unsigned>(plan.num_chunks * plan.chunk_rows),
                       static_cast<unsigned>(plan.num_kv_heads));
  CombineKernel<CT, DP, true><<<rows_grid, kCombineThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

/// Picks the layouts for T and DP (measured on an H200; the kernels are bound by instruction
/// latency at low occupancy, not by memory latency, so CTAs per SM matter more than stages):
///  128-row chunks  32 rows x 64 tokens per warp, 4 row groups, three K stages;
///  32-row chunks   16 rows x 32 tokens per warp, 2 row groups x 2 slices, two stages;
///  16-row chunks   16 rows x 16 tokens per warp, 4 slices, two stages;
///  DropKV          pass A as 32-row chunks with three K/V stages where they fit; pass B
///                  the same layout with two stages (DP 256: 32 rows x 16 tokens per warp,
///                  queries in registers, where the shared memory of the first does not fit).
///                  On the H100 at 128K (bf16, w = 8) pass B took 259-261 us so, 277 us as
///                  32 x 16 and 370-415 us with three or four stages of either (register
///                  spills): docs/benchmarks.md.
/// The model-aware reductions take the same three layouts in their kModel variants (row order,
/// combine, pass B's reductions; instantiated for DP <= 128 only: the model-aware scorers take
/// d <= 128), so the four scorers' kernels are unchanged.
template <typename T, int DP>
cudaError_t LaunchForDim(const FastAttentionPlan& plan, const FastArgs& args, cudaStream_t stream) {
  constexpr bool kRoomy = PlanesOf<T>() == 1 && DP <= 128;  // three K/V stages fit
  if (plan.reduce != Reduce::kSum) {
    if constexpr (DP <= 128) {
      if (plan.chunk_rows == 128) {
        return LaunchAll<T, DP, false, 2, 64, 3, 2, 64, 3, true>(plan, args, stream);
      }
      if (plan.chunk_rows == 32) {
        return LaunchAll<T, DP, false, 1, 32, 2, 1, 32, 2, true>(plan, args, stream);
      }
      return LaunchAll<T, DP, false, 1, 16, 2, 1, 16, 2, true>(plan, args, stream);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  if (plan.with_values) {
    if constexpr (DP <= 128) {
      return LaunchAll<T, DP, true, 1, 32, kRoomy ? 3 : 2, 1, 32, 2>(plan, args, stream);
    } else {
      return LaunchAll<T, DP, true, 1, 32, 2, 2, 16, 2>(plan, args, stream);
    }
  }
  if (plan.chunk_rows == 128) return LaunchAll<T, DP, false, 2, 64, 3, 2, 64, 3>(plan, args, stream);
  if (plan.chunk_rows == 32) return LaunchAll<T, DP, false, 1, 32, 2, 1, 32, 2>(plan, args, stream);
  return LaunchAll<T, DP, false, 1, 16, 2, 1, 16, 2>(plan, args, stream);
}

/// Picks DP for element type T (f32 inputs take two planes: at most DP = 128) and runs every
/// pass (kRowsOnly: pass A and the combine).
template <typename T, bool kRowsOnly = false>
cudaError_t LaunchForType(const FastAttentionPlan& plan, const FastArgs& args, cudaStream_t stream) {
  switch (plan.padded_dim) {
    case 64:
      return kRowsOnly ? LaunchRowsForDim<T, 64>(plan, args, stream)
                       : LaunchForDim<T, 64>(plan, args, stream);
    case 128:
      return kRowsOnly ? LaunchRowsForDim<T, 128>(plan, args, stream)
                       : LaunchForDim<T, 128>(plan, args, stream);
    case 256:
      if constexpr (std::is_same<T, float>::value) {
        return cudaErrorInvalidValue;
      } else {
        return kRowsOnly ? LaunchRowsForDim<T, 256>(plan, args, stream)
                         : LaunchForDim<T, 256>(plan, args, stream);
      }
    default: return cudaErrorInvalidValue;
  }
}

/// The kernels' arguments for `plan` over `layer` with the scratch regions at `base`.
FastArgs ArgsOf(const FastAttentionPlan& plan, const DeviceLayer& layer,
                const ScorerParams& params, char* base, float* out) {
  FastArgs args;
  args.keys = layer.keys;
  args.values = layer.values;
  args.queries = layer.queries;
  args.n = plan.num_tokens;
  args.d = plan.head_dim;
  args.w = plan.window_rows;
  args.group = plan.group;
  args.rows_per_qhead = plan.rows_per_qhead;
  args.first_row = plan.first_row;
  args.rows = plan.rows;
  args.num_kv_heads = plan.num_kv_heads;
  args.rows_total = plan.num_chunks * plan.chunk_rows;
  args.tiles_per_split = plan.tiles_per_split;
  args.parts = plan.parts;
  args.num_tiles = plan.num_tiles;
  args.scale2 = layer.softmax_scale * kLog2e;
  args.eps = params.eps;
  args.bf16_round = params.bf16_prob_round;
  args.direct_finish = plan.direct_finish;
  args.finish = plan.finish;
  args.reduce = plan.reduce;
  args.seg_log2 = plan.seg_log2;
  args.block_rows = plan.block_rows;
  args.in_bits = plan.in_bits;
  args.lane_bits = plan.lane_bits;
  args.part_max = reinterpret_cast<float*>(base + plan.part_max_offset);
  args.part_sum = reinterpret_cast<float*>(base + plan.part_sum_offset);
  args.part_out = reinterpret_cast<float*>(base + plan.part_out_offset);
  args.row_info = reinterpret_cast<RowInfo*>(base + plan.row_info_offset);
  args.row_out = base + plan.row_out_offset;
  args.partial = reinterpret_cast<float*>(base + plan.partial_offset);
  args.out = out;
  args.nonfinite = plan.dtype != DType::kF32 ? layer.finite_flag : nullptr;
  return args;
}

}  // namespace

cudaError_t LaunchFastAttentionScores(const FastAttentionPlan& plan, const DeviceLayer& layer,
                                      const ScorerParams& params, void* scratch, float* out,
                                      cudaStream_t stream) {
  if (plan.num_tokens == 0) return cudaSuccess;
  if (out == nullptr || scratch == nullptr) return cudaErrorInvalidValue;
  const FastArgs args = ArgsOf(plan, layer, params, static_cast<char*>(scratch), out);
  switch (plan.dtype) {
    case DType::kF32: return LaunchForType<float>(plan, args, stream);
    case DType::kF16: return LaunchForType<__half>(plan, args, stream);
    case DType::kBF16: return LaunchForType<__nv_bfloat16>(plan, args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchFastAttentionRows(const FastAttentionPlan& plan, const DeviceLayer& layer,
                                    const int64_t* list_offsets, const int32_t* list_indices,
                                    int32_t num_lists, void* scratch, RowInfo* row_info,
                                    void* row_out, cudaStream_t stream) {
  const bool gathered = list_indices != nullptr;
  if (!plan.with_values || plan.reduce != Reduce::kSum || scratch == nullptr ||
      row_info == nullptr || row_out == nullptr ||
      (gathered && (list_offsets == nullptr ||
                    (num_lists != 1 && num_lists != plan.num_kv_heads)))) {
    return cudaErrorInvalidValue;
  }
  if (!gathered && plan.num_tokens == 0) return cudaSuccess;
  ScorerParams params;
  FastArgs args = ArgsOf(plan, layer, params, static_cast<char*>(scratch), nullptr);
  if (gathered) {
    args.n = layer.num_tokens;  // the plan's tokens only size its tiles (list positions)
    args.list_offsets = list_offsets;
    args.list_indices = list_indices;
    args.one_list = num_lists == 1;
  }
  args.row_info = row_info;
  args.row_out = row_out;
  switch (plan.dtype) {
    case DType::kF32: return LaunchForType<float, true>(plan, args, stream);
    case DType::kF16: return LaunchForType<__half, true>(plan, args, stream);
    case DType::kBF16: return LaunchForType<__nv_bfloat16, true>(plan, args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvtrim::gpu::fast

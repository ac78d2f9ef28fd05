// SIMD steps of the fast CPU kernels, compiled once per instruction set: a translation unit
// includes this after hwy/foreach_target.h (Highway's per-target include guard below) and
// exports the entry points it dispatches. Layouts: a tile is `count` <= kFastTokenTile
// consecutive tokens; "token-major" [count, rows] matrices hold one row of window rows per
// token; `seen` [rows] is how many of the tile's tokens each row sees (floats, 0 for padding
// rows); rows are a multiple of the vector length.
#if defined(KVTRIM_KERNELS_CPU_FAST_TILE_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVTRIM_KERNELS_CPU_FAST_TILE_OPS_INL_H_
#undef KVTRIM_KERNELS_CPU_FAST_TILE_OPS_INL_H_
#else
#define KVTRIM_KERNELS_CPU_FAST_TILE_OPS_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvtrim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// lt [count, rows] = k [count, d] . qt [d, rows] (qt's rows `q_stride` apart): the logits
/// of `count` tokens (keys in their own row-major layout) against the scaled query rows
/// transposed (rows a multiple of the vector length). Blocks of 6 (then 4) tokens x 2 row
/// vectors (or 4 x 1) held in registers across d, one fused multiply-add per token and
/// vector: 12 accumulators, two vector loads and six broadcasts per step (fits AVX2's 16
/// registers). Every output is one FMA chain over i = 0 .. d-1, whatever the blocking.
/// With kLower, qt is lower triangular (qt[i, c] = 0 for i < c): the sum of a block of
/// columns starting at c0 runs over i >= c0 only (about half the products of a [d, d] matrix).
template <bool kLower>
inline void TileProductT(const float* qt, int64_t q_stride, int64_t rows, const float* k,
                         int64_t count, int64_t d, float* lt) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; r += lanes) {
    const bool two = r + 2 * lanes <= rows;
    int64_t j = 0;
    if (two) {
      for (; j + 6 <= count; j += 6) {
        const float* k0 = k + j * d;
        auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
        auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
        auto a40 = hn::Zero(df), a41 = hn::Zero(df), a50 = hn::Zero(df), a51 = hn::Zero(df);
        for (int64_t i = kLower ? r : 0; i < d; ++i) {
          const auto q0 = hn::LoadU(df, qt + i * q_stride + r);
          const auto q1 = hn::LoadU(df, qt + i * q_stride + r + lanes);
          auto b = hn::Set(df, k0[i]);
          a00 = hn::MulAdd(b, q0, a00);
          a01 = hn::MulAdd(b, q1, a01);
          b = hn::Set(df, k0[d + i]);
          a10 = hn::MulAdd(b, q0, a10);
          a11 = hn::MulAdd(b, q1, a11);
          b = hn::Set(df, k0[2 * d + i]);
          a20 = hn::MulAdd(b, q0, a20);
          a21 = hn::MulAdd(b, q1, a21);
          b = hn::Set(df, k0[3 * d + i]);
          a30 = hn::MulAdd(b, q0, a30);
          a31 = hn::MulAdd(b, q1, a31);
          b = hn::Set(df, k0[4 * d + i]);
          a40 = hn::MulAdd(b, q0, a40);
          a41 = hn::MulAdd(b, q1, a41);
          b = hn::Set(df, k0[5 * d + i]);
          a50 = hn::MulAdd(b, q0, a50);
          a51 = hn::MulAdd(b, q1, a51);
        }
        float* out = lt + j * rows + r;
        hn::StoreU(a00, df, out);
        hn::StoreU(a01, df, out + lanes);
        hn::StoreU(a10, df, out + rows);
        hn::StoreU(a11, df, out + rows + lanes);
        hn::StoreU(a20, df, out + 2 * rows);
        hn::StoreU(a21, df, out + 2 * rows + lanes);
        hn::StoreU(a30, df, out + 3 * rows);
        hn::StoreU(a31, df, out + 3 * rows + lanes);
        hn::StoreU(a40, df, out + 4 * rows);
        hn::StoreU(a41, df, out + 4 * rows + lanes);
        hn::StoreU(a50, df, out + 5 * rows);
        hn::StoreU(a51, df, out + 5 * rows + lanes);
      }
      for (; j + 4 <= count; j += 4) {
        const float* k0 = k + j * d;
        auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
        auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
        for (int64_t i = kLower ? r : 0; i < d; ++i) {
          const auto q0 = hn::LoadU(df, qt + i * q_stride + r);
          const auto q1 = hn::LoadU(df, qt + i * q_stride + r + lanes);
          const auto b0 = hn::Set(df, k0[i]);
          const auto b1 = hn::Set(df, k0[d + i]);
          const auto b2 = hn::Set(df, k0[2 * d + i]);
          const auto b3 = hn::Set(df, k0[3 * d + i]);
          a00 = hn::MulAdd(b0, q0, a00);
          a01 = hn::MulAdd(b0, q1, a01);
          a10 = hn::MulAdd(b1, q0, a10);
          a11 = hn::MulAdd(b1, q1, a11);
          a20 = hn::MulAdd(b2, q0, a20);
          a21 = hn::MulAdd(b2, q1, a21);
          a30 = hn::MulAdd(b3, q0, a30);
          a31 = hn::MulAdd(b3, q1, a31);
        }
        float* out = lt + j * rows + r;
        hn::StoreU(a00, df, out);
        hn::StoreU(a01, df, out + lanes);
        hn::StoreU(a10, df, out + rows);
        hn::StoreU(a11, df, out + rows + lanes);
        hn::StoreU(a20, df, out + 2 * rows);
        hn::StoreU(a21, df, out + 2 * rows + lanes);
        hn::StoreU(a30, df, out + 3 * rows);
        hn::StoreU(a31, df, out + 3 * rows + lanes);
      }
    } else {
      for (; j + 4 <= count; j += 4) {
        const float* k0 = k + j * d;
        auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
        for (int64_t i = kLower ? r : 0; i < d; ++i) {
          const auto q0 = hn::LoadU(df, qt + i * q_stride + r);
          a0 = hn::MulAdd(hn::Set(df, k0[i]), q0, a0);
          a1 = hn::MulAdd(hn::Set(df, k0[d + i]), q0, a1);
          a2 = hn::MulAdd(hn::Set(df, k0[2 * d + i]), q0, a2);
          a3 = hn::MulAdd(hn::Set(df, k0[3 * d + i]), q0, a3);
        }
        float* out = lt + j * rows + r;
        hn::StoreU(a0, df, out);
        hn::StoreU(a1, df, out + rows);
        hn::StoreU(a2, df, out + 2 * rows);
        hn::StoreU(a3, df, out + 3 * rows);
      }
    }
    for (; j < count; ++j) {  // the tile's last tokens, one at a time
      for (int64_t v = 0; v < (two ? 2 : 1); ++v) {
        auto a = hn::Zero(df);
        for (int64_t i = kLower ? r : 0; i < d; ++i) {
          a = hn::MulAdd(hn::Set(df, k[j * d + i]),
                         hn::LoadU(df, qt + i * q_stride + r + v * lanes), a);
        }
        hn::StoreU(a, df, lt + j * rows + r + v * lanes);
      }
    }
    if (two) r += lanes;
  }
}

/// The product of TileProductT over a dense qt.
inline void TileLogitsT(const float* qt, int64_t q_stride, int64_t rows, const float* k,
                        int64_t count, int64_t d, float* lt) {
  TileProductT<false>(qt, q_stride, rows, k, count, d, lt);
}

/// The product of TileProductT over a lower-triangular qt [d, rows] (rows >= d): y = k L
/// for a Cholesky factor L of a d x d matrix.
inline void TileLowerProductT(const float* qt, int64_t q_stride, int64_t rows, const float* k,
                              int64_t count, int64_t d, float* lt) {
  TileProductT<true>(qt, q_stride, rows, k, count, d, lt);
}

/// lt[j, r] = q_r . k_j for the first `rows` rows of q [rows, d] (row-major) and `count`
/// tokens (the columns of lt past `rows`, up to `stride`, are left as they are): each dot
/// product vectorised over d and reduced across lanes. For a few rows (TOVA's G), where
/// TileLogitsT would compute a whole vector of rows for each token.
inline void TileLogitsDot(const float* q, int64_t rows, const float* k, int64_t count, int64_t d,
                   int64_t stride, float* lt) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float* kj = k + j * d;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * d;
      auto acc = hn::Zero(df);
      int64_t i = 0;
      for (; i + lanes <= d; i += lanes) {
        acc = hn::MulAdd(hn::LoadU(df, qr + i), hn::LoadU(df, kj + i), acc);
      }
      float dot = hn::GetLane(hn::SumOfLanes(df, acc));
      for (; i < d; ++i) dot += qr[i] * kj[i];
      lt[j * stride + r] = dot;
    }
  }
}

/// Per row r (vectorised over rows) of lt [count, rows]: the maximum and the sum of exp(l -
/// max) over the tokens j < seen[r] (seen: floats, 0 for rows that see none of the tile,
/// whose maximum is then -inf and sum 0); and, when exp_out is not null (it may be lt
/// itself), those exp(l - max) [count, rows], 0 where the row does not see the token.
inline void TileRowStats(const float* lt, int64_t count, int64_t rows, const float* seen,
                         float* max_out, float* sum_out, float* exp_out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto neg_inf = hn::Set(df, -HUGE_VALF);
  for (int64_t r = 0; r < rows; r += lanes) {
    const auto limit = hn::LoadU(df, seen + r);
    auto m = neg_inf;
    for (int64_t j = 0; j < count; ++j) {
      const auto visible = hn::Lt(hn::Set(df, static_cast<float>(j)), limit);
      m = hn::Max(m, hn::IfThenElse(visible, hn::LoadU(df, lt + j * rows + r), neg_inf));
    }
    // Rows that see nothing keep -inf; shift them by 0 so that exp stays finite (masked).
    const auto shift = hn::IfThenElse(hn::Eq(m, neg_inf), hn::Zero(df), hn::Neg(m));
    auto s = hn::Zero(df);
    for (int64_t j = 0; j < count; ++j) {
      const auto visible = hn::Lt(hn::Set(df, static_cast<float>(j)), limit);
      const auto e = hn::IfThenElseZero(
          visible, hn::Exp(df, hn::Add(hn::LoadU(df, lt + j * rows + r), shift)));
      s = hn::Add(s, e);
      if (exp_out != nullptr) hn::StoreU(e, df, exp_out + j * rows + r);
    }
    hn::StoreU(m, df, max_out + r);
    hn::StoreU(s, df, sum_out + r);
  }
}

/// sums[j] = sum over rows r with j < seen[r] of exp(lt[j, r] + neg_max[r]) * inv_sum[r],
/// for j < count (the rows' vectors added in order, then across lanes).
inline void TileAddProbs(const float* lt, int64_t count, int64_t rows, const float* seen,
                  const float* neg_max, const float* inv_sum, float* sums) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const auto token = hn::Set(df, static_cast<float>(j));
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      const auto visible = hn::Lt(token, hn::LoadU(df, seen + r));
      const auto e = hn::Exp(df, hn::Add(hn::LoadU(df, lt + j * rows + r), hn::LoadU(df, neg_max + r)));
      acc = hn::Add(acc, hn::IfThenElseZero(visible, hn::Mul(e, hn::LoadU(df, inv_sum + r))));
    }
    sums[j] = hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// Lanes of a float vector on this target.
inline int64_t FloatLanes() { return static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>())); }

/// sums[j] = sum_r e[j, r] * factor[r] for j < count (e [count, rows] token-major, 0 where a
/// row does not see the token; the rows' vectors added in order, then across lanes).
inline void TileAddScaled(const float* e, int64_t count, int64_t rows, const float* factor,
                          float* sums) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      acc = hn::MulAdd(hn::LoadU(df, e + j * rows + r), hn::LoadU(df, factor + r), acc);
    }
    sums[j] = hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// In place over e [count, rows]: e[j, r] *= factor[r].
inline void TileScaleRows(float* e, int64_t count, int64_t rows, const float* factor) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t r = 0; r < rows; r += lanes) {
      float* x = e + j * rows + r;
      hn::StoreU(hn::Mul(hn::LoadU(df, x), hn::LoadU(df, factor + r)), df, x);
    }
  }
}

/// In place over lt [count, rows]: p = exp(l + neg_max[r]) * inv_sum[r] where row r sees
/// token j (j < seen[r]), else 0.
inline void TileProbs(float* lt, int64_t count, int64_t rows, const float* seen,
                      const float* neg_max, const float* inv_sum) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const auto token = hn::Set(df, static_cast<float>(j));
    for (int64_t r = 0; r < rows; r += lanes) {
      const auto visible = hn::Lt(token, hn::LoadU(df, seen + r));
      float* l = lt + j * rows + r;
      const auto e = hn::Exp(df, hn::Add(hn::LoadU(df, l), hn::LoadU(df, neg_max + r)));
      hn::StoreU(hn::IfThenElseZero(visible, hn::Mul(e, hn::LoadU(df, inv_sum + r))), df, l);
    }
  }
}

/// a [rows, d] += p^T v: a[r, :] += sum_j p[j, r] * v[j, :] over the tile (p [count, rows]
/// token-major, v [count, d] row-major, rows a multiple of 4). The tile's sums are held in
/// registers (4 rows x 2 vectors of columns) and added to `a` once, in token order.
inline void TileAddPV(const float* p, int64_t count, int64_t rows, const float* v, int64_t d,
                      float* a) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + 2 * lanes <= d; i += 2 * lanes) {
    for (int64_t r = 0; r < rows; r += 4) {
      auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
      auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
      for (int64_t j = 0; j < count; ++j) {
        const auto v0 = hn::LoadU(df, v + j * d + i);
        const auto v1 = hn::LoadU(df, v + j * d + i + lanes);
        const float* pj = p + j * rows + r;
        const auto b0 = hn::Set(df, pj[0]);
        const auto b1 = hn::Set(df, pj[1]);
        const auto b2 = hn::Set(df, pj[2]);
        const auto b3 = hn::Set(df, pj[3]);
        a00 = hn::MulAdd(b0, v0, a00);
        a01 = hn::MulAdd(b0, v1, a01);
        a10 = hn::MulAdd(b1, v0, a10);
        a11 = hn::MulAdd(b1, v1, a11);
        a20 = hn::MulAdd(b2, v0, a20);
        a21 = hn::MulAdd(b2, v1, a21);
        a30 = hn::MulAdd(b3, v0, a30);
        a31 = hn::MulAdd(b3, v1, a31);
      }
      float* out = a + r * d + i;
      hn::StoreU(hn::Add(hn::LoadU(df, out), a00), df, out);
      hn::StoreU(hn::Add(hn::LoadU(df, out + lanes), a01), df, out + lanes);
      hn::StoreU(hn::Add(hn::LoadU(df, out + d), a10), df, out + d);
      hn::StoreU(hn::Add(hn::LoadU(df, out + d + lanes), a11), df, out + d + lanes);
      hn::StoreU(hn::Add(hn::LoadU(df, out + 2 * d), a20), df, out + 2 * d);
      hn::StoreU(hn::Add(hn::LoadU(df, out + 2 * d + lanes), a21), df, out + 2 * d + lanes);
      hn::StoreU(hn::Add(hn::LoadU(df, out + 3 * d), a30), df, out + 3 * d);
      hn::StoreU(hn::Add(hn::LoadU(df, out + 3 * d + lanes), a31), df, out + 3 * d + lanes);
    }
  }
  for (; i + lanes <= d; i += lanes) {  // one vector of columns left
    for (int64_t r = 0; r < rows; ++r) {
      auto acc = hn::Zero(df);
      for (int64_t j = 0; j < count; ++j) {
        acc = hn::MulAdd(hn::Set(df, p[j * rows + r]), hn::LoadU(df, v + j * d + i), acc);
      }
      float* out = a + r * d + i;
      hn::StoreU(hn::Add(hn::LoadU(df, out), acc), df, out);
    }
  }
  for (; i < d; ++i) {  // columns past the last whole vector (d not a multiple of it)
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (int64_t j = 0; j < count; ++j) acc += p[j * rows + r] * v[j * d + i];
      a[r * d + i] += acc;
    }
  }
}

/// out[j] = |v_j|^2 for the tile's rows v [count, d].
inline void TileSquaredNorms(const float* v, int64_t count, int64_t d, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float* vj = v + j * d;
    auto acc = hn::Zero(df);
    int64_t i = 0;
    for (; i + lanes <= d; i += lanes) {
      const auto x = hn::LoadU(df, vj + i);
      acc = hn::MulAdd(x, x, acc);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, acc));
    for (; i < d; ++i) sum += vj[i] * vj[i];
    out[j] = sum;
  }
}

/// p rounded to the nearest bf16 (ties to even), kept in fp32: DropKV's bf16_prob_round
/// (RoundToBf16 of base/dtype.h for the finite p in [0, 1] this sees).
template <class D, class V>
HWY_INLINE V RoundToBf16Lanes(D df, V p) {
  const hn::RebindToUnsigned<D> du;
  const auto bits = hn::BitCast(du, p);
  const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd));
  return hn::BitCast(df, hn::And(rounded, hn::Set(du, 0xFFFF0000u)));
}

/// cost[j] += sum over the rows r that see token j of omega(p~) * max(0, aa[r] + vv[j] - 2
/// av[j, r]), omega = (p~ / (1 - p~ + eps))^2, p~ = p[j, r] rounded to bf16 when
/// `round_bf16` (DropKV's eviction cost terms; p and av [count, rows] token-major).
inline void TileDropKVCost(const float* p, const float* av, int64_t count, int64_t rows,
                           const float* seen, const float* aa, const float* vv, float eps,
                           bool round_bf16, float* cost) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f);
  const auto eps_v = hn::Set(df, eps);
  const auto two = hn::Set(df, 2.0f);
  const auto zero = hn::Zero(df);
  for (int64_t j = 0; j < count; ++j) {
    const auto token = hn::Set(df, static_cast<float>(j));
    const auto vvj = hn::Set(df, vv[j]);
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      const auto visible = hn::Lt(token, hn::LoadU(df, seen + r));
      auto pr = hn::LoadU(df, p + j * rows + r);
      if (round_bf16) pr = RoundToBf16Lanes(df, pr);
      const auto ratio = hn::Div(pr, hn::Add(hn::Sub(one, pr), eps_v));
      const auto raw = hn::NegMulAdd(two, hn::LoadU(df, av + j * rows + r),
                                     hn::Add(hn::LoadU(df, aa + r), vvj));
      const auto term = hn::Mul(hn::Mul(ratio, ratio), hn::Max(raw, zero));
      acc = hn::Add(acc, hn::IfThenElseZero(visible, term));
    }
    cost[j] += hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// sum[c] += sum_j u_j[c] over the tile's rows k [count, d], u_j = k_j / norms[j] (zero
/// rows: 0) when `unit`, else k_j: KeyDiff's anchor sums (rows in order per lane).
inline void TileAddRows(const float* k, int64_t count, int64_t d, const float* norms, bool unit,
                        float* sum) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float inv = !unit ? 1.0f : norms[j] > 0.0f ? 1.0f / norms[j] : 0.0f;
    const auto scale = hn::Set(df, inv);
    const float* kj = k + j * d;
    int64_t i = 0;
    for (; i + lanes <= d; i += lanes) {
      hn::StoreU(hn::MulAdd(hn::LoadU(df, kj + i), scale, hn::LoadU(df, sum + i)), df, sum + i);
    }
    for (; i < d; ++i) sum[i] += kj[i] * inv;
  }
}

/// sums[j] += sum_r |x[j, r]| for j < count (x [count, rows] token-major): the l1 norms of
/// projected rows, one block of output columns at a time (the rows' vectors added in order,
/// then across lanes).
inline void TileAddAbsRows(const float* x, int64_t count, int64_t rows, float* sums) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      acc = hn::Add(acc, hn::Abs(hn::LoadU(df, x + j * rows + r)));
    }
    sums[j] += hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// out[j] = sum_{i < d} a[j, i] * (b[j, i] + bias[i]) for j < count (a [count, d] rows d
/// apart, b [count, b_stride]; no bias when `bias` is null): the quadratic form a_j^T M a_j
/// once b = a M^T is known (and Expected Attention's linear term through the bias).
inline void TileRowDots(const float* a, const float* b, int64_t b_stride, const float* bias,
                        int64_t count, int64_t d, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float* aj = a + j * d;
    const float* bj = b + j * b_stride;
    auto acc = hn::Zero(df);
    int64_t i = 0;
    for (; i + lanes <= d; i += lanes) {
      auto y = hn::LoadU(df, bj + i);
      if (bias != nullptr) y = hn::Add(y, hn::LoadU(df, bias + i));
      acc = hn::MulAdd(hn::LoadU(df, aj + i), y, acc);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, acc));
    for (; i < d; ++i) sum += aj[i] * (bj[i] + (bias != nullptr ? bias[i] : 0.0f));
    out[j] = sum;
  }
}

/// out[j] = factor * sum_{c < cols} y[j, c]^2 + sum_{i < d} k[j, i] * bias[i] (no bias term
/// when `bias` is null) for j < count: y [count, y_stride] (cols a multiple of the vector
/// length), k [count, d]. A quadratic form k_j^T M k_j = |L^T k_j|^2 once y = k L is known
/// for M = L L^T, plus a linear term.
inline void TileSquaresPlusDot(const float* y, int64_t y_stride, int64_t cols, float factor,
                               const float* k, int64_t d, const float* bias, int64_t count,
                               float* out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    const float* yj = y + j * y_stride;
    auto acc = hn::Zero(df);
    for (int64_t c = 0; c < cols; c += lanes) {
      const auto x = hn::LoadU(df, yj + c);
      acc = hn::MulAdd(x, x, acc);
    }
    float sum = factor * hn::GetLane(hn::SumOfLanes(df, acc));
    if (bias != nullptr) {
      const float* kj = k + j * d;
      auto lin = hn::Zero(df);
      int64_t i = 0;
      for (; i + lanes <= d; i += lanes) {
        lin = hn::MulAdd(hn::LoadU(df, kj + i), hn::LoadU(df, bias + i), lin);
      }
      float dot = hn::GetLane(hn::SumOfLanes(df, lin));
      for (; i < d; ++i) dot += kj[i] * bias[i];
      sum += dot;
    }
    out[j] = sum;
  }
}

/// sums[j] = sum_r factor[r] * e[j, r]^2 for j < count (e [count, rows] token-major): the
/// squared probabilities of the rows a 0/1 factor selects (the rows' vectors added in order,
/// then across lanes).
inline void TileAddScaledSquares(const float* e, int64_t count, int64_t rows, const float* factor,
                                 float* sums) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t j = 0; j < count; ++j) {
    auto acc = hn::Zero(df);
    for (int64_t r = 0; r < rows; r += lanes) {
      const auto x = hn::LoadU(df, e + j * rows + r);
      acc = hn::MulAdd(hn::Mul(x, x), hn::LoadU(df, factor + r), acc);
    }
    sums[j] = hn::GetLane(hn::SumOfLanes(df, acc));
  }
}

/// The maximum of x[0..count) and the sum of exp(x - max) over them: one row's softmax
/// statistics over a tile (x readable up to count rounded up to the vector length; the
/// lanes past count are masked out).
inline void RowMaxExpSum(const float* x, int64_t count, float* max_out, float* sum_out) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto neg_inf = hn::Set(df, -HUGE_VALF);
  auto m = neg_inf;
  for (int64_t j = 0; j < count; j += lanes) {
    const auto valid = hn::FirstN(df, static_cast<size_t>(count - j));
    m = hn::Max(m, hn::IfThenElse(valid, hn::LoadU(df, x + j), neg_inf));
  }
  const float max = hn::GetLane(hn::MaxOfLanes(df, m));
  const auto shift = hn::Set(df, max == -HUGE_VALF ? 0.0f : -max);
  auto s = hn::Zero(df);
  for (int64_t j = 0; j < count; j += lanes) {
    const auto valid = hn::FirstN(df, static_cast<size_t>(count - j));
    s = hn::Add(s, hn::IfThenElseZero(valid, hn::Exp(df, hn::Add(hn::LoadU(df, x + j), shift))));
  }
  *max_out = max;
  *sum_out = hn::GetLane(hn::SumOfLanes(df, s));
}

/// acc[j] += exp(x[j] + neg_max) * inv_sum for j < count (x and acc readable and acc
/// writable up to count rounded up to the vector length; those lanes get 0 added): one
/// row's probabilities added to a running sum.
inline void RowAddProbs(const float* x, int64_t count, float neg_max, float inv_sum, float* acc) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto shift = hn::Set(df, neg_max);
  const auto scale = hn::Set(df, inv_sum);
  for (int64_t j = 0; j < count; j += lanes) {
    const auto valid = hn::FirstN(df, static_cast<size_t>(count - j));
    const auto e = hn::IfThenElseZero(valid, hn::Exp(df, hn::Add(hn::LoadU(df, x + j), shift)));
    hn::StoreU(hn::MulAdd(e, scale, hn::LoadU(df, acc + j)), df, acc + j);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvtrim
HWY_AFTER_NAMESPACE();

#endif  // KVTRIM_KERNELS_CPU_FAST_TILE_OPS_INL_H_

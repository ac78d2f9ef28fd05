#include "kernels/expected_attention_stats.h"

#include <cmath>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "kernels/layer_error.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

/// Mean RoPE rotation over positions [start, start + count): per pair i, (mean cos, mean sin).
void MeanRotation(const std::vector<double>& inv_freq, int64_t start, int64_t count,
                  std::vector<double>* cos_bar, std::vector<double>* sin_bar) {
  const size_t half = inv_freq.size();
  cos_bar->assign(half, 0.0);
  sin_bar->assign(half, 0.0);
  for (size_t i = 0; i < half; ++i) {
    double c = 0, s = 0;
    for (int64_t p = start; p < start + count; ++p) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      c += std::cos(angle);
      s += std::sin(angle);
    }
    (*cos_bar)[i] = c / static_cast<double>(count);
    (*sin_bar)[i] = s / static_cast<double>(count);
  }
}

/// MeanRotation, remembered for the last few (frequencies, start, count): every layer of a
/// prefill has the same n, so one prefill computes the count x d/2 cos / sin sums once
/// instead of once per layer (the same values either way). Thread-safe.
void CachedMeanRotation(const std::vector<double>& inv_freq, int64_t start, int64_t count,
                        std::vector<double>* cos_bar, std::vector<double>* sin_bar) {
  struct Entry {
    std::vector<double> inv_freq;
    int64_t start = 0, count = 0;
    std::vector<double> cos_bar, sin_bar;
  };
  static std::mutex mutex;
  static std::deque<Entry> entries;  // most recent first
  constexpr size_t kEntries = 16;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& e : entries) {
      if (e.start == start && e.count == count && e.inv_freq == inv_freq) {
        *cos_bar = e.cos_bar;
        *sin_bar = e.sin_bar;
        return;
      }
    }
  }
  MeanRotation(inv_freq, start, count, cos_bar, sin_bar);
  std::lock_guard<std::mutex> lock(mutex);
  entries.push_front(Entry{inv_freq, start, count, *cos_bar, *sin_bar});
  if (entries.size() > kEntries) entries.pop_back();
}

/// R x for the block-diagonal rotation with per-pair (c, s): (a, b) -> (c a - s b, s a + c b).
void Rotate(const RopeConfig& rope, int64_t d, const std::vector<double>& c,
            const std::vector<double>& s, const double* x, double* out) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const auto [a, b] = rope.PairDims(i, d);
    out[a] = c[i] * x[a] - s[i] * x[b];
    out[b] = s[i] * x[a] + c[i] * x[b];
  }
}

}  // namespace

absl::StatusOr<ExpectedQueryStats> ComputeExpectedQueryStats(const RegisteredModel& model,
                                                             const ResolvedParams& params,
                                                             int32_t layer_id, int64_t n,
                                                             const TensorView& queries,
                                                             float softmax_scale) {
  const QueryStatsSource source = params.Enum<QueryStatsSource>("query_stats");
  const int64_t hq = model.layout.num_query_heads;
  const int64_t d = model.layout.head_dim;
  const RopeConfig& rope = model.rope;
  const std::vector<double> inv_freq = rope.InverseFrequencies(d);
  bool use_model = source == QueryStatsSource::kModel ||
                   (source == QueryStatsSource::kAuto && model.has_query_stats());
  // PolicyEngine::AttachModel refused query_stats=model for a model without statistics:
  // reaching here so is a caller that skipped the engine (INTERNAL, naming no request field).
  if (use_model && !model.has_query_stats()) {
    return absl::InternalError(absl::StrCat("expected_attention: query_stats=model on model ",
                                            model.digest, ", registered without statistics"));
  }
  // Pre-RoPE mean [H_q, d] and covariance [H_q, d, d] in double.
  std::vector<double> mean(static_cast<size_t>(hq * d), 0.0);
  std::vector<double> cov(static_cast<size_t>(hq * d * d), 0.0);
  ExpectedQueryStats out;
  if (use_model) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] = model.query_mean[layer_id][i];
    for (size_t i = 0; i < cov.size(); ++i) cov[i] = model.query_cov[layer_id][i];
  } else {
    if (!queries.present()) {
      return LayerFieldError("queries",
                             "expected_attention without registered query statistics estimates "
                             "them from the query window [H_q, w, d]; send it");
    }
    out.from_window = true;
    const int64_t w = queries.shape[1];
    std::vector<float> row(static_cast<size_t>(d));
    std::vector<double> pre(static_cast<size_t>(w * d));
    std::vector<double> c(static_cast<size_t>(d / 2)), s(static_cast<size_t>(d / 2));
    std::vector<double> x(static_cast<size_t>(d));
    for (int64_t q = 0; q < hq; ++q) {
      for (int64_t t = 0; t < w; ++t) {
        ConvertToF32(queries.dtype,
                     static_cast<const char*>(queries.data) +
                         ((q * w + t) * d) * static_cast<int64_t>(DTypeSize(queries.dtype)),
                     static_cast<size_t>(d), row.data());
        const double position = static_cast<double>(n - w + t);
        // Inverse rotation R(-position).
        for (int64_t i = 0; i < d / 2; ++i) {
          c[i] = std::cos(position * inv_freq[i]);
          s[i] = -std::sin(position * inv_freq[i]);
        }
        for (int64_t i = 0; i < d; ++i) x[i] = row[i];
        Rotate(rope, d, c, s, x.data(), pre.data() + t * d);
      }
      double* mu = mean.data() + q * d;
      for (int64_t t = 0; t < w; ++t) {
        for (int64_t i = 0; i < d; ++i) mu[i] += pre[t * d + i];
      }
      for (int64_t i = 0; i < d; ++i) mu[i] /= static_cast<double>(w);
      double* sigma = cov.data() + q * d * d;
      for (int64_t t = 0; t < w; ++t) {
        for (int64_t i = 0; i < d; ++i) {
          const double a = pre[t * d + i] - mu[i];
          for (int64_t k = 0; k < d; ++k) sigma[i * d + k] += a * (pre[t * d + k] - mu[k]);
        }
      }
      for (int64_t i = 0; i < d * d; ++i) sigma[i] /= static_cast<double>(w);
    }
  }
  // Mean rotation over the next positions; mu_bar = R mu, Sigma_bar = R Sigma R^T.
  std::vector<double> cbar, sbar;
  CachedMeanRotation(inv_freq, n, params.Int("n_future_positions"), &cbar, &sbar);
  out.mean.resize(static_cast<size_t>(hq * d));
  out.cov.resize(static_cast<size_t>(hq * d * d));
  std::vector<double> tmp(static_cast<size_t>(d * d)), rotated(static_cast<size_t>(d));
  for (int64_t q = 0; q < hq; ++q) {
    Rotate(rope, d, cbar, sbar, mean.data() + q * d, rotated.data());
    for (int64_t i = 0; i < d; ++i) out.mean[q * d + i] = static_cast<float>(rotated[i]);
    // tmp = R Sigma: rotating every column k mixes rows a and b of each pair, element by
    // element (c x[a] - s x[b], s x[a] + c x[b]); done a row pair at a time, contiguous.
    const double* sigma = cov.data() + q * d * d;
    for (int64_t i = 0; i < d / 2; ++i) {
      const auto [a, b] = rope.PairDims(i, d);
      const double ci = cbar[i], si = sbar[i];
      const double* ra = sigma + a * d;
      const double* rb = sigma + b * d;
      double* ta = tmp.data() + a * d;
      double* tb = tmp.data() + b * d;
      for (int64_t k = 0; k < d; ++k) {
        ta[k] = ci * ra[k] - si * rb[k];
        tb[k] = si * ra[k] + ci * rb[k];
      }
    }
    // out = tmp R^T: rotate every row of tmp.
    for (int64_t i = 0; i < d; ++i) {
      Rotate(rope, d, cbar, sbar, tmp.data() + i * d, rotated.data());
      for (int64_t k = 0; k < d; ++k) out.cov[(q * d + i) * d + k] = static_cast<float>(rotated[k]);
    }
  }
  out.half_scale2 = static_cast<float>(0.5 * static_cast<double>(softmax_scale) *
                                       static_cast<double>(softmax_scale));
  return out;
}

}  // namespace kvtrim

#include "tests/oracle/attention_oracle.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

namespace kvtrim::oracle {

namespace {

// Element [i0, i1, i2] of a row-major [*, dim1, dim2] float tensor, as double.
double At(const std::vector<float>& x, int64_t dim1, int64_t dim2, int64_t i0, int64_t i1,
          int64_t i2) {
  return static_cast<double>(x[static_cast<size_t>((i0 * dim1 + i1) * dim2 + i2)]);
}

// Rounds to float, then to 8 significant bits (bfloat16) by arithmetic, round half to even.
double RoundBf16(double p) {
  const float f = static_cast<float>(p);
  if (f == 0.0f || !std::isfinite(f)) return f;
  int exponent = 0;
  const double mantissa = std::frexp(static_cast<double>(f), &exponent);  // [0.5, 1)
  const double scaled = mantissa * 256.0;  // 8 significant bits before the point
  double rounded = std::floor(scaled);
  const double frac = scaled - rounded;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(rounded, 2.0) != 0.0)) rounded += 1.0;
  return std::ldexp(rounded, exponent - 8);
}

// DropKV's weight (p~/(1-p~+eps))^2 for one probability.
double Omega(double p, const DropKVOptions& opt) {
  const double pr = opt.bf16_round ? RoundBf16(p) : p;
  const double ratio = pr / (1.0 - pr + opt.eps);
  return ratio * ratio;
}

}  // namespace

AttentionProblem RandomProblem(uint64_t seed, int64_t num_kv_heads, int64_t group, int64_t n,
                               int64_t d, int64_t w, double query_gain) {
  AttentionProblem pb;
  pb.num_kv_heads = num_kv_heads;
  pb.num_tokens = n;
  pb.head_dim = d;
  pb.num_query_heads = num_kv_heads * group;
  pb.window_rows = w;
  // The API carries the scale as fp32: use the fp32 value so both sides see the same one.
  pb.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<float>& x, int64_t count, double gain) {
    x.resize(static_cast<size_t>(count));
    for (auto& e : x) e = static_cast<float>(gain * normal(rng));
  };
  fill(pb.keys, num_kv_heads * n * d, 1.0);
  fill(pb.values, num_kv_heads * n * d, 1.0);
  fill(pb.queries, pb.num_query_heads * w * d, query_gain);
  return pb;
}

std::vector<double> ProbMatrix(const AttentionProblem& pb, int64_t q_head) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, w = pb.window_rows;
  const int64_t h = q_head / pb.group();
  std::vector<double> p(static_cast<size_t>(w * n), 0.0);
  for (int64_t t = 0; t < w; ++t) {
    const int64_t last = std::min(n - w + t, n - 1);  // causal: j <= n - w + t
    if (last < 0) continue;
    std::vector<double> logit(static_cast<size_t>(last + 1));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= last; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += At(pb.queries, w, d, q_head, t, i) * At(pb.keys, n, d, h, j, i);
      logit[j] = pb.scale * dot;
      m = std::max(m, logit[j]);
    }
    double z = 0;
    for (int64_t j = 0; j <= last; ++j) z += std::exp(logit[j] - m);
    for (int64_t j = 0; j <= last; ++j) p[t * n + j] = std::exp(logit[j] - m) / z;
  }
  return p;
}

std::vector<double> OutputMatrix(const AttentionProblem& pb, int64_t q_head) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, w = pb.window_rows;
  const int64_t h = q_head / pb.group();
  const std::vector<double> p = ProbMatrix(pb, q_head);
  std::vector<double> a(static_cast<size_t>(w * d), 0.0);
  for (int64_t t = 0; t < w; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += p[t * n + j] * At(pb.values, n, d, h, j, i);
      a[t * d + i] = s;
    }
  }
  return a;
}

std::vector<double> Pool(const std::vector<double>& x, int64_t kernel, bool max_pool) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t r = kernel / 2;
  const double pad = max_pool ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<double> padded(static_cast<size_t>(n + 2 * r), pad);
  std::copy(x.begin(), x.end(), padded.begin() + r);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double acc = max_pool ? pad : 0.0;
    for (int64_t i = j; i < j + kernel; ++i) {
      acc = max_pool ? std::max(acc, padded[i]) : acc + padded[i];
    }
    out[j] = max_pool ? acc : acc / static_cast<double>(kernel);
  }
  return out;
}

AttentionProblem WindowBoundarySpikeProblem() {
  AttentionProblem pb;
  pb.num_kv_heads = 1;
  pb.num_tokens = 40;
  pb.head_dim = 4;
  pb.num_query_heads = 1;
  pb.window_rows = 8;
  pb.scale = 0.5;  // 1/sqrt(4), exact in fp32
  pb.keys.assign(40 * 4, 0.0f);
  pb.keys[5 * 4] = 2.0f;
  pb.keys[15 * 4] = 1.0f;
  pb.keys[32 * 4] = 6.0f;
  pb.values.assign(40 * 4, 1.0f);
  pb.queries.assign(8 * 4, 0.0f);
  for (int t = 0; t < 8; ++t) pb.queries[t * 4] = 4.0f;
  return pb;
}

std::vector<double> SnapKVScores(const AttentionProblem& pb, int64_t window, int64_t kernel,
                                 bool max_pool) {
  const int64_t n = pb.num_tokens, w = pb.window_rows, G = pb.group();
  const int64_t prefix = std::max<int64_t>(0, n - window);
  std::vector<double> out;
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    // Columns of the prefix only: the softmax covers every visible key, the window columns
    // are dropped before pooling.
    std::vector<double> mean(static_cast<size_t>(prefix), 0.0);
    for (int64_t g = 0; g < G; ++g) {
      const std::vector<double> p = ProbMatrix(pb, h * G + g);
      for (int64_t t = w - window; t < w; ++t) {
        for (int64_t j = 0; j < prefix; ++j) {
          mean[j] += p[t * n + j] / static_cast<double>(window * G);
        }
      }
    }
    const std::vector<double> pooled = Pool(mean, kernel, max_pool);
    const double best = pooled.empty() ? 0.0 : *std::max_element(pooled.begin(), pooled.end());
    out.insert(out.end(), pooled.begin(), pooled.end());
    out.insert(out.end(), static_cast<size_t>(n - prefix), best);  // the window: max score
  }
  return out;
}

std::vector<double> H2OScores(const AttentionProblem& pb, bool causal_normalize) {
  const int64_t n = pb.num_tokens, w = pb.window_rows, G = pb.group();
  std::vector<double> out(static_cast<size_t>(pb.num_kv_heads * n), 0.0);
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    for (int64_t g = 0; g < G; ++g) {
      const std::vector<double> p = ProbMatrix(pb, h * G + g);
      for (int64_t t = 0; t < w; ++t) {
        for (int64_t j = 0; j < n; ++j) out[h * n + j] += p[t * n + j] / static_cast<double>(G);
      }
    }
    if (!causal_normalize) continue;
    for (int64_t j = 0; j < n; ++j) {
      int64_t seen_by = 0;
      for (int64_t t = 0; t < w; ++t) seen_by += (n - w + t >= j) ? 1 : 0;
      out[h * n + j] = seen_by == 0 ? 0.0 : out[h * n + j] / static_cast<double>(seen_by);
    }
  }
  return out;
}

std::vector<double> TovaScores(const AttentionProblem& pb) {
  const int64_t n = pb.num_tokens, w = pb.window_rows;
  std::vector<double> mean(static_cast<size_t>(n), 0.0);
  for (int64_t q = 0; q < pb.num_query_heads; ++q) {
    const std::vector<double> p = ProbMatrix(pb, q);
    for (int64_t j = 0; j < n; ++j) {
      mean[j] += p[(w - 1) * n + j] / static_cast<double>(pb.num_query_heads);
    }
  }
  std::vector<double> out;
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) out.insert(out.end(), mean.begin(), mean.end());
  return out;
}

std::vector<double> DropKVScoresDirect(const AttentionProblem& pb, const DropKVOptions& opt) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, w = pb.window_rows, G = pb.group();
  std::vector<double> out;
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    std::vector<double> cost(static_cast<size_t>(n), 0.0);
    for (int64_t g = 0; g < G; ++g) {
      const std::vector<double> p = ProbMatrix(pb, h * G + g);
      const std::vector<double> a = OutputMatrix(pb, h * G + g);
      for (int64_t t = w - opt.window; t < w; ++t) {
        for (int64_t j = 0; j < n; ++j) {
          if (j > n - w + t) continue;  // masked: p = 0
          double dist = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double diff = a[t * d + i] - At(pb.values, n, d, h, j, i);
            dist += diff * diff;
          }
          cost[j] += Omega(p[t * n + j], opt) * dist;
        }
      }
    }
    for (auto& c : cost) c /= static_cast<double>(G);
    const std::vector<double> pooled = Pool(cost, opt.kernel, opt.max_pool);
    out.insert(out.end(), pooled.begin(), pooled.end());
  }
  return out;
}

std::vector<double> DropKVScoresGemm(const AttentionProblem& pb, const DropKVOptions& opt) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, w = pb.window_rows, G = pb.group();
  const int64_t rows = G * opt.window;
  std::vector<double> out;
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    std::vector<double> omega(static_cast<size_t>(rows * n), 0.0);  // [rows, n]
    std::vector<double> A(static_cast<size_t>(rows * d), 0.0);      // [rows, d]
    for (int64_t g = 0; g < G; ++g) {
      const std::vector<double> p = ProbMatrix(pb, h * G + g);
      const std::vector<double> a = OutputMatrix(pb, h * G + g);
      for (int64_t r = 0; r < opt.window; ++r) {
        const int64_t t = w - opt.window + r;
        const int64_t row = g * opt.window + r;
        for (int64_t j = 0; j < n; ++j) {
          omega[row * n + j] = j > n - w + t ? 0.0 : Omega(p[t * n + j], opt);
        }
        for (int64_t i = 0; i < d; ++i) A[row * d + i] = a[t * d + i];
      }
    }
    std::vector<double> a_sq(static_cast<size_t>(rows), 0.0);  // ||A||^2 per row
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t i = 0; i < d; ++i) a_sq[row] += A[row * d + i] * A[row * d + i];
    }
    std::vector<double> cost(static_cast<size_t>(n), 0.0);
    for (int64_t j = 0; j < n; ++j) {
      double col = 0, om_a_sq = 0;
      std::vector<double> om_a(static_cast<size_t>(d), 0.0);  // (Omega^T A)[j, :]
      for (int64_t row = 0; row < rows; ++row) {
        const double o = omega[row * n + j];
        col += o;
        om_a_sq += o * a_sq[row];
        for (int64_t i = 0; i < d; ++i) om_a[i] += o * A[row * d + i];
      }
      double v_sq = 0, v_dot = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double v = At(pb.values, n, d, h, j, i);
        v_sq += v * v;
        v_dot += v * om_a[i];
      }
      cost[j] = (col * v_sq - 2.0 * v_dot + om_a_sq) / static_cast<double>(G);
    }
    const std::vector<double> pooled = Pool(cost, opt.kernel, opt.max_pool);
    out.insert(out.end(), pooled.begin(), pooled.end());
  }
  return out;
}

std::vector<double> SingleQueryOutput(const std::vector<double>& keys,
                                      const std::vector<double>& values,
                                      const std::vector<double>& q, int64_t n, int64_t d,
                                      double scale, const std::vector<bool>& excluded) {
  std::vector<double> logit(static_cast<size_t>(n), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (excluded[j]) continue;
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * keys[j * d + i];
    logit[j] = scale * dot;
    m = std::max(m, logit[j]);
  }
  std::vector<double> a(static_cast<size_t>(d), 0.0);
  double z = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (excluded[j]) continue;
    const double e = std::exp(logit[j] - m);
    z += e;
    for (int64_t i = 0; i < d; ++i) a[i] += e * values[j * d + i];
  }
  if (z > 0) {
    for (auto& x : a) x /= z;
  }
  return a;
}

std::vector<double> OutputPerturbation(const AttentionProblem& pb,
                                       const std::vector<int64_t>& offsets,
                                       const std::vector<int32_t>& kept) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, w = pb.window_rows, G = pb.group();
  std::vector<double> out(static_cast<size_t>(pb.num_kv_heads), 0.0);
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    const int64_t list = offsets.size() == 2 ? 0 : h;
    std::vector<bool> is_kept(static_cast<size_t>(n), false);
    for (int64_t i = offsets[list]; i < offsets[list + 1]; ++i) is_kept[kept[i]] = true;
    std::vector<double> keys(static_cast<size_t>(n * d)), values(static_cast<size_t>(n * d));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < d; ++i) {
        keys[j * d + i] = At(pb.keys, n, d, h, j, i);
        values[j * d + i] = At(pb.values, n, d, h, j, i);
      }
    }
    double total = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t t = 0; t < w; ++t) {
        std::vector<double> q(static_cast<size_t>(d));
        for (int64_t i = 0; i < d; ++i) q[i] = At(pb.queries, w, d, h * G + g, t, i);
        std::vector<bool> not_seen(static_cast<size_t>(n), false);
        std::vector<bool> not_kept(static_cast<size_t>(n), false);
        for (int64_t j = 0; j < n; ++j) {
          not_seen[j] = j > n - w + t;
          not_kept[j] = not_seen[j] || !is_kept[j];
        }
        const std::vector<double> full = SingleQueryOutput(keys, values, q, n, d, pb.scale, not_seen);
        const std::vector<double> part = SingleQueryOutput(keys, values, q, n, d, pb.scale, not_kept);
        double full_sq = 0, part_sq = 0, diff_sq = 0;
        for (int64_t i = 0; i < d; ++i) {
          full_sq += full[i] * full[i];
          part_sq += part[i] * part[i];
          diff_sq += (part[i] - full[i]) * (part[i] - full[i]);
        }
        if (full_sq == 0) {
          total += part_sq == 0 ? 0.0 : 1.0;
        } else {
          total += std::sqrt(diff_sq / full_sq);
        }
      }
    }
    out[h] = total / static_cast<double>(G * w);
  }
  return out;
}

double SubsetPerturbation(const std::vector<double>& p, const std::vector<double>& r, int64_t d,
                          const std::vector<int64_t>& subset) {
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  double mass = 0;
  for (int64_t i : subset) {
    mass += p[i];
    for (int64_t c = 0; c < d; ++c) sum[c] += p[i] * r[i * d + c];
  }
  double norm_sq = 0;
  for (double s : sum) norm_sq += s * s;
  return std::sqrt(norm_sq) / (1.0 - mass);
}

double MinSubsetPerturbation(const std::vector<double>& p, const std::vector<double>& r,
                             int64_t m, int64_t d, int64_t k) {
  // Depth-first enumeration of k-subsets with running sums per depth.
  std::vector<double> sums(static_cast<size_t>((k + 1) * d), 0.0);  // [k + 1, d]
  std::vector<double> mass(static_cast<size_t>(k + 1), 0.0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int64_t, int64_t)> visit = [&](int64_t start, int64_t depth) {
    if (depth == k) {
      double norm_sq = 0;
      for (int64_t c = 0; c < d; ++c) norm_sq += sums[depth * d + c] * sums[depth * d + c];
      best = std::min(best, std::sqrt(norm_sq) / (1.0 - mass[depth]));
      return;
    }
    for (int64_t i = start; i <= m - (k - depth); ++i) {
      for (int64_t c = 0; c < d; ++c) {
        sums[(depth + 1) * d + c] = sums[depth * d + c] + p[i] * r[i * d + c];
      }
      mass[depth + 1] = mass[depth] + p[i];
      visit(i + 1, depth + 1);
    }
  };
  visit(0, 0);
  return best;
}

double MaxRelativeError(const float* got, const double* want, int64_t n, double floor) {
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double err = std::abs(static_cast<double>(got[j]) - want[j]);
    worst = std::max(worst, err / std::max(std::abs(want[j]), floor));
  }
  return worst;
}

std::vector<int64_t> TopK(const std::vector<double>& scores, int64_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(order.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

std::string CompareTopK(const float* got, const double* want, int64_t n, int64_t k,
                        double tie_rel) {
  const std::vector<double> got_d(got, got + n);
  const std::vector<double> want_d(want, want + n);
  const std::vector<int64_t> a = TopK(got_d, k);
  const std::vector<int64_t> b = TopK(want_d, k);
  if (a == b) return "";
  std::vector<double> sorted = want_d;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  const double kth = sorted[static_cast<size_t>(k - 1)];
  std::vector<int64_t> diff;
  std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  for (int64_t j : diff) {
    if (std::abs(want[j] - kth) > tie_rel * std::abs(kth)) {
      std::ostringstream msg;
      msg << "token " << j << " (oracle score " << want[j] << ", kernel " << got[j]
          << ") is on different sides of the top-" << k << " cut (k-th oracle score " << kth
          << ")";
      return msg.str();
    }
  }
  return "";
}

}  // namespace kvtrim::oracle

#include "tests/oracle/model_policies_oracle.h"

#include <cmath>

namespace kvtrim::oracle {

namespace {

/// Dense V_h W_O^q: [n, D] for KV head h and query head q.
std::vector<double> ProjectedValues(const AttentionProblem& pb, const ProjectionProblem& proj,
                                    int64_t h, int64_t q) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, D = proj.hidden;
  const int64_t stride = pb.num_query_heads * d;
  std::vector<double> out(static_cast<size_t>(n * D), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t e = 0; e < D; ++e) {
      double acc = 0;
      for (int64_t i = 0; i < d; ++i) {
        // W_O^q[i, e] = o_proj.weight[e, q*d + i]
        acc += static_cast<double>(pb.values[(h * n + j) * d + i]) *
               static_cast<double>(proj.w_o[e * stride + q * d + i]);
      }
      out[j * D + e] = acc;
    }
  }
  return out;
}

double RowNorm(const std::vector<double>& m, int64_t row, int64_t width, bool l1) {
  double acc = 0;
  for (int64_t e = 0; e < width; ++e) {
    const double x = m[row * width + e];
    acc += l1 ? std::fabs(x) : x * x;
  }
  return l1 ? acc : std::sqrt(acc);
}

}  // namespace

void CriticalKVScores(const AttentionProblem& pb, const ProjectionProblem& proj, int64_t window,
                      int64_t kernel, bool max_pool, double eps, bool norm_l1,
                      std::vector<double>* attention, std::vector<double>* critical) {
  const int64_t n = pb.num_tokens, w = pb.window_rows, G = pb.group();
  const int64_t prefix = n - window;
  attention->assign(static_cast<size_t>(pb.num_kv_heads * n), 0.0);
  critical->assign(static_cast<size_t>(pb.num_kv_heads * n), 0.0);
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    std::vector<double> att(static_cast<size_t>(prefix), 0.0), norm(static_cast<size_t>(prefix), 0.0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t q = h * G + g;
      const std::vector<double> P = ProbMatrix(pb, q);
      std::vector<double> mean(static_cast<size_t>(prefix), 0.0);
      for (int64_t t = w - window; t < w; ++t) {
        for (int64_t j = 0; j < prefix; ++j) mean[j] += P[t * n + j] / static_cast<double>(window);
      }
      const std::vector<double> pooled = Pool(mean, kernel, max_pool);
      const std::vector<double> vw = ProjectedValues(pb, proj, h, q);
      for (int64_t j = 0; j < prefix; ++j) {
        att[j] += pooled[j] / static_cast<double>(G);
        norm[j] += RowNorm(vw, j, proj.hidden, norm_l1) / static_cast<double>(G);
      }
    }
    for (int64_t j = 0; j < prefix; ++j) {
      (*attention)[h * n + j] = att[j];
      (*critical)[h * n + j] = (att[j] + eps) * norm[j];
    }
  }
}

std::vector<double> LaProxScores(const AttentionProblem& pb, const ProjectionProblem& proj,
                                 int64_t window, int64_t kernel, bool max_pool, int gqa) {
  const int64_t n = pb.num_tokens, w = pb.window_rows, G = pb.group(), D = proj.hidden;
  const int64_t prefix = n - window;
  std::vector<double> out(static_cast<size_t>(pb.num_kv_heads * n), 0.0);
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    std::vector<std::vector<double>> probs, projected;
    for (int64_t g = 0; g < G; ++g) {
      probs.push_back(ProbMatrix(pb, h * G + g));
      projected.push_back(ProjectedValues(pb, proj, h, h * G + g));
    }
    if (gqa == 1) {
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> col(static_cast<size_t>(prefix), 0.0);
        for (int64_t j = 0; j < prefix; ++j) {
          for (int64_t t = w - window; t < w; ++t) col[j] += probs[g][t * n + j] * probs[g][t * n + j];
          col[j] = std::sqrt(col[j]);
        }
        const std::vector<double> pooled = Pool(col, kernel, max_pool);
        for (int64_t j = 0; j < prefix; ++j) {
          out[h * n + j] += pooled[j] * RowNorm(projected[g], j, D, false) / static_cast<double>(G);
        }
      }
      continue;
    }
    std::vector<double> col(static_cast<size_t>(prefix), 0.0);
    for (int64_t j = 0; j < prefix; ++j) {
      for (int64_t t = w - window; t < w; ++t) {
        double m = 0;
        for (int64_t g = 0; g < G; ++g) m += probs[g][t * n + j] / static_cast<double>(G);
        col[j] += m * m;
      }
      col[j] = std::sqrt(col[j]);
    }
    const std::vector<double> pooled = Pool(col, kernel, max_pool);
    for (int64_t j = 0; j < prefix; ++j) {
      double norm = 0;
      if (gqa == 2) {
        std::vector<double> summed(static_cast<size_t>(D), 0.0);
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t e = 0; e < D; ++e) summed[e] += projected[g][j * D + e];
        }
        norm = RowNorm(summed, 0, D, false);
      } else {
        for (int64_t g = 0; g < G; ++g) norm += RowNorm(projected[g], j, D, false) / static_cast<double>(G);
      }
      out[h * n + j] = pooled[j] * norm;
    }
  }
  return out;
}

std::vector<double> RopeMatrix(const std::vector<double>& inv_freq, bool interleaved,
                               int64_t position) {
  const int64_t d = static_cast<int64_t>(inv_freq.size()) * 2;
  std::vector<double> r(static_cast<size_t>(d * d), 0.0);
  for (int64_t i = 0; i < d / 2; ++i) {
    const int64_t a = interleaved ? 2 * i : i;
    const int64_t b = interleaved ? 2 * i + 1 : i + d / 2;
    const double angle = static_cast<double>(position) * inv_freq[i];
    r[a * d + a] = std::cos(angle);
    r[a * d + b] = -std::sin(angle);
    r[b * d + a] = std::sin(angle);
    r[b * d + b] = std::cos(angle);
  }
  return r;
}

std::vector<double> ExpectedAttentionScores(const AttentionProblem& pb,
                                            const std::vector<double>& mean,
                                            const std::vector<double>& cov,
                                            const std::vector<double>& inv_freq, bool interleaved,
                                            int64_t future, double eps, bool use_vnorm) {
  const int64_t n = pb.num_tokens, d = pb.head_dim, G = pb.group();
  std::vector<double> rbar(static_cast<size_t>(d * d), 0.0);
  for (int64_t p = n; p < n + future; ++p) {
    const std::vector<double> r = RopeMatrix(inv_freq, interleaved, p);
    for (size_t i = 0; i < r.size(); ++i) rbar[i] += r[i] / static_cast<double>(future);
  }
  std::vector<double> out(static_cast<size_t>(pb.num_kv_heads * n), 0.0);
  for (int64_t h = 0; h < pb.num_kv_heads; ++h) {
    std::vector<double> ea(static_cast<size_t>(n), 0.0);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t q = h * G + g;
      // mu_bar = R mu; Sigma_bar = R Sigma R^T.
      std::vector<double> mu(static_cast<size_t>(d), 0.0), tmp(static_cast<size_t>(d * d), 0.0),
          sigma(static_cast<size_t>(d * d), 0.0);
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) mu[i] += rbar[i * d + k] * mean[q * d + k];
      }
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          for (int64_t m = 0; m < d; ++m) tmp[i * d + k] += rbar[i * d + m] * cov[(q * d + m) * d + k];
        }
      }
      for (int64_t i = 0; i < d; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          for (int64_t m = 0; m < d; ++m) sigma[i * d + k] += tmp[i * d + m] * rbar[k * d + m];
        }
      }
      std::vector<double> logits(static_cast<size_t>(n));
      double max_logit = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* key = pb.keys.data() + (h * n + j) * d;
        double lin = 0, quad = 0;
        for (int64_t i = 0; i < d; ++i) {
          lin += mu[i] * key[i];
          for (int64_t k = 0; k < d; ++k) quad += key[i] * sigma[i * d + k] * key[k];
        }
        logits[j] = lin * pb.scale + quad * 0.5 * pb.scale * pb.scale;
        max_logit = std::max(max_logit, logits[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(logits[j] - max_logit);
      for (int64_t j = 0; j < n; ++j) ea[j] += std::exp(logits[j] - max_logit) / z / static_cast<double>(G);
    }
    for (int64_t j = 0; j < n; ++j) {
      double vnorm = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double v = pb.values[(h * n + j) * d + i];
        vnorm += v * v;
      }
      out[h * n + j] = use_vnorm ? (ea[j] + eps) * std::sqrt(vnorm) : ea[j] + eps;
    }
  }
  return out;
}

}  // namespace kvtrim::oracle

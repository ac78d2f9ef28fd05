// The single list of built-in scorers, allocators and presets (RegisterBuiltinPolicies).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/registry.h"
#include "kernels/scorer_params.h"

namespace kvtrim {

namespace {

using Kind = ParamSpec::Kind;

ParamSpec WindowParam(int64_t def) {
  return ParamSpec::Int("window", static_cast<double>(def), 1, 4096,
                        "observation window: the last `window` query rows score the tokens, and "
                        "the last `window` tokens are protected (inside the budget)");
}
ParamSpec KernelParam(int64_t def) {
  return ParamSpec::Int("kernel", static_cast<double>(def), 1, 1023,
                        "1-D pooling kernel along tokens (odd; stride 1, same length)");
}
ParamSpec PoolingParam() {
  return ParamSpec::Enum("pooling", "max", PoolKindChoices(),
                         "max: edges clipped; avg: zero padding, divides by kernel (PyTorch "
                         "avg_pool1d default)");
}

/// Protection "the last `window` tokens".
Protection WindowProtection(const ResolvedParams& p, int64_t) { return {0, p.Int("window")}; }
Protection NoProtection(const ResolvedParams&, int64_t) { return {0, 0}; }
/// Protection "the round(recent_fraction * k) most recent tokens", half up in double
/// (specs README rule 6: every budget split rounds half up).
Protection RecentFractionProtection(const ResolvedParams& p, int64_t k) {
  return {0, RoundHalfUp(p.Number("recent_fraction") * static_cast<double>(k))};
}

/// Validation of scorers that read a window of `window` query rows with odd pooling.
absl::Status ValidateWindowed(const LayerShape& shape, const ResolvedParams& p, int64_t,
                              const std::string& field) {
  if (p.Int("kernel") % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": policy.params.kernel must be odd, got ", p.Int("kernel")));
  }
  if (shape.window_rows < p.Int("window")) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".queries.shape[1]: the policy reads window=", p.Int("window"),
        " query rows but only ", shape.window_rows,
        " were sent; send more rows or lower policy.params.window"));
  }
  return absl::OkStatus();
}

absl::Status ValidateNothing(const LayerShape&, const ResolvedParams&, int64_t,
                             const std::string&) {
  return absl::OkStatus();
}

void AddScorers(PolicyRegistry* r) {
  ScorerSpec s;

  s = {};
  s.name = "streaming_llm";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/streaming_llm.*
  s.description = "keep the first sink tokens and the most recent ones (position only)";
  s.paper = "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024";
  s.reads_key_values = false;
  s.required_inputs = kInputKeys;
  s.scope = DecisionScope::kHead;
  s.doc_default_sink = 4;
  s.doc_default_recent = "rest of the budget (score = position)";
  s.default_protection = [](const ResolvedParams&, int64_t) { return Protection{4, 0}; };
  s.validate = ValidateNothing;
  r->AddScorer(s);

  s = {};
  s.name = "random";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/random.*
  s.description = "uniform random scores from a counter hash of (seed, layer, head, token)";
  s.paper = "sanity floor (kvpress RandomPress); no seed paper";
  s.reads_key_values = false;
  s.required_inputs = kInputKeys;
  s.default_protection = NoProtection;
  s.validate = ValidateNothing;
  r->AddScorer(s);

  s = {};
  s.name = "knorm";
  s.kind = ScorerKind::kTable;  // kernels/cpu/scorers/knorm.cc, kernels/gpu/scorers/knorm.cu
  s.description = "keep the keys with the smallest L2 norm (score = -||k_j||)";
  s.paper = "Devoto et al., A Simple and Effective L2 Norm-Based Strategy for KV Cache "
            "Compression, EMNLP 2024";
  s.required_inputs = kInputKeys;
  s.default_protection = NoProtection;
  s.validate = ValidateNothing;
  r->AddScorer(s);

  s = {};
  s.name = "keydiff";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/keydiff.*
  s.description = "keep the keys least similar to the anchor (score = -cos(k_j, anchor))";
  s.paper = "Park et al., KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM "
            "Inference in Resource-Constrained Environments (Qualcomm AI Research)";
  s.required_inputs = kInputKeys;
  s.params = {
      ParamSpec::Enum("anchor", "normalized_mean", KeyDiffAnchorChoices(),
                      "anchor = mean of unit keys (ranks like Eq. 7) or mean of raw keys"),
      ParamSpec::Float("recent_fraction", 0, 0, 1,
                       "share of the budget N reserved for the most recent tokens, "
                       "R = round(recent_fraction * N), half up"),
      ParamSpec::Float("eps", 1e-8, 0, 1, "guard of the cosine denominator"),
      ParamSpec::Int("block_size", 0, 0, 1 << 20,
                     "block-wise mode: B > 0 requires n <= N + B per call (the cache plus one "
                     "block); 0 = one-shot"),
  };
  s.doc_default_recent = "round(recent_fraction * budget)";
  s.default_protection = RecentFractionProtection;
  s.validate = [](const LayerShape& shape, const ResolvedParams& p, int64_t k,
                  const std::string& field) -> absl::Status {
    const int64_t block = p.Int("block_size");
    if (block > 0 && shape.num_tokens > k + block) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".keys.shape[1]: keydiff block mode holds at most N + B = ", k, " + ", block,
          " entries per call, got n=", shape.num_tokens));
    }
    return absl::OkStatus();
  };
  r->AddScorer(s);

  s = {};
  s.name = "snapkv";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/snapkv.*
  s.description = "pooled attention of the observation window, GQA-mean; window protected";
  s.paper = "Li et al., SnapKV: LLM Knows What You are Looking for Before Generation, "
            "NeurIPS 2024";
  s.required_inputs = kInputKeys | kInputQueries;
  s.optional_inputs = kInputValues;
  s.params = {WindowParam(32), KernelParam(7), PoolingParam()};
  s.doc_default_recent = "window";
  s.default_protection = WindowProtection;
  s.validate = ValidateWindowed;
  r->AddScorer(s);

  s = {};
  s.name = "h2o";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/h2o.*
  s.description = "attention accumulated over every query row sent, GQA-mean";
  s.paper = "Zhang et al., H2O: Heavy-Hitter Oracle for Efficient Generative Inference of "
            "Large Language Models, NeurIPS 2023";
  s.required_inputs = kInputKeys | kInputQueries;
  s.optional_inputs = kInputValues;
  s.params = {
      ParamSpec::Float("recent_fraction", 0, 0, 1,
                       "share of the budget given to the most recent tokens, rounded half up "
                       "(0.5 in the H2O paper; 0 = pure heavy hitters)"),
      ParamSpec::Bool("causal_normalize", false,
                      "divide each token's sum by the number of query rows that see it"),
  };
  s.doc_default_recent = "round(recent_fraction * budget)";
  s.default_protection = RecentFractionProtection;
  s.validate = ValidateNothing;
  r->AddScorer(s);

  s = {};
  s.name = "tova";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/tova.*
  s.description = "attention of the last query row averaged over every head of the layer; "
                  "the same tokens in every head";
  s.paper = "Oren et al., Transformers are Multi-State RNNs, 2024";
  s.required_inputs = kInputKeys | kInputQueries;
  s.optional_inputs = kInputValues;
  s.scope = DecisionScope::kLayer;
  s.doc_default_recent = "1 (the last token)";
  s.default_protection = [](const ResolvedParams&, int64_t) { return Protection{0, 1}; };
  s.validate = ValidateNothing;
  r->AddScorer(s);

  s = {};
  s.name = "dropkv";
  s.kind = ScorerKind::kTable;  // kernels/{cpu,gpu}/scorers/dropkv.*
  s.description = "eviction cost sum_t (p/(1-p))^2 ||a_t - v_j||^2, GQA-mean, max-pooled; "
                  "window protected";
  s.paper = "Zhang et al., DropKV: Decoupling Residual-Output Perturbation for Near-Optimal "
            "KV-Cache Eviction";
  s.required_inputs = kInputKeys | kInputValues | kInputQueries;
  s.params = {
      WindowParam(8),
      KernelParam(11),
      PoolingParam(),
      ParamSpec::Float("eps", 1e-6, 0, 1, "guard in 1 - p + eps"),
      ParamSpec::Enum("bf16_prob_round", "auto", Bf16ProbRoundChoices(),
                      "round p to bf16 before the weight; auto = on for bf16 inputs"),
  };
  s.doc_default_recent = "window";
  s.default_protection = WindowProtection;
  s.validate = ValidateWindowed;
  r->AddScorer(s);

  s = {};
  s.name = "criticalkv";
  s.kind = ScorerKind::kCriticalKV;
  s.description = "two-stage: the top alpha*b by pooled window attention, then the rest by "
                  "(attention + eps) * ||v W_O^h||_1 (GQA-mean); window protected";
  s.paper = "Feng et al., CriticalKV: Optimizing KV Cache Eviction from an Output Perturbation "
            "Perspective (Identify Critical KV Cache in LLM Inference), 2025";
  s.required_inputs = kInputKeys | kInputValues | kInputQueries | kInputModel;
  s.params = {
      WindowParam(32),
      KernelParam(7),
      PoolingParam(),
      ParamSpec::Float("alpha", 0.5, 0, 1,
                       "stage-1 share: the first round(alpha * b) prefix tokens by "
                       "attention, half up"),
      ParamSpec::Float("eps", 1e-4, 0, 1, "added to the attention in the stage-2 product"),
      ParamSpec::Enum("norm", "l1", CriticalKVNormChoices(),
                      "projected-value norm ||v W_O^h||: l1 (paper) or l2 (Gram matrices)"),
  };
  s.doc_default_recent = "window";
  s.default_protection = WindowProtection;
  s.validate = ValidateWindowed;
  r->AddScorer(s);

  s = {};
  s.name = "laprox";
  s.kind = ScorerKind::kLaProx;
  s.description = "||mean-attention column||_2 over the window (avg-pooled) * ||v W_O^h||_2; "
                  "normalised per layer; one top-K over every layer and head";
  s.paper = "Mai & Kim, Reformulating KV Cache Eviction Problem for Long-Context LLM "
            "Inference (LaProx), 2026";
  s.required_inputs = kInputKeys | kInputValues | kInputQueries | kInputModel;
  s.params = {
      WindowParam(32),
      KernelParam(7),
      ParamSpec::Enum("pooling", "avg", PoolKindChoices(),
                      "pooling of the column-norm vector (avg: zero padding, divides by kernel)"),
      ParamSpec::Enum("mode", "model", LaProxModeChoices(),
                      "model: one top-K over all layers on layer-normalised scores (answered "
                      "at the end); model_raw: same without normalisation; layer: one top-k "
                      "over the heads of a layer; local: per-head top-k"),
      ParamSpec::Enum("gqa", "mean", LaProxGqaChoices(),
                      "GQA: mean = ||mean_h A_h col|| * mean_h ||v W_O^h||; head_bound = "
                      "mean_h ||A_h col|| ||v W_O^h||; summed_wo = ||mean col|| * ||v sum_h "
                      "W_O^h||"),
  };
  s.scope = DecisionScope::kModel;
  s.doc_default_recent = "window";
  s.default_protection = WindowProtection;
  s.validate = ValidateWindowed;
  r->AddScorer(s);

  s = {};
  s.name = "expected_attention";
  s.kind = ScorerKind::kExpectedAttention;
  s.description = "softmax of the expected logit under Gaussian future queries rotated by the "
                  "mean RoPE of the next positions, (EA + eps) * ||v||, GQA-mean; sink 4";
  s.paper = "Devoto, Jeblick & Jegou, Expected Attention: KV-cache compression by estimating "
            "attention from future queries distribution, 2025 (kvpress)";
  s.required_inputs = kInputKeys | kInputValues | kInputModel;
  s.optional_inputs = kInputQueries;
  s.params = {
      ParamSpec::Int("n_future_positions", 512, 1, 1 << 20,
                     "future positions averaged into the mean RoPE rotation"),
      ParamSpec::Float("eps", 0.02, 0, 1e3, "added to the expected attention before * ||v||"),
      ParamSpec::Bool("use_vnorm", true, "multiply by the value norm"),
      ParamSpec::Enum("query_stats", "auto", QueryStatsSourceChoices(),
                      "query mean/covariance: model = registered pre-RoPE statistics; window = "
                      "estimated from the sent query rows un-rotated to pre-RoPE (an "
                      "approximation); auto = model when registered, else window"),
  };
  s.doc_default_sink = 4;
  s.doc_default_recent = "0";
  s.default_protection = [](const ResolvedParams&, int64_t) { return Protection{4, 0}; };
  s.validate = [](const LayerShape& shape, const ResolvedParams& p, int64_t,
                  const std::string& field) -> absl::Status {
    if (p.Enum<QueryStatsSource>("query_stats") == QueryStatsSource::kWindow &&
        !shape.has_queries) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".queries: expected_attention with query_stats=window estimates the query "
                 "statistics from the window rows [H_q, w, d]; send them"));
    }
    return absl::OkStatus();
  };
  r->AddScorer(s);
}

void AddAllocators(PolicyRegistry* r) {
  AllocatorSpec a;
  a.name = "uniform";
  a.kind = AllocatorKind::kUniform;
  a.description = "every head keeps the same budget";
  a.paper = "uniform allocation (baselines §10)";
  r->AddAllocator(a);

  a = {};
  a.name = "pyramid";
  a.kind = AllocatorKind::kPyramid;
  a.description = "per-layer budget falling linearly with depth, total conserved";
  a.paper = "Cai et al., PyramidKV: Dynamic KV Cache Compression based on Pyramidal "
            "Information Funneling, 2024";
  a.params = {ParamSpec::Float("beta", 20, 1.0000001, 1e6,
                               "ratio of the mean budget to the last layer's budget")};
  a.scope = DecisionScope::kLayer;
  r->AddAllocator(a);

  a = {};
  a.name = "adakv";
  a.kind = AllocatorKind::kAdaKV;
  a.description = "each head keeps floor(alpha*b) of its own, the rest of the layer budget "
                  "goes to one top-k over all heads";
  a.paper = "Feng et al., Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation, "
            "2024";
  a.params = {ParamSpec::Float("safeguard_alpha", 0.2, 0, 1,
                               "share of the uniform budget each head is guaranteed")};
  a.scope = DecisionScope::kLayer;
  r->AddAllocator(a);

  a = {};
  a.name = "lukv";
  a.kind = AllocatorKind::kLukv;
  a.description = "per-head budgets read from the model's offline LU-KV profile (nearest "
                  "row of the global evicted ratio), largest remainder per layer";
  a.paper = "Tang et al., Predicting Future Utility: Global Combinatorial Optimization for "
            "Task-Agnostic KV Cache Eviction (LU-KV), 2026";
  a.params = {ParamSpec::Bool("interpolate", false,
                              "interpolate linearly between the two nearest profile rows "
                              "instead of taking the nearest")};
  a.scope = DecisionScope::kHead;
  a.required_inputs = kInputModel | kInputProfile;
  r->AddAllocator(a);
}

}  // namespace

void RegisterBuiltinPolicies(PolicyRegistry* registry) {
  AddScorers(registry);
  AddAllocators(registry);
  for (const char* scorer :
       {"streaming_llm", "random", "knorm", "snapkv", "h2o", "tova", "keydiff", "dropkv"}) {
    const ScorerSpec* s = registry->FindScorer(scorer);
    registry->AddPreset({scorer, s->description, scorer, "uniform"});
  }
  registry->AddPreset({"pyramidkv", "SnapKV scores with the PyramidKV per-layer budget",
                       "snapkv", "pyramid"});
  registry->AddPreset({"adakv", "SnapKV scores with the AdaKV per-head budget", "snapkv",
                       "adakv"});
  for (const char* scorer : {"criticalkv", "laprox", "expected_attention"}) {
    const ScorerSpec* s = registry->FindScorer(scorer);
    registry->AddPreset({scorer, s->description, scorer, "uniform"});
  }
  registry->AddPreset({"criticalkv_adakv",
                       "CriticalKV inside AdaKV budgets (allocation on attention-only scores)",
                       "criticalkv", "adakv"});
  registry->AddPreset({"lukv",
                       "LU-KV profile budgets over SnapKV scores (needs profile.snapkv)",
                       "snapkv", "lukv"});
}

}  // namespace kvtrim

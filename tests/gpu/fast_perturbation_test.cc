// The output perturbation statistic in fast numerics (LaunchFastPerturbation) against the fp64
// kernel (LaunchPerturbation, itself within 1e-9 of the CPU's definition): every dtype, odd
// sizes, GQA groups, per-head and shared lists (an empty list and a full one among them),
// within the fast bound of tests/gpu/parity_rule.h; bit-identical when run twice; and the
// two kernels timed at a served shape (FastPerturbationTiming prints both). Skips without a
// GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "base/dtype.h"
#include "kernels/engine.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/layer.h"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/model_test_data.h"
#include "tests/gpu/parity_rule.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/shared_backends.h"
#include "tests/gpu/test_device.h"
#include "tests/gpu/window_traits.h"

namespace kvtrim::gpu::testing {
namespace {

/// One layer on the device with its kept lists, and both kernels' scratch.
struct PerturbationCase {
  DType dtype = DType::kBF16;
  int64_t heads = 2, group = 4, n = 1000, d = 64, w = 8;
  bool shared = false;  // one list for every head
  uint64_t seed = 1;
  std::string Describe() const {
    return absl::StrCat(DTypeName(dtype), " H_kv=", heads, " G=", group, " n=", n, " d=", d,
                        " w=", w, shared ? " shared" : " per-head");
  }
};

/// The layer of a case on the device; with `last_rows` > 0 its window is cut to the last
/// `last_rows` rows of every query head (the same positions, keys, values and lists).
class DeviceCase {
 public:
  explicit DeviceCase(const PerturbationCase& c, int64_t last_rows = 0) : c_(c) {
    const ModelLayerData data = MakeModelLayerData(c.dtype, c.heads, c.n, c.d, c.group, c.w, c.seed);
    Upload(data.keys, &keys_);
    Upload(data.values, &values_);
    std::vector<uint8_t> queries = data.queries;
    int64_t w = c.w;
    if (last_rows > 0) {
      const size_t row_bytes = static_cast<size_t>(c.d) * DTypeSize(c.dtype);
      queries.clear();
      for (int64_t q = 0; q < c.heads * c.group; ++q) {
        const size_t at = static_cast<size_t>(q * c.w + c.w - last_rows) * row_bytes;
        queries.insert(queries.end(), data.queries.begin() + at,
                       data.queries.begin() + at + last_rows * row_bytes);
      }
      w = last_rows;
    }
    Upload(queries, &queries_);
    layer_.keys = keys_.get();
    layer_.values = values_.get();
    layer_.queries = queries_.get();
    layer_.dtype = c.dtype;
    layer_.num_kv_heads = static_cast<int32_t>(c.heads);
    layer_.num_query_heads = static_cast<int32_t>(c.heads * c.group);
    layer_.window_rows = static_cast<int32_t>(w);
    layer_.head_dim = static_cast<int32_t>(c.d);
    layer_.num_tokens = c.n;
    layer_.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
    // Lists: about a fifth of the tokens at random; list 0 empty, list 1 everything (per
    // head with at least two heads), the last 4 tokens always kept elsewhere.
    std::mt19937_64 rng(c.seed * 7919);
    const int64_t lists = c.shared ? 1 : c.heads;
    std::vector<int64_t> offsets{0};
    std::vector<int32_t> indices;
    for (int64_t l = 0; l < lists; ++l) {
      for (int64_t j = 0; j < c.n; ++j) {
        bool keep = rng() % 5 == 0 || j >= c.n - 4;
        if (!c.shared && lists > 1 && l == 0) keep = false;
        if (!c.shared && lists > 1 && l == 1) keep = true;
        if (keep) indices.push_back(static_cast<int32_t>(j));
      }
      offsets.push_back(static_cast<int64_t>(indices.size()));
    }
    num_lists_ = static_cast<int32_t>(lists);
    for (size_t l = 0; l + 1 < offsets.size(); ++l) {
      max_list_ = std::max(max_list_, offsets[l + 1] - offsets[l]);
    }
    Upload(offsets, &offsets_);
    Upload(indices, &indices_);
    out_.Allocate(static_cast<size_t>(c.heads) * sizeof(double));
    exact_bytes_ = PerturbationScratchBytes(layer_);
    fast_bytes_ = FastPerturbationScratchBytes(layer_, layer_.window_rows);
    exact_scratch_.Allocate(exact_bytes_);
    fast_scratch_.Allocate(fast_bytes_);
  }

  /// The exact (fp64) kernel's answer, or the fast one's over the last `rows` window rows of
  /// every query head (0: all of them).
  std::vector<double> Run(bool fast, int32_t rows = 0) {
    const cudaError_t err = fast ? LaunchFast(rows) : LaunchExact();
    EXPECT_EQ(err, cudaSuccess) << c_.Describe();
    std::vector<double> host(static_cast<size_t>(c_.heads));
    EXPECT_EQ(cudaMemcpy(host.data(), out_.get(), host.size() * sizeof(double),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  cudaError_t LaunchFast(int32_t rows = 0, const FastPerturbationHints& hints = {}) {
    return LaunchFastPerturbation(layer_, rows > 0 ? rows : layer_.window_rows,
                                  offsets_.as<int64_t>(), num_lists_, indices_.as<int32_t>(),
                                  out_.as<double>(), fast_scratch_.get(), fast_bytes_, nullptr,
                                  hints);
  }
  /// The fast statistic with hints (LaunchFast's answer, read back).
  std::vector<double> RunHinted(int32_t rows, const FastPerturbationHints& hints) {
    EXPECT_EQ(LaunchFast(rows, hints), cudaSuccess) << c_.Describe();
    std::vector<double> host(static_cast<size_t>(c_.heads));
    EXPECT_EQ(cudaMemcpy(host.data(), out_.get(), host.size() * sizeof(double),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  /// Runs the fast DropKV scorer with `params` and keeps a copy of its row outputs for the
  /// statistic over `rows` rows (FastScorerRowsBytes); false when they are not the
  /// statistic's.
  bool ScoreAndKeepRows(const ScorerParams& params, int32_t rows) {
    const WindowAttentionTraits& dropkv = WindowTraitsOf("dropkv");
    size_t from = 0;
    const size_t bytes = FastScorerRowsBytes(dropkv, layer_, params, rows, &from);
    if (bytes == 0) return false;
    DeviceBuffer scores, scratch;
    const size_t scratch_bytes = ScoreScratchBytes(dropkv, layer_, params);
    EXPECT_TRUE(scores.Allocate(static_cast<size_t>(c_.heads * c_.n) * sizeof(float)));
    EXPECT_TRUE(scratch.Allocate(scratch_bytes));
    EXPECT_TRUE(full_rows_.Allocate(bytes));
    EXPECT_EQ(LaunchScore(dropkv, layer_, params, scores.as<float>(), scratch.get(), scratch_bytes,
                          nullptr),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(full_rows_.get(), static_cast<char*>(scratch.get()) + from, bytes,
                         cudaMemcpyDeviceToDevice),
              cudaSuccess);
    return true;
  }
  const void* full_rows() const { return full_rows_.get(); }
  int64_t max_list() const { return max_list_; }
  const DeviceLayer& layer() const { return layer_; }
  cudaError_t LaunchExact() {
    return LaunchPerturbation(layer_, offsets_.as<int64_t>(), num_lists_, indices_.as<int32_t>(),
                              out_.as<double>(), exact_scratch_.get(), exact_bytes_, nullptr);
  }
  size_t fast_bytes() const { return fast_bytes_; }

 private:
  template <typename T>
  static void Upload(const std::vector<T>& host, DeviceBuffer* out) {
    ASSERT_TRUE(out->Allocate(host.size() * sizeof(T)));
    if (!host.empty()) {
      ASSERT_EQ(cudaMemcpy(out->get(), host.data(), host.size() * sizeof(T),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }

  PerturbationCase c_;
  DeviceBuffer keys_, values_, queries_, offsets_, indices_, out_, exact_scratch_, fast_scratch_;
  DeviceBuffer full_rows_;
  DeviceLayer layer_;
  int32_t num_lists_ = 1;
  int64_t max_list_ = 0;  // the longest kept list
  size_t exact_bytes_ = 0, fast_bytes_ = 0;
};

/// Every head of `fast` within the fast bound of `exact`.
void ExpectWithinFastBound(const std::vector<double>& fast, const std::vector<double>& exact,
                           const std::string& what) {
  ASSERT_EQ(fast.size(), exact.size()) << what;
  for (size_t h = 0; h < exact.size(); ++h) {
    EXPECT_LE(std::fabs(fast[h] - exact[h]),
              kFastPerturbationRel * std::fabs(exact[h]) + kFastPerturbationAbs)
        << what << " head " << h << ": exact " << exact[h] << " fast " << fast[h];
  }
}

TEST(FastPerturbation, WithinTheFastBoundOfTheExactStatistic) {
  KVTRIM_SKIP_WITHOUT_GPU();
  double worst = 0;
  int cases = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {1, 7, 99, 1000, 40000}) {
      for (int64_t d : {64, 128}) {
        for (int64_t group : {1, 4, 8}) {
          for (bool shared : {false, true}) {
            PerturbationCase c;
            c.dtype = dtype;
            c.n = n;
            c.d = d;
            c.group = group;
            c.w = n >= 1000 ? 32 : 8;
            c.heads = group == 8 ? 2 : 3;
            c.shared = shared;
            c.seed = static_cast<uint64_t>(n * 131 + d + group);
            if (n == 40000 && (group != 4 || dtype == DType::kF32)) continue;  // time
            DeviceCase device(c);
            ASSERT_GT(device.fast_bytes(), 0u) << c.Describe();
            const std::vector<double> exact = device.Run(false);
            const std::vector<double> fast = device.Run(true);
            const std::vector<double> again = device.Run(true);
            EXPECT_EQ(fast, again) << c.Describe() << ": two fast runs differ";
            for (size_t h = 0; h < exact.size(); ++h) {
              const double err = std::fabs(fast[h] - exact[h]);
              EXPECT_LE(err, kFastPerturbationRel * std::fabs(exact[h]) + kFastPerturbationAbs)
                  << c.Describe() << " head " << h << ": exact " << exact[h] << " fast "
                  << fast[h];
              worst = std::max(worst, err / (std::fabs(exact[h]) + 1e-3));
            }
            ++cases;
          }
        }
      }
    }
  }
  std::printf("[ fast     ] perturbation: %d cases, worst |fast - exact| / (|exact| + 1e-3) = %.3g\n",
              cases, worst);
}

TEST(FastPerturbation, SampledIsTheStatisticOfTheLastRows) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {99, 5000}) {
      for (bool shared : {false, true}) {
        PerturbationCase c;
        c.dtype = dtype;
        c.n = n;
        c.w = 32;
        c.shared = shared;
        c.seed = static_cast<uint64_t>(n + 17);
        DeviceCase whole(c);
        DeviceCase tail(c, kSampledPerturbationRows);
        const std::vector<double> sampled = whole.Run(true, kSampledPerturbationRows);
        const std::vector<double> exact_tail = tail.Run(false);
        const std::vector<double> full = whole.Run(true);
        for (size_t h = 0; h < sampled.size(); ++h) {
          EXPECT_LE(std::fabs(sampled[h] - exact_tail[h]),
                    kFastPerturbationRel * std::fabs(exact_tail[h]) + kFastPerturbationAbs)
              << c.Describe() << " head " << h << ": sampled " << sampled[h]
              << ", exact over the last rows " << exact_tail[h];
          std::printf("[ sampled  ] %s head %zu: full %.4f sampled %.4f\n", c.Describe().c_str(),
                      h, full[h], sampled[h]);
        }
      }
    }
  }
  // Rows outside [1, w] are refused.
  PerturbationCase c;
  DeviceCase device(c);
  EXPECT_EQ(device.LaunchFast(static_cast<int32_t>(c.w) + 1), cudaErrorInvalidValue);
}

// The two shortcuts the pipeline takes: the kept run's splits sized for the longest list
// (the host's counts), and the DropKV scorer's own row outputs as the full ones when its rows
// are the statistic's (bit-identical: the same pass A over the same splits).
TEST(FastPerturbation, ABoundOnTheListsAndTheScorersRowsGiveTheSameStatistic) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {5, 99, 5000, 40000}) {
      for (bool shared : {false, true}) {
        PerturbationCase c;
        c.dtype = dtype;
        c.n = n;
        c.w = 32;
        c.shared = shared;
        c.seed = static_cast<uint64_t>(n + 29);
        DeviceCase device(c);
        const std::vector<double> exact = device.Run(false);
        FastPerturbationHints bounded;
        bounded.kept_bound = device.max_list();
        ExpectWithinFastBound(device.RunHinted(0, bounded), exact,
                              absl::StrCat(c.Describe(), " kept_bound ", bounded.kept_bound));
        ScorerParams params;
        params.window = kSampledPerturbationRows;
        params.kernel = 7;
        params.fast = true;
        ASSERT_TRUE(device.ScoreAndKeepRows(params, kSampledPerturbationRows)) << c.Describe();
        const std::vector<double> sampled = device.Run(true, kSampledPerturbationRows);
        FastPerturbationHints reuse;
        reuse.full_rows = device.full_rows();
        EXPECT_EQ(device.RunHinted(kSampledPerturbationRows, reuse), sampled)
            << c.Describe() << ": the scorer's rows give another statistic";
        reuse.kept_bound = device.max_list();
        const std::vector<double> both = device.RunHinted(kSampledPerturbationRows, reuse);
        for (size_t h = 0; h < sampled.size(); ++h) {
          EXPECT_NEAR(both[h], sampled[h], 1e-5 * std::fabs(sampled[h]) + 1e-9)
              << c.Describe() << " head " << h;
        }
        // Another window: the scorer's rows are not the statistic's.
        params.window = 4;
        EXPECT_EQ(FastScorerRowsBytes(WindowTraitsOf("dropkv"), device.layer(), params,
                                      kSampledPerturbationRows, nullptr),
                  0u);
      }
    }
  }
}

// Small cases for compute-sanitizer (memcheck and racecheck through scripts/gpu_run.sh): every
// dtype, a row that sees nothing (n < w), shared and per-head lists, full and sampled, with
// and without the pipeline's list bound and DropKV's own row outputs.
TEST(FastPerturbationSanitizer, SmallCases) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {7, 99}) {
      for (bool shared : {false, true}) {
        PerturbationCase c;
        c.dtype = dtype;
        c.n = n;
        c.w = 8;
        c.shared = shared;
        DeviceCase device(c);
        const std::vector<double> exact = device.Run(false);
        const std::vector<double> fast = device.Run(true);
        device.Run(true, 2);
        ExpectWithinFastBound(fast, exact, c.Describe());
        // The pipeline's shortcuts: the list bound and DropKV's own rows.
        FastPerturbationHints hints;
        hints.kept_bound = device.max_list();
        ExpectWithinFastBound(device.RunHinted(0, hints), exact, c.Describe());
        ScorerParams params;
        params.window = 4;
        params.kernel = 3;
        params.fast = true;
        ASSERT_TRUE(device.ScoreAndKeepRows(params, 4)) << c.Describe();
        hints.full_rows = device.full_rows();
        device.RunHinted(4, hints);
      }
    }
  }
}

// Finite inputs near 1e19 overflow fp32 attention: through the GPU backend every fast
// policy answers with finite statistics (full and sampled) or refuses the layer with
// INVALID_ARGUMENT naming the keys -- never a NaN statistic, which would poison the
// metrics' sums (the CPU backend's twin: FastCpuTolerance.HugeFiniteInputs...).
TEST(FastPerturbation, HugeFiniteInputsGiveFiniteStatisticsOrAreRefused) {
  KVTRIM_SKIP_WITHOUT_GPU();
  constexpr int64_t kHeads = 3, n = 300, d = 64, group = 4, w = 16;
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal;
  std::vector<float> keys(kHeads * n * d), values(keys.size()), queries(kHeads * group * w * d);
  for (auto* t : {&keys, &values, &queries}) {
    for (float& x : *t) x = normal(rng) * 1e19f;
  }
  PolicyEngine engine(BuiltinRegistry(), SharedGpu());
  for (const char* policy : {"streaming_llm", "knorm", "keydiff", "tova", "snapkv", "dropkv"}) {
    for (const bool sampled : {false, true}) {
      SCOPED_TRACE(absl::StrCat(policy, sampled ? " sampled" : " full"));
      CompressionSettings settings;
      settings.policy = policy;
      settings.budget.keep_fraction = 0.3;
      settings.numerics = Numerics::kFast;
      settings.perturbation_sampled = sampled;
      if (std::string(policy) == "snapkv") settings.params["window"] = ParamValue::Number(8);
      auto prepared = engine.Prepare(settings, "settings");
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      LayerRequest layer;
      layer.keys = {keys.data(), DType::kF32, {kHeads, n, d}};
      layer.values = {values.data(), DType::kF32, {kHeads, n, d}};
      layer.queries = {queries.data(), DType::kF32, {kHeads * group, w, d}};
      auto decision = engine.CompressLayer(*prepared, layer, "layer");
      if (!decision.ok()) {
        EXPECT_EQ(decision.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(std::string(decision.status().message()).find("keys"), std::string::npos)
            << decision.status();
        continue;
      }
      EXPECT_FALSE(decision->perturbation.empty());
      for (double p : decision->perturbation) EXPECT_TRUE(std::isfinite(p)) << p;
    }
  }
}

TEST(FastPerturbation, HeadDimensionsTheFastKernelsDoNotTakeAreRefused) {
  KVTRIM_SKIP_WITHOUT_GPU();
  PerturbationCase c;
  c.dtype = DType::kF32;
  c.d = 136;  // f32 rows above 128: the exact kernel only
  c.n = 50;
  DeviceCase device(c);
  EXPECT_EQ(device.fast_bytes(), 0u);
  EXPECT_EQ(device.LaunchFast(), cudaErrorNotSupported);
}

TEST(FastPerturbation, FastPerturbationTiming) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {32768, 131072}) {
    PerturbationCase c;
    c.heads = 8;
    c.group = 4;
    c.d = 128;
    c.w = 32;
    c.n = n;
    c.shared = true;  // one list of about a fifth of the tokens, as DropKV at 20 % keeps
    DeviceCase device(c);
    const double exact = MedianLaunchMicros(5, [&] { return device.LaunchExact(); });
    const double fast = MedianLaunchMicros(20, [&] { return device.LaunchFast(); });
    const double sampled =
        MedianLaunchMicros(20, [&] { return device.LaunchFast(kSampledPerturbationRows); });
    // As the pipeline runs them: the kept run sized by the host's counts, and the sampled
    // statistic over DropKV's default rows taking the scorer's full outputs.
    FastPerturbationHints hints;
    hints.kept_bound = device.max_list();
    const double fast_bounded = MedianLaunchMicros(20, [&] { return device.LaunchFast(0, hints); });
    ScorerParams params;
    params.window = kSampledPerturbationRows;
    params.kernel = 7;
    params.fast = true;
    ASSERT_TRUE(device.ScoreAndKeepRows(params, kSampledPerturbationRows));
    hints.full_rows = device.full_rows();
    const double sampled_fused = MedianLaunchMicros(
        20, [&] { return device.LaunchFast(kSampledPerturbationRows, hints); });
    std::printf("[ timing   ] perturbation bf16 n=%lld H_kv=8 G=4 d=128 w=32 (lists of %lld): "
                "exact %.1f us, fast %.1f us (%.1fx), sampled (last 8 rows) %.1f us; with the "
                "list bound: fast %.1f us, sampled on DropKV's rows %.1f us\n",
                static_cast<long long>(n), static_cast<long long>(device.max_list()), exact, fast,
                exact / fast, sampled, fast_bounded, sampled_fused);
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing

// GPU vs CPU parity of the key-only scorers (the table scorers, kernels/gpu/scorers/),
// protection and the selectors / AdaKV allocator (kernels/gpu/kernels/launchers.h), launcher
// by launcher:
//  * scores: bit-identical (memcmp) to every table scorer's CPU exact scorer (streaming_llm,
//    random, knorm, keydiff with both anchors, ...), for f32, f16 and bf16; a
//    table scorer's fast kernels within the fast-numerics band (tests/gpu/parity_rule.h);
//  * the scorer tables: every table scorer of the registry has CPU and GPU entries;
//  * protection: bit-identical to ApplyProtection;
//  * indices and counts: equal to SelectTopK, AllocateAdaKV and SelectSharedRoundRobin on
//    scores with many exact ties (a small set of values, -0.0 and +0.0, +inf and -inf),
//    smooth random scores and constant scores.
// Sizes: n in {1, 7, 99, 1000, 40000} (plus 2^20 + 3 and 2^22), d in {64, 128} (plus odd d),
// H in {1, 4, 8, 32}. Outputs are poisoned before every launch. A failure prints the case.
// SelectTiming prints the median time of LaunchSelectTopK at n = 131072, H = 8 (and of the
// other launchers at that size, for information).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/decide/allocate.h"
#include "kernels/counter_hash.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/scorers.h"
#include "kernels/decide/protection.h"
#include "kernels/decide/select.h"
#include "kernels/thread_pool.h"
#include "base/dtype.h"
#include "kernels/cpu/cpu_scorer_table.h"
#include "kernels/gpu/kernels/gpu_scorer_table.h"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/registry.h"
#include "tests/gpu/parity_rule.h"
#include "tests/gpu/policy_test_setup.h"
#include "tests/gpu/test_device.h"
#include "tests/gpu/window_traits.h"

namespace kvtrim::gpu::testing {
namespace {

#define KVTRIM_CUDA_ASSERT(expr)                                                        \
  do {                                                                                  \
    const cudaError_t kvtrim_err = (expr);                                              \
    ASSERT_EQ(kvtrim_err, cudaSuccess)                                                  \
        << #expr << ": " << cudaGetErrorName(kvtrim_err) << " " << cudaGetErrorString(kvtrim_err); \
  } while (0)

// ---- Helpers ------------------------------------------------------------------------------

/// A device allocation of `count` elements of T (at least one byte), freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    status_ = cudaMalloc(&ptr_, std::max<size_t>(1, count * sizeof(T)));
  }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  cudaError_t status() const { return status_; }
  /// Copies host [count] to the device.
  cudaError_t Upload(const T* host) const {
    return cudaMemcpy(ptr_, host, count_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  /// Copies the device array to host [count].
  cudaError_t Download(T* host) const {
    return cudaMemcpy(host, ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  /// Fills every byte with `byte` (a poison the launchers must overwrite).
  cudaError_t Poison(int byte) const { return cudaMemset(ptr_, byte, std::max<size_t>(1, count_ * sizeof(T))); }

 private:
  void* ptr_ = nullptr;
  size_t count_;
  cudaError_t status_;
};

/// A fast deterministic generator (splitmix64 counter).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  uint64_t Next() { return SplitMix64(state_++); }
  /// Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  /// Uniform integer in [0, m).
  int64_t Below(int64_t m) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(m)); }
  /// Zero mean, unit variance, bell-ish (sum of two 32-bit uniforms from one draw, rescaled).
  float Normal() {
    const uint64_t r = Next();
    const float u = static_cast<float>(r >> 40) + static_cast<float>((r >> 8) & 0xFFFFFF);
    return (u * (1.0f / 16777216.0f) - 1.0f) * 2.4494897f;
  }

 private:
  uint64_t state_;
};

/// Hex bits and value of a float, for failure messages.
std::string Describe(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  std::ostringstream out;
  out << x << " (0x" << std::hex << bits << ")";
  return out.str();
}

/// "" when a == b bitwise, else the first differing element of [H, n] scores.
std::string FirstScoreMismatch(const std::vector<float>& cpu, const std::vector<float>& gpu,
                               int64_t n) {
  if (cpu.size() == gpu.size() &&
      std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)) == 0) {
    return "";
  }
  for (size_t i = 0; i < std::min(cpu.size(), gpu.size()); ++i) {
    if (std::memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) {
      std::ostringstream out;
      out << "head " << i / n << " token " << i % n << ": cpu " << Describe(cpu[i]) << ", gpu "
          << Describe(gpu[i]);
      return out.str();
    }
  }
  return "sizes differ";
}

/// "" when every fast score f lies within |f - e| <= kFastTau * (|e| + scale_h) of the exact
/// score e (scale_h: the largest finite |e| of head h; non-finite scores must be equal), else
/// the first one outside, of [H, n] scores.
std::string FirstOutsideFastBand(const std::vector<float>& exact, const std::vector<float>& fast,
                                 int64_t heads, int64_t n) {
  if (exact.size() != fast.size()) return "sizes differ";
  for (int64_t h = 0; h < heads; ++h) {
    double scale = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double e = exact[h * n + j];
      if (std::isfinite(e)) scale = std::max(scale, std::fabs(e));
    }
    for (int64_t j = 0; j < n; ++j) {
      const double e = exact[h * n + j], f = fast[h * n + j];
      const bool finite = std::isfinite(e) && std::isfinite(f);
      if ((finite && std::fabs(f - e) <= kFastTau * (std::fabs(e) + scale)) ||
          (!finite && std::memcmp(&exact[h * n + j], &fast[h * n + j], sizeof(float)) == 0)) {
        continue;
      }
      std::ostringstream out;
      out << "head " << h << " token " << j << ": exact " << Describe(exact[h * n + j])
          << ", fast " << Describe(fast[h * n + j]);
      return out.str();
    }
  }
  return "";
}

/// "" when equal, else the first differing position of two index lists.
template <typename T>
std::string FirstListMismatch(const std::vector<T>& cpu, const std::vector<T>& gpu) {
  if (cpu == gpu) return "";
  std::ostringstream out;
  out << "sizes cpu " << cpu.size() << " gpu " << gpu.size();
  for (size_t i = 0; i < std::min(cpu.size(), gpu.size()); ++i) {
    if (cpu[i] != gpu[i]) {
      out << "; first difference at " << i << ": cpu " << cpu[i] << ", gpu " << gpu[i];
      break;
    }
  }
  return out.str();
}

/// The parameters of the scorer `name` with `overrides` over its defaults, resolved as the
/// engine resolves them.
ResolvedParams ResolveScorerParams(const std::string& name,
                                   const std::map<std::string, ParamValue>& overrides) {
  const ScorerSpec* spec = BuiltinRegistry().FindScorer(name);
  EXPECT_NE(spec, nullptr) << name;
  if (spec == nullptr) return ResolvedParams{};
  absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(spec->params, overrides, "params");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : ResolvedParams{};
}

// ---- Key scorers --------------------------------------------------------------------------

/// One key-scorer parity case: a table scorer with parameter overrides.
struct KeyCase {
  std::string scorer;                          // its registered name
  std::map<std::string, ParamValue> overrides;  // over its default parameters
  DType dtype;
  int64_t heads, n, d;
  std::string Name() const {
    std::ostringstream out;
    out << scorer;
    for (const auto& [name, value] : overrides) {
      out << "/" << name << "=";
      if (value.is_text) {
        out << value.text;
      } else {
        out << value.number;
      }
    }
    out << " " << DTypeName(dtype) << " H=" << heads << " n=" << n << " d=" << d;
    return out.str();
  }
};

/// Keys [H, n, d] like real ones (a per-head offset direction plus noise, per-key scales
/// spread over two orders of magnitude, a few zero keys), rounded to `dtype`. Returns the
/// raw bytes for the device and fills `f32` with their exact fp32 values.
std::vector<uint8_t> MakeKeys(int64_t heads, int64_t n, int64_t d, DType dtype, uint64_t seed,
                              std::vector<float>* f32) {
  Rng rng(seed);
  const size_t count = static_cast<size_t>(heads * n * d);
  f32->resize(count);
  std::vector<float> dir(static_cast<size_t>(d));
  for (int64_t h = 0; h < heads; ++h) {
    for (float& x : dir) x = 1.5f * rng.Normal();
    for (int64_t j = 0; j < n; ++j) {
      float* k = f32->data() + (h * n + j) * d;
      const bool zero = n > 4 && rng.Below(97) == 0;
      const float scale = static_cast<float>(std::exp(2.3 * (rng.Uniform() - 0.5)));
      for (int64_t c = 0; c < d; ++c) k[c] = zero ? 0.0f : scale * (dir[c] + rng.Normal());
    }
  }
  std::vector<uint8_t> bytes(count * DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data(), f32->data(), bytes.size());
    return bytes;
  }
  std::vector<uint16_t> half(count);
  for (size_t i = 0; i < count; ++i) {
    half[i] = dtype == DType::kF16 ? FloatToF16((*f32)[i]) : FloatToBf16((*f32)[i]);
  }
  std::memcpy(bytes.data(), half.data(), bytes.size());
  ConvertToF32(dtype, half.data(), count, f32->data());  // the values the CPU backend sees
  return bytes;
}

/// Runs the CPU scorer of `c` on fp32 keys [H, n, d].
std::vector<float> CpuKeyScores(const KeyCase& c, const std::vector<float>& keys, int32_t layer_id,
                                uint64_t seed) {
  CpuLayer layer;
  layer.layer_id = layer_id;
  layer.num_layers = layer_id + 1;
  layer.shape.num_kv_heads = c.heads;
  layer.shape.num_tokens = c.n;
  layer.shape.head_dim = c.d;
  layer.keys = F32Tensor::Owning(keys, {c.heads, c.n, c.d});
  layer.softmax_scale = 1.0f;
  layer.seed = seed;
  layer.input_dtype = c.dtype;
  static ThreadPool pool(16);
  std::vector<float> scores(static_cast<size_t>(c.heads * c.n), NAN);
  const CpuScorer* cpu = CpuScorerTable::Builtin().Find(c.scorer);
  EXPECT_NE(cpu, nullptr) << c.scorer;
  if (cpu == nullptr) return scores;
  const absl::Status st =
      cpu->exact(layer, ResolveScorerParams(c.scorer, c.overrides), pool, scores.data());
  EXPECT_TRUE(st.ok()) << c.Name() << ": " << st;
  return scores;
}

/// Runs the GPU table's exact kernels of `c` (its fast ones when `fast`) on device keys, with
/// ScorerParams from the table's parameter reader; returns scores [H, n] or fails the test.
void GpuKeyScores(const KeyCase& c, const void* device_keys, int32_t layer_id, uint64_t seed,
                  std::vector<float>* out, bool fast = false) {
  DeviceLayer layer;
  layer.keys = device_keys;
  layer.dtype = c.dtype;
  layer.num_kv_heads = static_cast<int32_t>(c.heads);
  layer.head_dim = static_cast<int32_t>(c.d);
  layer.num_tokens = c.n;
  layer.softmax_scale = 1.0f;
  layer.layer_id = layer_id;
  layer.seed = seed;
  const GpuScorer* table = GpuScorerTable::Builtin().Find(c.scorer);
  ASSERT_NE(table, nullptr) << c.scorer;
  ScorerParams params;
  if (table->read_params != nullptr) {
    table->read_params(ResolveScorerParams(c.scorer, c.overrides), c.dtype, &params);
  }
  const size_t scratch_bytes = table->For(fast).ScratchBytes(layer, params);
  DeviceArray<uint8_t> scratch(scratch_bytes);
  DeviceArray<float> scores(static_cast<size_t>(c.heads * c.n));
  KVTRIM_CUDA_ASSERT(scratch.status());
  KVTRIM_CUDA_ASSERT(scores.status());
  KVTRIM_CUDA_ASSERT(scores.Poison(0xFF));  // NaN everywhere until written
  void* scratch_ptr = scratch_bytes ? scratch.get() : nullptr;
  KVTRIM_CUDA_ASSERT(table->For(fast).launch(layer, params, scores.get(), scratch_ptr,
                                             scratch_bytes, nullptr));
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
  out->assign(static_cast<size_t>(c.heads * c.n), 0.0f);
  KVTRIM_CUDA_ASSERT(scores.Download(out->data()));
}

/// Checks every table scorer with its default parameters, and KeyDiff's other anchor (with
/// `all_kinds`: also eps = 0), on one key tensor.
void CheckKeyScorersOn(int64_t heads, int64_t n, int64_t d, DType dtype, uint64_t seed,
                       bool all_kinds) {
  std::vector<float> f32;
  const std::vector<uint8_t> bytes = MakeKeys(heads, n, d, dtype, seed, &f32);
  DeviceArray<uint8_t> keys(bytes.size());
  KVTRIM_CUDA_ASSERT(keys.status());
  KVTRIM_CUDA_ASSERT(keys.Upload(bytes.data()));
  std::vector<KeyCase> cases;
  // Every table scorer that reads keys alone, with its default parameters (a new one is
  // tested with no edit here); the window-attention ones: attention_parity_test.cu.
  for (const std::string& name : GpuScorerTable::Builtin().Names()) {
    const ScorerSpec* spec = BuiltinRegistry().FindScorer(name);
    ASSERT_NE(spec, nullptr) << name;
    if (spec->required_inputs != kInputKeys) continue;
    cases.push_back({name, {}, dtype, heads, n, d});
  }
  ASSERT_GE(cases.size(), 4u);  // streaming_llm, random, knorm, keydiff at least
  cases.push_back({"keydiff", {{"anchor", ParamValue::Text("raw_mean")}}, dtype, heads, n, d});
  if (all_kinds) cases.push_back({"keydiff", {{"eps", ParamValue::Number(0)}}, dtype, heads, n, d});
  const int32_t layer_id = static_cast<int32_t>(seed % 7);
  for (const KeyCase& c : cases) {
    const std::vector<float> cpu = CpuKeyScores(c, f32, layer_id, seed);
    std::vector<float> gpu;
    GpuKeyScores(c, keys.get(), layer_id, seed, &gpu);
    if (::testing::Test::HasFatalFailure()) return;
    const std::string diff = FirstScoreMismatch(cpu, gpu, n);
    ASSERT_TRUE(diff.empty()) << c.Name() << ": " << diff;
    const GpuScorer* table = GpuScorerTable::Builtin().Find(c.scorer);
    if (!table->fast.Supports(dtype, static_cast<int32_t>(d))) continue;
    // The fast kernels: within the fast-numerics band of docs/numerics.md of the exact scores.
    std::vector<float> fast;
    GpuKeyScores(c, keys.get(), layer_id, seed, &fast, /*fast=*/true);
    if (::testing::Test::HasFatalFailure()) return;
    const std::string band = FirstOutsideFastBand(cpu, fast, heads, n);
    ASSERT_TRUE(band.empty()) << c.Name() << " (fast): " << band;
  }
}

// Host only: runs without a GPU too.
TEST(GpuScorerTable, EveryTableScorerHasCpuAndGpuEntriesAndNothingElse) {
  std::set<std::string> table_scorers;
  for (const ScorerSpec* spec : BuiltinRegistry().scorers()) {
    if (spec->kind != ScorerKind::kTable) continue;
    table_scorers.insert(spec->name);
    const GpuScorer* gpu = GpuScorerTable::Builtin().Find(spec->name);
    ASSERT_NE(gpu, nullptr) << spec->name << ": no file in kernels/gpu/scorers/ registers it";
    EXPECT_NE(gpu->exact.launch, nullptr) << spec->name;
    EXPECT_NE(CpuScorerTable::Builtin().Find(spec->name), nullptr) << spec->name;
  }
  for (const std::string& name : GpuScorerTable::Builtin().Names()) {
    EXPECT_EQ(table_scorers.count(name), 1u)
        << name << ": registered on the GPU but not a table scorer of the registry";
  }
  GpuScorerTable table;
  GpuScorer none;
  EXPECT_FALSE(table.Add("none", none));  // no exact kernels
  none.exact = GpuScorerTable::Builtin().Find("knorm")->exact;
  EXPECT_TRUE(table.Add("none", none));
  EXPECT_FALSE(table.Add("none", none));  // the name is taken
  // Other threads of the process (the shared backend's workers) make fork() unsafe: re-exec.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(table.Register("none", none), "GPU scorer 'none'");
}

// Host only: a table scorer's own parameters round-trip through ScorerParams::table, and
// the bytes the launch key reads tell different parameters apart (and not equal ones).
TEST(GpuScorerTable, TableParamsKeepAScorersOwnParametersAsBytes) {
  struct Wide {
    double a;
    uint64_t b, c, d;
  };
  struct Narrow {
    float eps;
    uint32_t flag;
  };
  TableParams table;
  table.Store(Wide{1.5, 2, 3, 4});
  EXPECT_EQ(table.Load<Wide>().a, 1.5);
  EXPECT_EQ(table.Load<Wide>().d, 4u);
  table.Store(Narrow{0.25f, 1});  // a smaller struct zeroes the bytes past it
  EXPECT_EQ(table.Load<Narrow>().eps, 0.25f);
  EXPECT_EQ(table.Load<Narrow>().flag, 1u);
  for (size_t w = 1; w < TableParams::kWords; ++w) EXPECT_EQ(table.words()[w], 0u) << w;

  // KeyDiff keeps its anchor and eps there: each parameter changes the key's bytes.
  const GpuScorer* keydiff = GpuScorerTable::Builtin().Find("keydiff");
  ASSERT_NE(keydiff, nullptr);
  auto words = [&](const std::map<std::string, ParamValue>& overrides) {
    ScorerParams params;
    keydiff->read_params(ResolveScorerParams("keydiff", overrides), DType::kF32, &params);
    return params.table.words();
  };
  EXPECT_EQ(words({}), words({}));
  EXPECT_NE(words({}), words({{"anchor", ParamValue::Text("raw_mean")}}));
  EXPECT_NE(words({}), words({{"eps", ParamValue::Number(0)}}));
}

/// The kind of `spec`'s parameter `name`, or nullopt when it declares none.
std::optional<ParamSpec::Kind> ParamKindOf(const ScorerSpec& spec, const std::string& name) {
  for (const ParamSpec& p : spec.params) {
    if (p.name == name) return p.kind;
  }
  return std::nullopt;
}

// Host only: a window-attention scorer's traits (its GPU file) say which parameters and inputs
// the shared kernels read (ReadWindowAttentionParams); its registry entry declares each.
TEST(GpuScorerTable, WindowAttentionTraitsAgreeWithTheRegistryEntry) {
  using Kind = ParamSpec::Kind;
  int checked = 0;
  for (const std::string& name : GpuScorerTable::Builtin().Names()) {
    const WindowAttentionTraits* t = GpuScorerTable::Builtin().Find(name)->window_attention;
    if (t == nullptr) continue;
    ++checked;
    SCOPED_TRACE(name);
    const ScorerSpec* spec = BuiltinRegistry().FindScorer(name);
    ASSERT_NE(spec, nullptr);
    EXPECT_TRUE(spec->required_inputs & kInputQueries);
    const bool window_pooling = t->ReadsWindowPooling();
    EXPECT_EQ(ParamKindOf(*spec, "window") == Kind::kInt, window_pooling);
    EXPECT_EQ(ParamKindOf(*spec, "kernel") == Kind::kInt, window_pooling);
    EXPECT_EQ(ParamKindOf(*spec, "pooling") == Kind::kEnum, window_pooling);
    EXPECT_EQ(static_cast<bool>(spec->required_inputs & kInputValues), t->ReadsValues());
    EXPECT_EQ(ParamKindOf(*spec, "eps") == Kind::kFloat, t->ReadsValues());
    EXPECT_EQ(ParamKindOf(*spec, "bf16_prob_round") == Kind::kEnum, t->ReadsValues());
    EXPECT_EQ(ParamKindOf(*spec, "causal_normalize") == Kind::kBool, t->causal_normalize_param);
    // One score for every KV head is a layer-wide decision.
    EXPECT_EQ(t->SharedByEveryHead(), spec->scope == DecisionScope::kLayer);
    // The CPU twin forms the rows' outputs exactly when the GPU kernels do.
    const CpuScorer* cpu = CpuScorerTable::Builtin().Find(name);
    ASSERT_NE(cpu, nullptr);
    EXPECT_EQ(cpu->fast_with_rows != nullptr, t->ReadsValues());
  }
  EXPECT_EQ(checked, 4);  // snapkv, h2o, tova, dropkv
}

TEST(KeyScorerParity, BitIdenticalAcrossSizesAndDtypes) {
  KVTRIM_SKIP_WITHOUT_GPU();
  int64_t tensors = 0;
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t d : {64, 128}) {
      for (int64_t heads : {1, 4, 8, 32}) {
        const int64_t elements = heads * n * d;
        for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
          // The largest tensors only in fp32 and bf16, to keep the test short.
          if (elements > (int64_t{1} << 24) && dtype == DType::kF16) continue;
          SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " H=" << heads << " n=" << n
                                            << " d=" << d);
          CheckKeyScorersOn(heads, n, d, dtype, 1000 + n + d + heads, dtype == DType::kF32);
          if (HasFatalFailure()) return;
          ++tensors;
        }
      }
    }
  }
  EXPECT_EQ(tensors, 115);  // 40 shapes x 3 dtypes, less 5 large f16 tensors
}

TEST(KeyScorerParity, OddHeadDimsAndChunkBoundaries) {
  KVTRIM_SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t heads, n, d;
  };
  for (const Shape s : {Shape{1, 1, 1}, Shape{2, 63, 7}, Shape{3, 64, 9}, Shape{2, 65, 130},
                        Shape{1, 511, 3}, Shape{2, 512, 17}, Shape{1, 513, 64},
                        Shape{1, 16385, 33}, Shape{2, 70001, 8}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " H=" << s.heads << " n=" << s.n
                                        << " d=" << s.d);
      CheckKeyScorersOn(s.heads, s.n, s.d, dtype, 77 + s.n * 3 + s.d, true);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(KeyScorerErrors, RejectsBadArgumentsAndSkipsEmptyLayers) {
  KVTRIM_SKIP_WITHOUT_GPU();
  DeviceArray<float> scores(16);
  KVTRIM_CUDA_ASSERT(scores.status());
  DeviceLayer layer;
  layer.num_kv_heads = 2;
  layer.num_tokens = 8;
  layer.head_dim = 4;
  ScorerParams params;
  // K-norm without keys, in both numerics; KeyDiff with too little scratch, in both.
  const GpuScorer* knorm = GpuScorerTable::Builtin().Find("knorm");
  const GpuScorer* keydiff = GpuScorerTable::Builtin().Find("keydiff");
  ASSERT_NE(knorm, nullptr);
  ASSERT_NE(keydiff, nullptr);
  layer.head_dim = 8;
  for (bool fast : {false, true}) {
    EXPECT_EQ(knorm->For(fast).launch(layer, params, scores.get(), nullptr, 0, nullptr),
              cudaErrorInvalidValue);
  }
  DeviceArray<float> keys(64);
  KVTRIM_CUDA_ASSERT(keys.status());
  layer.keys = keys.get();
  for (bool fast : {false, true}) {
    const size_t need = keydiff->For(fast).ScratchBytes(layer, params);
    EXPECT_GT(need, 0u);
    DeviceArray<uint8_t> scratch(need);
    KVTRIM_CUDA_ASSERT(scratch.status());
    EXPECT_EQ(keydiff->For(fast).launch(layer, params, scores.get(), scratch.get(), need - 1,
                                        nullptr),
              cudaErrorInvalidValue);
  }
  layer.head_dim = 4;
  EXPECT_EQ(knorm->exact.ScratchBytes(layer, params), 0u);
  EXPECT_FALSE(knorm->fast.Supports(DType::kBF16, 4));  // d not a multiple of 8
  EXPECT_EQ(knorm->fast.launch(layer, params, scores.get(), nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // n = 0 launches nothing and succeeds, even without pointers (at a d the fast kernels take).
  layer.num_tokens = 0;
  layer.head_dim = 8;
  for (bool fast : {false, true}) {
    EXPECT_EQ(keydiff->For(fast).launch(layer, params, nullptr, nullptr, 0, nullptr),
              cudaSuccess);
  }
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
}

// ---- Selection inputs ---------------------------------------------------------------------

/// Kinds of score tensors for the selection tests.
enum class ScoreKind { kTied, kSmooth, kConstant };

const char* ScoreKindName(ScoreKind k) {
  return k == ScoreKind::kTied ? "tied" : k == ScoreKind::kSmooth ? "smooth" : "constant";
}

/// Scores [H, n]: kTied draws from {-0.5, -0.25, -0.0, +0.0, 0.25, 0.5} with 5% +inf and 5%
/// -inf; kSmooth is continuous with 1% +inf; kConstant is 0.75 everywhere.
std::vector<float> MakeScores(ScoreKind kind, int64_t heads, int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> s(static_cast<size_t>(heads * n));
  const float levels[] = {-0.5f, -0.25f, -0.0f, 0.0f, 0.25f, 0.5f};
  for (float& x : s) {
    if (kind == ScoreKind::kConstant) {
      x = 0.75f;
    } else if (kind == ScoreKind::kTied) {
      const int64_t r = rng.Below(20);
      x = r == 0 ? INFINITY : r == 1 ? -INFINITY : levels[rng.Below(6)];
    } else {
      x = rng.Below(100) == 0 ? INFINITY : rng.Normal();
    }
  }
  return s;
}

/// Describes a selection case for failure messages.
std::string SelCase(const char* what, ScoreKind kind, int64_t heads, int64_t n) {
  std::ostringstream out;
  out << what << " " << ScoreKindName(kind) << " H=" << heads << " n=" << n;
  return out.str();
}

/// Scratch for the selection launchers of [H, n].
struct SelectScratch {
  explicit SelectScratch(int32_t heads, int64_t n)
      : bytes(SelectScratchBytes(heads, n)), buffer(bytes) {}
  size_t bytes;
  DeviceArray<uint8_t> buffer;
};

// ---- Top-k --------------------------------------------------------------------------------

/// Checks LaunchSelectTopK against SelectTopK for `counts` [H] on `scores` [H, n].
void CheckTopK(const std::vector<float>& host_scores, int64_t heads, int64_t n,
               const std::vector<int64_t>& counts, const std::string& label) {
  std::vector<int64_t> cpu_offsets = {0};
  std::vector<int32_t> cpu_indices;
  for (int64_t h = 0; h < heads; ++h) {
    SelectTopK(host_scores.data() + h * n, n, counts[h], &cpu_indices);
    cpu_offsets.push_back(static_cast<int64_t>(cpu_indices.size()));
  }
  DeviceArray<float> scores(host_scores.size());
  DeviceArray<int64_t> d_counts(static_cast<size_t>(heads));
  DeviceArray<int64_t> offsets(static_cast<size_t>(heads + 1));
  DeviceArray<int32_t> indices(cpu_indices.size());
  SelectScratch scratch(static_cast<int32_t>(heads), n);
  KVTRIM_CUDA_ASSERT(scores.status());
  KVTRIM_CUDA_ASSERT(scratch.buffer.status());
  ASSERT_GT(scratch.bytes, 0u);
  KVTRIM_CUDA_ASSERT(scores.Upload(host_scores.data()));
  KVTRIM_CUDA_ASSERT(d_counts.Upload(counts.data()));
  KVTRIM_CUDA_ASSERT(offsets.Poison(0xA5));
  KVTRIM_CUDA_ASSERT(indices.Poison(0xFF));
  KVTRIM_CUDA_ASSERT(LaunchSelectTopK(scores.get(), static_cast<int32_t>(heads), n,
                                      d_counts.get(), offsets.get(), indices.get(),
                                      scratch.buffer.get(), scratch.bytes, nullptr));
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int64_t> gpu_offsets(static_cast<size_t>(heads + 1));
  std::vector<int32_t> gpu_indices(cpu_indices.size());
  KVTRIM_CUDA_ASSERT(offsets.Download(gpu_offsets.data()));
  KVTRIM_CUDA_ASSERT(indices.Download(gpu_indices.data()));
  std::string diff = FirstListMismatch(cpu_offsets, gpu_offsets);
  ASSERT_TRUE(diff.empty()) << label << ": offsets " << diff;
  for (int64_t h = 0; h < heads; ++h) {
    const std::vector<int32_t> cpu(cpu_indices.begin() + cpu_offsets[h],
                                   cpu_indices.begin() + cpu_offsets[h + 1]);
    const std::vector<int32_t> gpu(gpu_indices.begin() + cpu_offsets[h],
                                   gpu_indices.begin() + cpu_offsets[h + 1]);
    diff = FirstListMismatch(cpu, gpu);
    ASSERT_TRUE(diff.empty()) << label << " head " << h << " count " << counts[h] << ": " << diff;
  }
}

/// Per-head counts covering 0, n, out-of-range values and random ones.
std::vector<int64_t> MakeCounts(int64_t heads, int64_t n, Rng& rng) {
  std::vector<int64_t> counts(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    switch (h % 6) {
      case 0:
        counts[h] = rng.Below(n + 1);
        break;
      case 1:
        counts[h] = n;
        break;
      case 2:
        counts[h] = 0;
        break;
      case 3:
        counts[h] = n + 5;  // clamped to n
        break;
      case 4:
        counts[h] = -3;  // clamped to 0
        break;
      default:
        counts[h] = std::max<int64_t>(1, n / 5);
        break;
    }
  }
  if (heads == 1) counts[0] = std::max<int64_t>(1, (n * 2) / 7);
  return counts;
}

TEST(SelectTopKParity, EqualsTheCpuOnTiesInfinitiesAndSmoothScores) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t heads : {1, 4, 8, 32}) {
      for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth, ScoreKind::kConstant}) {
        const std::vector<float> scores = MakeScores(kind, heads, n, 31 * n + heads);
        Rng rng(n + 7 * heads);
        for (int round = 0; round < 3; ++round) {
          std::vector<int64_t> counts = MakeCounts(heads, n, rng);
          if (round > 0) std::rotate(counts.begin(), counts.begin() + round % heads, counts.end());
          CheckTopK(scores, heads, n, counts, SelCase("topk", kind, heads, n));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(SelectTopKParity, LargeRows) {
  KVTRIM_SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t heads, n;
  };
  for (const Shape s : {Shape{2, (int64_t{1} << 20) + 3}, Shape{1, int64_t{1} << 22}}) {
    for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth}) {
      const std::vector<float> scores = MakeScores(kind, s.heads, s.n, 5 + s.n);
      std::vector<int64_t> counts(static_cast<size_t>(s.heads));
      for (int64_t h = 0; h < s.heads; ++h) counts[h] = (s.n * (h + 1)) / 5 + 1;
      CheckTopK(scores, s.heads, s.n, counts, SelCase("topk", kind, s.heads, s.n));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(SelectTopKParity, EmptyShapesWriteOffsetsOnly) {
  KVTRIM_SKIP_WITHOUT_GPU();
  // n = 0: every offset is 0. H = 0: offsets[0] = 0.
  for (int64_t heads : {0, 3}) {
    DeviceArray<int64_t> counts(3);
    DeviceArray<int64_t> offsets(4);
    SelectScratch scratch(static_cast<int32_t>(heads), 0);
    const std::vector<int64_t> host_counts = {5, 0, 2};
    KVTRIM_CUDA_ASSERT(counts.Upload(host_counts.data()));
    KVTRIM_CUDA_ASSERT(offsets.Poison(0x5A));
    KVTRIM_CUDA_ASSERT(LaunchSelectTopK(nullptr, static_cast<int32_t>(heads), 0, counts.get(),
                                        offsets.get(), nullptr, scratch.buffer.get(),
                                        scratch.bytes, nullptr));
    KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<int64_t> got(4);
    KVTRIM_CUDA_ASSERT(offsets.Download(got.data()));
    for (int64_t h = 0; h <= heads; ++h) EXPECT_EQ(got[h], 0) << "H=" << heads << " offset " << h;
  }
  // Too little scratch.
  SelectScratch scratch(2, 100);
  DeviceArray<int64_t> offsets(3);
  DeviceArray<int64_t> counts(2);
  EXPECT_EQ(LaunchSelectTopK(nullptr, 2, 100, counts.get(), offsets.get(), nullptr,
                             scratch.buffer.get(), 16, nullptr),
            cudaErrorInvalidValue);
}

// ---- Protection ---------------------------------------------------------------------------

TEST(SelectProtectionParity, BitIdenticalToApplyProtection) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t heads : {1, 4, 8, 32}) {
      const std::vector<float> base = MakeScores(ScoreKind::kSmooth, heads, n, 3 * n + heads);
      for (const Protection p : {Protection{0, 0}, Protection{4, 0}, Protection{0, 64},
                                 Protection{4, 32}, Protection{n, 1}, Protection{n / 2, n},
                                 Protection{n + 3, n + 9}}) {
        std::vector<float> cpu = base;
        ApplyProtection(p, heads, n, cpu.data());
        DeviceArray<float> scores(base.size());
        KVTRIM_CUDA_ASSERT(scores.Upload(base.data()));
        KVTRIM_CUDA_ASSERT(LaunchApplyProtection(scores.get(), static_cast<int32_t>(heads), n,
                                                 p.sink, p.recent, nullptr));
        KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> gpu(base.size());
        KVTRIM_CUDA_ASSERT(scores.Download(gpu.data()));
        const std::string diff = FirstScoreMismatch(cpu, gpu, n);
        ASSERT_TRUE(diff.empty()) << "protection sink=" << p.sink << " recent=" << p.recent
                                  << " H=" << heads << " n=" << n << ": " << diff;
      }
    }
  }
}

// ---- AdaKV ----------------------------------------------------------------------------------

/// Checks LaunchAdaKVCounts against AllocateAdaKV for budget k and safeguard fraction alpha.
void CheckAdaKV(const std::vector<float>& host_scores, int64_t heads, int64_t n, int64_t k,
                double alpha, const std::string& label) {
  const std::vector<int64_t> cpu = AllocateAdaKV(host_scores.data(), heads, n, k, alpha);
  const int64_t safeguard =
      std::min<int64_t>(n, static_cast<int64_t>(std::floor(alpha * static_cast<double>(k))));
  DeviceArray<float> scores(host_scores.size());
  DeviceArray<int64_t> counts(static_cast<size_t>(heads));
  SelectScratch scratch(static_cast<int32_t>(heads), n);
  KVTRIM_CUDA_ASSERT(scratch.buffer.status());
  KVTRIM_CUDA_ASSERT(scores.Upload(host_scores.data()));
  KVTRIM_CUDA_ASSERT(counts.Poison(0x77));
  KVTRIM_CUDA_ASSERT(LaunchAdaKVCounts(scores.get(), static_cast<int32_t>(heads), n, k, safeguard,
                                       counts.get(), scratch.buffer.get(), scratch.bytes,
                                       nullptr));
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int64_t> gpu(static_cast<size_t>(heads));
  KVTRIM_CUDA_ASSERT(counts.Download(gpu.data()));
  const std::string diff = FirstListMismatch(cpu, gpu);
  ASSERT_TRUE(diff.empty()) << label << " k=" << k << " alpha=" << alpha
                            << " safeguard=" << safeguard << ": counts " << diff;
}

TEST(SelectAdaKVParity, CountsEqualTheCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t heads : {1, 4, 8, 32}) {
      for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth, ScoreKind::kConstant}) {
        std::vector<float> scores = MakeScores(kind, heads, n, 17 * n + heads);
        ApplyProtection(Protection{std::min<int64_t>(4, n / 3), std::min<int64_t>(16, n / 4)},
                        heads, n, scores.data());
        for (int64_t k : {int64_t{1}, std::max<int64_t>(1, n / 5), std::max<int64_t>(1, n / 2), n}) {
          for (double alpha : {0.0, 0.2, 1.0}) {
            // At n = 40000 a subset of (k, alpha), to keep the CPU reference time short.
            if (n > 1000 && (alpha == 0.0) != (k == n / 2)) continue;
            CheckAdaKV(scores, heads, n, k, alpha, SelCase("adakv", kind, heads, n));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(SelectAdaKVParity, LargeRows) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{1} << 20) + 3;
  for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth}) {
    const std::vector<float> scores = MakeScores(kind, 3, n, 99);
    CheckAdaKV(scores, 3, n, n / 4, 0.2, SelCase("adakv", kind, 3, n));
    if (HasFatalFailure()) return;
  }
}

// ---- Shared -----------------------------------------------------------------------------------

/// Checks LaunchSelectShared against SelectSharedRoundRobin.
void CheckShared(const std::vector<float>& host_scores, int64_t heads, int64_t n, int64_t count,
                 const std::string& label) {
  std::vector<int32_t> cpu;
  SelectSharedRoundRobin(host_scores.data(), heads, n, count, &cpu);
  DeviceArray<float> scores(host_scores.size());
  DeviceArray<int32_t> indices(cpu.size());
  SelectScratch scratch(static_cast<int32_t>(heads), n);
  KVTRIM_CUDA_ASSERT(scratch.buffer.status());
  ASSERT_GT(scratch.bytes, 0u);
  KVTRIM_CUDA_ASSERT(scores.Upload(host_scores.data()));
  KVTRIM_CUDA_ASSERT(indices.Poison(0xFF));
  KVTRIM_CUDA_ASSERT(LaunchSelectShared(scores.get(), static_cast<int32_t>(heads), n, count,
                                        indices.get(), scratch.buffer.get(), scratch.bytes,
                                        nullptr));
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int32_t> gpu(cpu.size());
  KVTRIM_CUDA_ASSERT(indices.Download(gpu.data()));
  const std::string diff = FirstListMismatch(cpu, gpu);
  ASSERT_TRUE(diff.empty()) << label << " count=" << count << ": " << diff;
}

TEST(SelectSharedParity, EqualsTheRoundRobinUnion) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t heads : {1, 4, 8, 32}) {
      for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth, ScoreKind::kConstant}) {
        const std::vector<float> scores = MakeScores(kind, heads, n, 23 * n + heads);
        for (int64_t count : {int64_t{1}, n / 4 + 1, n / 2, n - 1, n, n + 3}) {
          if (count < 1 || (n > 1000 && count != n / 4 + 1 && count != n)) continue;
          CheckShared(scores, heads, n, count, SelCase("shared", kind, heads, n));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(SelectSharedParity, LargeRows) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{1} << 20) + 3;
  for (ScoreKind kind : {ScoreKind::kTied, ScoreKind::kSmooth}) {
    const std::vector<float> scores = MakeScores(kind, 2, n, 1234);
    CheckShared(scores, 2, n, n / 3, SelCase("shared", kind, 2, n));
    if (HasFatalFailure()) return;
  }
}

// ---- Timing ---------------------------------------------------------------------------------

/// Median over `reps` runs of `launch` (after 5 warm-up runs), each bracketed by events.
template <typename Fn>
float MedianMicros(int reps, Fn&& launch) {
  cudaEvent_t start, stop;
  EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(launch(), cudaSuccess);
  std::vector<float> us;
  for (int i = 0; i < reps; ++i) {
    EXPECT_EQ(cudaEventRecord(start, nullptr), cudaSuccess);
    EXPECT_EQ(launch(), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(stop, nullptr), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    us.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST(SelectTiming, TopKAt128KTokens8Heads) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int32_t heads = 8;
  const int64_t n = 131072;
  const int64_t k = n / 5;  // keep 20%
  std::vector<float> host = MakeScores(ScoreKind::kSmooth, heads, n, 42);
  ApplyProtection(Protection{4, 64}, heads, n, host.data());
  DeviceArray<float> scores(host.size());
  DeviceArray<int64_t> counts(heads);
  DeviceArray<int64_t> offsets(heads + 1);
  DeviceArray<int32_t> indices(static_cast<size_t>(heads * n));
  SelectScratch scratch(heads, n);
  KVTRIM_CUDA_ASSERT(scratch.buffer.status());
  KVTRIM_CUDA_ASSERT(scores.Upload(host.data()));
  const std::vector<int64_t> host_counts(heads, k);
  KVTRIM_CUDA_ASSERT(counts.Upload(host_counts.data()));

  const float topk = MedianMicros(50, [&] {
    return LaunchSelectTopK(scores.get(), heads, n, counts.get(), offsets.get(), indices.get(),
                            scratch.buffer.get(), scratch.bytes, nullptr);
  });
  const float adakv = MedianMicros(50, [&] {
    return LaunchAdaKVCounts(scores.get(), heads, n, k, k / 5, counts.get(), scratch.buffer.get(),
                             scratch.bytes, nullptr);
  });
  KVTRIM_CUDA_ASSERT(counts.Upload(host_counts.data()));
  const float shared = MedianMicros(50, [&] {
    return LaunchSelectShared(scores.get(), heads, n, k, indices.get(), scratch.buffer.get(),
                              scratch.bytes, nullptr);
  });
  const float protect = MedianMicros(50, [&] {
    return LaunchApplyProtection(scores.get(), heads, n, 4, 64, nullptr);
  });
  // The same top-k on heavily tied scores (six values), and the launch floor at n = 1000.
  const std::vector<float> tied = MakeScores(ScoreKind::kTied, heads, n, 43);
  DeviceArray<float> tied_scores(tied.size());
  KVTRIM_CUDA_ASSERT(tied_scores.Upload(tied.data()));
  const float topk_tied = MedianMicros(50, [&] {
    return LaunchSelectTopK(tied_scores.get(), heads, n, counts.get(), offsets.get(),
                            indices.get(), scratch.buffer.get(), scratch.bytes, nullptr);
  });
  const float topk_small = MedianMicros(50, [&] {
    return LaunchSelectTopK(scores.get(), heads, 1000, counts.get(), offsets.get(), indices.get(),
                            scratch.buffer.get(), scratch.bytes, nullptr);
  });

  // Key scorers on bf16 keys [8, 131072, 128] for reference.
  std::vector<float> f32;
  const std::vector<uint8_t> bytes = MakeKeys(heads, n, 128, DType::kBF16, 7, &f32);
  DeviceArray<uint8_t> keys(bytes.size());
  KVTRIM_CUDA_ASSERT(keys.Upload(bytes.data()));
  DeviceLayer layer;
  layer.keys = keys.get();
  layer.dtype = DType::kBF16;
  layer.num_kv_heads = heads;
  layer.head_dim = 128;
  layer.num_tokens = n;
  layer.softmax_scale = 1.0f / std::sqrt(128.0f);
  ScorerParams params;  // KeyDiff's defaults, as the plan reads them
  GpuScorerTable::Builtin().Find("keydiff")->read_params(ResolveScorerParams("keydiff", {}),
                                                        DType::kBF16, &params);
  const GpuScorerKernels& keydiff_exact = GpuScorerTable::Builtin().Find("keydiff")->exact;
  const size_t kd_bytes = keydiff_exact.ScratchBytes(layer, params);
  DeviceArray<uint8_t> kd_scratch(kd_bytes);
  KVTRIM_CUDA_ASSERT(kd_scratch.status());
  const float knorm = MedianMicros(20, [&] {
    return GpuScorerTable::Builtin().Find("knorm")->exact.launch(layer, params, scores.get(),
                                                                 nullptr, 0, nullptr);
  });
  const float keydiff = MedianMicros(20, [&] {
    return keydiff_exact.launch(layer, params, scores.get(), kd_scratch.get(), kd_bytes,
                                nullptr);
  });
  KVTRIM_CUDA_ASSERT(cudaDeviceSynchronize());

  std::printf("[timing] n=131072 H=8 k=%lld (median, us): select_topk %.1f (tied scores %.1f)"
              " | select_topk at n=1000 %.1f | adakv_counts %.1f | select_shared %.1f |"
              " protection %.1f | knorm(bf16,d=128) %.1f | keydiff(bf16,d=128) %.1f\n",
              static_cast<long long>(k), topk, topk_tied, topk_small, adakv, shared, protect,
              knorm, keydiff);
  std::fflush(stdout);
  RecordProperty("select_topk_us", std::to_string(topk));
  RecordProperty("adakv_counts_us", std::to_string(adakv));
  RecordProperty("select_shared_us", std::to_string(shared));
  RecordProperty("keydiff_us", std::to_string(keydiff));
  EXPECT_GT(topk, 0.0f);

  // For scale only, never a failure: the DropKV scorer of the same layer (G = 4, w = 8,
  // kernel 11), from LaunchScore (kernels/gpu/kernels/score_dispatch.cu).
  std::vector<float> qf;
  const std::vector<uint8_t> qbytes = MakeKeys(4 * heads, 8, 128, DType::kBF16, 8, &qf);
  DeviceArray<uint8_t> queries(qbytes.size());
  if (queries.Upload(qbytes.data()) != cudaSuccess) return;
  layer.values = keys.get();
  layer.queries = queries.get();
  layer.num_query_heads = 4 * heads;
  layer.window_rows = 8;
  ScorerParams dropkv;
  dropkv.window = 8;
  dropkv.kernel = 11;
  dropkv.pool_max = true;
  dropkv.eps = 1e-6f;
  const WindowAttentionTraits& dropkv_traits = WindowTraitsOf("dropkv");
  const size_t dk_bytes = ScoreScratchBytes(dropkv_traits, layer, dropkv);
  DeviceArray<uint8_t> dk_scratch(dk_bytes);
  cudaError_t dk_err = dk_bytes == 0 ? cudaErrorInvalidValue : cudaSuccess;
  float dk = -1.0f;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (dk_err == cudaSuccess) dk_err = cudaEventCreate(&start);
  if (dk_err == cudaSuccess) dk_err = cudaEventCreate(&stop);
  std::vector<float> dk_us;
  for (int rep = 0; rep < 6 && dk_err == cudaSuccess; ++rep) {
    dk_err = cudaEventRecord(start, nullptr);
    if (dk_err == cudaSuccess) {
      dk_err = LaunchScore(dropkv_traits, layer, dropkv, scores.get(), dk_scratch.get(), dk_bytes,
                           nullptr);
    }
    if (dk_err == cudaSuccess) dk_err = cudaEventRecord(stop, nullptr);
    if (dk_err == cudaSuccess) dk_err = cudaEventSynchronize(stop);
    float ms = 0;
    if (dk_err == cudaSuccess) dk_err = cudaEventElapsedTime(&ms, start, stop);
    if (rep > 0) dk_us.push_back(ms * 1000.0f);  // rep 0 warms up
  }
  if (dk_err == cudaSuccess && !dk_us.empty()) {
    std::sort(dk_us.begin(), dk_us.end());
    dk = dk_us[dk_us.size() / 2];
  }
  if (dk_bytes != 0) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  std::printf("[timing] dropkv score (LaunchScore, G=4, w=8, kernel 11, bf16): %.1f us (%s);"
              " select_topk is %.1f%% of it\n",
              dk, cudaGetErrorName(dk_err), dk > 0 ? 100.0f * topk / dk : -1.0f);
  std::fflush(stdout);
}

}  // namespace
}  // namespace kvtrim::gpu::testing

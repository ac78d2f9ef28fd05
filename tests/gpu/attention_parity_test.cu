// GPU parity of the attention scorers (SnapKV, H2O, TOVA, DropKV) and the output
// perturbation: the scores of LaunchScore must equal the CPU scorers' bit for bit (memcmp)
// for f32, f16 and bf16 inputs; the perturbation must match the CPU to 1e-9 relative.
// Every case draws fresh random inputs and poisons the output before the launch.
// Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/perturbation.h"
#include "kernels/cpu/scorers.h"
#include "base/dtype.h"
#include "kernels/gpu/kernels/attention_plan.cuh"
#include "kernels/gpu/kernels/attention_score.cuh"
#include "kernels/gpu/kernels/attention_stats.cuh"
#include "kernels/gpu/kernels/launchers.h"
#include "kernels/gpu/kernels/pooling.cuh"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"
#include "tests/gpu/window_traits.h"

namespace kvtrim::gpu {
namespace {

#define CUDA_OK(expr)                                                              \
  do {                                                                             \
    const cudaError_t err_ = (expr);                                               \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);     \
  } while (0)

using testing::DeviceBuffer;

/// The window-attention scorers under test (the order keeps the cases' seeds).
enum class Attn { kSnapKV, kH2O, kTova, kDropKV };

/// The name of a scorer under test, for case descriptions and test names ("SnapKV").
const char* KindName(Attn kind) {
  switch (kind) {
    case Attn::kSnapKV: return "SnapKV";
    case Attn::kH2O: return "H2O";
    case Attn::kTova: return "Tova";
    case Attn::kDropKV: return "DropKV";
  }
  return "?";
}

/// The traits a scorer under test registers on the GPU (what its table entry passes
/// LaunchScore).
const WindowAttentionTraits& Traits(Attn kind) {
  switch (kind) {
    case Attn::kSnapKV: return testing::WindowTraitsOf("snapkv");
    case Attn::kH2O: return testing::WindowTraitsOf("h2o");
    case Attn::kTova: return testing::WindowTraitsOf("tova");
    case Attn::kDropKV: return testing::WindowTraitsOf("dropkv");
  }
  return testing::WindowTraitsOf("?");
}

/// One scorer invocation to compare.
struct Case {
  Attn kind = Attn::kSnapKV;
  DType dtype = DType::kF32;
  int64_t h_kv = 2, group = 1, n = 1, d = 64, w = 1;
  int64_t window = 1;     // snapkv / dropkv
  int64_t kernel = 1;     // snapkv / dropkv
  bool max_pool = true;
  bool causal_normalize = false;  // h2o
  std::string bf16_round = "auto";  // dropkv
  double query_gain = 2.0;

  std::string Describe() const {
    std::ostringstream s;
    s << KindName(kind) << " dtype=" << DTypeName(dtype) << " H_kv=" << h_kv
      << " G=" << group << " n=" << n << " d=" << d << " w=" << w << " window=" << window
      << " kernel=" << kernel << " pool=" << (max_pool ? "max" : "avg")
      << " causal_normalize=" << causal_normalize << " bf16_prob_round=" << bf16_round;
    return s.str();
  }
};

/// Random inputs of a case: dtype bytes for the device and their exact fp32 widening.
struct Inputs {
  std::vector<uint8_t> keys, values, queries;  // raw dtype bytes
  std::vector<float> keys_f, values_f, queries_f;
};

/// Fills `raw` (dtype bytes) and `widened` (fp32) with `count` N(0, gain^2) values.
void RandomTensor(std::mt19937_64& rng, DType dtype, int64_t count, double gain,
                  std::vector<uint8_t>* raw, std::vector<float>* widened) {
  std::normal_distribution<double> normal(0.0, gain);
  raw->resize(static_cast<size_t>(count) * DTypeSize(dtype));
  widened->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const float x = static_cast<float>(normal(rng));
    if (dtype == DType::kF32) {
      std::memcpy(raw->data() + 4 * i, &x, 4);
      (*widened)[i] = x;
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
      std::memcpy(raw->data() + 2 * i, &bits, 2);
      (*widened)[i] = dtype == DType::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
    }
  }
}

Inputs MakeInputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  RandomTensor(rng, c.dtype, c.h_kv * c.n * c.d, 1.0, &in.keys, &in.keys_f);
  RandomTensor(rng, c.dtype, c.h_kv * c.n * c.d, 1.0, &in.values, &in.values_f);
  RandomTensor(rng, c.dtype, c.h_kv * c.group * c.w * c.d, c.query_gain, &in.queries,
               &in.queries_f);
  return in;
}

CpuLayer MakeCpuLayer(const Case& c, const Inputs& in) {
  CpuLayer layer;
  layer.shape.num_kv_heads = c.h_kv;
  layer.shape.num_tokens = c.n;
  layer.shape.head_dim = c.d;
  layer.shape.num_query_heads = c.h_kv * c.group;
  layer.shape.window_rows = c.w;
  layer.shape.has_values = true;
  layer.shape.has_queries = true;
  layer.keys = F32Tensor::Owning(in.keys_f, {c.h_kv, c.n, c.d});
  layer.values = F32Tensor::Owning(in.values_f, {c.h_kv, c.n, c.d});
  layer.queries = F32Tensor::Owning(in.queries_f, {c.h_kv * c.group, c.w, c.d});
  layer.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  layer.input_dtype = c.dtype;
  return layer;
}

/// The scorer's ResolvedParams, with the specs of kernels/builtin_policies.cc.
ResolvedParams CpuParams(const Case& c) {
  std::vector<ParamSpec> specs;
  std::map<std::string, ParamValue> values;
  switch (c.kind) {
    case Attn::kSnapKV:
      specs = {ParamSpec::Int("window", 32, 1, 4096, ""), ParamSpec::Int("kernel", 7, 1, 1023, ""),
               ParamSpec::Enum("pooling", "max", {"max", "avg"}, "")};
      values = {{"window", ParamValue::Number(c.window)},
                {"kernel", ParamValue::Number(c.kernel)},
                {"pooling", ParamValue::Text(c.max_pool ? "max" : "avg")}};
      break;
    case Attn::kH2O:
      specs = {ParamSpec::Float("recent_fraction", 0, 0, 1, ""),
               ParamSpec::Bool("causal_normalize", false, "")};
      values = {{"causal_normalize", ParamValue::Number(c.causal_normalize ? 1 : 0)}};
      break;
    case Attn::kDropKV:
      specs = {ParamSpec::Int("window", 8, 1, 4096, ""), ParamSpec::Int("kernel", 11, 1, 1023, ""),
               ParamSpec::Enum("pooling", "max", {"max", "avg"}, ""),
               ParamSpec::Float("eps", 1e-6, 0, 1, ""),
               ParamSpec::Enum("bf16_prob_round", "auto", {"auto", "on", "off"}, "")};
      values = {{"window", ParamValue::Number(c.window)},
                {"kernel", ParamValue::Number(c.kernel)},
                {"pooling", ParamValue::Text(c.max_pool ? "max" : "avg")},
                {"bf16_prob_round", ParamValue::Text(c.bf16_round)}};
      break;
    default:
      break;
  }
  absl::StatusOr<ResolvedParams> p = ResolvedParams::Resolve(specs, values, "params");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : ResolvedParams();
}

ScorerParams GpuParams(const Case& c) {
  ScorerParams p;
  p.window = static_cast<int32_t>(c.window);
  p.kernel = static_cast<int32_t>(c.kernel);
  p.pool_max = c.max_pool;
  p.eps = static_cast<float>(1e-6);
  p.bf16_prob_round =
      c.bf16_round == "on" || (c.bf16_round == "auto" && c.dtype == DType::kBF16);
  p.causal_normalize = c.causal_normalize;
  return p;
}

absl::Status CpuScore(const Case& c, const CpuLayer& layer, ThreadPool& pool, float* out) {
  const ResolvedParams params = CpuParams(c);
  switch (c.kind) {
    case Attn::kSnapKV: return ScoreSnapKV(layer, params, pool, out);
    case Attn::kH2O: return ScoreH2O(layer, params, pool, out);
    case Attn::kTova: return ScoreTova(layer, params, pool, out);
    case Attn::kDropKV: return ScoreDropKV(layer, params, pool, out);
    default: return absl::InvalidArgumentError("not an attention scorer");
  }
}

int HostThreads() { return std::max(2u, std::min(16u, std::thread::hardware_concurrency())); }

/// The device copy of a case's inputs.
struct DeviceInputs {
  DeviceBuffer keys, values, queries;
  DeviceLayer layer;
};

void Upload(const Case& c, const Inputs& in, DeviceInputs* dev) {
  ASSERT_TRUE(dev->keys.Allocate(in.keys.size()));
  ASSERT_TRUE(dev->values.Allocate(in.values.size()));
  ASSERT_TRUE(dev->queries.Allocate(in.queries.size()));
  CUDA_OK(cudaMemcpy(dev->keys.get(), in.keys.data(), in.keys.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dev->values.get(), in.values.data(), in.values.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dev->queries.get(), in.queries.data(), in.queries.size(),
                     cudaMemcpyHostToDevice));
  DeviceLayer& l = dev->layer;
  l.keys = dev->keys.get();
  l.values = dev->values.get();
  l.queries = dev->queries.get();
  l.dtype = c.dtype;
  l.num_kv_heads = static_cast<int32_t>(c.h_kv);
  l.num_query_heads = static_cast<int32_t>(c.h_kv * c.group);
  l.window_rows = static_cast<int32_t>(c.w);
  l.head_dim = static_cast<int32_t>(c.d);
  l.num_tokens = c.n;
  l.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
}

/// Runs LaunchScore on the device copy; `gpu` gets the scores [H_kv, n]. The output is
/// poisoned with NaN first so that an unwritten element cannot pass.
void GpuScore(const Case& c, const DeviceInputs& dev, std::vector<float>* gpu) {
  const ScorerParams params = GpuParams(c);
  const size_t count = static_cast<size_t>(c.h_kv * c.n);
  DeviceBuffer scores(count * sizeof(float));
  CUDA_OK(cudaMemset(scores.get(), 0xFF, count * sizeof(float)));  // NaN poison
  const size_t scratch_bytes = ScoreScratchBytes(Traits(c.kind), dev.layer, params);
  DeviceBuffer scratch(scratch_bytes);
  CUDA_OK(cudaMemset(scratch.get(), 0xFF, std::max<size_t>(scratch_bytes, 1)));
  CUDA_OK(LaunchScore(Traits(c.kind), dev.layer, params, scores.as<float>(), scratch.get(),
                      scratch_bytes, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  gpu->assign(count, 0.0f);
  CUDA_OK(cudaMemcpy(gpu->data(), scores.get(), count * sizeof(float), cudaMemcpyDeviceToHost));
}

/// Compares a case: CPU scorer vs LaunchScore, bit for bit.
void CheckCase(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.Describe());
  const Inputs in = MakeInputs(c, seed);
  DeviceInputs dev;
  ASSERT_NO_FATAL_FAILURE(Upload(c, in, &dev));
  std::vector<float> gpu;
  ASSERT_NO_FATAL_FAILURE(GpuScore(c, dev, &gpu));
  ThreadPool pool(HostThreads());
  std::vector<float> cpu(gpu.size(), -1.0f);
  const absl::Status st = CpuScore(c, MakeCpuLayer(c, in), pool, cpu.data());
  ASSERT_TRUE(st.ok()) << st;
  if (std::memcmp(cpu.data(), gpu.data(), cpu.size() * sizeof(float)) != 0) {
    size_t first = 0;
    size_t differing = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (std::memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) {
        if (differing == 0) first = i;
        ++differing;
      }
    }
    uint32_t cb, gb;
    std::memcpy(&cb, &cpu[first], 4);
    std::memcpy(&gb, &gpu[first], 4);
    ADD_FAILURE() << "GPU != CPU for " << c.Describe() << " seed=" << seed << ": " << differing
                  << " of " << cpu.size() << " differ; first at head " << first / c.n
                  << " token " << first % c.n << ": cpu " << cpu[first] << " (0x" << std::hex
                  << cb << ") gpu " << gpu[first] << " (0x" << gb << std::dec << ")";
  }
}

/// The base cases of one scorer over the brief's grid n x d x G (fp32 gets the full grid;
/// f16/bf16 the full grid below n = 40000 and one Llama-like case at 40000).
std::vector<Case> GridCases(Attn kind, DType dtype) {
  std::vector<Case> cases;
  for (int64_t n : {1, 7, 99, 1000, 40000}) {
    for (int64_t d : {64, 128}) {
      for (int64_t g : {1, 4, 8}) {
        if (n == 40000 && dtype != DType::kF32 && !(d == 128 && g == 4)) continue;
        Case c;
        c.kind = kind;
        c.dtype = dtype;
        c.n = n;
        c.d = d;
        c.group = g;
        c.h_kv = n == 40000 ? 4 : 2;
        switch (kind) {
          case Attn::kSnapKV:
            c.w = 32;  // the default observation window
            c.window = n == 7 ? 5 : 32;
            c.kernel = 7;
            c.max_pool = (n + d + g) % 2 == 0;  // both pooling kinds across the grid
            break;
          case Attn::kH2O:
            c.w = n >= 1000 ? 32 : 9;
            c.causal_normalize = g != 4;
            break;
          case Attn::kTova:
            c.w = 3;
            break;
          case Attn::kDropKV:
            c.w = 8;
            c.window = n == 7 ? 3 : 8;
            c.kernel = 11;
            c.max_pool = (n + d + g) % 2 == 1;
            break;
          default:
            break;
        }
        cases.push_back(c);
      }
    }
  }
  return cases;
}

class AttentionParityTest : public ::testing::TestWithParam<std::tuple<Attn, DType>> {};

TEST_P(AttentionParityTest, BitIdenticalToCpuOnTheGrid) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const auto [kind, dtype] = GetParam();
  uint64_t seed = 1000 * static_cast<uint64_t>(kind) + 100 * static_cast<uint64_t>(dtype);
  for (const Case& c : GridCases(kind, dtype)) ASSERT_NO_FATAL_FAILURE(CheckCase(c, ++seed));
}

// Shapes off the grid: w > n (rows at negative positions see nothing), one-token windows,
// odd head dims (tails of the 8-lane dot product), d = 256, kernel 1 and avg pooling,
// segment boundaries (512, 513), bf16 rounding forced on/off, G not a multiple of 8.
TEST_P(AttentionParityTest, BitIdenticalOnEdgeShapes) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const auto [kind, dtype] = GetParam();
  struct Shape {
    int64_t h_kv, group, n, d, w, window, kernel;
  };
  const std::vector<Shape> shapes = {
      {2, 4, 5, 8, 8, 6, 3},     {1, 7, 7, 5, 7, 7, 1},     {3, 3, 512, 80, 4, 4, 5},
      {1, 5, 513, 100, 9, 2, 9}, {2, 2, 1100, 256, 3, 3, 1}, {1, 8, 2000, 13, 16, 16, 21},
      {1, 1, 64, 200, 1, 1, 3},  {2, 6, 3000, 96, 12, 12, 11},
  };
  uint64_t seed = 50000 + 100 * static_cast<uint64_t>(kind) + static_cast<uint64_t>(dtype);
  for (const Shape& s : shapes) {
    for (int variant = 0; variant < 2; ++variant) {
      Case c;
      c.kind = kind;
      c.dtype = dtype;
      c.h_kv = s.h_kv;
      c.group = s.group;
      c.n = s.n;
      c.d = s.d;
      c.w = s.w;
      c.window = s.window;
      c.kernel = s.kernel;
      c.max_pool = variant == 0;
      c.causal_normalize = variant == 1;
      c.bf16_round = variant == 0 ? "on" : "off";
      c.query_gain = variant == 0 ? 2.0 : 6.0;  // 6: peaked rows, p close to 1
      ASSERT_NO_FATAL_FAILURE(CheckCase(c, ++seed));
    }
  }
}

/// Test name of a (scorer, dtype) parameter, e.g. "DropKV_bf16".
std::string ParamName(const ::testing::TestParamInfo<AttentionParityTest::ParamType>& info) {
  return std::string(KindName(std::get<0>(info.param))) + "_" +
         DTypeName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Scorers, AttentionParityTest,
    ::testing::Combine(::testing::Values(Attn::kSnapKV, Attn::kH2O, Attn::kTova,
                                         Attn::kDropKV),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
    ParamName);

TEST(AttentionLaunchTest, RejectsInvalidLaunches) {
  KVTRIM_SKIP_WITHOUT_GPU();
  Case c;
  c.kind = Attn::kDropKV;
  c.h_kv = 1;
  c.group = 2;
  c.n = 50;
  c.d = 16;
  c.w = 4;
  c.window = 4;
  c.kernel = 3;
  const Inputs in = MakeInputs(c, 7);
  DeviceInputs dev;
  ASSERT_NO_FATAL_FAILURE(Upload(c, in, &dev));
  DeviceBuffer scores(50 * sizeof(float));
  const ScorerParams ok = GpuParams(c);
  const size_t bytes = ScoreScratchBytes(Traits(c.kind), dev.layer, ok);
  ASSERT_GT(bytes, 0u);
  DeviceBuffer scratch(bytes);
  auto launch = [&](Attn kind, const DeviceLayer& layer, const ScorerParams& p,
                    size_t scratch_bytes) {
    return LaunchScore(Traits(kind), layer, p, scores.as<float>(), scratch.get(), scratch_bytes,
                       nullptr);
  };
  EXPECT_EQ(launch(c.kind, dev.layer, ok, bytes), cudaSuccess);
  EXPECT_EQ(launch(c.kind, dev.layer, ok, bytes - 1), cudaErrorInvalidValue);
  ScorerParams bad = ok;
  bad.window = 5;  // > w
  EXPECT_EQ(launch(c.kind, dev.layer, bad, bytes), cudaErrorInvalidValue);
  bad = ok;
  bad.kernel = 4;  // even
  EXPECT_EQ(launch(c.kind, dev.layer, bad, bytes), cudaErrorInvalidValue);
  DeviceLayer no_values = dev.layer;
  no_values.values = nullptr;
  EXPECT_EQ(launch(Attn::kDropKV, no_values, ok, bytes), cudaErrorInvalidValue);
  EXPECT_EQ(launch(Attn::kSnapKV, no_values, ok, bytes), cudaSuccess);  // values unused
  DeviceLayer no_queries = dev.layer;
  no_queries.queries = nullptr;
  EXPECT_EQ(launch(Attn::kH2O, no_queries, ok, bytes), cudaErrorInvalidValue);
  DeviceLayer wide = dev.layer;
  wide.head_dim = 512;  // above the GPU attention limit (256)
  EXPECT_EQ(ScoreScratchBytes(Traits(Attn::kSnapKV), wide, ok), 0u);
  EXPECT_EQ(launch(Attn::kSnapKV, wide, ok, bytes), cudaErrorInvalidValue);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---------------------------------------------------------------------------------------
// Output perturbation: GPU (fp64, streamed) vs CPU (fp64, direct), 1e-9 relative.

/// Random ascending kept lists: one per KV head, or one shared list.
void RandomKept(std::mt19937_64& rng, int64_t n, int64_t lists, std::vector<int64_t>* offsets,
                std::vector<int32_t>* kept) {
  offsets->assign(1, 0);
  kept->clear();
  std::uniform_int_distribution<int64_t> size_dist(0, n);
  for (int64_t l = 0; l < lists; ++l) {
    std::vector<int32_t> all(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) all[j] = static_cast<int32_t>(j);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<size_t>(size_dist(rng)));
    std::sort(all.begin(), all.end());
    kept->insert(kept->end(), all.begin(), all.end());
    offsets->push_back(static_cast<int64_t>(kept->size()));
  }
}

TEST(AttentionPerturbationTest, MatchesCpuWithin1e9Relative) {
  KVTRIM_SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t h_kv, group, n, d, w;
    DType dtype;
  };
  const std::vector<Shape> shapes = {
      {1, 1, 1, 64, 1, DType::kF32},     {2, 4, 7, 64, 3, DType::kF32},
      {2, 4, 5, 8, 8, DType::kF32},      {3, 7, 99, 128, 8, DType::kBF16},
      {2, 1, 1000, 128, 32, DType::kF16}, {4, 4, 40000, 128, 8, DType::kF32},
      {1, 8, 3000, 256, 5, DType::kF32}, {2, 3, 777, 13, 6, DType::kBF16},
  };
  std::mt19937_64 rng(4242);
  uint64_t seed = 90000;
  for (const Shape& s : shapes) {
    for (bool shared : {false, true}) {
      Case c;
      c.dtype = s.dtype;
      c.h_kv = s.h_kv;
      c.group = s.group;
      c.n = s.n;
      c.d = s.d;
      c.w = s.w;
      SCOPED_TRACE(c.Describe() + (shared ? " shared list" : " per-head lists"));
      const Inputs in = MakeInputs(c, ++seed);
      DeviceInputs dev;
      ASSERT_NO_FATAL_FAILURE(Upload(c, in, &dev));
      std::vector<int64_t> offsets;
      std::vector<int32_t> kept;
      RandomKept(rng, c.n, shared ? 1 : c.h_kv, &offsets, &kept);
      const int32_t lists = static_cast<int32_t>(offsets.size() - 1);

      ThreadPool pool(HostThreads());
      std::vector<double> cpu(static_cast<size_t>(c.h_kv), -1.0);
      OutputPerturbation(MakeCpuLayer(c, in), offsets, kept, pool, cpu.data());

      DeviceBuffer d_offsets(offsets.size() * sizeof(int64_t));
      DeviceBuffer d_kept(std::max<size_t>(kept.size(), 1) * sizeof(int32_t));
      DeviceBuffer d_out(static_cast<size_t>(c.h_kv) * sizeof(double));
      CUDA_OK(cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * sizeof(int64_t),
                         cudaMemcpyHostToDevice));
      if (!kept.empty()) {
        CUDA_OK(cudaMemcpy(d_kept.get(), kept.data(), kept.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
      }
      CUDA_OK(cudaMemset(d_out.get(), 0xFF, static_cast<size_t>(c.h_kv) * sizeof(double)));
      const size_t bytes = PerturbationScratchBytes(dev.layer);
      ASSERT_GT(bytes, 0u);
      DeviceBuffer scratch(bytes);
      CUDA_OK(cudaMemset(scratch.get(), 0xFF, bytes));
      CUDA_OK(LaunchPerturbation(dev.layer, d_offsets.as<int64_t>(), lists, d_kept.as<int32_t>(),
                                 d_out.as<double>(), scratch.get(), bytes, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<double> gpu(static_cast<size_t>(c.h_kv));
      CUDA_OK(cudaMemcpy(gpu.data(), d_out.get(), gpu.size() * sizeof(double),
                         cudaMemcpyDeviceToHost));
      for (int64_t h = 0; h < c.h_kv; ++h) {
        const double tol = 1e-9 * std::max(std::abs(cpu[h]), 1e-12);
        EXPECT_NEAR(gpu[h], cpu[h], tol) << "head " << h;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Llama-3.1-8B-like layer (H_kv = 8, G = 4, d = 128, w = 32, n = 32768): parity plus the
// median times (CUDA events, 10 runs after a warm-up) of LaunchScore and of its stages
// (stats = segment partials + row combine, scores, pooling), printed as a table.

/// Median milliseconds of `fn` (which enqueues work on the default stream) over 10 runs.
template <typename Fn>
float MedianMs(Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int it = 0; it < 11; ++it) {
    cudaEventRecord(start);
    const cudaError_t err = fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (it > 0) ms.push_back(t);  // the first run is the warm-up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

TEST(AttentionTimingTest, Llama32KParityAndTimings) {
  KVTRIM_SKIP_WITHOUT_GPU();
  std::vector<std::string> lines;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (Attn kind :
         {Attn::kSnapKV, Attn::kH2O, Attn::kTova, Attn::kDropKV}) {
      Case c;
      c.kind = kind;
      c.dtype = dtype;
      c.h_kv = 8;
      c.group = 4;
      c.n = 32768;
      c.d = 128;
      c.w = 32;
      c.window = kind == Attn::kDropKV ? 8 : 32;
      c.kernel = kind == Attn::kDropKV ? 11 : 7;
      SCOPED_TRACE(c.Describe());
      const Inputs in = MakeInputs(c, 777 + static_cast<uint64_t>(kind));
      DeviceInputs dev;
      ASSERT_NO_FATAL_FAILURE(Upload(c, in, &dev));
      const ScorerParams params = GpuParams(c);
      const size_t count = static_cast<size_t>(c.h_kv * c.n);
      DeviceBuffer scores(count * sizeof(float));
      const size_t bytes = ScoreScratchBytes(Traits(kind), dev.layer, params);
      DeviceBuffer scratch(bytes);
      attn::AttentionPlan plan;
      CUDA_OK(attn::MakeAttentionPlan(Traits(kind), dev.layer, params, &plan));
      float* pre = plan.pooled ? reinterpret_cast<float*>(scratch.as<char>() + plan.pre_pool_offset)
                               : scores.as<float>();
      const float total = MedianMs([&] {
        return LaunchScore(Traits(kind), dev.layer, params, scores.as<float>(), scratch.get(),
                           bytes, nullptr);
      });
      const float stats =
          MedianMs([&] { return attn::LaunchAttentionStats(plan, dev.layer, scratch.get(), nullptr); });
      const float score = MedianMs([&] {
        return attn::LaunchAttentionScores(plan, dev.layer, params, scratch.get(), pre, nullptr);
      });
      // The pooling stage of LaunchScore: SnapKV pools the prefix and fills the window.
      const float pool = plan.pooled ? MedianMs([&] {
        if (kind == Attn::kSnapKV) {
          return LaunchPoolPrefix(pre, plan.num_kv_heads, plan.num_tokens, c.n - c.window,
                                  params.kernel, params.pool_max, scores.as<float>(), nullptr);
        }
        return LaunchPool1D(pre, plan.num_kv_heads, plan.num_tokens, params.kernel,
                            params.pool_max, scores.as<float>(), nullptr);
      })
                                     : 0.0f;
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<float> gpu(count);
      CUDA_OK(cudaMemcpy(gpu.data(), scores.get(), count * sizeof(float), cudaMemcpyDeviceToHost));
      ThreadPool pool_threads(HostThreads());
      std::vector<float> cpu(count);
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(CpuScore(c, MakeCpuLayer(c, in), pool_threads, cpu.data()).ok());
      const double cpu_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), count * sizeof(float)), 0);
      char line[256];
      std::snprintf(line, sizeof line,
                    "%-7s %-5s total %7.3f ms = stats %7.3f + scores %7.3f + pool %6.3f | cpu %8.1f "
                    "ms (%d thr) | scratch %9zu B",
                    c.Describe().substr(0, c.Describe().find(' ')).c_str(), DTypeName(dtype), total,
                    stats, score, pool, cpu_ms, HostThreads(), bytes);
      lines.push_back(line);
    }
  }
  // The perturbation statistic on the same shape (all 32 rows, 20% kept per head).
  {
    Case c;
    c.h_kv = 8;
    c.group = 4;
    c.n = 32768;
    c.d = 128;
    c.w = 32;
    const Inputs in = MakeInputs(c, 4711);
    DeviceInputs dev;
    ASSERT_NO_FATAL_FAILURE(Upload(c, in, &dev));
    std::vector<int64_t> offsets(1, 0);
    std::vector<int32_t> kept;
    for (int64_t h = 0; h < c.h_kv; ++h) {
      for (int64_t j = h % 5; j < c.n; j += 5) kept.push_back(static_cast<int32_t>(j));
      offsets.push_back(static_cast<int64_t>(kept.size()));
    }
    DeviceBuffer d_offsets(offsets.size() * sizeof(int64_t));
    DeviceBuffer d_kept(kept.size() * sizeof(int32_t));
    DeviceBuffer d_out(static_cast<size_t>(c.h_kv) * sizeof(double));
    CUDA_OK(cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * sizeof(int64_t),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_kept.get(), kept.data(), kept.size() * sizeof(int32_t),
                       cudaMemcpyHostToDevice));
    const size_t bytes = PerturbationScratchBytes(dev.layer);
    DeviceBuffer scratch(bytes);
    const float ms = MedianMs([&] {
      return LaunchPerturbation(dev.layer, d_offsets.as<int64_t>(), static_cast<int32_t>(c.h_kv),
                                d_kept.as<int32_t>(), d_out.as<double>(), scratch.get(), bytes,
                                nullptr);
    });
    std::vector<double> gpu(static_cast<size_t>(c.h_kv));
    CUDA_OK(cudaMemcpy(gpu.data(), d_out.get(), gpu.size() * sizeof(double),
                       cudaMemcpyDeviceToHost));
    ThreadPool pool(HostThreads());
    std::vector<double> cpu(static_cast<size_t>(c.h_kv));
    const auto t0 = std::chrono::steady_clock::now();
    OutputPerturbation(MakeCpuLayer(c, in), offsets, kept, pool, cpu.data());
    const double cpu_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (int64_t h = 0; h < c.h_kv; ++h) {
      EXPECT_NEAR(gpu[h], cpu[h], 1e-9 * std::abs(cpu[h])) << "head " << h;
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "perturb f32   total %7.3f ms | cpu %8.1f ms | scratch %9zu B | head0 %.6f",
                  ms, cpu_ms, bytes, gpu[0]);
    lines.push_back(line);
  }
  std::printf("\n[attention timings] H_kv=8 G=4 d=128 w=32 n=32768 (dropkv window 8)\n");
  for (const std::string& l : lines) std::printf("%s\n", l.c_str());
}

}  // namespace
}  // namespace kvtrim::gpu

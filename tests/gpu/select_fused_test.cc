// LaunchProtectSelectTopK (kernels/gpu/kernels/select_fused.cu) against the CPU, bit for bit: the
// first NaN of the raw scores (flat index, as CpuBackend checks them), then ApplyProtection
// and SelectTopK per head (offsets and every kept index). Sizes n in {1, 2, 7, 99, 1000, 5000,
// 8193, 20000, 40000, 65537, 131073} (one, two, three, five and eight CTAs per head; one batch of 8
// keys per lane up to 4096 tokens per CTA, batches of 16 above), H in {1, 3, 8}; scores with
// many exact ties (a handful of values, -0.0 and +0.0, subnormals, +inf and -inf), smooth
// ones, ones a few ULPs apart (the low digits decide) and constant ones; counts 0, 1, k, n and
// out of range; protection none, clamped by rule 3 (also larger than the requested k) and
// unclamped. Rows beyond the shared memory (n = 2^20 + 3) take the global-memory passes. Rows built
// around one 12-bit key bin take each way the kernel resolves the low 20 bits: the list of
// matching keys exchanged across the cluster (up to 4096 of them, at the limit and one past
// it, spread over the CTAs or in one), cluster rounds first when the bin holds most of the
// row (one round then the list, two rounds, two rounds of ties), and the last <= 32 keys
// ranked by every warp (exactly 32, 33 with two values, 20 ties). Outputs are poisoned before
// every launch. A failure prints the case.
//
// Sanitizer cases: SelectFusedErrors.* and SelectFusedSanitizer.* (small shapes, one to five
// CTAs per head, a NaN, each resolution path); SelectFusedSanitizer.ClusterOfThreeWithNaN
// alone is racecheck's. SelectFusedTiming prints the fused launch against the three launchers
// it replaces at n = 4096, 32768 and 131072, H = 8.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/budget.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/decide/protection.h"
#include "kernels/decide/select.h"
#include "kernels/gpu/runtime/device_arena.h"
#include "kernels/gpu/kernels/device_nan_probe.h"
#include "kernels/gpu/kernels/launchers.h"
#include "tests/gpu/device_test_util.h"
#include "tests/gpu/test_device.h"

namespace kvtrim::gpu::testing {
namespace {

/// Fails the current test (fatally) when a CUDA call does not return cudaSuccess.
#define KVTRIM_FUSED_OK(expr)                                                         \
  do {                                                                                \
    const cudaError_t fused_err = (expr);                                             \
    ASSERT_EQ(fused_err, cudaSuccess) << #expr << ": " << cudaGetErrorName(fused_err); \
  } while (0)

// ---- Inputs -------------------------------------------------------------------------------

/// Score tensors of the tests.
enum class Scores { kTied, kSmooth, kUlps, kConstant };

/// The name of `s` in failure messages.
const char* Name(Scores s) {
  static const char* const kNames[] = {"tied", "smooth", "ulps", "constant"};
  return kNames[static_cast<int>(s)];
}

/// A float from its bits.
float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// Raw scores [H, n]. kTied: 5% +inf, 5% -inf, else one of twelve values (+-0.5, +-0.25,
/// -0.0, +0.0, the smallest subnormals, a mid subnormal, FLT_MIN, 1); kSmooth: normal with 1%
/// +inf; kUlps: 1.0f plus 0..2999 ULPs (keys share their top bits); kConstant: 0.75.
std::vector<float> MakeRaw(Scores kind, int64_t heads, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float levels[] = {-0.5f, -0.25f, -0.0f, 0.0f, 0.25f, 0.5f,
                          FromBits(0x00000001u), FromBits(0x80000001u), FromBits(0x00012345u),
                          FromBits(0x00800000u), 1.0f, FromBits(0x80000002u)};
  std::vector<float> out(static_cast<size_t>(heads * n));
  for (float& x : out) {
    switch (kind) {
      case Scores::kTied: {
        const uint64_t r = rng() % 20;
        x = r == 0 ? INFINITY : r == 1 ? -INFINITY : levels[rng() % 12];
        break;
      }
      case Scores::kSmooth:
        x = rng() % 100 == 0 ? INFINITY : normal(rng);
        break;
      case Scores::kUlps:
        x = FromBits(0x3F800000u + static_cast<uint32_t>(rng() % 3000));
        break;
      case Scores::kConstant:
        x = 0.75f;
        break;
    }
  }
  return out;
}

/// One row of n scores whose 12-bit key bin of 1.0f holds `m` tokens, placed at random among
/// the tokens [lo, hi): 1.0f plus fewer than `spread` ULPs (below 2^20: the keys share their
/// top 12 bits, and more of their low bits the smaller `spread`). `above` other tokens score
/// 4 and more (ranked before the bin), the rest -1 and less.
std::vector<float> MakeBinRow(int64_t n, int64_t m, int64_t above, uint32_t spread, int64_t lo,
                              int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> pos;
  for (int64_t j = lo; j < hi; ++j) pos.push_back(j);
  std::shuffle(pos.begin(), pos.end(), rng);
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<char> in_bin(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < m; ++i) {
    row[pos[i]] = FromBits(0x3F800000u + static_cast<uint32_t>(rng() % spread));
    in_bin[pos[i]] = 1;
  }
  std::vector<int64_t> rest;
  for (int64_t j = 0; j < n; ++j) {
    if (!in_bin[j]) rest.push_back(j);
  }
  std::shuffle(rest.begin(), rest.end(), rng);
  for (size_t i = 0; i < rest.size(); ++i) {
    const float offset = static_cast<float>(rng() % 1000);
    row[rest[i]] = static_cast<int64_t>(i) < above ? 4.0f + offset : -1.0f - offset;
  }
  return row;
}

/// Per-head counts: 0, 1, k, n, n + 5 (clamped to n), -3 (clamped to 0), a random one and
/// k again, rotated by `round`.
std::vector<int64_t> MakeCounts(int64_t heads, int64_t n, int64_t k, int round, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t pattern[] = {0, 1, k, n, n + 5, -3, static_cast<int64_t>(rng() % (n + 1)), k};
  std::vector<int64_t> counts(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) counts[h] = pattern[(h + round) % 8];
  if (heads == 1) counts[0] = round % 2 == 0 ? k : pattern[round % 8];
  return counts;
}

// ---- Reference and launch -----------------------------------------------------------------

/// One layer's answer: CSR lists and the first NaN's flat index.
struct Answer {
  std::vector<int64_t> offsets;  // [H + 1]
  std::vector<int32_t> indices;  // [offsets[H]]
  unsigned long long first_nan = kNoNaN;
};

/// The CPU backend's steps: the NaN check of the raw scores, ApplyProtection, SelectTopK.
Answer CpuAnswer(const std::vector<float>& raw, int64_t heads, int64_t n, Protection p,
                 const std::vector<int64_t>& counts) {
  Answer a;
  for (size_t i = 0; i < raw.size() && a.first_nan == kNoNaN; ++i) {
    if (std::isnan(raw[i])) a.first_nan = i;
  }
  std::vector<float> scores = raw;
  ApplyProtection(p, heads, n, scores.data());
  a.offsets.push_back(0);
  for (int64_t h = 0; h < heads; ++h) {
    SelectTopK(scores.data() + h * n, n, counts[h], &a.indices);
    a.offsets.push_back(static_cast<int64_t>(a.indices.size()));
  }
  return a;
}

/// The launch's regions in one device allocation: raw scores [H, n] fp32, counts [H] int64,
/// offsets [H + 1] int64, indices [capacity] int32 and the first-NaN slot.
class LaunchRegions {
 public:
  LaunchRegions(int64_t heads, int64_t n, int64_t capacity) {
    ArenaLayout layout;
    scores_ = layout.Add(static_cast<size_t>(heads * n) * sizeof(float));
    counts_ = layout.Add(static_cast<size_t>(heads) * sizeof(int64_t));
    offsets_ = layout.Add(static_cast<size_t>(heads + 1) * sizeof(int64_t));
    indices_ = layout.Add(static_cast<size_t>(std::max<int64_t>(capacity, 1)) * sizeof(int32_t));
    nan_ = layout.Add(sizeof(unsigned long long));
    status_ = cudaMalloc(&base_, layout.total());
  }
  ~LaunchRegions() {
    if (base_ != nullptr) cudaFree(base_);
  }
  LaunchRegions(const LaunchRegions&) = delete;
  LaunchRegions& operator=(const LaunchRegions&) = delete;

  cudaError_t status() const { return status_; }
  float* scores() const { return At<float>(scores_); }
  int64_t* counts() const { return At<int64_t>(counts_); }
  int64_t* offsets() const { return At<int64_t>(offsets_); }
  int32_t* indices() const { return At<int32_t>(indices_); }
  unsigned long long* first_nan() const { return At<unsigned long long>(nan_); }

 private:
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }
  void* base_ = nullptr;
  cudaError_t status_ = cudaSuccess;
  size_t scores_ = 0, counts_ = 0, offsets_ = 0, indices_ = 0, nan_ = 0;
};

/// Copies host `values` to `device`.
template <typename T>
cudaError_t ToDevice(T* device, const std::vector<T>& values) {
  return cudaMemcpy(device, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice);
}

/// Copies `count` elements from `device` into a host vector.
template <typename T>
cudaError_t ToHost(const T* device, size_t count, std::vector<T>* values) {
  values->resize(count);
  return cudaMemcpy(values->data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
}

/// Runs LaunchProtectSelectTopK on `raw` with poisoned outputs and the NaN slot at kNoNaN;
/// `capacity` indices are read back.
void GpuAnswer(const std::vector<float>& raw, int64_t heads, int64_t n, Protection p,
               const std::vector<int64_t>& counts, int64_t capacity, Answer* out) {
  LaunchRegions r(heads, n, capacity);
  KVTRIM_FUSED_OK(r.status());
  KVTRIM_FUSED_OK(ToDevice(r.scores(), raw));
  KVTRIM_FUSED_OK(ToDevice(r.counts(), counts));
  KVTRIM_FUSED_OK(cudaMemset(r.offsets(), 0xA5, static_cast<size_t>(heads + 1) * sizeof(int64_t)));
  KVTRIM_FUSED_OK(cudaMemset(r.indices(), 0xFF, static_cast<size_t>(capacity) * sizeof(int32_t)));
  KVTRIM_FUSED_OK(cudaMemset(r.first_nan(), 0xFF, sizeof(unsigned long long)));
  const size_t scratch = ProtectSelectTopKScratchBytes(static_cast<int32_t>(heads), n);
  ASSERT_EQ(scratch, 0u);
  KVTRIM_FUSED_OK(LaunchProtectSelectTopK(r.scores(), static_cast<int32_t>(heads), n, p.sink,
                                          p.recent, r.counts(), r.offsets(), r.indices(),
                                          r.first_nan(), nullptr, 0, nullptr));
  KVTRIM_FUSED_OK(cudaDeviceSynchronize());
  KVTRIM_FUSED_OK(ToHost(r.offsets(), static_cast<size_t>(heads + 1), &out->offsets));
  KVTRIM_FUSED_OK(ToHost(r.indices(), static_cast<size_t>(capacity), &out->indices));
  std::vector<unsigned long long> nan;
  KVTRIM_FUSED_OK(ToHost(r.first_nan(), 1, &nan));
  out->first_nan = nan[0];
}

/// "" when the answers are identical, else where they first differ.
std::string Difference(const Answer& cpu, const Answer& gpu) {
  std::ostringstream out;
  if (cpu.first_nan != gpu.first_nan) {
    out << "first NaN: cpu " << cpu.first_nan << ", gpu " << gpu.first_nan;
    return out.str();
  }
  if (cpu.offsets != gpu.offsets) {
    for (size_t h = 0; h < cpu.offsets.size() && h < gpu.offsets.size(); ++h) {
      if (cpu.offsets[h] != gpu.offsets[h]) {
        out << "offsets[" << h << "]: cpu " << cpu.offsets[h] << ", gpu " << gpu.offsets[h];
        return out.str();
      }
    }
    return "offsets differ in size";
  }
  for (size_t h = 0; h + 1 < cpu.offsets.size(); ++h) {
    for (int64_t i = cpu.offsets[h]; i < cpu.offsets[h + 1]; ++i) {
      if (cpu.indices[i] != gpu.indices[i]) {
        out << "head " << h << " position " << i - cpu.offsets[h] << " of "
            << cpu.offsets[h + 1] - cpu.offsets[h] << ": cpu " << cpu.indices[i] << ", gpu "
            << gpu.indices[i];
        return out.str();
      }
    }
  }
  return "";
}

/// Describes a case for failure messages.
std::string Label(Scores kind, int64_t heads, int64_t n, Protection p,
                  const std::vector<int64_t>& counts) {
  std::ostringstream out;
  out << Name(kind) << " H=" << heads << " n=" << n << " sink=" << p.sink
      << " recent=" << p.recent << " counts={";
  for (size_t h = 0; h < counts.size(); ++h) out << (h ? "," : "") << counts[h];
  out << "}";
  return out.str();
}

/// Compares the launch with the CPU on `raw`.
void ExpectSameAnswer(const std::vector<float>& raw, Scores kind, int64_t heads, int64_t n,
                      Protection p, const std::vector<int64_t>& counts) {
  const Answer cpu = CpuAnswer(raw, heads, n, p, counts);
  Answer gpu;
  GpuAnswer(raw, heads, n, p, counts, cpu.offsets.back(), &gpu);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string diff = Difference(cpu, gpu);
  ASSERT_TRUE(diff.empty()) << Label(kind, heads, n, p, counts) << ": " << diff;
}

/// Protection of round `round` for a requested per-head budget k: none, rule 3 on (4, 16),
/// rule 3 on (64, 128) (more than k when k is small), and unclamped (n / 3, n / 2).
Protection RoundProtection(int round, int64_t k, int64_t n) {
  switch (round % 4) {
    case 0:
      return Protection{0, 0};
    case 1:
      return ClampProtection(Protection{4, 16}, k, n);
    case 2:
      return ClampProtection(Protection{64, 128}, k, n);
    default:
      return Protection{n / 3, n / 2};
  }
}

// ---- Parity -------------------------------------------------------------------------------

TEST(SelectFusedParity, EqualsCpuProtectionAndTopK) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 2, 7, 99, 1000, 5000, 8193, 20000, 40000, 65537, 131073}) {
    for (int64_t heads : {1, 3, 8}) {
      for (Scores kind : {Scores::kTied, Scores::kSmooth, Scores::kUlps, Scores::kConstant}) {
        const uint64_t seed = static_cast<uint64_t>(n * 131 + heads * 7) + static_cast<int>(kind);
        const std::vector<float> raw = MakeRaw(kind, heads, n, seed);
        const int64_t k = std::max<int64_t>(1, (3 * n) / 10);
        for (int round = 0; round < 4; ++round) {
          const std::vector<int64_t> counts = MakeCounts(heads, n, k, round, seed + round);
          ExpectSameAnswer(raw, kind, heads, n, RoundProtection(round, k, n), counts);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(SelectFusedParity, LargeRowsReadTheScoresFromGlobalMemory) {
  KVTRIM_SKIP_WITHOUT_GPU();
  // 327680 = 8 CTAs x 40960 keys: the last size whose keys stay in shared memory.
  struct Shape {
    int64_t heads, n;
  };
  for (const Shape s : {Shape{1, 327680}, Shape{1, 327681}, Shape{2, (int64_t{1} << 20) + 3}}) {
    for (Scores kind : {Scores::kTied, Scores::kSmooth}) {
      const std::vector<float> raw = MakeRaw(kind, s.heads, s.n, 77 + s.n);
      std::vector<int64_t> counts(static_cast<size_t>(s.heads));
      for (int64_t h = 0; h < s.heads; ++h) counts[h] = (s.n * (h + 1)) / 5 + 1;
      ExpectSameAnswer(raw, kind, s.heads, s.n, Protection{4, 64}, counts);
      if (HasFatalFailure()) return;
    }
  }
}

/// A row of MakeBinRow: n tokens, m of them in the bin among [lo, hi), `above` above it.
struct BinCase {
  const char* what;
  int64_t n, m, above;
  uint32_t spread;
  int64_t lo, hi;
};

/// Checks `c` with k just above, inside (first, middle, last but one, last) the bin, or (not
/// every_k) in its middle only.
void ExpectBinCase(const BinCase& c, bool every_k = true) {
  const std::vector<float> raw = MakeBinRow(c.n, c.m, c.above, c.spread, c.lo, c.hi, c.n + 3 * c.m);
  for (int64_t k : {c.above, c.above + 1, c.above + c.m / 2, c.above + c.m - 1, c.above + c.m}) {
    if (k < 1 || k > c.n || (!every_k && k != c.above + c.m / 2)) continue;
    const Answer cpu = CpuAnswer(raw, 1, c.n, Protection{0, 0}, {k});
    Answer gpu;
    GpuAnswer(raw, 1, c.n, Protection{0, 0}, {k}, cpu.offsets.back(), &gpu);
    if (::testing::Test::HasFatalFailure()) return;
    const std::string diff = Difference(cpu, gpu);
    ASSERT_TRUE(diff.empty()) << c.what << " n=" << c.n << " k=" << k << ": " << diff;
  }
}

TEST(SelectFusedParity, EveryResolutionOfTheLowBits) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const BinCase cases[] = {
      {"4095 in the bin", 32768, 4095, 2000, 1u << 20, 0, 32768},
      {"4096 in the bin (the list's capacity)", 32768, 4096, 2000, 1u << 20, 0, 32768},
      {"4097 in the bin (a cluster round first)", 32768, 4097, 2000, 1u << 20, 0, 32768},
      {"4096 in the third CTA", 32768, 4096, 100, 1u << 20, 16384, 24576},
      {"4096 over 8 CTAs of 16384 tokens", 131072, 4096, 2000, 1u << 20, 0, 131072},
      {"4097 over 8 CTAs of 16384 tokens (a cluster round first)", 131072, 4097, 2000,
       1u << 20, 0, 131072},
      {"4096 in the last of 8 CTAs of 16384 tokens", 131072, 4096, 100, 1u << 20, 114688,
       131072},
      {"4096 in the first CTA, 64 values", 32768, 4096, 100, 64, 0, 8192},
      {"4097 in the last CTA", 32768, 4097, 10, 1u << 20, 24576, 32768},
      {"most of the row, 2^20 values (a round, then the list)", 40000, 36000, 1000, 1u << 20, 0,
       40000},
      {"most of the row, 1024 values (two rounds)", 40000, 36000, 1000, 1024, 0, 40000},
      {"most of the row, 3 values (two rounds of ties)", 40000, 36000, 1000, 3, 0, 40000},
      {"the whole row, 5000 values", 9000, 9000, 0, 5000, 0, 9000},
      {"32 in the bin (ranked by every warp)", 20000, 32, 700, 1u << 20, 0, 20000},
      {"33 in the bin, 2 values", 20000, 33, 700, 2, 0, 20000},
      {"20 ties in the bin", 20000, 20, 5000, 1, 0, 20000},
      {"40 in the bin, 8 values, 131072 tokens", 131072, 40, 13000, 8, 0, 131072},
  };
  for (const BinCase& c : cases) {
    ExpectBinCase(c);
    if (HasFatalFailure()) return;
  }
}

// ---- NaN ----------------------------------------------------------------------------------

/// Puts NaN (positive quiet, or negative with a payload when `negative`) at (head, token).
void PutNaN(std::vector<float>* raw, int64_t n, int64_t head, int64_t token, bool negative) {
  (*raw)[static_cast<size_t>(head * n + token)] =
      negative ? FromBits(0xFFC00001u) : std::numeric_limits<float>::quiet_NaN();
}

/// Checks the first NaN against the CPU; the lists must still be in bounds and ascending, and
/// the offsets those of the clamped counts.
void ExpectFirstNaN(const std::vector<float>& raw, int64_t heads, int64_t n, Protection p,
                    const std::vector<int64_t>& counts, const std::string& label) {
  const Answer cpu = CpuAnswer(raw, heads, n, p, counts);
  ASSERT_NE(cpu.first_nan, kNoNaN) << label;
  Answer gpu;
  GpuAnswer(raw, heads, n, p, counts, cpu.offsets.back(), &gpu);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(gpu.first_nan, cpu.first_nan) << label;
  ASSERT_EQ(gpu.offsets, cpu.offsets) << label;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = gpu.offsets[h]; i < gpu.offsets[h + 1]; ++i) {
      ASSERT_TRUE(gpu.indices[i] >= 0 && gpu.indices[i] < n) << label << " head " << h;
      if (i > gpu.offsets[h]) {
        ASSERT_LT(gpu.indices[i - 1], gpu.indices[i]) << label;
      }
    }
  }
}

TEST(SelectFusedNaN, ReportsTheFirstRawNaNOfTheLayer) {
  KVTRIM_SKIP_WITHOUT_GPU();
  struct Spot {
    int64_t head, token;
    bool negative;
  };
  struct Case {
    const char* what;
    int64_t heads, n;
    std::vector<Spot> nans;
    std::vector<int64_t> counts;
  };
  const std::vector<Case> cases = {
      {"lowest of three", 3, 40000, {{2, 3, false}, {1, 39999, true}, {1, 17, false}}, {4000, 4000, 4000}},
      {"in the sink", 3, 40000, {{0, 2, false}, {2, 100, false}}, {4000, 4000, 4000}},
      {"last token, recent", 8, 131073, {{7, 131072, false}}, std::vector<int64_t>(8, 13107)},
      {"negative NaN, last CTA", 3, 20000, {{2, 19999, true}, {2, 14000, true}}, {0, 20000, 900}},
      {"heads keeping 0 and n", 2, 99, {{1, 50, false}, {0, 98, true}}, {0, 99}},
      {"one token", 1, 1, {{0, 0, false}}, {1}},
  };
  for (const Case& c : cases) {
    std::vector<float> raw = MakeRaw(Scores::kSmooth, c.heads, c.n, 5 + c.n);
    for (const Spot& s : c.nans) PutNaN(&raw, c.n, s.head, s.token, s.negative);
    ExpectFirstNaN(raw, c.heads, c.n, Protection{4, 16}, c.counts, c.what);
    if (HasFatalFailure()) return;
  }
  // Every score NaN.
  const std::vector<float> all(3 * 5000, std::numeric_limits<float>::quiet_NaN());
  ExpectFirstNaN(all, 3, 5000, Protection{4, 16}, {1, 2500, 5000}, "all NaN");
}

// ---- Edges, errors and the sanitizer cases ------------------------------------------------

TEST(SelectFusedErrors, EmptyShapesAndInvalidArguments) {
  KVTRIM_SKIP_WITHOUT_GPU();
  LaunchRegions r(3, 16, 48);
  KVTRIM_FUSED_OK(r.status());
  KVTRIM_FUSED_OK(ToDevice(r.counts(), std::vector<int64_t>{5, 0, 2}));
  const std::vector<unsigned long long> marker = {12345};
  KVTRIM_FUSED_OK(ToDevice(r.first_nan(), marker));
  // H = 0 writes offsets[0]; n = 0 writes zero offsets and leaves the NaN slot alone.
  for (int32_t heads : {0, 3}) {
    KVTRIM_FUSED_OK(cudaMemset(r.offsets(), 0x5A, 4 * sizeof(int64_t)));
    KVTRIM_FUSED_OK(LaunchProtectSelectTopK(nullptr, heads, 0, 4, 16, heads ? r.counts() : nullptr,
                                            r.offsets(), nullptr, nullptr, nullptr, 0, nullptr));
    KVTRIM_FUSED_OK(cudaDeviceSynchronize());
    std::vector<int64_t> offsets;
    KVTRIM_FUSED_OK(ToHost(r.offsets(), 4, &offsets));
    for (int32_t h = 0; h <= heads; ++h) EXPECT_EQ(offsets[h], 0) << "H=" << heads << " offset " << h;
  }
  std::vector<unsigned long long> nan;
  KVTRIM_FUSED_OK(ToHost(r.first_nan(), 1, &nan));
  EXPECT_EQ(nan[0], 12345u);

  // Invalid arguments: nothing is launched.
  const float* s = r.scores();
  int64_t* c = r.counts();
  int64_t* o = r.offsets();
  int32_t* i = r.indices();
  unsigned long long* f = r.first_nan();
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, 16, 0, 0, c, nullptr, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, 16, 0, 0, nullptr, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(nullptr, 3, 16, 0, 0, c, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, 16, 0, 0, c, o, nullptr, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, 16, 0, 0, c, o, i, nullptr, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, -1, 16, 0, 0, c, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 65536, 16, 0, 0, c, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, -1, 0, 0, c, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchProtectSelectTopK(s, 3, int64_t{1} << 31, 0, 0, c, o, i, f, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // The scratch query is 0 for every shape: no scratch is never too little.
  EXPECT_EQ(ProtectSelectTopKScratchBytes(8, 131072), 0u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  // Protection larger than n and every count clamped: all tokens, in order.
  std::vector<float> raw = MakeRaw(Scores::kTied, 3, 16, 3);
  const std::vector<int64_t> counts = {16, 40, -2};
  ExpectSameAnswer(raw, Scores::kTied, 3, 16, Protection{20, 30}, counts);
}

TEST(SelectFusedSanitizer, SmallShapesMatchTheCpu) {
  KVTRIM_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 99, 8193, 17000}) {
    for (int64_t heads : {1, 3}) {
      for (Scores kind : {Scores::kTied, Scores::kSmooth}) {
        const std::vector<float> raw = MakeRaw(kind, heads, n, 11 * n + heads);
        const int64_t k = std::max<int64_t>(1, n / 4);
        const std::vector<int64_t> counts = MakeCounts(heads, n, k, 1, n);
        ExpectSameAnswer(raw, kind, heads, n, ClampProtection(Protection{4, 16}, k, n), counts);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(SelectFusedSanitizer, ClusterOfThreeWithNaN) {
  KVTRIM_SKIP_WITHOUT_GPU();
  // Three CTAs per head, the low bits resolved from the exchanged list; then a NaN in head 1.
  std::vector<float> raw = MakeRaw(Scores::kTied, 3, 12000, 9);
  const std::vector<int64_t> counts = {1700, 8500, 0};
  ExpectSameAnswer(raw, Scores::kTied, 3, 12000, Protection{4, 16}, counts);
  if (HasFatalFailure()) return;
  PutNaN(&raw, 12000, 1, 9000, false);
  ExpectFirstNaN(raw, 3, 12000, Protection{4, 16}, counts, "sanitizer NaN");
  if (HasFatalFailure()) return;
  // The other resolutions of the low bits: a cluster round then the list, two cluster
  // rounds, and a small set ranked by every warp.
  for (const BinCase& c : {BinCase{"round, then list", 12000, 6000, 500, 1u << 20, 0, 12000},
                           BinCase{"two rounds", 12000, 9000, 500, 4, 0, 12000},
                           BinCase{"small set", 12000, 25, 3000, 6, 0, 12000}}) {
    ExpectBinCase(c, /*every_k=*/false);
    if (HasFatalFailure()) return;
  }
}

// ---- Timing -------------------------------------------------------------------------------

TEST(SelectFusedTiming, AgainstProbeProtectionAndTopK) {
  KVTRIM_SKIP_WITHOUT_GPU();
  const int32_t heads = 8;
  for (int64_t n : {int64_t{4096}, int64_t{32768}, int64_t{131072}}) {
    const int64_t k = n / 10;
    const std::vector<float> raw = MakeRaw(Scores::kSmooth, heads, n, 42);
    LaunchRegions r(heads, n, heads * k);
    KVTRIM_FUSED_OK(r.status());
    KVTRIM_FUSED_OK(ToDevice(r.scores(), raw));
    KVTRIM_FUSED_OK(ToDevice(r.counts(), std::vector<int64_t>(heads, k)));
    KVTRIM_FUSED_OK(cudaMemset(r.first_nan(), 0xFF, sizeof(unsigned long long)));
    const size_t select_bytes = SelectScratchBytes(heads, n);
    void* scratch = nullptr;
    KVTRIM_FUSED_OK(cudaMalloc(&scratch, select_bytes));
    const double fused = MedianLaunchMicros(50, [&] {
      return LaunchProtectSelectTopK(r.scores(), heads, n, 4, 64, r.counts(), r.offsets(),
                                     r.indices(), r.first_nan(), nullptr, 0, nullptr);
    });
    const double separate = MedianLaunchMicros(50, [&] {
      cudaError_t e = LaunchFindFirstNaN(r.scores(), heads * n, r.first_nan(), nullptr);
      if (e == cudaSuccess) e = LaunchApplyProtection(r.scores(), heads, n, 4, 64, nullptr);
      if (e != cudaSuccess) return e;
      return LaunchSelectTopK(r.scores(), heads, n, r.counts(), r.offsets(), r.indices(),
                              scratch, select_bytes, nullptr);
    });
    KVTRIM_FUSED_OK(cudaFree(scratch));
    std::printf("[timing] n=%lld H=8 k=%lld (median, us): fused %.1f | NaN probe + protection +"
                " top-k %.1f\n",
                static_cast<long long>(n), static_cast<long long>(k), fused, separate);
    std::fflush(stdout);
    RecordProperty("fused_us_n" + std::to_string(n), std::to_string(fused));
    RecordProperty("separate_us_n" + std::to_string(n), std::to_string(separate));
    EXPECT_GT(fused, 0.0);
  }
}

}  // namespace
}  // namespace kvtrim::gpu::testing

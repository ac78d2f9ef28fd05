// BuildModel's Gram matrices (RegisteredModel::head_gram / group_gram), computed row by row
// on every core: bit-identical to summing each entry over the hidden rows on its own, for
// every layer, head and group, and symmetric.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/model.h"
#include "tests/testing/random_model_test_util.h"

namespace kvtrim {
namespace {

/// out[i][j] = sum over e ascending of w[e][col + i] * w[e][col + j] in double, of the
/// columns [col, col + d) of `w_o` [D, stride] (or, with `group` > 1, the sum of `group`
/// consecutive heads' columns), rounded to float: the definition, entry by entry.
std::vector<float> ReferenceGram(const std::vector<float>& w_o, int64_t D, int64_t stride,
                                 int64_t col, int64_t d, int64_t group) {
  std::vector<double> m(static_cast<size_t>(D * d), 0.0);
  for (int64_t e = 0; e < D; ++e) {
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t g = 0; g < group; ++g) m[e * d + i] += w_o[e * stride + col + g * d + i];
    }
  }
  std::vector<float> out(static_cast<size_t>(d * d));
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      double acc = 0;
      for (int64_t e = 0; e < D; ++e) acc += m[e * d + i] * m[e * d + j];
      out[i * d + j] = static_cast<float>(acc);
    }
  }
  return out;
}

TEST(ModelGram, RowByRowOnEveryCoreEqualsTheDefinitionBitForBit) {
  RandomModelOptions o;
  o.layers = 5;  // more layers than most test machines' cores: several per thread
  o.query_heads = 6;
  o.kv_heads = 2;
  o.head_dim = 16;
  o.hidden = 99;  // not a multiple of 4: the batched rows and the rest
  auto model = BuildModel(RandomModelInput(o));
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t d = o.head_dim, hq = o.query_heads, G = o.query_heads / o.kv_heads;
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::vector<float>& w = (*model)->w_o[l];
    for (int64_t h = 0; h < hq; ++h) {
      const std::vector<float> want = ReferenceGram(w, o.hidden, hq * d, h * d, d, 1);
      const std::vector<float> got((*model)->head_gram[l].begin() + h * d * d,
                                   (*model)->head_gram[l].begin() + (h + 1) * d * d);
      EXPECT_EQ(got, want) << "layer " << l << " head " << h;
    }
    for (int64_t g = 0; g < o.kv_heads; ++g) {
      const std::vector<float> want = ReferenceGram(w, o.hidden, hq * d, g * G * d, d, G);
      const std::vector<float> got((*model)->group_gram[l].begin() + g * d * d,
                                   (*model)->group_gram[l].begin() + (g + 1) * d * d);
      EXPECT_EQ(got, want) << "layer " << l << " group " << g;
    }
  }
}

// W_O is converted on every core, after a layer-by-layer walk of the structure; the fault
// reported is still the one a layer-by-layer walk meets first: the lowest layer's, and
// within a layer W_O's shape, then its values, then the query-statistics pair.
TEST(ModelGram, FaultsReportAsALayerByLayerWalkMeetsThem) {
  RandomModelOptions o;
  o.layers = 5;
  o.query_stats = true;
  struct Case {
    int nan_layer;          // W_O of this layer gets a NaN at element 3
    const char* erased;     // this tensor is left out
    const char* expected;   // the fault reported: the whole message, or its start
    bool whole;
  };
  for (const Case& c : {
           Case{1, "layers.3.w_o", "weights[layers.1.w_o].data: element 3 is not finite", true},
           Case{1, "layers.0.w_o", "weights[layers.0.w_o]: missing", false},
           Case{2, "layers.2.query_cov", "weights[layers.2.w_o].data: element 3 is not finite",
                true},
           Case{4, "layers.2.query_cov", "weights[layers.2.query_cov]: missing", false}}) {
    ModelInput in = RandomModelInput(o);
    const float nan = std::nanf("");
    std::memcpy(in.tensors[absl::StrCat("layers.", c.nan_layer, ".w_o")].bytes.data() + 4 * 3,
                &nan, 4);
    in.tensors.erase(c.erased);
    auto model = BuildModel(std::move(in));
    ASSERT_FALSE(model.ok()) << c.expected;
    const std::string message(model.status().message());
    if (c.whole) {
      EXPECT_EQ(message, c.expected);
    } else {
      EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace kvtrim

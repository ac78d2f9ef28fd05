// Bad requests never crash the server nor disturb concurrent valid ones.
#include <atomic>
#include <cmath>
#include <thread>

#include "service/test_util.h"

namespace kvtrim::service::testing {
namespace {

/// The bad requests of the flood, one per kind of error.
std::vector<v1::CompressRequest> BadRequests() {
  std::vector<v1::CompressRequest> bad;
  auto r = MakeRequest("dropkv");
  r.mutable_layers(0)->mutable_keys()->set_dtype(static_cast<v1::DType>(9));
  bad.push_back(r);
  r = MakeRequest("dropkv");
  r.mutable_layers(0)->mutable_keys()->mutable_inline_data()->resize(3);
  bad.push_back(r);
  r = MakeRequest("dropkv");
  r.mutable_layers(0)->mutable_queries()->set_shape(0, 3);
  r.mutable_layers(0)->mutable_queries()->mutable_inline_data()->resize(3 * 32 * 8 * 4);
  bad.push_back(r);
  r = MakeRequest("dropkv");
  std::vector<float> keys = Values(2 * 64 * 8, 3);
  keys[77] = std::nanf("");
  *r.mutable_layers(0)->mutable_keys() = MakeTensor(v1::DTYPE_F32, {2, 64, 8}, keys);
  bad.push_back(r);
  r = MakeRequest("dropkv", 3);
  r.mutable_layers(2)->set_layer_id(0);
  bad.push_back(r);
  r = MakeRequest("nope");
  bad.push_back(r);
  r = MakeRequest("dropkv");
  r.mutable_settings()->mutable_budget()->set_keep_fraction(-1);
  bad.push_back(r);
  r = MakeRequest("dropkv");
  r.mutable_layers(0)->clear_queries();
  bad.push_back(r);
  r = MakeRequest("dropkv");
  (*r.mutable_settings()->mutable_policy()->mutable_params())["kernel"].set_number(1e9);
  bad.push_back(r);
  r = MakeRequest("dropkv");
  r.mutable_layers(0)->mutable_keys()->add_shape(1);
  bad.push_back(r);
  return bad;
}

TEST(ConcurrencyTest, ValidAnswersUnchangedUnderAFloodOfBadRequests) {
  Config config = TestConfig();
  config.workers = 2;
  auto server = StartServer(config);
  ASSERT_NE(server, nullptr);
  auto channel = Connect(*server);
  auto stub = v1::Kvtrim::NewStub(channel);

  v1::CompressRequest valid = MakeRequest("dropkv", 4);
  valid.mutable_settings()->set_num_layers(4);
  v1::CompressResponse reference;
  ASSERT_TRUE(CallCompress(*stub, valid, &reference).ok());

  const auto bad = BadRequests();
  std::atomic<bool> stop{false};
  std::atomic<int> bad_calls{0};
  std::atomic<int> unexpected_ok{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 6; ++t) {
    flood.emplace_back([&, t] {
      auto own = v1::Kvtrim::NewStub(Connect(*server));
      for (size_t i = static_cast<size_t>(t); !stop.load(); ++i) {
        const grpc::Status s = CallCompress(*own, bad[i % bad.size()]);
        if (s.ok()) unexpected_ok.fetch_add(1);
        bad_calls.fetch_add(1);
      }
    });
  }
  std::vector<std::thread> good;
  std::atomic<int> mismatches{0};
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    good.emplace_back([&] {
      auto own = v1::Kvtrim::NewStub(Connect(*server));
      for (int i = 0; i < 15; ++i) {
        v1::CompressResponse response;
        const grpc::Status s = CallCompress(*own, valid, &response);
        if (!s.ok()) {
          failures.fetch_add(1);
          continue;
        }
        for (int l = 0; l < reference.layers_size(); ++l) {
          auto a = reference.layers(l);
          auto b = response.layers(l);
          a.clear_compute_seconds();
          b.clear_compute_seconds();
          if (a.SerializeAsString() != b.SerializeAsString()) mismatches.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : good) t.join();
  stop = true;
  for (auto& t : flood) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(unexpected_ok.load(), 0);
  EXPECT_GT(bad_calls.load(), 0);
  // Still healthy and still answering the same.
  EXPECT_EQ(HealthCheck(channel, ""), 1);
  v1::CompressResponse after;
  ASSERT_TRUE(CallCompress(*stub, valid, &after).ok());
  EXPECT_EQ(after.layers(0).indices_size(), reference.layers(0).indices_size());
}

}  // namespace
}  // namespace kvtrim::service::testing

// Inputs a careless or hostile worker may hand kvtrimd through shared memory: a FIFO where a
// segment is expected (refused at once, never blocking the handler) and a host_shm tensor
// larger than kvtrimd reads into memory (RESOURCE_EXHAUSTED naming the tensor).
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/region_registry.h"
#include "service/tensor_codec.h"
#include "service/test_util.h"
#include "service/transport_test_util.h"

namespace kvtrim::service::testing {
namespace {

using ::testing::HasSubstr;

TEST(RegionInputLimitsTest, AFifoIsRefusedAsNoSegmentWithoutBlocking) {
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  const std::string name = "/kvtrim-test-fifo-" + std::to_string(getpid());
  const std::string path = "/dev/shm" + name;
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
  const std::string client = registry.OpenClient("");
  v1::RegisterRegion request;
  request.mutable_host_shm()->set_name(name);
  request.mutable_host_shm()->set_size_bytes(4096);
  const auto id = registry.Register(client, request);
  unlink(path.c_str());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("register_region.host_shm.name: '" + name +
                        "' is not a shared-memory segment (a regular file)"));
}

TEST(RegionInputLimitsTest, HostShmTensorsAboveTheReadLimitAreRefused) {
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  TestSegment segment(64 << 10);
  const std::string client = registry.OpenClient("");
  v1::RegisterRegion request;
  request.mutable_host_shm()->set_name(segment.name());
  request.mutable_host_shm()->set_size_bytes(segment.size());
  const auto id = registry.Register(client, request);
  ASSERT_TRUE(id.ok()) << id.status();

  v1::LayerInput layer = MakeLayer(0, LayerDims{});  // keys [2, 64, 8] f32: 4096 bytes
  *layer.mutable_keys() = RegionTensor(false, v1::DTYPE_F32, {2, 64, 8}, *id, 0);
  DecodeContext context;
  context.regions = &registry;
  context.client_id = client;
  context.max_host_read_bytes = 4096;
  DecodedLayer decoded;
  EXPECT_TRUE(DecodeLayer(layer, EngineLimits{}, "layers[0]", context, &decoded).ok());
  context.max_host_read_bytes = 4095;
  DecodedLayer refused;
  const absl::Status status =
      DecodeLayer(layer, EngineLimits{}, "layers[0]", context, &refused);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("layers[0].keys.host_shm: a host_shm tensor of 4096 bytes is read into "
                        "memory; that exceeds --max_layer_bytes=4095"));
}

}  // namespace
}  // namespace kvtrim::service::testing

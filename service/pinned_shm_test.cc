// Host shm segments page-locked for direct device copies (RegionOptions::max_pinned_shm_bytes),
// on a stand-in mapper that maps without CUDA: which segments are pinned under the cap, that
// dense tensors of a pinned segment decode to kPinnedHost views into the mapping (no read),
// and that strided ones and unpinned segments are still read with pread; and a session's
// chunked tensors received into page-locked pool buffers decode to kPinnedHost views.
#include <sys/mman.h>

#include <cstring>
#include <string>
#include <vector>

#include "service/host_buffer_pool.h"
#include "service/region_registry.h"
#include "service/session_input.h"
#include "service/tensor_codec.h"
#include "service/transport_test_util.h"

namespace kvtrim::service::testing {
namespace {

/// A PinnedHostMemory that is a plain read-only mapping (what the CUDA one adds is the
/// page-locking).
class MappedOnly final : public PinnedHostMemory {
 public:
  MappedOnly(void* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  ~MappedOnly() override { munmap(base_, bytes_); }
  const char* base() const override { return static_cast<const char*>(base_); }

 private:
  void* base_;
  uint64_t bytes_;
};

/// A mapper that pins by mapping (or refuses, when `refuse`), and opens no CUDA handles.
class MapOnlyMapper final : public DeviceMapper {
 public:
  const std::string& device_uuid() const override { return uuid_; }
  std::string FormatUuid(const std::string& uuid16) const override { return uuid16; }
  absl::StatusOr<std::unique_ptr<MappedDeviceMemory>> OpenMemory(const std::string&, uint64_t,
                                                                 const std::string&) override {
    return absl::UnimplementedError("no CUDA here");
  }
  absl::StatusOr<std::unique_ptr<MappedDeviceEvent>> OpenEvent(const std::string&,
                                                               const std::string&) override {
    return absl::UnimplementedError("no CUDA here");
  }
  absl::StatusOr<std::unique_ptr<PinnedHostMemory>> PinHost(int fd, uint64_t size_bytes,
                                                            const std::string& field) override {
    if (refuse) return absl::InvalidArgumentError(field + ": refused by the test");
    void* base = mmap(nullptr, size_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return absl::InvalidArgumentError(field + ": mmap failed");
    return std::unique_ptr<PinnedHostMemory>(new MappedOnly(base, size_bytes));
  }
  bool refuse = false;

 private:
  std::string uuid_ = std::string(16, '\x01');
};

/// A registry with regions allowed and the stand-in mapper, a cap of `cap` pinned bytes.
struct PinnedRegistry {
  explicit PinnedRegistry(uint64_t cap)
      : registry(
            [&] {
              RegionOptions options;
              options.allow_client_shm = true;
              options.max_pinned_shm_bytes = cap;
              return options;
            }(),
            &mapper),
        client(registry.OpenClient("")) {}

  /// Registers `segment` whole; its region id.
  std::string Register(const TestSegment& segment) {
    v1::RegisterRegion request;
    request.mutable_host_shm()->set_name(segment.name());
    request.mutable_host_shm()->set_size_bytes(segment.size());
    auto id = registry.Register(client, request);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  const char* PinnedBase(const std::string& id) {
    auto pin = registry.Acquire(client, id, RegionKind::kHostShm, "f");
    EXPECT_TRUE(pin.ok()) << pin.status();
    return pin.ok() ? (*pin)->pinned_base() : nullptr;
  }

  MapOnlyMapper mapper;
  RegionRegistry registry;
  std::string client;
};

TEST(PinnedShmTest, SegmentsArePinnedWithinTheCapAndReleasedWithTheirRegion) {
  PinnedRegistry r(3 * 4096);
  TestSegment a(2 * 4096), b(2 * 4096), c(4096);
  const std::string ida = r.Register(a);
  EXPECT_NE(r.PinnedBase(ida), nullptr);
  EXPECT_EQ(r.registry.pinned_shm_bytes(), 2u * 4096);
  const std::string idb = r.Register(b);  // 4 pages would pass the cap of 3: pread
  EXPECT_EQ(r.PinnedBase(idb), nullptr);
  const std::string idc = r.Register(c);  // 3 pages: within it
  EXPECT_NE(r.PinnedBase(idc), nullptr);
  EXPECT_EQ(r.registry.pinned_shm_bytes(), 3u * 4096);
  ASSERT_TRUE(r.registry.Unregister(r.client, ida).ok());
  EXPECT_EQ(r.registry.pinned_shm_bytes(), 4096u);
  r.registry.CloseClient(r.client);
  EXPECT_EQ(r.registry.pinned_shm_bytes(), 0u);
}

TEST(PinnedShmTest, ACapOfZeroOrARefusalLeavesTheSegmentToPread) {
  {
    PinnedRegistry r(0);
    TestSegment a(4096);
    EXPECT_EQ(r.PinnedBase(r.Register(a)), nullptr);
  }
  PinnedRegistry r(uint64_t{1} << 30);
  r.mapper.refuse = true;
  TestSegment a(4096);
  EXPECT_EQ(r.PinnedBase(r.Register(a)), nullptr);
  EXPECT_EQ(r.registry.pinned_shm_bytes(), 0u);
}

TEST(PinnedShmTest, DenseTensorsOfAPinnedSegmentAreViewsIntoTheMappingOthersAreRead) {
  constexpr int64_t kHeads = 2, kTokens = 16, kDim = 8;
  constexpr size_t kTensorBytes = kHeads * kTokens * kDim * 4;
  TestSegment segment(4 * kTensorBytes);
  for (size_t i = 0; i < segment.size() / 4; ++i) {
    const float x = static_cast<float>(i);
    std::memcpy(segment.data() + 4 * i, &x, 4);
  }
  for (uint64_t cap : {uint64_t{1} << 30, uint64_t{0}}) {
    PinnedRegistry r(cap);
    const std::string id = r.Register(segment);
    DecodeContext context;
    context.regions = &r.registry;
    context.client_id = r.client;
    v1::Tensor tensor;
    tensor.set_dtype(v1::DTYPE_F32);
    for (int64_t d : {kHeads, kTokens, kDim}) tensor.add_shape(d);
    tensor.mutable_host_shm()->set_region_id(id);
    tensor.mutable_host_shm()->set_offset_bytes(kTensorBytes);
    OwnedBuffers owned;
    std::vector<RegionPin> pins;
    TransportBytes bytes;
    auto dense = DecodeTensor(tensor, TensorRole::kKeys, EngineLimits{}, "layers[0].keys",
                              context, &owned, &pins, &bytes);
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_EQ(bytes.host_shm, static_cast<int64_t>(kTensorBytes));
    if (cap > 0) {
      EXPECT_EQ(dense->space, MemorySpace::kPinnedHost);
      EXPECT_EQ(dense->data, r.PinnedBase(id) + kTensorBytes);
      EXPECT_TRUE(owned.empty());
    } else {
      EXPECT_EQ(dense->space, MemorySpace::kHost);
      EXPECT_EQ(std::memcmp(dense->data, segment.data() + kTensorBytes, kTensorBytes), 0);
    }
    // Token-major (strides [d, H_kv * d, 1]): read with pread into dense memory either way.
    for (int64_t s : {kDim, kHeads * kDim, int64_t{1}}) {
      tensor.mutable_host_shm()->add_strides_elements(s);
    }
    auto strided = DecodeTensor(tensor, TensorRole::kKeys, EngineLimits{}, "layers[0].keys",
                                context, &owned, &pins, &bytes);
    ASSERT_TRUE(strided.ok()) << strided.status();
    EXPECT_EQ(strided->space, MemorySpace::kHost);
    float first_of_head1 = 0;
    std::memcpy(&first_of_head1, static_cast<const char*>(strided->data) + kTokens * kDim * 4, 4);
    EXPECT_EQ(first_of_head1, static_cast<float>(kTensorBytes / 4 + kDim));
  }
}

/// The keys' view of a one-layer session whose keys [2, 128, 1024] f32 (1 MiB: a pooled
/// buffer) arrive as one chunk, with a pool that locks (or not) its buffers.
TensorView ChunkedKeysView(bool lock) {
  constexpr int64_t kHeads = 2, kTokens = 128, kDim = 1024;  // 1 MiB: a pooled buffer
  constexpr int64_t kBytes = kHeads * kTokens * kDim * 4;
  HostMemoryLocker locker{[](void*, size_t) { return true; }, [](void*) {}};
  DecodeContext context;
  context.buffers = std::make_shared<HostBufferPool>(size_t{64} << 20, size_t{1} << 20,
                                                     lock ? locker : HostMemoryLocker{},
                                                     size_t{64} << 20);
  SessionInput input(EngineLimits{}, context, int64_t{1} << 30);
  auto layer = std::make_unique<v1::SessionRequest>();
  v1::Tensor* keys = layer->mutable_layer()->mutable_keys();
  keys->set_dtype(v1::DTYPE_F32);
  for (int64_t d : {kHeads, kTokens, kDim}) keys->add_shape(d);
  keys->mutable_chunked()->set_total_bytes(kBytes);
  const auto now = std::chrono::steady_clock::now();
  EXPECT_FALSE(input.Take(std::move(layer), now).has_value());  // waits for its chunks
  auto chunk = std::make_unique<v1::SessionRequest>();
  chunk->mutable_tensor_chunk()->set_slot(v1::TENSOR_SLOT_KEYS);
  chunk->mutable_tensor_chunk()->set_data(std::string(kBytes, '\0'));
  std::optional<SessionItem> item = input.Take(std::move(chunk), now);
  EXPECT_TRUE(item.has_value() && item->status.ok() && item->decoded != nullptr);
  if (!item.has_value() || item->decoded == nullptr) return {};
  TensorView view = item->decoded->request.keys;
  EXPECT_EQ(view.data, item->decoded->owned.front().get());
  return view;
}

TEST(PinnedShmTest, ChunksReceivedIntoPageLockedPoolBuffersAreDeviceCopiedViews) {
  EXPECT_EQ(ChunkedKeysView(/*lock=*/true).space, MemorySpace::kPinnedHost);
  EXPECT_EQ(ChunkedKeysView(/*lock=*/false).space, MemorySpace::kHost);
}

}  // namespace
}  // namespace kvtrim::service::testing

// The zero-copy and chunked transports end to end on the CPU backend: sessions over host
// shared memory (dense, strided, paged) and chunked inline bytes give the indices of inline
// Compress; region misuse and chunking mistakes get clear errors and the server keeps
// serving. (CUDA IPC runs in tests/gpu/ipc_transport_test.cc on a GPU.)
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "service/region_registry.h"
#include "service/transport_test_util.h"

namespace kvtrim::service::testing {
namespace {

constexpr int kLayers = 3;

/// A server with regions allowed, one channel and stub.
class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config = TestConfig();
    config.allow_client_shm = true;
    config.max_regions_per_client = 8;
    server_ = StartServer(config);
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Kvtrim::NewStub(Connect(*server_));
  }

  /// Inline Compress of layers 0..kLayers-1 with `policy`: the reference answers.
  std::vector<v1::LayerResult> InlineAnswers(const std::string& policy, const LayerDims& dims) {
    v1::CompressRequest request = MakeRequest(policy, kLayers, dims);
    v1::CompressResponse response;
    EXPECT_TRUE(CallCompress(*stub_, request, &response).ok());
    return {response.layers().begin(), response.layers().end()};
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Kvtrim::Stub> stub_;
};

/// The kept indices of answers, by layer id.
std::map<int32_t, std::vector<int32_t>> Indices(const std::vector<v1::LayerResult>& layers) {
  std::map<int32_t, std::vector<int32_t>> out;
  for (const auto& l : layers) out[l.layer_id()] = {l.indices().begin(), l.indices().end()};
  return out;
}

/// Element bytes of a dtype.
size_t ElementBytes(v1::DType dtype) { return dtype == v1::DTYPE_F32 ? 4 : 2; }

/// Layouts a worker may keep K/V in.
enum class Layout { kDense, kTokenMajor, kPaged };

/// Writes tensor `t` [A, N, C] (dense bytes) into `dst` in `layout`, returns the region
/// tensor that describes it at `offset`. Paged: blocks of 16 tokens, pool order reversed.
v1::Tensor PlaceTensor(const v1::Tensor& t, Layout layout, const std::string& region,
                       uint64_t offset, char* dst) {
  const int64_t a = t.shape(0), n = t.shape(1), c = t.shape(2);
  const size_t e = ElementBytes(t.dtype());
  const char* src = t.inline_data().data();
  std::vector<int64_t> shape = {a, n, c};
  if (layout == Layout::kDense) {
    std::memcpy(dst + offset, src, t.inline_data().size());
    return RegionTensor(false, t.dtype(), shape, region, offset);
  }
  const int64_t block = 16;
  const int64_t blocks = (n + block - 1) / block;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
  for (int64_t i0 = 0; i0 < a; ++i0) {
    for (int64_t i1 = 0; i1 < n; ++i1) {
      int64_t token = i1 * a * c;  // token-major: [n, A, C]
      if (layout == Layout::kPaged) token = table[i1 / block] * block * a * c + (i1 % block) * a * c;
      const int64_t element = i0 * c + token;
      std::memcpy(dst + offset + element * e, src + (i0 * n + i1) * c * e, c * e);
    }
  }
  v1::Tensor out = RegionTensor(false, t.dtype(), shape, region, offset, {c, a * c, 1});
  if (layout == Layout::kPaged) {
    v1::PagedLayout* paged = out.mutable_host_shm()->mutable_paged();
    paged->set_block_tokens(block);
    paged->set_block_stride_elements(block * a * c);
    for (int32_t b : table) paged->add_block_table(b);
  }
  return out;
}

/// Session messages for layers 0..kLayers-1 placed in `segment` (registered as `region`).
std::vector<v1::SessionRequest> ShmLayers(const LayerDims& dims, Layout layout, TestSegment* segment,
                                          const std::string& region) {
  std::vector<v1::SessionRequest> messages;
  uint64_t offset = 0;
  for (int i = 0; i < kLayers; ++i) {
    const v1::LayerInput inline_layer = MakeLayer(i, dims);
    v1::LayerInput layer;
    layer.set_layer_id(i);
    // Reserve room for the paged pool (same size as the tensor) and align to 64 bytes.
    auto place = [&](const v1::Tensor& t) {
      const v1::Tensor placed = PlaceTensor(t, layout, region, offset, segment->data());
      offset += (t.inline_data().size() + 63) / 64 * 64 + 64 * 16 * 8;
      return placed;
    };
    *layer.mutable_keys() = place(inline_layer.keys());
    if (inline_layer.has_values()) *layer.mutable_values() = place(inline_layer.values());
    if (inline_layer.has_queries()) {
      // Queries stay dense (their shape is [H_q, w, d]).
      const v1::Tensor& q = inline_layer.queries();
      std::memcpy(segment->data() + offset, q.inline_data().data(), q.inline_data().size());
      *layer.mutable_queries() = RegionTensor(false, q.dtype(), {q.shape(0), q.shape(1), q.shape(2)},
                                              region, offset);
      offset += (q.inline_data().size() + 63) / 64 * 64;
    }
    EXPECT_LE(offset, segment->size());
    messages.push_back(SessionLayer(layer));
  }
  messages.push_back(SessionFinish());
  return messages;
}

TEST_F(TransportTest, HostShmSessionsMatchInlineCompressInEveryLayout) {
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    LayerDims dims;
    dims.dtype = dtype;
    for (const std::string policy : {"snapkv", "knorm", "dropkv", "keydiff"}) {
      const auto expected = Indices(InlineAnswers(policy, dims));
      for (Layout layout : {Layout::kDense, Layout::kTokenMajor, Layout::kPaged}) {
        SCOPED_TRACE(policy + " layout " + std::to_string(static_cast<int>(layout)) + " dtype " +
                     std::to_string(dtype));
        TestSegment segment(1 << 20);
        TestLease lease(*stub_);
        ASSERT_FALSE(lease.client_id().empty());
        const v1::RegionResponse registered = lease.RegisterShm(segment.name(), segment.size());
        ASSERT_EQ(registered.code(), 0) << registered.message();
        const auto messages =
            ShmLayers(dims, layout, &segment, registered.registered_region_id());
        std::vector<v1::LayerResult> answers;
        const grpc::Status status =
            RunSession(*stub_, lease.client_id(), MakeSettings(policy), messages, &answers);
        ASSERT_TRUE(status.ok()) << status.error_message();
        EXPECT_EQ(Indices(answers), expected);
      }
    }
  }
  EXPECT_GT(CounterValue(*server_, "kvtrim_tensor_bytes_total", {{"transport", "host_shm"}}), 0);
}

/// A session's messages with every tensor of every layer chunked into `chunk` bytes.
std::vector<v1::SessionRequest> ChunkedLayers(const LayerDims& dims, size_t chunk) {
  std::vector<v1::SessionRequest> messages;
  for (int i = 0; i < kLayers; ++i) {
    v1::LayerInput layer = MakeLayer(i, dims);
    std::vector<std::pair<v1::TensorSlot, std::string>> data;
    auto chunk_tensor = [&](v1::Tensor* t, v1::TensorSlot slot) {
      std::string bytes = t->inline_data();
      t->mutable_chunked()->set_total_bytes(bytes.size());
      data.emplace_back(slot, std::move(bytes));
    };
    chunk_tensor(layer.mutable_keys(), v1::TENSOR_SLOT_KEYS);
    chunk_tensor(layer.mutable_values(), v1::TENSOR_SLOT_VALUES);
    chunk_tensor(layer.mutable_queries(), v1::TENSOR_SLOT_QUERIES);
    messages.push_back(SessionLayer(layer));
    // Interleave the tensors' chunks: allowed, each tensor's own chunks stay in order.
    std::vector<size_t> at(data.size(), 0);
    bool more = true;
    while (more) {
      more = false;
      for (size_t t = 0; t < data.size(); ++t) {
        if (at[t] >= data[t].second.size()) continue;
        v1::SessionRequest r;
        v1::TensorChunk* c = r.mutable_tensor_chunk();
        c->set_layer_id(i);
        c->set_slot(data[t].first);
        c->set_offset_bytes(at[t]);
        c->set_data(data[t].second.substr(at[t], chunk));
        at[t] += chunk;
        messages.push_back(std::move(r));
        more = true;
      }
    }
  }
  messages.push_back(SessionFinish());
  return messages;
}

TEST_F(TransportTest, ChunkedInlineSessionMatchesInlineCompress) {
  LayerDims dims;
  dims.dtype = v1::DTYPE_BF16;
  for (const std::string policy : {"snapkv", "dropkv"}) {
    const auto expected = Indices(InlineAnswers(policy, dims));
    for (size_t chunk : {size_t{1000}, size_t{4097}, size_t{1} << 20}) {
      std::vector<v1::LayerResult> answers;
      const grpc::Status status =
          RunSession(*stub_, "", MakeSettings(policy), ChunkedLayers(dims, chunk), &answers);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(Indices(answers), expected) << policy << " chunk " << chunk;
    }
  }
}

TEST_F(TransportTest, ChunkedTensorsOfAMiBOrMoreGoThroughTheHostBufferPool) {
  LayerDims dims;
  dims.tokens = 4096;
  dims.head_dim = 64;  // keys and values of 2 MiB each (f32, 2 heads)
  std::vector<v1::LayerResult> answers;
  const grpc::Status status = RunSession(*stub_, "", MakeSettings("knorm"),
                                         ChunkedLayers(dims, size_t{1} << 20), &answers);
  ASSERT_TRUE(status.ok()) << status.error_message();
  server_->PublishMemoryMetrics();
  const auto families = server_->metrics().registry()->Collect();
  const auto* idle = FindMetric(families, "kvtrim_host_buffer_bytes", {{"state", "idle"}});
  const auto* in_use = FindMetric(families, "kvtrim_host_buffer_bytes", {{"state", "in_use"}});
  ASSERT_NE(idle, nullptr);
  ASSERT_NE(in_use, nullptr);
  EXPECT_GE(idle->gauge.value, 2 << 20);  // the session's buffers went back to the pool
  EXPECT_EQ(in_use->gauge.value, 0);
}

TEST_F(TransportTest, AnUndecodableMessageNamesSessionRequest) {
  // Wire bytes that are no SessionRequest, after a valid begin: the session ends with
  // INVALID_ARGUMENT naming the message (not "closed without finish").
  std::shared_ptr<grpc::Channel> channel = Connect(*server_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::internal::RpcMethod method("/kvtrim.v1.Kvtrim/CompressSession",
                                         grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, v1::SessionResponse>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::SessionResponse>::Create(
          channel.get(), method, &context));
  auto bytes = [](const std::string& data) {
    grpc::Slice slice(data);
    return grpc::ByteBuffer(&slice, 1);
  };
  stream->Write(bytes(SessionBegin(MakeSettings("snapkv")).SerializeAsString()));
  stream->Write(bytes(std::string("\x22\xff\xff\xff\xff\x0f", 6)));
  stream->WritesDone();
  v1::SessionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_GRPC_ERROR(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                    "SessionRequest: a message of 6 bytes is not a valid SessionRequest");
}

TEST_F(TransportTest, ChunkingMistakesNameTensorChunk) {
  LayerDims dims;
  auto messages = ChunkedLayers(dims, 1000);
  // A chunk with no chunked tensor pending.
  {
    std::vector<v1::SessionRequest> bad = {messages[1]};
    EXPECT_GRPC_ERROR(RunSession(*stub_, "", MakeSettings("snapkv"), bad, nullptr),
                      grpc::StatusCode::INVALID_ARGUMENT, "tensor_chunk: no chunked tensor is pending");
  }
  // finish before the last chunk.
  {
    std::vector<v1::SessionRequest> bad(messages.begin(), messages.begin() + 3);
    bad.push_back(SessionFinish());
    EXPECT_GRPC_ERROR(RunSession(*stub_, "", MakeSettings("snapkv"), bad, nullptr),
                      grpc::StatusCode::INVALID_ARGUMENT, "before the next layer or finish");
  }
  // A gap.
  {
    // The layer, then keys' second chunk without its first.
    std::vector<v1::SessionRequest> bad = {messages[0], messages[4]};
    ASSERT_EQ(messages[4].tensor_chunk().offset_bytes(), 1000u);
    EXPECT_GRPC_ERROR(RunSession(*stub_, "", MakeSettings("snapkv"), bad, nullptr),
                      grpc::StatusCode::INVALID_ARGUMENT, "tensor_chunk.offset_bytes");
  }
  // A slot that names no chunked tensor of the layer: the slot by name, or its number.
  for (const auto& [slot, shown] : {std::pair<int, std::string>{7, "7"},
                                    {0, "TENSOR_SLOT_UNSPECIFIED"}}) {
    std::vector<v1::SessionRequest> bad = {messages[0], messages[1]};
    bad[1].mutable_tensor_chunk()->set_slot(static_cast<v1::TensorSlot>(slot));
    EXPECT_GRPC_ERROR(RunSession(*stub_, "", MakeSettings("snapkv"), bad, nullptr),
                      grpc::StatusCode::INVALID_ARGUMENT,
                      "tensor_chunk.slot: " + shown + " is not a chunked tensor of layer 0");
  }
  // Chunked tensors in unary Compress.
  {
    v1::CompressRequest request = MakeRequest("snapkv");
    request.mutable_layers(0)->mutable_keys()->mutable_chunked()->set_total_bytes(4096);
    EXPECT_GRPC_ERROR(CallCompress(*stub_, request), grpc::StatusCode::INVALID_ARGUMENT,
                      "layers[0].keys.chunked: chunked tensors are sent in a CompressSession");
  }
  // The server keeps serving.
  EXPECT_TRUE(CallCompress(*stub_, MakeRequest("snapkv")).ok());
}

/// A Compress request whose layer 0 keys sit in `region` at `offset` (dense f32).
v1::CompressRequest RegionRequest(const std::string& region, uint64_t offset,
                                  const LayerDims& dims = {}) {
  v1::CompressRequest request = MakeRequest("knorm", 1, dims);
  *request.mutable_layers(0)->mutable_keys() = RegionTensor(
      false, v1::DTYPE_F32, {dims.kv_heads, dims.tokens, dims.head_dim}, region, offset);
  return request;
}

TEST_F(TransportTest, RegionMisuseGetsClearErrors) {
  TestSegment segment(64 << 10);
  TestLease lease(*stub_);
  const auto registered = lease.RegisterShm(segment.name(), segment.size());
  ASSERT_EQ(registered.code(), 0) << registered.message();
  const std::string id = registered.registered_region_id();
  v1::CompressResponse response;
  // Works when right.
  ASSERT_TRUE(CompressAs(*stub_, lease.client_id(), RegionRequest(id, 0), &response).ok());
  // Unknown region.
  EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), RegionRequest("shm-nope", 0), &response),
                    grpc::StatusCode::NOT_FOUND, "layers[0].keys.host_shm.region_id: no region");
  // Offset + size outside the region (2*64*8*4 = 4 KiB tensor).
  EXPECT_GRPC_ERROR(
      CompressAs(*stub_, lease.client_id(), RegionRequest(id, (64 << 10) - 4096 + 4), &response),
      grpc::StatusCode::INVALID_ARGUMENT, "layers[0].keys.host_shm.offset_bytes");
  // Misaligned offset.
  EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), RegionRequest(id, 2), &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "is not a multiple of the 4-byte element");
  // A zero stride and a short block table.
  {
    v1::CompressRequest request = RegionRequest(id, 0);
    auto* slice = request.mutable_layers(0)->mutable_keys()->mutable_host_shm();
    slice->add_strides_elements(8);
    slice->add_strides_elements(0);
    slice->add_strides_elements(1);
    EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), request, &response),
                      grpc::StatusCode::INVALID_ARGUMENT, "strides_elements[1]: must be >= 1");
    slice->set_strides_elements(1, 16);
    slice->mutable_paged()->set_block_tokens(16);
    slice->mutable_paged()->set_block_stride_elements(256);
    slice->mutable_paged()->add_block_table(0);
    EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), request, &response),
                      grpc::StatusCode::INVALID_ARGUMENT, "paged.block_table: 1 entries");
  }
  // Another client's region.
  TestLease other(*stub_);
  EXPECT_GRPC_ERROR(CompressAs(*stub_, other.client_id(), RegionRequest(id, 0), &response),
                    grpc::StatusCode::PERMISSION_DENIED, "belongs to another client");
  EXPECT_EQ(other.Unregister(id).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  // No client id at all.
  EXPECT_GRPC_ERROR(CompressAs(*stub_, "", RegionRequest(id, 0), &response),
                    grpc::StatusCode::FAILED_PRECONDITION, "kvtrim-client-id");
  // A device region on the CPU backend.
  {
    v1::RegionRequest r;
    auto* ipc = r.mutable_register_region()->mutable_cuda_ipc();
    ipc->set_handle(std::string(64, '\0'));
    ipc->set_device_uuid(std::string(16, '\1'));
    ipc->set_size_bytes(1024);
    const auto answer = lease.Send(r);
    EXPECT_EQ(answer.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
    EXPECT_THAT(answer.message(), ::testing::HasSubstr("register_region.cuda_ipc"));
  }
  // A cuda_ipc tensor naming a shm region.
  {
    v1::CompressRequest request = RegionRequest(id, 0);
    *request.mutable_layers(0)->mutable_keys() =
        RegionTensor(true, v1::DTYPE_F32, {2, 64, 8}, id, 0);
    EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), request, &response),
                      grpc::StatusCode::INVALID_ARGUMENT, "is a host_shm region, not cuda_ipc");
  }
  // Bad registrations.
  EXPECT_EQ(lease.RegisterShm("no-slash", 16).code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(lease.RegisterShm("/kvtrim-test-missing-segment", 16).code(),
            static_cast<int>(grpc::StatusCode::NOT_FOUND));
  const auto too_big = lease.RegisterShm(segment.name(), segment.size() + 1);
  EXPECT_EQ(too_big.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(too_big.message(), ::testing::HasSubstr("host_shm.size_bytes"));
  // The segment shrinks behind the server's back: an error, not SIGBUS.
  segment.Truncate(1024);
  EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), RegionRequest(id, 0), &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "shorter than registered");
  // Unregister, then the id is gone.
  EXPECT_EQ(lease.Unregister(id).code(), 0);
  EXPECT_GRPC_ERROR(CompressAs(*stub_, lease.client_id(), RegionRequest(id, 0), &response),
                    grpc::StatusCode::NOT_FOUND, "no region");
  EXPECT_TRUE(CallCompress(*stub_, MakeRequest("snapkv")).ok());
}

TEST_F(TransportTest, RegionLimitPerClient) {
  TestSegment segment(4096);
  TestLease lease(*stub_);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(lease.RegisterShm(segment.name(), 4096).code(), 0);
  const auto refused = lease.RegisterShm(segment.name(), 4096);
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("--max_regions_per_client"));
}

TEST_F(TransportTest, DisconnectReleasesTheLeaseRegions) {
  TestSegment segment(64 << 10);
  std::string id, client;
  {
    TestLease lease(*stub_);
    client = lease.client_id();
    for (int i = 0; i < 3; ++i) {
      const auto registered = lease.RegisterShm(segment.name(), segment.size());
      ASSERT_EQ(registered.code(), 0);
      id = registered.registered_region_id();
    }
    lease.Cancel();  // the client goes away without unregistering
  }
  // The lease ends on the server's side asynchronously.
  for (int i = 0; i < 200; ++i) {
    const auto families = server_->metrics().registry()->Collect();
    const auto* g = FindMetric(families, "kvtrim_regions", {{"kind", "host_shm"}});
    const auto* leases = FindMetric(families, "kvtrim_region_leases", {});
    if (g != nullptr && g->gauge.value == 0 && leases != nullptr && leases->gauge.value == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto families = server_->metrics().registry()->Collect();
  EXPECT_EQ(FindMetric(families, "kvtrim_regions", {{"kind", "host_shm"}})->gauge.value, 0);
  v1::CompressResponse response;
  EXPECT_GRPC_ERROR(CompressAs(*stub_, client, RegionRequest(id, 0), &response),
                    grpc::StatusCode::NOT_FOUND, "no region");
  EXPECT_TRUE(CallCompress(*stub_, MakeRequest("snapkv")).ok());
}

/// ListRegions as client `client_id` ("" = none).
grpc::Status ListRegionsAs(v1::Kvtrim::Stub& stub, const std::string& client_id,
                           v1::ListRegionsResponse* response) {
  grpc::ClientContext context;
  if (!client_id.empty()) context.AddMetadata(kClientIdMetadata, client_id);
  return stub.ListRegions(&context, v1::ListRegionsRequest(), response);
}

// ListRegions: totals for anyone; a lease's regions one by one for the call naming it; its
// regions gone after an unregister; NOT_FOUND naming kvtrim-client-id once the lease ended.
TEST_F(TransportTest, ListRegionsShowsTheCallersLeaseAndTheTotals) {
  TestSegment segment(64 << 10);
  TestLease other(*stub_);
  ASSERT_EQ(other.RegisterShm(segment.name(), 4096).code(), 0);
  TestLease lease(*stub_);
  const auto first = lease.RegisterShm(segment.name(), 4096);
  const auto second = lease.RegisterShm(segment.name(), segment.size());
  ASSERT_EQ(first.code(), 0);
  ASSERT_EQ(second.code(), 0);

  v1::ListRegionsResponse totals;
  ASSERT_TRUE(ListRegionsAs(*stub_, "", &totals).ok());
  EXPECT_TRUE(totals.enabled());
  EXPECT_EQ(totals.max_regions_per_client(), 8);
  EXPECT_EQ(totals.leases(), 2);
  EXPECT_EQ(totals.regions_by_kind().at("host_shm"), 3);
  EXPECT_EQ(totals.regions_by_kind().at("cuda_ipc"), 0);
  EXPECT_TRUE(totals.regions().empty());  // no lease named: no ids of anyone's

  v1::ListRegionsResponse mine;
  ASSERT_TRUE(ListRegionsAs(*stub_, lease.client_id(), &mine).ok());
  ASSERT_EQ(mine.regions_size(), 2);
  std::map<std::string, uint64_t> sizes;
  for (const auto& region : mine.regions()) {
    EXPECT_EQ(region.kind(), "host_shm");
    EXPECT_EQ(region.readers(), 0);
    EXPECT_FALSE(region.page_locked());  // the CPU backend reads segments with pread
    sizes[region.region_id()] = region.size_bytes();
  }
  EXPECT_EQ(sizes, (std::map<std::string, uint64_t>{
                       {first.registered_region_id(), 4096},
                       {second.registered_region_id(), segment.size()}}));

  ASSERT_EQ(lease.Unregister(first.registered_region_id()).code(), 0);
  ASSERT_TRUE(ListRegionsAs(*stub_, lease.client_id(), &mine).ok());
  ASSERT_EQ(mine.regions_size(), 1);
  EXPECT_EQ(mine.regions(0).region_id(), second.registered_region_id());

  const std::string ended = lease.client_id();
  ASSERT_TRUE(lease.Close().ok());
  grpc::Status status;
  for (int i = 0; i < 200; ++i) {  // the lease ends on the server's side asynchronously
    v1::ListRegionsResponse after;
    status = ListRegionsAs(*stub_, ended, &after);
    if (!status.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GRPC_ERROR(status, grpc::StatusCode::NOT_FOUND, "kvtrim-client-id: no open lease");
  const auto families = server_->metrics().registry()->Collect();
  EXPECT_EQ(FindMetric(families, "kvtrim_requests_total",
                       {{"rpc", "ListRegions"}, {"policy", "none"}, {"code", "NOT_FOUND"}})
                ->counter.value,
            1);
}

TEST(TransportOffTest, RegionsNeedAllowClientShm) {
  auto server = StartServer(TestConfig());
  ASSERT_NE(server, nullptr);
  auto stub = v1::Kvtrim::NewStub(Connect(*server));
  TestLease lease(*stub);
  EXPECT_TRUE(lease.client_id().empty());
  EXPECT_GRPC_ERROR(lease.RefusedStatus(), grpc::StatusCode::FAILED_PRECONDITION,
                    "--allow_client_shm");
  v1::CompressResponse response;
  EXPECT_GRPC_ERROR(CompressAs(*stub, "abc", RegionRequest("shm-1", 0), &response),
                    grpc::StatusCode::FAILED_PRECONDITION, "--allow_client_shm");
  v1::ListRegionsResponse regions;  // says so too, without an error
  ASSERT_TRUE(ListRegionsAs(*stub, "", &regions).ok());
  EXPECT_FALSE(regions.enabled());
  EXPECT_EQ(regions.leases(), 0);
}

TEST(RegionRegistryTest, UnregisterWhileInUseIsRefusedUntilTheLayerIsDone) {
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  TestSegment segment(4096);
  const std::string client = registry.OpenClient("");
  v1::RegisterRegion request;
  request.mutable_host_shm()->set_name(segment.name());
  request.mutable_host_shm()->set_size_bytes(4096);
  auto id = registry.Register(client, request);
  ASSERT_TRUE(id.ok()) << id.status();
  {
    auto pin = registry.Acquire(client, *id, RegionKind::kHostShm, "layer.keys.host_shm.region_id");
    ASSERT_TRUE(pin.ok());
    const absl::Status busy = registry.Unregister(client, *id);
    EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(busy.message()), ::testing::HasSubstr("is being read by 1"));
    // The lease ending does not wait: the region leaves the table, the pin keeps it alive.
    registry.CloseClient(client);
    EXPECT_EQ(registry.CountByKind().at(RegionKind::kHostShm), 0);
    EXPECT_EQ((*pin)->pins(), 1);
  }
  const std::string again = registry.OpenClient("");
  auto id2 = registry.Register(again, request);
  ASSERT_TRUE(id2.ok());
  {
    auto pin = registry.Acquire(again, *id2, RegionKind::kHostShm, "f");
    ASSERT_TRUE(pin.ok());
  }
  EXPECT_TRUE(registry.Unregister(again, *id2).ok());
  EXPECT_EQ(registry.Acquire(again, *id2, RegionKind::kHostShm, "f").status().code(),
            absl::StatusCode::kNotFound);
}

// A segment kvtrimd cannot see is NOT_FOUND naming the field and the likely cause (two
// /dev/shm mounts: a deployment that does not share it).
TEST(RegionRegistryTest, AMissingSegmentNamesTheFieldAndTheSharedDevShm) {
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  const std::string client = registry.OpenClient("");
  v1::RegisterRegion request;
  request.mutable_host_shm()->set_name("/kvtrim-test-no-such-segment-" +
                                       std::to_string(getpid()));
  request.mutable_host_shm()->set_size_bytes(4096);
  const auto id = registry.Register(client, request);
  ASSERT_EQ(id.status().code(), absl::StatusCode::kNotFound) << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              ::testing::AllOf(::testing::HasSubstr("host_shm.name: cannot open shared-memory"),
                               ::testing::HasSubstr("must see one /dev/shm")));
  registry.CloseClient(client);
}

// Reads large enough to be split over several threads give the segment's bytes exactly, and
// a segment shrunk behind the server's back is an error naming the field, never a crash.
TEST(RegionRegistryTest, LargeReadsAreSplitAndExact) {
  RegionOptions options;
  options.allow_client_shm = true;
  RegionRegistry registry(options, nullptr);
  const size_t bytes = 5 * Region::kParallelReadBytes + 12345;
  TestSegment segment(bytes);
  for (size_t i = 0; i < bytes; ++i) segment.data()[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::string client = registry.OpenClient("");
  v1::RegisterRegion request;
  request.mutable_host_shm()->set_name(segment.name());
  request.mutable_host_shm()->set_size_bytes(bytes);
  auto id = registry.Register(client, request);
  ASSERT_TRUE(id.ok()) << id.status();
  auto pin = registry.Acquire(client, *id, RegionKind::kHostShm, "f");
  ASSERT_TRUE(pin.ok());
  for (size_t offset : {size_t{0}, size_t{4097}}) {
    const size_t len = bytes - offset - 3;
    std::vector<char> out(len, 0);
    ASSERT_TRUE((*pin)->ReadHost(offset, out.data(), len, "layers[0].keys").ok());
    EXPECT_EQ(std::memcmp(out.data(), segment.data() + offset, len), 0) << "offset " << offset;
  }
  segment.Truncate(bytes / 3);
  std::vector<char> out(bytes, 0);
  const absl::Status shrunk = (*pin)->ReadHost(0, out.data(), bytes, "layers[0].keys");
  EXPECT_EQ(shrunk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shrunk.message()),
              ::testing::HasSubstr("layers[0].keys: reading " + std::to_string(bytes) +
                                   " bytes at offset 0"));
  EXPECT_THAT(std::string(shrunk.message()), ::testing::HasSubstr("shorter than registered"));
}

}  // namespace
}  // namespace kvtrim::service::testing

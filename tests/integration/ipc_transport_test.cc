// CUDA IPC transport end to end on a GPU: this test process plays the worker (it owns the
// device buffers and exports them), a real `kvtrimd --backend=gpu --allow_client_shm` child
// maps them. Sessions over CUDA IPC (dense, token-major strided and paged layouts, with a
// ready event), over host shared memory and over inline bytes, plain and chunked, give the
// indices of inline Compress; output regions on the device hold the lists of inline Compress; region
// misuse gets clear errors and the server keeps serving. Skips without a GPU.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvtrim_client.h"
#include "client/regions.h"
#include "client/shm_segment.h"
#include "gtest/gtest.h"
#include "tests/integration/kvtrimd_process.h"
#include "tests/integration/metrics_scrape.h"

namespace kvtrim {
namespace {

using testing::KvtrimdProcess;

constexpr int kLayers = 3;
constexpr int64_t kHeads = 2, kTokens = 300, kDim = 64, kQHeads = 4, kWindow = 32;
constexpr int64_t kBlock = 16;

/// bf16 bits of `x` (round to nearest even).
uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// Deterministic bf16 values of a tensor with `count` elements.
std::vector<uint16_t> Data(int64_t count, uint64_t seed) {
  std::vector<uint16_t> out(static_cast<size_t>(count));
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 7;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = ToBf16(static_cast<float>(static_cast<double>(state >> 40) / 16777216.0) * 4.0f - 2.0f);
  }
  return out;
}

/// A bf16 tensor proto header of `shape`.
v1::Tensor Header(std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_BF16);
  for (int64_t s : shape) t.add_shape(s);
  return t;
}

/// Worker-side layouts of K/V in the device buffer.
enum class Layout { kDense, kTokenMajor, kPaged };

/// One layer's host data and where its copies sit in the device buffer.
struct HostLayer {
  std::vector<uint16_t> keys, values, queries;  // dense [H, n, d], [H, n, d], [H_q, w, d]
};

/// Rewrites dense [H, n, d] into token-major [n, H, d] or a paged pool [blocks, B, H, d]
/// with the block order reversed (table[b] = blocks - 1 - b).
std::vector<uint16_t> Relayout(const std::vector<uint16_t>& dense, Layout layout) {
  if (layout == Layout::kDense) return dense;
  const int64_t blocks = (kTokens + kBlock - 1) / kBlock;
  std::vector<uint16_t> out(static_cast<size_t>(blocks * kBlock * kHeads * kDim), 0);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t t = 0; t < kTokens; ++t) {
      int64_t token = t * kHeads * kDim;
      if (layout == Layout::kPaged) {
        token = (blocks - 1 - t / kBlock) * kBlock * kHeads * kDim + (t % kBlock) * kHeads * kDim;
      }
      std::memcpy(&out[token + h * kDim], &dense[(h * kTokens + t) * kDim], kDim * 2);
    }
  }
  return out;
}

/// A cuda_ipc tensor of `shape` at `offset` in `region`, in `layout`.
v1::Tensor IpcTensor(const std::string& region, uint64_t offset, std::vector<int64_t> shape,
                     Layout layout) {
  v1::Tensor t = Header(shape);
  v1::RegionSlice* slice = t.mutable_cuda_ipc();
  slice->set_region_id(region);
  slice->set_offset_bytes(offset);
  if (layout != Layout::kDense) {
    slice->add_strides_elements(kDim);
    slice->add_strides_elements(kHeads * kDim);
    slice->add_strides_elements(1);
  }
  if (layout == Layout::kPaged) {
    const int64_t blocks = (kTokens + kBlock - 1) / kBlock;
    slice->mutable_paged()->set_block_tokens(kBlock);
    slice->mutable_paged()->set_block_stride_elements(kBlock * kHeads * kDim);
    for (int64_t b = 0; b < blocks; ++b) slice->mutable_paged()->add_block_table(blocks - 1 - b);
  }
  return t;
}

class IpcTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    const char* binary = std::getenv("KVTRIMD_PATH");
    auto process = KvtrimdProcess::Start(
        binary != nullptr ? binary : KVTRIMD_PATH,
        {"--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--backend=gpu",
         "--allow_client_shm",
         "--workers=2", absl::StrCat("--max_message_bytes=", 64 << 20)});
    ASSERT_TRUE(process.ok()) << process.status();
    process_.emplace(*std::move(process));
    auto addresses = process_->WaitUntilServing(absl::Seconds(120));
    ASSERT_TRUE(addresses.ok()) << addresses.status();
    address_ = addresses->grpc;
    metrics_port_ = addresses->metrics_port();
    ClientOptions options;
    auto client = Client::Connect(address_, options);
    ASSERT_TRUE(client.ok());
    client_ = *std::move(client);
    // The worker's data: every layer dense, token-major and paged, back to back.
    for (int l = 0; l < kLayers; ++l) {
      HostLayer layer;
      layer.keys = Data(kHeads * kTokens * kDim, 10 * l + 1);
      layer.values = Data(kHeads * kTokens * kDim, 10 * l + 2);
      layer.queries = Data(kQHeads * kWindow * kDim, 10 * l + 3);
      layers_.push_back(std::move(layer));
    }
    std::vector<uint16_t> image;
    auto append = [&](const std::vector<uint16_t>& data) {
      const uint64_t at = image.size() * 2;
      image.insert(image.end(), data.begin(), data.end());
      image.resize((image.size() + 127) / 128 * 128, 0);  // 256-byte alignment
      return at;
    };
    for (const HostLayer& layer : layers_) {
      Offsets o;
      for (Layout layout : {Layout::kDense, Layout::kTokenMajor, Layout::kPaged}) {
        o.keys[static_cast<int>(layout)] = append(Relayout(layer.keys, layout));
        o.values[static_cast<int>(layout)] = append(Relayout(layer.values, layout));
      }
      o.queries = append(layer.queries);
      offsets_.push_back(o);
    }
    bytes_ = image.size() * 2;
    ASSERT_EQ(cudaMalloc(&device_, bytes_), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device_, image.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    cudaIpcMemHandle_t handle;
    ASSERT_EQ(cudaIpcGetMemHandle(&handle, device_), cudaSuccess);
    handle_.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    uuid_.assign(reinterpret_cast<const char*>(prop.uuid.bytes), 16);
    ASSERT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming | cudaEventInterprocess),
              cudaSuccess);
    cudaIpcEventHandle_t event_handle;
    ASSERT_EQ(cudaIpcGetEventHandle(&event_handle, event_), cudaSuccess);
    event_handle_.assign(reinterpret_cast<const char*>(&event_handle), sizeof event_handle);
  }

  void TearDown() override {
    if (HasFailure() && process_.has_value()) std::cerr << process_->Log();
    client_.reset();
    if (process_.has_value()) process_->StopWith(SIGTERM, absl::Seconds(20)).IgnoreError();
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (device_ != nullptr) cudaFree(device_);
  }

  /// An inline layer l (the reference).
  v1::LayerInput InlineLayer(int l) const {
    v1::LayerInput layer;
    layer.set_layer_id(l);
    auto fill = [](std::vector<int64_t> shape, const std::vector<uint16_t>& data) {
      v1::Tensor t = Header(shape);
      t.set_inline_data(std::string(reinterpret_cast<const char*>(data.data()), data.size() * 2));
      return t;
    };
    *layer.mutable_keys() = fill({kHeads, kTokens, kDim}, layers_[l].keys);
    *layer.mutable_values() = fill({kHeads, kTokens, kDim}, layers_[l].values);
    *layer.mutable_queries() = fill({kQHeads, kWindow, kDim}, layers_[l].queries);
    return layer;
  }

  /// Layer l as CUDA IPC tensors of `region` in `layout`, waiting on `event` (may be "").
  v1::LayerInput IpcLayer(int l, const std::string& region, Layout layout,
                          const std::string& event) const {
    v1::LayerInput layer;
    layer.set_layer_id(l);
    const int i = static_cast<int>(layout);
    *layer.mutable_keys() = IpcTensor(region, offsets_[l].keys[i], {kHeads, kTokens, kDim}, layout);
    *layer.mutable_values() =
        IpcTensor(region, offsets_[l].values[i], {kHeads, kTokens, kDim}, layout);
    *layer.mutable_queries() =
        IpcTensor(region, offsets_[l].queries, {kQHeads, kWindow, kDim}, Layout::kDense);
    if (!event.empty()) layer.set_ready_event_id(event);
    return layer;
  }

  static v1::CompressionSettings Settings(const std::string& policy) {
    v1::CompressionSettings s;
    s.mutable_policy()->set_name(policy);
    s.mutable_budget()->set_keep_fraction(0.2);
    s.set_num_layers(kLayers);
    return s;
  }

  /// Kept indices by layer id of a session over `layers`.
  absl::StatusOr<std::map<int32_t, std::vector<int32_t>>> RunSession(
      const std::string& policy, std::vector<v1::LayerInput> layers) {
    auto session = client_->OpenSession(Settings(policy));
    if (!session.ok()) return session.status();
    for (auto& layer : layers) {
      // The worker "writes" the layer, records its event, sends without synchronising.
      cudaEventRecord(event_, 0);
      if (auto st = (*session)->SendLayer(std::move(layer)); !st.ok()) return st;
    }
    auto result = (*session)->Finish();
    if (!result.ok()) return result.status();
    std::map<int32_t, std::vector<int32_t>> out;
    for (const auto& l : result->layers) out[l.layer_id()] = {l.indices().begin(), l.indices().end()};
    return out;
  }

  std::map<int32_t, std::vector<int32_t>> InlineAnswers(const std::string& policy) {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings(policy);
    for (int l = 0; l < kLayers; ++l) *request.add_layers() = InlineLayer(l);
    auto response = client_->Compress(request);
    EXPECT_TRUE(response.ok()) << response.status();
    std::map<int32_t, std::vector<int32_t>> out;
    if (!response.ok()) return out;
    for (const auto& l : response->layers()) {
      out[l.layer_id()] = {l.indices().begin(), l.indices().end()};
    }
    return out;
  }

  struct Offsets {
    uint64_t keys[3], values[3], queries;
  };
  std::optional<KvtrimdProcess> process_;
  std::string address_;
  int metrics_port_ = 0;
  std::unique_ptr<Client> client_;
  std::vector<HostLayer> layers_;
  std::vector<Offsets> offsets_;
  void* device_ = nullptr;
  size_t bytes_ = 0;
  std::string handle_, uuid_, event_handle_;
  cudaEvent_t event_ = nullptr;
};

TEST_F(IpcTransportTest, CudaIpcSessionsMatchInlineCompressInEveryLayout) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  auto region = (*lease)->RegisterCudaIpc(handle_, 0, uuid_, bytes_);
  ASSERT_TRUE(region.ok()) << region.status();
  auto event = (*lease)->RegisterCudaIpcEvent(event_handle_, uuid_);
  ASSERT_TRUE(event.ok()) << event.status();
  for (const std::string policy : {"snapkv", "dropkv", "knorm", "keydiff", "tova"}) {
    const auto expected = InlineAnswers(policy);
    ASSERT_EQ(expected.size(), static_cast<size_t>(kLayers));
    for (Layout layout : {Layout::kDense, Layout::kTokenMajor, Layout::kPaged}) {
      SCOPED_TRACE(policy + " layout " + std::to_string(static_cast<int>(layout)));
      std::vector<v1::LayerInput> layers;
      for (int l = 0; l < kLayers; ++l) {
        layers.push_back(IpcLayer(l, *region, layout, l % 2 == 0 ? *event : ""));
      }
      auto answers = RunSession(policy, std::move(layers));
      ASSERT_TRUE(answers.ok()) << answers.status();
      EXPECT_EQ(*answers, expected);
    }
  }
  // Unary Compress over CUDA IPC too.
  v1::CompressRequest request;
  *request.mutable_settings() = Settings("snapkv");
  for (int l = 0; l < kLayers; ++l) *request.add_layers() = IpcLayer(l, *region, Layout::kPaged, "");
  auto response = client_->Compress(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->backend(), "gpu");
  EXPECT_TRUE((*lease)->Close().ok());
}

TEST_F(IpcTransportTest, CudaIpcOutputRegionsHoldTheListsOfEveryOutputShape) {
  // The worker's output buffer and its done event: kvtrim writes every layer's lists there
  // device to device and records the event; the worker reads them after waiting on it.
  constexpr uint64_t kSlot = 64 << 10;  // per layer; needs 8 (L + 1) + 4 L n = 2424 bytes
  void* output = nullptr;
  ASSERT_EQ(cudaMalloc(&output, kLayers * kSlot), cudaSuccess);
  cudaIpcMemHandle_t output_handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&output_handle, output), cudaSuccess);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventInterprocess),
            cudaSuccess);
  cudaIpcEventHandle_t done_handle;
  ASSERT_EQ(cudaIpcGetEventHandle(&done_handle, done), cudaSuccess);
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  auto region = (*lease)->RegisterCudaIpc(handle_, 0, uuid_, bytes_);
  ASSERT_TRUE(region.ok()) << region.status();
  auto out_region = (*lease)->RegisterCudaIpc(
      std::string(reinterpret_cast<const char*>(&output_handle), sizeof output_handle), 0, uuid_,
      kLayers * kSlot);
  ASSERT_TRUE(out_region.ok()) << out_region.status();
  auto done_event = (*lease)->RegisterCudaIpcEvent(
      std::string(reinterpret_cast<const char*>(&done_handle), sizeof done_handle), uuid_);
  ASSERT_TRUE(done_event.ok()) << done_event.status();
  for (const std::string policy : {"dropkv", "snapkv", "knorm"}) {
    for (v1::OutputShape shape : {v1::PER_HEAD, v1::SHARED, v1::BLOCK_ALIGNED, v1::EQUAL_COUNT}) {
      SCOPED_TRACE(policy + " " + v1::OutputShape_Name(shape));
      v1::CompressionSettings settings = Settings(policy);
      settings.set_output_shape(shape);
      if (shape == v1::BLOCK_ALIGNED) settings.set_block_size(16);
      v1::CompressRequest reference;
      *reference.mutable_settings() = settings;
      for (int l = 0; l < kLayers; ++l) *reference.add_layers() = InlineLayer(l);
      auto expected = client_->Compress(reference);
      ASSERT_TRUE(expected.ok()) << expected.status();
      ASSERT_EQ(cudaMemset(output, 0xAB, kLayers * kSlot), cudaSuccess);
      auto session = client_->OpenSession(settings);
      ASSERT_TRUE(session.ok()) << session.status();
      for (int l = 0; l < kLayers; ++l) {
        v1::LayerInput layer = IpcLayer(l, *region, Layout::kDense, "");
        v1::OutputRegion* target = layer.mutable_output();
        target->mutable_cuda_ipc()->set_region_id(*out_region);
        target->mutable_cuda_ipc()->set_offset_bytes(l * kSlot);
        if (l % 2 == 0) target->set_done_event_id(*done_event);
        ASSERT_TRUE((*session)->SendLayer(std::move(layer)).ok());
      }
      auto result = (*session)->Finish();
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->layers.size(), static_cast<size_t>(kLayers));
      // The worker's stream orders after kvtrim's write (the answer also says it is done).
      ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
      std::vector<char> host(kLayers * kSlot);
      ASSERT_EQ(cudaMemcpy(host.data(), output, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (const v1::LayerResult& answer : result->layers) {
        const v1::LayerResult& want = expected->layers(answer.layer_id());
        EXPECT_TRUE(answer.output_written());
        EXPECT_EQ(answer.indices_size(), 0);
        ASSERT_EQ(answer.heads_size(), want.heads_size());
        const char* slot = host.data() + answer.layer_id() * kSlot;
        std::vector<int64_t> offsets(static_cast<size_t>(want.offsets_size()));
        std::memcpy(offsets.data(), slot, offsets.size() * sizeof(int64_t));
        EXPECT_EQ(offsets, std::vector<int64_t>(want.offsets().begin(), want.offsets().end()));
        std::vector<int32_t> indices(static_cast<size_t>(want.indices_size()));
        std::memcpy(indices.data(), slot + offsets.size() * sizeof(int64_t),
                    indices.size() * sizeof(int32_t));
        EXPECT_EQ(indices, std::vector<int32_t>(want.indices().begin(), want.indices().end()))
            << "layer " << answer.layer_id();
      }
    }
  }
  EXPECT_TRUE((*lease)->Close().ok());
  cudaEventDestroy(done);
  cudaFree(output);
}

TEST_F(IpcTransportTest, ElementAlignedCudaIpcTensorsAreCopiedNotMisread) {
  // Tensors at offsets that are a multiple of the element size only (2 bytes for bf16):
  // legal, and read through an aligned copy, never by misaligned vector loads (which would
  // be a sticky device error that stops kvtrimd).
  const size_t kv = kHeads * kTokens * kDim * 2, q = kQHeads * kWindow * kDim * 2;
  const uint64_t keys_at = 2, values_at = keys_at + kv + 6, queries_at = values_at + kv + 10;
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, queries_at + q), cudaSuccess);
  char* base = static_cast<char*>(buffer);
  ASSERT_EQ(cudaMemcpy(base + keys_at, layers_[0].keys.data(), kv, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(base + values_at, layers_[0].values.data(), kv, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(base + queries_at, layers_[0].queries.data(), q, cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, buffer), cudaSuccess);
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  auto region = (*lease)->RegisterCudaIpc(
      std::string(reinterpret_cast<const char*>(&handle), sizeof handle), 0, uuid_,
      queries_at + q);
  ASSERT_TRUE(region.ok()) << region.status();
  for (const std::string policy : {"dropkv", "snapkv", "knorm", "keydiff"}) {
    SCOPED_TRACE(policy);
    v1::CompressRequest reference;
    *reference.mutable_settings() = Settings(policy);
    *reference.add_layers() = InlineLayer(0);
    auto expected = client_->Compress(reference);
    ASSERT_TRUE(expected.ok()) << expected.status();
    v1::CompressRequest request;
    *request.mutable_settings() = Settings(policy);
    v1::LayerInput* layer = request.add_layers();
    *layer->mutable_keys() = IpcTensor(*region, keys_at, {kHeads, kTokens, kDim}, Layout::kDense);
    *layer->mutable_values() =
        IpcTensor(*region, values_at, {kHeads, kTokens, kDim}, Layout::kDense);
    *layer->mutable_queries() =
        IpcTensor(*region, queries_at, {kQHeads, kWindow, kDim}, Layout::kDense);
    auto answer = client_->Compress(request);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(std::vector<int32_t>(answer->layers(0).indices().begin(),
                                   answer->layers(0).indices().end()),
              std::vector<int32_t>(expected->layers(0).indices().begin(),
                                   expected->layers(0).indices().end()));
  }
  EXPECT_TRUE((*lease)->Close().ok());
  cudaFree(buffer);
}

TEST_F(IpcTransportTest, HostShmSessionOnTheGpuBackendMatchesInline) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  const size_t tensor = kHeads * kTokens * kDim * 2, queries = kQHeads * kWindow * kDim * 2;
  auto segment = SharedMemorySegment::Create(UniqueShmName("ipc-test"), kLayers * (2 * tensor + queries));
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto region = (*lease)->RegisterHostShm((*segment)->name(), (*segment)->size());
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<v1::LayerInput> layers;
  uint64_t at = 0;
  for (int l = 0; l < kLayers; ++l) {
    v1::LayerInput layer;
    layer.set_layer_id(l);
    auto place = [&](const std::vector<uint16_t>& data, std::vector<int64_t> shape) {
      std::memcpy(static_cast<char*>((*segment)->data()) + at, data.data(), data.size() * 2);
      v1::Tensor t = Header(shape);
      t.mutable_host_shm()->set_region_id(*region);
      t.mutable_host_shm()->set_offset_bytes(at);
      at += data.size() * 2;
      return t;
    };
    *layer.mutable_keys() = place(layers_[l].keys, {kHeads, kTokens, kDim});
    *layer.mutable_values() = place(layers_[l].values, {kHeads, kTokens, kDim});
    *layer.mutable_queries() = place(layers_[l].queries, {kQHeads, kWindow, kDim});
    layers.push_back(std::move(layer));
  }
  const auto expected = InlineAnswers("snapkv");
  auto answers = RunSession("snapkv", std::move(layers));
  ASSERT_TRUE(answers.ok()) << answers.status();
  EXPECT_EQ(*answers, expected);
  // The segment was page-locked (--max_pinned_shm_bytes): its tensors went by DMA.
  EXPECT_NE(process_->Log().find("bytes page-locked"), std::string::npos) << process_->Log();
}

// A page-locked host shm segment: NaN found on the device and named as the host check
// names it; head dims above the GPU kernels' limit (the CPU fallback) copied out by DMA and
// scanned; a segment the worker shrinks after registering it never faults kvtrimd.
TEST_F(IpcTransportTest, PinnedHostShmIsCheckedOnTheDeviceAndSurvivesAShrunkSegment) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  constexpr int64_t kWideDim = 320;  // above GpuBackend::kMaxGpuHeadDim
  const size_t tensor = kHeads * kTokens * kWideDim * 2;
  auto segment = SharedMemorySegment::Create(UniqueShmName("ipc-pinned"), 2 * tensor);
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto region = (*lease)->RegisterHostShm((*segment)->name(), (*segment)->size());
  ASSERT_TRUE(region.ok()) << region.status();
  char* base = static_cast<char*>((*segment)->data());
  auto shm_tensor = [&](uint64_t at, std::vector<int64_t> shape) {
    v1::Tensor t = Header(shape);
    t.mutable_host_shm()->set_region_id(*region);
    t.mutable_host_shm()->set_offset_bytes(at);
    return t;
  };
  auto compress = [&](const v1::LayerInput& layer) {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings("knorm");
    *request.add_layers() = layer;
    return client_->Compress(request);
  };
  // d = 64 keys with a NaN at [1, 2, 3]: the device probe's message.
  {
    std::vector<uint16_t> keys = Data(kHeads * kTokens * kDim, 7);
    keys[(1 * kTokens + 2) * kDim + 3] = 0x7FC0;
    std::memcpy(base, keys.data(), keys.size() * 2);
    v1::LayerInput layer;
    *layer.mutable_keys() = shm_tensor(0, {kHeads, kTokens, kDim});
    auto response = compress(layer);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
    EXPECT_NE(response.status().message().find("layers[0].keys: contains NaN at [1, 2, 3]"),
              std::string::npos) << response.status();
  }
  // d = 320 (the CPU fallback): the same kept sets as inline; then a NaN found there.
  std::vector<uint16_t> wide = Data(kHeads * kTokens * kWideDim, 8);
  std::memcpy(base + tensor, wide.data(), tensor);
  v1::LayerInput inline_layer;
  *inline_layer.mutable_keys() = Header({kHeads, kTokens, kWideDim});
  inline_layer.mutable_keys()->set_inline_data(std::string(base + tensor, tensor));
  auto expected = compress(inline_layer);
  ASSERT_TRUE(expected.ok()) << expected.status();
  v1::LayerInput wide_layer;
  *wide_layer.mutable_keys() = shm_tensor(tensor, {kHeads, kTokens, kWideDim});
  auto answer = compress(wide_layer);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->layers_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(answer->layers(0).indices().begin(),
                                 answer->layers(0).indices().end()),
            std::vector<int32_t>(expected->layers(0).indices().begin(),
                                 expected->layers(0).indices().end()));
  const uint16_t inf = 0x7F80;
  std::memcpy(base + tensor + 2 * ((0 * kTokens + 9) * kWideDim + 300), &inf, 2);
  auto wide_nan = compress(wide_layer);
  EXPECT_EQ(wide_nan.status().code(), absl::StatusCode::kInvalidArgument) << wide_nan.status();
  EXPECT_NE(wide_nan.status().message().find("layers[0].keys: contains Inf at [0, 9, 300]"),
            std::string::npos) << wide_nan.status();
  // The worker shrinks its segment to nothing: stale pages or an error, never a crash.
  // (This process no longer touches its own mapping past the new end either.)
  const int fd = shm_open((*segment)->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  v1::LayerInput small;
  *small.mutable_keys() = shm_tensor(0, {kHeads, kTokens, kDim});
  for (const v1::LayerInput* layer : {&small, &wide_layer}) {  // the DMA, the fallback's copy
    auto after = compress(*layer);
    if (!after.ok()) {
      EXPECT_NE(after.status().code(), absl::StatusCode::kUnavailable)
          << "d=" << layer->keys().shape(2) << ": " << after.status();
    }
  }
  v1::CompressRequest request;
  *request.mutable_settings() = Settings("snapkv");
  *request.add_layers() = InlineLayer(0);
  EXPECT_TRUE(client_->Compress(request).ok());
  EXPECT_TRUE(process_->Running());
}

// DropKV and SnapKV check the K / V they read for NaN / Inf in their own first pass (no
// separate probe of those): each bad element is still named exactly, dense or gathered from a
// token-major layout, and the clean layers around it are unaffected.
TEST_F(IpcTransportTest, NonFiniteKAndVAreFoundByTheScorersOwnPass) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  auto region = (*lease)->RegisterCudaIpc(handle_, 0, uuid_, bytes_);
  ASSERT_TRUE(region.ok()) << region.status();
  auto poke = [&](uint64_t at, uint16_t bits) {
    uint16_t old = 0;
    EXPECT_EQ(cudaMemcpy(&old, static_cast<char*>(device_) + at, 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(static_cast<char*>(device_) + at, &bits, 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    return old;
  };
  auto compress = [&](const std::string& policy, Layout layout) {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings(policy);
    *request.add_layers() = IpcLayer(2, *region, layout, "");
    return client_->Compress(request);
  };
  struct Case {
    const char* policy;
    Layout layout;
    bool in_values;
    uint16_t bits;
    const char* message;
  };
  const int64_t h = 1, t = 7, c = 3;
  const char* kValuesNaN = "layers[0].values: contains NaN at [1, 7, 3]";
  const char* kKeysInf = "layers[0].keys: contains Inf at [1, 7, 3]";
  for (const Case& bad : {Case{"dropkv", Layout::kDense, true, 0x7FC0, kValuesNaN},
                          Case{"dropkv", Layout::kDense, false, 0xFF80, kKeysInf},
                          Case{"snapkv", Layout::kDense, false, 0x7F80, kKeysInf},
                          Case{"dropkv", Layout::kTokenMajor, true, 0x7FC0, kValuesNaN}}) {
    const int li = static_cast<int>(bad.layout);
    const uint64_t base = bad.in_values ? offsets_[2].values[li] : offsets_[2].keys[li];
    const int64_t element = bad.layout == Layout::kDense ? (h * kTokens + t) * kDim + c
                                                         : (t * kHeads + h) * kDim + c;
    const uint16_t old = poke(base + 2 * element, bad.bits);
    auto response = compress(bad.policy, bad.layout);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.policy << ": " << response.status();
    EXPECT_NE(response.status().message().find(bad.message), std::string::npos)
        << response.status();
    poke(base + 2 * element, old);
    auto clean = compress(bad.policy, bad.layout);
    EXPECT_TRUE(clean.ok()) << bad.policy << " after the repair: " << clean.status();
  }
}

TEST_F(IpcTransportTest, InlineSessionsPlainAndChunkedMatchInlineCompress) {
  for (int64_t chunk : {int64_t{0}, int64_t{4096}, int64_t{65536}}) {
    ClientOptions options;
    options.session_chunk_bytes = chunk;
    auto client = Client::Connect(address_, options);
    ASSERT_TRUE(client.ok());
    for (const std::string policy : {"snapkv", "dropkv"}) {
      const auto expected = InlineAnswers(policy);
      auto session = (*client)->OpenSession(Settings(policy));
      ASSERT_TRUE(session.ok()) << session.status();
      for (int l = 0; l < kLayers; ++l) ASSERT_TRUE((*session)->SendLayer(InlineLayer(l)).ok());
      auto result = (*session)->Finish();
      ASSERT_TRUE(result.ok()) << result.status();
      std::map<int32_t, std::vector<int32_t>> answers;
      for (const auto& l : result->layers) {
        answers[l.layer_id()] = {l.indices().begin(), l.indices().end()};
      }
      EXPECT_EQ(answers, expected) << policy << " chunk " << chunk;
    }
  }
}

// A session's chunked tensors of 1 MiB or more arrive in kvtrimd's pooled host buffers,
// page-locked once: the device copies each by one DMA and checks it for NaN / Inf itself.
// The kept sets equal inline Compress's, a NaN is named exactly, the gauge shows the locked
// buffers, and the CPU fallback (d > 256) reads them through the device.
TEST_F(IpcTransportTest, ChunkedLayersArriveInPageLockedBuffersAndAreCheckedOnTheDevice) {
  constexpr int64_t kLongTokens = 8192;  // keys and values [2, 8192, 64] bf16: 2 MiB each
  auto bytes_of = [](const std::vector<uint16_t>& data) {
    return std::string(reinterpret_cast<const char*>(data.data()), data.size() * 2);
  };
  auto make_layer = [&](int64_t dim, std::vector<uint16_t> values) {
    v1::LayerInput layer;
    *layer.mutable_keys() = Header({kHeads, kLongTokens, dim});
    layer.mutable_keys()->set_inline_data(bytes_of(Data(kHeads * kLongTokens * dim, 51)));
    *layer.mutable_values() = Header({kHeads, kLongTokens, dim});
    layer.mutable_values()->set_inline_data(bytes_of(values));
    *layer.mutable_queries() = Header({kQHeads, kWindow, dim});
    layer.mutable_queries()->set_inline_data(bytes_of(Data(kQHeads * kWindow * dim, 53)));
    return layer;
  };
  ClientOptions options;
  options.session_chunk_bytes = 256 << 10;
  auto chunking = Client::Connect(address_, options);
  ASSERT_TRUE(chunking.ok());
  auto in_session = [&](const std::string& policy, const v1::LayerInput& layer)
      -> absl::StatusOr<std::vector<int32_t>> {
    auto session = (*chunking)->OpenSession(Settings(policy));
    if (!session.ok()) return session.status();
    if (auto st = (*session)->SendLayer(layer); !st.ok()) return st;
    auto result = (*session)->Finish();
    if (!result.ok()) return result.status();
    if (result->layers.size() != 1) return absl::InternalError("not one layer answered");
    return std::vector<int32_t>(result->layers[0].indices().begin(),
                                result->layers[0].indices().end());
  };
  auto inline_compress = [&](const std::string& policy, const v1::LayerInput& layer) {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings(policy);
    *request.add_layers() = layer;
    auto response = client_->Compress(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? std::vector<int32_t>(response->layers(0).indices().begin(),
                                                response->layers(0).indices().end())
                         : std::vector<int32_t>();
  };
  // d = 64 on the device, d = 320 through the CPU fallback.
  for (int64_t dim : {kDim, int64_t{320}}) {
    const v1::LayerInput layer = make_layer(dim, Data(kHeads * kLongTokens * dim, 52));
    auto answer = in_session("dropkv", layer);
    ASSERT_TRUE(answer.ok()) << "d=" << dim << ": " << answer.status();
    EXPECT_EQ(*answer, inline_compress("dropkv", layer)) << "d=" << dim;
    std::vector<uint16_t> values = Data(kHeads * kLongTokens * dim, 52);
    values[(1 * kLongTokens + 7) * dim + 3] = 0x7FC0;
    auto nan = in_session("dropkv", make_layer(dim, std::move(values)));
    EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument) << nan.status();
    EXPECT_NE(nan.status().message().find("values: contains NaN at [1, 7, 3]"),
              std::string::npos) << "d=" << dim << ": " << nan.status();
  }
  auto text = testing::HttpGet("127.0.0.1", metrics_port_, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  auto samples = testing::ParseExposition(*text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_GE(testing::MetricsSnapshot(*samples).Sum("kvtrim_pinned_buffer_bytes", {}),
            2.0 * (2 << 20));
}

TEST_F(IpcTransportTest, RegionMisuseGetsClearErrorsAndTheServerKeepsServing) {
  auto lease = client_->OpenRegionLease();
  ASSERT_TRUE(lease.ok()) << lease.status();
  client_->SetClientId((*lease)->client_id());
  // A handle "from another device": the uuid is not kvtrimd's.
  std::string other_uuid = uuid_;
  other_uuid[0] = static_cast<char>(other_uuid[0] ^ 0x5A);
  auto wrong_device = (*lease)->RegisterCudaIpc(handle_, 1, other_uuid, bytes_);
  EXPECT_EQ(wrong_device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_device.status().message().find("register_region.cuda_ipc.device_uuid"),
            std::string::npos) << wrong_device.status();
  // A handle the driver refuses.
  auto garbage = (*lease)->RegisterCudaIpc(std::string(64, '\x11'), 0, uuid_, bytes_);
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument) << garbage.status();
  // More bytes than the allocation has.
  auto too_big = (*lease)->RegisterCudaIpc(handle_, 0, uuid_, bytes_ + (64 << 20));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument) << too_big.status();
  EXPECT_NE(too_big.status().message().find("size_bytes"), std::string::npos);
  auto region = (*lease)->RegisterCudaIpc(handle_, 0, uuid_, bytes_);
  ASSERT_TRUE(region.ok()) << region.status();
  // Offset + size outside the region.
  {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings("knorm");
    v1::LayerInput layer = IpcLayer(0, *region, Layout::kDense, "");
    layer.mutable_keys()->mutable_cuda_ipc()->set_offset_bytes(bytes_ - 256);
    *request.add_layers() = layer;
    auto response = client_->Compress(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(response.status().message().find("layers[0].keys.cuda_ipc.offset_bytes"),
              std::string::npos) << response.status();
  }
  // NaN inside device memory: found on the device, named like the host check.
  {
    const uint16_t nan = 0x7FC0;
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(device_) + offsets_[1].keys[0] + 2 * (kDim + 5), &nan,
                         2, cudaMemcpyHostToDevice),
              cudaSuccess);
    v1::CompressRequest request;
    *request.mutable_settings() = Settings("knorm");
    *request.add_layers() = IpcLayer(1, *region, Layout::kDense, "");
    auto response = client_->Compress(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(response.status().message().find("layers[0].keys: contains NaN at [0, 1, 5]"),
              std::string::npos) << response.status();
  }
  // Another client's region.
  auto other = client_->OpenRegionLease();
  ASSERT_TRUE(other.ok());
  client_->SetClientId((*other)->client_id());
  {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings("knorm");
    *request.add_layers() = IpcLayer(0, *region, Layout::kDense, "");
    auto response = client_->Compress(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kPermissionDenied) << response.status();
  }
  // Disconnect with regions registered: released, and the id is gone.
  client_->SetClientId((*lease)->client_id());
  lease->reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    v1::CompressRequest request;
    *request.mutable_settings() = Settings("knorm");
    *request.add_layers() = IpcLayer(0, *region, Layout::kDense, "");
    auto response = client_->Compress(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound) << response.status();
  }
  // Still serving.
  v1::CompressRequest request;
  *request.mutable_settings() = Settings("snapkv");
  *request.add_layers() = InlineLayer(0);
  EXPECT_TRUE(client_->Compress(request).ok());
  EXPECT_TRUE(process_->Running());
}

}  // namespace
}  // namespace kvtrim

// kvtrim-c-session-bench: serial CUDA IPC sessions through libkvtrim's C ABI
// (kvtrim_session_send / kvtrim_session_answer), the calls the Python client's native
// transport makes, from C++ with no interpreter. It sits between kvtrim-loadgen (the C++
// client with its regions registered up front) and the Python client in
// tools/python_client_bench.py: Python − this = the interpreter's share, this − loadgen =
// libkvtrim's own (region lookups per tensor, the ready-event check, the answer's copy and
// serialization).
//
// Each layer is laid out as torch lays it out: keys, values and queries in their own
// cudaMalloc allocations, an output buffer of its own per layer (--device_outputs); or, with
// --one_allocation, as the load generator does: slots of one allocation. Per
// layer it times filling the kvtrim_layer, kvtrim_session_send, kvtrim_session_answer (the
// wait and the answer's bytes) and parsing the answer; writes JSON (p50 / min / max of each)
// to --json_out and one line per stage to stdout.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kvtrim/v1/kvtrim.pb.h"
#include "libkvtrim/kvtrim_c.h"

ABSL_FLAG(std::string, target, "", "kvtrimd address (--backend=gpu --allow_client_shm)");
ABSL_FLAG(int32_t, tokens, 4096, "n: tokens per layer");
ABSL_FLAG(int32_t, layers, 8, "layers per session");
ABSL_FLAG(int32_t, prefills, 8, "timed sessions");
ABSL_FLAG(int32_t, warmup_prefills, 1, "untimed sessions first");
ABSL_FLAG(int32_t, kv_heads, 8, "H_kv");
ABSL_FLAG(int32_t, q_heads, 32, "H_q");
ABSL_FLAG(int32_t, head_dim, 128, "d");
ABSL_FLAG(int32_t, window, 32, "w: query window");
ABSL_FLAG(bool, device_outputs, true, "kvtrimd writes each layer's lists into a device "
          "buffer of the caller (else the lists come in the answer)");
ABSL_FLAG(std::string, json_out, "", "where to write the JSON (empty: stdout only)");
ABSL_FLAG(bool, one_allocation, false, "every layer's tensors and output in slots of one "
          "cudaMalloc block, as kvtrim-loadgen lays them out (one region), instead of one "
          "allocation per tensor as torch does");
ABSL_FLAG(bool, profile, false, "ask kvtrimd for each layer's stage profile: p50 of each stage "
          "into the JSON's \"profile_p50_s\" (compare kvtrim-loadgen --profile)");
ABSL_FLAG(bool, primitives, false, "also time the CUDA calls the native client's send makes "
          "(mean of 2000 calls each), into the JSON's \"primitives_s\"");

namespace {

using Clock = std::chrono::steady_clock;

/// Seconds between two clock readings.
double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// {p50, min, max, count} of `values` as a JSON object.
std::string SummaryJson(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  double p50 = 0;
  if (n > 0) p50 = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return absl::StrCat("{\"p50\": ", p50, ", \"min\": ", n ? values.front() : 0,
                      ", \"max\": ", n ? values.back() : 0, ", \"count\": ", n, "}");
}

/// One layer's device allocations: keys, values [H_kv, n, d] and queries [H_q, w, d] bf16,
/// and the output buffer (8 (H_kv + 1) + 4 H_kv n bytes) when asked.
struct DeviceLayer {
  void* keys = nullptr;
  void* values = nullptr;
  void* queries = nullptr;
  void* output = nullptr;
  uint64_t output_bytes = 0;
};

/// cudaMalloc of `bytes` filled with small random bf16 values (the same for every call).
void* RandomBf16(size_t elements) {
  std::vector<uint16_t> host(elements);
  uint32_t state = 12345;
  for (uint16_t& x : host) {
    state = state * 1664525u + 1013904223u;
    const float f = static_cast<float>((state >> 8) & 0xffff) / 65536.0f - 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    x = static_cast<uint16_t>(bits >> 16);
  }
  void* device = nullptr;
  if (cudaMalloc(&device, elements * 2) != cudaSuccess ||
      cudaMemcpy(device, host.data(), elements * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
    std::cerr << "cudaMalloc / cudaMemcpy failed\n";
    std::exit(1);
  }
  return device;
}

/// A bf16 kvtrim_tensor [a, b, c] (dense) on device 0.
kvtrim_tensor Tensor(const void* data, int64_t a, int64_t b, int64_t c) {
  kvtrim_tensor t{};
  t.data = data;
  t.dtype = kvtrim::v1::DTYPE_BF16;
  t.device = 0;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  return t;
}

/// Exits with `what` and the library's message when `code` is not OK.
void Check(int32_t code, const char* what, const char* error) {
  if (code != 0) {
    std::cerr << what << " failed (" << code << "): " << error << "\n";
    std::exit(1);
  }
}

/// Appends every stage of `profile` to `stages` (by field name).
void AddProfile(const kvtrim::v1::LayerProfile& profile,
                std::map<std::string, std::vector<double>>* stages) {
  const google::protobuf::Descriptor* descriptor = profile.GetDescriptor();
  const google::protobuf::Reflection* reflection = profile.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    (*stages)[field->name()].push_back(reflection->GetDouble(profile, field));
  }
}

/// {"stage": p50, ...} of `stages`.
std::string ProfileJson(const std::map<std::string, std::vector<double>>& stages) {
  std::string json = "{";
  for (auto [name, values] : stages) {
    std::sort(values.begin(), values.end());
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", name, "\": ",
                    values[values.size() / 2]);
  }
  return json + "}";
}

/// Mean seconds of `call()` over 2000 calls (after 100 untimed).
template <typename Call>
double MeanSeconds(Call call) {
  for (int i = 0; i < 100; ++i) call();
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < 2000; ++i) call();
  return Seconds(start, Clock::now()) / 2000;
}

/// {"name": mean seconds, ...} of the CUDA calls one native-client send makes per tensor and
/// per layer, on `pointer` (a device allocation) and `stream` (idle).
std::string PrimitivesJson(void* pointer, cudaStream_t stream) {
  using Attributes = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &entry, 12000, cudaEnableDefault,
                                   &found);
  const auto attributes = reinterpret_cast<Attributes>(entry);
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;
  CUpointer_attribute names[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void* values[] = {&base, &size, &buffer_id};
  const CUdeviceptr address = reinterpret_cast<CUdeviceptr>(pointer) + 256;
  int device = 0;
  cudaEvent_t event = nullptr;
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess);
  const std::pair<const char*, double> rows[] = {
      {"cuPointerGetAttributes (3)", MeanSeconds([&] { attributes(3, names, values, address); })},
      {"cudaGetDevice", MeanSeconds([&] { cudaGetDevice(&device); })},
      {"cudaSetDevice (current)", MeanSeconds([&] { cudaSetDevice(0); })},
      {"cudaStreamQuery (idle stream)", MeanSeconds([&] { cudaStreamQuery(stream); })},
      {"cudaStreamQuery (legacy default)", MeanSeconds([&] { cudaStreamQuery(nullptr); })},
      {"cudaEventRecord (interprocess)", MeanSeconds([&] { cudaEventRecord(event, stream); })}};
  cudaEventDestroy(event);
  std::string json = "{";
  for (const auto& [name, seconds] : rows) {
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", name, "\": ", seconds);
  }
  return json + "}";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t n = absl::GetFlag(FLAGS_tokens), h_kv = absl::GetFlag(FLAGS_kv_heads);
  const int64_t h_q = absl::GetFlag(FLAGS_q_heads), d = absl::GetFlag(FLAGS_head_dim);
  const int64_t w = absl::GetFlag(FLAGS_window);
  const int32_t layers = absl::GetFlag(FLAGS_layers);
  const bool device_outputs = absl::GetFlag(FLAGS_device_outputs);
  std::vector<DeviceLayer> device(layers);
  for (DeviceLayer& layer : device) {
    layer.keys = RandomBf16(h_kv * n * d);
    layer.values = RandomBf16(h_kv * n * d);
    layer.queries = RandomBf16(h_q * w * d);
    if (device_outputs) {
      layer.output_bytes = 8 * (h_kv + 1) + 4 * h_kv * n;
      if (cudaMalloc(&layer.output, layer.output_bytes) != cudaSuccess) return 1;
    }
  }
  char* block = nullptr;  // --one_allocation: [layers] slots of keys, values, queries, output
  if (absl::GetFlag(FLAGS_one_allocation)) {
    const auto align = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };
    const uint64_t kv = align(h_kv * n * d * 2), qb = align(h_q * w * d * 2);
    const uint64_t slot = 2 * kv + qb + align(8 * (h_kv + 1) + 4 * h_kv * n);
    if (cudaMalloc(&block, slot * layers) != cudaSuccess) return 1;
    for (int32_t id = 0; id < layers; ++id) {
      DeviceLayer& layer = device[id];
      char* base = block + slot * id;
      cudaMemcpy(base, layer.keys, h_kv * n * d * 2, cudaMemcpyDeviceToDevice);
      cudaMemcpy(base + kv, layer.values, h_kv * n * d * 2, cudaMemcpyDeviceToDevice);
      cudaMemcpy(base + 2 * kv, layer.queries, h_q * w * d * 2, cudaMemcpyDeviceToDevice);
      for (void* own : {layer.keys, layer.values, layer.queries, layer.output}) cudaFree(own);
      layer = DeviceLayer{base, base + kv, base + 2 * kv,
                          device_outputs ? base + 2 * kv + qb : nullptr, layer.output_bytes};
    }
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  char error[4096] = {0};
  kvtrim_client* client = nullptr;
  Check(kvtrim_client_connect(absl::GetFlag(FLAGS_target).c_str(), 30, 256 << 20, nullptr,
                              &client, error, sizeof(error)),
        "kvtrim_client_connect", error);
  kvtrim::v1::CompressionSettings settings;
  settings.mutable_policy()->set_name("dropkv");
  settings.mutable_budget()->set_keep_fraction(0.2);
  settings.set_perturbation(kvtrim::v1::PERTURBATION_OFF);
  settings.set_answer_encoding(kvtrim::v1::ANSWER_ENCODING_PACKED);
  settings.set_profile(absl::GetFlag(FLAGS_profile));
  const std::string settings_bytes = settings.SerializeAsString();

  std::vector<double> fill_s, send_s, answer_s, parse_s, total_s;
  std::map<std::string, std::vector<double>> stages;
  const int32_t sessions = absl::GetFlag(FLAGS_warmup_prefills) + absl::GetFlag(FLAGS_prefills);
  for (int32_t s = 0; s < sessions; ++s) {
    const bool timed = s >= absl::GetFlag(FLAGS_warmup_prefills);
    kvtrim_session* session = nullptr;
    int32_t regions = 0;
    Check(kvtrim_session_open(client, settings_bytes.data(), settings_bytes.size(), 1, &regions,
                              &session, error, sizeof(error)),
          "kvtrim_session_open", error);
    if (regions == 0) {
      std::cerr << "kvtrimd refused the Regions lease (run it with --allow_client_shm)\n";
      return 1;
    }
    for (int32_t id = 0; id < layers; ++id) {
      const Clock::time_point t0 = Clock::now();
      kvtrim_layer layer{};
      layer.layer_id = id;
      layer.keys = Tensor(device[id].keys, h_kv, n, d);
      layer.values = Tensor(device[id].values, h_kv, n, d);
      layer.queries = Tensor(device[id].queries, h_q, w, d);
      layer.output = device[id].output;
      layer.output_capacity = device[id].output_bytes;
      const Clock::time_point t1 = Clock::now();
      Check(kvtrim_session_send(session, &layer, stream, error, sizeof(error)),
            "kvtrim_session_send", error);
      const Clock::time_point t2 = Clock::now();
      void* answer = nullptr;
      size_t size = 0;
      Check(kvtrim_session_answer(session, id, &answer, &size, error, sizeof(error)),
            "kvtrim_session_answer", error);
      const Clock::time_point t3 = Clock::now();
      kvtrim::v1::LayerResult result;
      const bool parsed = result.ParseFromArray(answer, static_cast<int>(size));
      kvtrim_buffer_free(answer);
      const Clock::time_point t4 = Clock::now();
      if (!parsed || result.output_written() != device_outputs) {
        std::cerr << "layer " << id << ": unexpected answer\n";
        return 1;
      }
      if (timed) {
        fill_s.push_back(Seconds(t0, t1));
        send_s.push_back(Seconds(t1, t2));
        answer_s.push_back(Seconds(t2, t3));
        parse_s.push_back(Seconds(t3, t4));
        total_s.push_back(Seconds(t0, t4));
        if (result.has_profile()) AddProfile(result.profile(), &stages);
      }
    }
    void *all = nullptr, *summary = nullptr;
    size_t all_size = 0, summary_size = 0;
    Check(kvtrim_session_finish(session, &all, &all_size, &summary, &summary_size, error,
                                sizeof(error)),
          "kvtrim_session_finish", error);
    kvtrim_buffer_free(all);
    kvtrim_buffer_free(summary);
    kvtrim_session_free(session);
  }
  kvtrim_client_free(client);

  const std::string json = absl::StrCat(
      "{\"generated_by\": \"kvtrim-c-session-bench\", \"tokens\": ", n, ", \"layers\": ", layers,
      ", \"device_outputs\": ", device_outputs ? "true" : "false",
      ",\n \"serial_latency_s\": ", SummaryJson(total_s), ",\n \"fill_s\": ",
      SummaryJson(fill_s), ",\n \"send_s\": ", SummaryJson(send_s), ",\n \"answer_s\": ",
      SummaryJson(answer_s), ",\n \"parse_s\": ", SummaryJson(parse_s),
      stages.empty() ? std::string()
                     : absl::StrCat(",\n \"profile_p50_s\": ", ProfileJson(stages)),
      absl::GetFlag(FLAGS_primitives)
          ? absl::StrCat(",\n \"primitives_s\": ", PrimitivesJson(device[0].keys, stream))
          : std::string(),
      "}\n");
  std::cout << json;
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream(path) << json;
  }
  for (DeviceLayer& layer : device) {
    if (block != nullptr) break;
    cudaFree(layer.keys);
    cudaFree(layer.values);
    cudaFree(layer.queries);
    if (layer.output != nullptr) cudaFree(layer.output);
  }
  cudaFree(block);
  cudaStreamDestroy(stream);
  return 0;
}

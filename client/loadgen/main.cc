// kvtrim-loadgen: plays a model's prefill against a running kvtrimd from one or more
// concurrent workers and reports per-layer latency, server compute time, prefill wall time
// and wire throughput, for the inline, host_shm and cuda_ipc transports.
//
//   kvtrim-loadgen --target=localhost:50051 --transport=inline --workers=4 --json_out=r.json
//
// Exit codes: 0 every worker ran every prefill, 1 a worker or the server failed, 2 usage.
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <algorithm>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cli/flag_parse.h"
#include "client/kvtrim_client.h"
#include "client/loadgen/config.h"
#include "client/loadgen/memcpy_bench.h"
#include "client/loadgen/report.h"
#include "client/loadgen/rpc_floor.h"
#include "client/loadgen/synthetic.h"
#include "client/loadgen/worker.h"
#include "client/numerics.h"

ABSL_FLAG(std::string, target, "localhost:50051", "kvtrimd address (any gRPC target)");
ABSL_FLAG(std::string, transport, "inline",
          "inline (bytes in the messages) | host_shm (one POSIX shm segment) | cuda_ipc (one "
          "cudaMalloc buffer); region transports need kvtrimd --allow_client_shm");
ABSL_FLAG(std::string, policy, "dropkv", "policy preset or SCORER+ALLOCATOR");
ABSL_FLAG(double, keep_fraction, 0.2, "budget: fraction of the n tokens kept per head");
ABSL_FLAG(bool, profile, true,
          "ask kvtrimd for each layer's per-stage times (settings.profile) and report them "
          "(the \"stage_profile\" of --json_out); --noprofile leaves them out");
ABSL_FLAG(bool, packed_answer, true,
          "ask for the kept lists as packed little-endian bytes (answer_encoding PACKED); "
          "--nopacked_answer asks for the repeated offsets / indices fields");
ABSL_FLAG(std::string, perturbation, "full",
          "the output perturbation statistic: full (every window row), sampled (fast numerics: "
          "the last 8 rows of each query head) or off");
ABSL_FLAG(std::string, numerics, "",
          "fast | exact; empty leaves it to the server (kvtrimd --numerics). The report counts "
          "the layers the server computed in each mode");
ABSL_FLAG(int32_t, layers, 32, "layers per prefill (L)");
ABSL_FLAG(int64_t, tokens, 32768, "prompt tokens (n)");
ABSL_FLAG(int32_t, kv_heads, 8, "KV heads (H_kv)");
ABSL_FLAG(int32_t, q_heads, 32, "query heads (H_q, a multiple of H_kv)");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension (d)");
ABSL_FLAG(int32_t, window, 32, "window query rows (w)");
ABSL_FLAG(std::string, dtype, "bf16", "bf16 | f16 | f32");
ABSL_FLAG(int32_t, workers, 1,
          "concurrent workers (threads), each with its own channel and, for region "
          "transports, its own lease and buffers");
ABSL_FLAG(int32_t, prefills, 3, "measured prefills per worker (closed loop)");
ABSL_FLAG(int32_t, warmup_prefills, 1, "unmeasured prefills per worker before them");
ABSL_FLAG(int64_t, chunk_bytes, 4 << 20,
          "inline: tensors longer than this go in tensor_chunk messages of this size "
          "(0 = one message per layer; kvtrimd's --max_message_bytes must allow each)");
ABSL_FLAG(bool, send_optional, false,
          "also send the policy's optional inputs (e.g. values for the perturbation statistic "
          "of a key-only policy); default: only what the policy requires");
ABSL_FLAG(bool, serial, false,
          "wait for each layer's answer before sending the next (default: pipelined)");
ABSL_FLAG(std::string, json_out, "", "write the results as one JSON object to this file");
ABSL_FLAG(uint64_t, seed, 0, "seed of the synthetic data (and of the settings)");
ABSL_FLAG(int32_t, device, 0, "cuda_ipc: CUDA device ordinal");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20, "largest gRPC message sent or received");
ABSL_FLAG(double, timeout_s, 600, "deadline in seconds of each session stream");
ABSL_FLAG(int32_t, http2_window_bytes, 0,
          "HTTP/2 flow-control window and largest frame of each worker's channel, bytes "
          "(0 = gRPC's defaults); kvtrimd has the same flag for its side");
ABSL_FLAG(std::string, model_digest, "",
          "settings.model_digest: a model registered beforehand (kvtrim register-model), for "
          "the model-aware policies (criticalkv, laprox, expected_attention, lukv)");
ABSL_FLAG(bool, shared_connection, false,
          "workers share one connection (gRPC's process-wide subchannel pool) instead of one "
          "each");
ABSL_FLAG(bool, output_region, false,
          "cuda_ipc: kvtrim writes each layer's kept lists into a device output region of the "
          "worker (LayerInput.output) and records its event; the answer carries no lists");
ABSL_FLAG(bool, rewrite_per_layer, false,
          "host_shm: copy the layer into the segment again before each layer (counted in "
          "the layer's latency)");

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

/// The usage text with every flag.
std::string Usage() {
  return absl::StrCat(
      "usage: kvtrim-loadgen [flags]\n\n"
      "Plays prefills (one CompressSession of --layers layers each) against kvtrimd and\n"
      "prints latency and throughput. Values / queries are sent only when the policy lists\n"
      "them in its inputs or optional inputs.\n\n"
      "JSON (--json_out): config{target, transport, policy, keep_fraction, layers, tokens,\n"
      "kv_heads, q_heads, head_dim, window, dtype, workers, prefills, warmup_prefills,\n"
      "chunk_bytes, serial, seed, device, max_message_bytes, rewrite_per_layer, output_region,\n"
      "http2_window_bytes, shared_connection, model_digest,\n"
      "send_values, send_queries, numerics, profile, perturbation}, backend, layer_latency_s,\n"
      "layer_prepare_s, serial_wait_latency_s (--serial: until WaitForAnswer returned),\n"
      "serial_send_s (--serial: SendLayer alone),\n"
      "server_compute_s, prefill_wall_s (each {count, mean, p50, p99, min, max}),\n"
      "wire_bytes_per_prefill, layers_by_numerics{fast, exact}, stage_profile{order[],\n"
      "stages{<stage>: {where, count, mean, p50, p99, min, max}}} (null without --profile;\n"
      "the stages of kvtrimd's LayerResult.profile in seconds, plus outside_server = the\n"
      "layer's round trip minus the server's time),\n"
      "workers[{worker, prefills, wire_bytes, wall_s, throughput_bytes_per_s, ok, error,\n"
      "notes}], aggregate{prefills, wire_bytes, run_wall_s, throughput_bytes_per_s},\n"
      "host_memcpy{buffer_bytes, repeats, best_bytes_per_s}, host_memcpy_all_cores{threads,\n"
      "buffer_bytes, repeats, best_bytes_per_s}, grpc_round_trip{calls, round_trip_s} (Health checks on a worker-like connection; null if not measured), notes\n\n"
      "exit codes: 0 ok, 1 a worker or the server failed, 2 usage error\n\nflags:\n",
      kvtrim::cli::FlagsHelp("client/loadgen/main.cc"));
}

/// The configuration from the flags; INVALID_ARGUMENT naming the flag.
absl::StatusOr<kvtrim::loadgen::LoadgenConfig> ConfigFromFlags() {
  kvtrim::loadgen::LoadgenConfig config;
  absl::StatusOr<kvtrim::loadgen::Transport> transport =
      kvtrim::loadgen::ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) return transport.status();
  absl::StatusOr<kvtrim::v1::DType> dtype = kvtrim::loadgen::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<kvtrim::v1::Numerics> numerics =
      kvtrim::ParseNumericsFlag(absl::GetFlag(FLAGS_numerics));
  if (!numerics.ok()) return numerics.status();
  config.target = absl::GetFlag(FLAGS_target);
  config.transport = *transport;
  config.policy = absl::GetFlag(FLAGS_policy);
  config.keep_fraction = absl::GetFlag(FLAGS_keep_fraction);
  config.layers = absl::GetFlag(FLAGS_layers);
  config.tokens = absl::GetFlag(FLAGS_tokens);
  config.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  config.q_heads = absl::GetFlag(FLAGS_q_heads);
  config.head_dim = absl::GetFlag(FLAGS_head_dim);
  config.window = absl::GetFlag(FLAGS_window);
  config.dtype = *dtype;
  config.workers = absl::GetFlag(FLAGS_workers);
  config.prefills = absl::GetFlag(FLAGS_prefills);
  config.warmup_prefills = absl::GetFlag(FLAGS_warmup_prefills);
  config.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  config.serial = absl::GetFlag(FLAGS_serial);
  config.send_optional = absl::GetFlag(FLAGS_send_optional);
  config.seed = absl::GetFlag(FLAGS_seed);
  config.device = absl::GetFlag(FLAGS_device);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  config.rewrite_per_layer = absl::GetFlag(FLAGS_rewrite_per_layer);
  config.output_region = absl::GetFlag(FLAGS_output_region);
  config.http2_window_bytes = absl::GetFlag(FLAGS_http2_window_bytes);
  config.shared_connection = absl::GetFlag(FLAGS_shared_connection);
  config.model_digest = absl::GetFlag(FLAGS_model_digest);
  config.json_out = absl::GetFlag(FLAGS_json_out);
  config.numerics = *numerics;
  const std::string perturbation = absl::GetFlag(FLAGS_perturbation);
  if (perturbation == "full") {
    config.perturbation = kvtrim::v1::PERTURBATION_FULL;
  } else if (perturbation == "sampled") {
    config.perturbation = kvtrim::v1::PERTURBATION_SAMPLED;
  } else if (perturbation == "off") {
    config.perturbation = kvtrim::v1::PERTURBATION_OFF;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--perturbation: '", perturbation.substr(0, 32), "' is not one of full, sampled, off"));
  }
  config.packed_answer = absl::GetFlag(FLAGS_packed_answer);
  config.profile = absl::GetFlag(FLAGS_profile);
  KVTRIM_RETURN_IF_ERROR(kvtrim::loadgen::ValidateConfig(config));
  return config;
}

/// What `policy` needs on the wire, asked of the server once.
absl::StatusOr<kvtrim::loadgen::PolicyNeeds> AskPolicyNeeds(
    const kvtrim::loadgen::LoadgenConfig& config) {
  kvtrim::ClientOptions options;
  options.max_message_bytes = config.max_message_bytes;
  absl::StatusOr<std::unique_ptr<kvtrim::Client>> client =
      kvtrim::Client::Connect(config.target, options);
  if (!client.ok()) return client.status();
  absl::StatusOr<kvtrim::v1::ListPoliciesResponse> policies = (*client)->ListPolicies();
  if (!policies.ok()) {
    return absl::Status(policies.status().code(),
                        absl::StrCat("ListPolicies: ", policies.status().message()));
  }
  return kvtrim::loadgen::NeedsOfPolicy(*policies, config.policy, config.send_optional,
                                        !config.model_digest.empty());
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<kvtrim::cli::ParsedArgs> args =
      kvtrim::cli::ParseArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) {
    std::cerr << "usage error: " << args.status().message() << "\n";
    return kExitUsage;
  }
  if (args->help) {
    std::cout << Usage();
    return kExitOk;
  }
  if (!args->positional.empty()) {
    std::cerr << "usage error: unexpected argument \"" << args->positional[0] << "\"\n";
    return kExitUsage;
  }
  absl::StatusOr<kvtrim::loadgen::LoadgenConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::cerr << "usage error: " << config.status().message() << "\n";
    return kExitUsage;
  }
#if !KVTRIM_LOADGEN_CUDA
  if (config->transport == kvtrim::loadgen::Transport::kCudaIpc) {
    std::cerr << "error: --transport=cuda_ipc: kvtrim-loadgen was built without CUDA\n";
    return kExitUsage;
  }
#endif

  kvtrim::loadgen::RunReport report;
  report.config = *config;
  absl::StatusOr<kvtrim::loadgen::PolicyNeeds> needs = AskPolicyNeeds(*config);
  if (!needs.ok()) {
    std::cerr << "error: " << needs.status().ToString() << "\n";
    return kExitFailed;
  }
  if (needs->model_wide && config->serial) {
    std::cerr << "usage error: --serial: policy \"" << config->policy
              << "\" is model-wide and answers every layer only at finish\n";
    return kExitUsage;
  }
  report.needs = *needs;
  if (needs->model_wide) {
    report.notes.push_back(
        "model-wide policy: every layer is answered at finish, so layer latency includes "
        "the later layers");
  }
  // Before the workers start, so that the reference does not compete with them.
  report.memcpy = kvtrim::loadgen::MeasureMemcpy();
  // The host's memory bandwidth ceiling (every core copying 64 MiB buffers at once): what
  // the inline transport's copies per byte share with the server and the kernel.
  report.memcpy_all_cores = kvtrim::loadgen::MeasureMemcpy(
      size_t{64} << 20, 5, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  report.rpc_floor = kvtrim::loadgen::MeasureRpcFloor(*config);

  const kvtrim::loadgen::HostLayer layer =
      kvtrim::loadgen::MakeHostLayer(*config, needs->values, needs->queries);
  report.workers.resize(config->workers);
  kvtrim::loadgen::StartLine start_line(config->workers);
  std::vector<std::thread> threads;
  for (int i = 0; i < config->workers; ++i) {
    threads.emplace_back(kvtrim::loadgen::RunWorker, i, std::cref(*config), std::cref(layer),
                         &start_line, &report.workers[i]);
  }
  for (std::thread& thread : threads) thread.join();

  const kvtrim::loadgen::RunTotals totals = kvtrim::loadgen::Aggregate(report);
  kvtrim::loadgen::PrintReport(report, totals, std::cout);
  if (!config->json_out.empty()) {
    std::ofstream file(config->json_out);
    file << kvtrim::loadgen::ReportJson(report, totals).dump(2) << "\n";
    if (!file) {
      std::cerr << "error: --json_out: could not write " << config->json_out << "\n";
      return kExitFailed;
    }
  }
  for (const kvtrim::loadgen::WorkerResult& worker : report.workers) {
    if (!worker.status.ok()) return kExitFailed;
  }
  return kExitOk;
}

#include "client/loadgen/report.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "client/numerics.h"

namespace kvtrim::loadgen {
namespace {

/// `summary` as a JSON object {count, mean, p50, p99, min, max}.
nlohmann::json SummaryJson(const Summary& summary) {
  return {{"count", summary.count}, {"mean", summary.mean}, {"p50", summary.p50},
          {"p99", summary.p99},     {"min", summary.min},   {"max", summary.max}};
}

/// One table row of `summary`, in milliseconds.
std::string RowMs(const char* name, const Summary& summary) {
  return absl::StrFormat("  %-22s %8d %10.3f %10.3f %10.3f %10.3f %10.3f\n", name, summary.count,
                         summary.mean * 1e3, summary.p50 * 1e3, summary.p99 * 1e3,
                         summary.min * 1e3, summary.max * 1e3);
}

/// `bytes_per_s` in GB/s (1e9 bytes).
double Gbps(double bytes_per_s) { return bytes_per_s / 1e9; }

/// The statistics rows, wire bytes and throughput lines of `totals`.
void PrintTable(const RunTotals& totals, std::ostream& out) {
  out << absl::StrFormat("  %-22s %8s %10s %10s %10s %10s %10s\n", "(milliseconds)", "count",
                         "mean", "p50", "p99", "min", "max");
  out << RowMs("layer latency", totals.layer_latency_s);
  out << RowMs("  of which prepare", totals.layer_prepare_s);
  out << RowMs("server compute", totals.compute_s);
  out << RowMs("prefill wall", totals.prefill_wall_s);
  out << absl::StrFormat("  wire bytes per prefill: %d (%.1f MiB)\n", totals.wire_bytes_per_prefill,
                         static_cast<double>(totals.wire_bytes_per_prefill) / (1 << 20));
  for (const WorkerTotals& worker : totals.workers) {
    out << absl::StrFormat("  worker %d: %d prefills, %d wire bytes in %.3f s = %.3f GB/s\n",
                           worker.worker, worker.prefills, worker.wire_bytes, worker.wall_s,
                           Gbps(worker.bytes_per_s));
  }
  out << absl::StrFormat(
      "  aggregate: %d prefills, %d wire bytes in %.3f s = %.3f GB/s (%.2f prefills/s)\n",
      totals.prefills, totals.wire_bytes, totals.run_wall_s, Gbps(totals.bytes_per_s),
      totals.run_wall_s > 0 ? static_cast<double>(totals.prefills) / totals.run_wall_s : 0.0);
}

}  // namespace

RunTotals Aggregate(const RunReport& report) {
  RunTotals totals;
  std::vector<double> latency, prepare, serial_wait, serial_send, compute, wall;
  for (const WorkerResult& worker : report.workers) {
    WorkerTotals mine;
    mine.worker = worker.worker;
    mine.wall_s = std::max(0.0, worker.end_s - worker.start_s);
    for (const PrefillSample& prefill : worker.prefills) {
      latency.insert(latency.end(), prefill.layer_latency_s.begin(), prefill.layer_latency_s.end());
      prepare.insert(prepare.end(), prefill.layer_prepare_s.begin(), prefill.layer_prepare_s.end());
      serial_wait.insert(serial_wait.end(), prefill.serial_wait_latency_s.begin(),
                         prefill.serial_wait_latency_s.end());
      serial_send.insert(serial_send.end(), prefill.serial_send_s.begin(),
                         prefill.serial_send_s.end());
      compute.insert(compute.end(), prefill.compute_s.begin(), prefill.compute_s.end());
      wall.push_back(prefill.wall_s);
      mine.prefills += 1;
      mine.wire_bytes += prefill.wire_bytes;
      totals.wire_bytes_per_prefill = prefill.wire_bytes;
      totals.fast_layers += prefill.fast_layers;
      totals.exact_layers += prefill.exact_layers;
      totals.stages.Merge(prefill.stages);
    }
    if (mine.wall_s > 0) mine.bytes_per_s = static_cast<double>(mine.wire_bytes) / mine.wall_s;
    totals.prefills += mine.prefills;
    totals.wire_bytes += mine.wire_bytes;
    totals.run_wall_s = std::max(totals.run_wall_s, worker.end_s);
    if (totals.backend.empty()) totals.backend = worker.backend;
    totals.workers.push_back(mine);
  }
  totals.layer_latency_s = Summarize(std::move(latency));
  totals.layer_prepare_s = Summarize(std::move(prepare));
  totals.serial_wait_latency_s = Summarize(std::move(serial_wait));
  totals.serial_send_s = Summarize(std::move(serial_send));
  totals.compute_s = Summarize(std::move(compute));
  totals.prefill_wall_s = Summarize(std::move(wall));
  if (totals.run_wall_s > 0) {
    totals.bytes_per_s = static_cast<double>(totals.wire_bytes) / totals.run_wall_s;
  }
  return totals;
}

void PrintReport(const RunReport& report, const RunTotals& totals, std::ostream& out) {
  const LoadgenConfig& c = report.config;
  out << absl::StrFormat(
      "kvtrim-loadgen  target=%s transport=%s policy=%s keep_fraction=%g backend=%s "
      "numerics_asked=%s\n"
      "  model: L=%d n=%d H_kv=%d H_q=%d d=%d w=%d dtype=%s; inputs sent: keys%s%s\n"
      "  load: workers=%d prefills=%d (+%d warm-up) per worker, %s%s\n",
      c.target, TransportName(c.transport), c.policy, c.keep_fraction,
      totals.backend.empty() ? "?" : totals.backend, NumericsLabel(c.numerics), c.layers,
      c.tokens, c.kv_heads, c.q_heads,
      c.head_dim, c.window, DTypeName(c.dtype), report.needs.values ? ", values" : "",
      report.needs.queries ? ", queries" : "", c.workers, c.prefills, c.warmup_prefills,
      c.serial ? "serial layers" : "pipelined layers",
      c.transport == Transport::kInline ? absl::StrFormat(", chunk_bytes=%d", c.chunk_bytes)
                                        : std::string());
  if (totals.prefills == 0) {
    out << "  no measured prefill completed\n";
  } else {
    PrintTable(totals, out);
    out << absl::StrFormat("  layers computed: fast=%d exact=%d\n", totals.fast_layers,
                           totals.exact_layers);
    if (totals.stages.layers() > 0) {
      out << absl::StrFormat("  per-stage profile of %d layers (kvtrimd's LayerResult.profile):\n",
                             totals.stages.layers());
      out << totals.stages.Table();
    }
  }
  out << absl::StrFormat("  host memcpy reference: best %.2f GB/s (%d MiB x %d)\n",
                         Gbps(report.memcpy.best_bytes_per_s),
                         static_cast<int64_t>(report.memcpy.buffer_bytes >> 20),
                         report.memcpy.repeats);
  if (report.memcpy_all_cores.threads > 1) {
    out << absl::StrFormat(
        "  host memcpy, %d cores at once: best %.2f GB/s copied (%.2f GB/s of memory traffic)\n",
        report.memcpy_all_cores.threads, Gbps(report.memcpy_all_cores.best_bytes_per_s),
        2 * Gbps(report.memcpy_all_cores.best_bytes_per_s));
  }
  if (report.rpc_floor.calls > 0) {
    out << absl::StrFormat("  gRPC round trip of an empty call (Health, %d calls): p50 %.1f us, "
                           "p99 %.1f us\n",
                           report.rpc_floor.calls, report.rpc_floor.round_trip_s.p50 * 1e6,
                           report.rpc_floor.round_trip_s.p99 * 1e6);
  } else if (!report.rpc_floor.error.empty()) {
    out << "  gRPC round trip reference not measured: " << report.rpc_floor.error << "\n";
  }
  for (const std::string& note : report.notes) out << "  note: " << note << "\n";
  for (const WorkerResult& worker : report.workers) {
    for (const std::string& note : worker.notes) {
      out << "  note (worker " << worker.worker << "): " << note << "\n";
    }
    if (!worker.status.ok()) {
      out << "  ERROR (worker " << worker.worker << "): " << worker.status.ToString() << "\n";
    }
  }
}

nlohmann::json ReportJson(const RunReport& report, const RunTotals& totals) {
  const LoadgenConfig& c = report.config;
  nlohmann::json config = {
      {"target", c.target},
      {"transport", TransportName(c.transport)},
      {"policy", c.policy},
      {"keep_fraction", c.keep_fraction},
      {"layers", c.layers},
      {"tokens", c.tokens},
      {"kv_heads", c.kv_heads},
      {"q_heads", c.q_heads},
      {"head_dim", c.head_dim},
      {"window", c.window},
      {"dtype", DTypeName(c.dtype)},
      {"workers", c.workers},
      {"prefills", c.prefills},
      {"warmup_prefills", c.warmup_prefills},
      {"chunk_bytes", c.chunk_bytes},
      {"serial", c.serial},
      {"seed", c.seed},
      {"device", c.device},
      {"max_message_bytes", c.max_message_bytes},
      {"rewrite_per_layer", c.rewrite_per_layer},
      {"output_region", c.output_region},
      {"http2_window_bytes", c.http2_window_bytes},
      {"shared_connection", c.shared_connection},
      {"model_digest", c.model_digest},
      {"send_values", report.needs.values},
      {"send_queries", report.needs.queries},
      {"numerics", NumericsLabel(c.numerics)},
      {"profile", c.profile},
      {"perturbation", v1::Perturbation_Name(c.perturbation)},
  };
  nlohmann::json workers = nlohmann::json::array();
  for (size_t i = 0; i < totals.workers.size(); ++i) {
    const WorkerTotals& mine = totals.workers[i];
    const WorkerResult& result = report.workers[i];
    workers.push_back({{"worker", mine.worker},
                       {"prefills", mine.prefills},
                       {"wire_bytes", mine.wire_bytes},
                       {"wall_s", mine.wall_s},
                       {"throughput_bytes_per_s", mine.bytes_per_s},
                       {"ok", result.status.ok()},
                       {"error", result.status.ok() ? "" : result.status.ToString()},
                       {"notes", result.notes}});
  }
  return {
      {"config", config},
      {"backend", totals.backend},
      {"layer_latency_s", SummaryJson(totals.layer_latency_s)},
      {"layer_prepare_s", SummaryJson(totals.layer_prepare_s)},
      {"serial_wait_latency_s", SummaryJson(totals.serial_wait_latency_s)},
      {"serial_send_s", SummaryJson(totals.serial_send_s)},
      {"server_compute_s", SummaryJson(totals.compute_s)},
      {"prefill_wall_s", SummaryJson(totals.prefill_wall_s)},
      {"wire_bytes_per_prefill", totals.wire_bytes_per_prefill},
      {"layers_by_numerics", {{"fast", totals.fast_layers}, {"exact", totals.exact_layers}}},
      {"stage_profile", totals.stages.layers() > 0 ? totals.stages.Json() : nlohmann::json()},
      {"workers", workers},
      {"aggregate",
       {{"prefills", totals.prefills},
        {"wire_bytes", totals.wire_bytes},
        {"run_wall_s", totals.run_wall_s},
        {"throughput_bytes_per_s", totals.bytes_per_s}}},
      {"host_memcpy",
       {{"buffer_bytes", report.memcpy.buffer_bytes},
        {"repeats", report.memcpy.repeats},
        {"best_bytes_per_s", report.memcpy.best_bytes_per_s}}},
      {"host_memcpy_all_cores",
       {{"threads", report.memcpy_all_cores.threads},
        {"buffer_bytes", report.memcpy_all_cores.buffer_bytes},
        {"repeats", report.memcpy_all_cores.repeats},
        {"best_bytes_per_s", report.memcpy_all_cores.best_bytes_per_s}}},
      {"grpc_round_trip",
       report.rpc_floor.calls > 0
           ? nlohmann::json{{"calls", report.rpc_floor.calls},
                            {"round_trip_s", SummaryJson(report.rpc_floor.round_trip_s)}}
           : nlohmann::json()},
      {"notes", report.notes},
  };
}

}  // namespace kvtrim::loadgen

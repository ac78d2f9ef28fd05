// Tests of the load generator's aggregation over workers and its JSON report.
#include "client/loadgen/report.h"

#include <gtest/gtest.h>

#include <sstream>

namespace kvtrim::loadgen {
namespace {

/// A prefill of `layers` layers, each with latency `latency` and compute `compute`.
PrefillSample Prefill(int layers, double latency, double compute, double wall, int64_t bytes) {
  PrefillSample sample;
  sample.wall_s = wall;
  sample.wire_bytes = bytes;
  sample.layer_latency_s.assign(layers, latency);
  sample.layer_prepare_s.assign(layers, 0.001);
  sample.serial_wait_latency_s.assign(layers, latency + 0.0005);
  sample.serial_send_s.assign(layers, 0.0001);
  sample.compute_s.assign(layers, compute);
  sample.exact_layers = layers;
  return sample;
}

/// Two workers: worker 0 ran 2 prefills in [0, 4] s, worker 1 ran 1 in [0.5, 2.5] s and
/// then failed.
RunReport TwoWorkers() {
  RunReport report;
  report.config.layers = 2;
  report.workers.resize(2);
  report.workers[0].worker = 0;
  report.workers[0].start_s = 0;
  report.workers[0].end_s = 4;
  report.workers[0].backend = "gpu";
  report.workers[0].prefills = {Prefill(2, 0.010, 0.004, 2.0, 1000),
                                Prefill(2, 0.030, 0.006, 2.0, 1000)};
  report.workers[1].worker = 1;
  report.workers[1].start_s = 0.5;
  report.workers[1].end_s = 2.5;
  report.workers[1].prefills = {Prefill(2, 0.020, 0.005, 1.0, 1000)};
  report.workers[1].status = absl::UnavailableError("gone");
  report.workers[1].notes = {"one slot"};
  report.memcpy.buffer_bytes = 1 << 20;
  report.memcpy.repeats = 2;
  report.memcpy.best_bytes_per_s = 5e9;
  return report;
}

TEST(AggregateTest, PoolsEveryLayerAndPrefillAcrossWorkers) {
  const RunTotals totals = Aggregate(TwoWorkers());
  EXPECT_EQ(totals.layer_latency_s.count, 6);
  EXPECT_DOUBLE_EQ(totals.layer_latency_s.p50, 0.020);
  EXPECT_DOUBLE_EQ(totals.layer_latency_s.mean, 0.020);
  EXPECT_EQ(totals.serial_wait_latency_s.count, 6);
  EXPECT_DOUBLE_EQ(totals.serial_wait_latency_s.p50, 0.0205);
  EXPECT_EQ(totals.serial_send_s.count, 6);
  EXPECT_DOUBLE_EQ(totals.serial_send_s.p50, 0.0001);
  EXPECT_DOUBLE_EQ(totals.compute_s.max, 0.006);
  EXPECT_EQ(totals.prefill_wall_s.count, 3);
  EXPECT_DOUBLE_EQ(totals.prefill_wall_s.p50, 2.0);
  EXPECT_EQ(totals.prefills, 3);
  EXPECT_EQ(totals.wire_bytes, 3000);
  EXPECT_EQ(totals.wire_bytes_per_prefill, 1000);
  EXPECT_DOUBLE_EQ(totals.run_wall_s, 4.0);
  EXPECT_DOUBLE_EQ(totals.bytes_per_s, 750.0);
  ASSERT_EQ(totals.workers.size(), 2u);
  EXPECT_DOUBLE_EQ(totals.workers[0].bytes_per_s, 500.0);
  EXPECT_DOUBLE_EQ(totals.workers[1].wall_s, 2.0);
  EXPECT_DOUBLE_EQ(totals.workers[1].bytes_per_s, 500.0);
  EXPECT_EQ(totals.backend, "gpu");
  EXPECT_EQ(totals.exact_layers, 6);
  EXPECT_EQ(totals.fast_layers, 0);
}

TEST(ReportJsonTest, HoldsConfigurationAndNumbers) {
  const RunReport report = TwoWorkers();
  const nlohmann::json json = ReportJson(report, Aggregate(report));
  EXPECT_EQ(json["config"]["transport"], "inline");
  EXPECT_EQ(json["config"]["layers"], 2);
  EXPECT_EQ(json["config"]["dtype"], "bf16");
  EXPECT_EQ(json["layer_latency_s"]["count"], 6);
  EXPECT_EQ(json["serial_wait_latency_s"]["count"], 6);
  EXPECT_EQ(json["serial_send_s"]["count"], 6);
  EXPECT_DOUBLE_EQ(json["server_compute_s"]["p50"].get<double>(), 0.005);
  EXPECT_EQ(json["prefill_wall_s"]["count"], 3);
  EXPECT_EQ(json["wire_bytes_per_prefill"], 1000);
  EXPECT_EQ(json["aggregate"]["wire_bytes"], 3000);
  EXPECT_DOUBLE_EQ(json["aggregate"]["throughput_bytes_per_s"].get<double>(), 750.0);
  EXPECT_EQ(json["workers"][1]["ok"], false);
  EXPECT_EQ(json["workers"][1]["error"], "UNAVAILABLE: gone");
  EXPECT_EQ(json["workers"][1]["notes"][0], "one slot");
  EXPECT_DOUBLE_EQ(json["host_memcpy"]["best_bytes_per_s"].get<double>(), 5e9);
  EXPECT_EQ(json["config"]["numerics"], "default");
  EXPECT_EQ(json["layers_by_numerics"]["exact"], 6);
  EXPECT_EQ(json["layers_by_numerics"]["fast"], 0);
}

TEST(PrintReportTest, ShowsTheTableAndErrors) {
  const RunReport report = TwoWorkers();
  std::ostringstream out;
  PrintReport(report, Aggregate(report), out);
  EXPECT_NE(out.str().find("layer latency"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("ERROR (worker 1): UNAVAILABLE: gone"), std::string::npos);
  EXPECT_NE(out.str().find("numerics_asked=default"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("layers computed: fast=0 exact=6"), std::string::npos) << out.str();
  RunReport empty;
  std::ostringstream none;
  PrintReport(empty, Aggregate(empty), none);
  EXPECT_NE(none.str().find("no measured prefill completed"), std::string::npos);
}

}  // namespace
}  // namespace kvtrim::loadgen

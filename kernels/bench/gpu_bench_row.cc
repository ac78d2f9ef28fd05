#include "kernels/bench/gpu_bench_row.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvtrim::gpu::bench {

std::string CheckAnswer(const std::vector<int64_t>& offsets, const std::vector<int32_t>& indices,
                        int64_t n, int64_t expected_total) {
  if (offsets.empty() || offsets.front() != 0 ||
      (expected_total >= 0 && offsets.back() != expected_total) ||
      offsets.back() != static_cast<int64_t>(indices.size())) {
    return absl::StrCat("offsets end at ", offsets.empty() ? -1 : offsets.back(), ", expected ",
                        expected_total >= 0 ? expected_total
                                            : static_cast<int64_t>(indices.size()));
  }
  for (size_t l = 0; l + 1 < offsets.size(); ++l) {
    for (int64_t i = offsets[l]; i < offsets[l + 1]; ++i) {
      const int32_t j = indices[static_cast<size_t>(i)];
      if (j < 0 || j >= n || (i > offsets[l] && j <= indices[static_cast<size_t>(i - 1)])) {
        return absl::StrCat("list ", l, " is not strictly ascending in [0, n) at ", i - offsets[l]);
      }
    }
  }
  return "";
}

nlohmann::json RowJson(const Row& r, double copy_gbps) {
  nlohmann::json j;
  j["policy"] = r.policy;
  j["scorer"] = r.scorer;
  j["n"] = r.n;
  j["w"] = r.w;
  j["h_kv"] = kKvHeads;
  j["group"] = kGroup;
  j["d"] = kHeadDim;
  j["dtype"] = DTypeName(r.dtype);
  j["numerics"] = r.numerics ? nlohmann::json(NumericsName(*r.numerics)) : nlohmann::json();
  j["numerics_planned"] = r.planned ? nlohmann::json(NumericsName(*r.planned)) : nlohmann::json();
  j["kvtrim_us"] = r.total_us;
  j["score_us"] = r.score_us;
  j["selection_us"] = r.select_us;
  j["select_us"] = r.select_us;  // the name of earlier runs
  j["total_us"] = r.total_us;
  j["direct_us"] = r.direct_us > 0 ? nlohmann::json(r.direct_us) : nlohmann::json();
  j["graph_replays"] = r.graph_replays;
  j["graph_direct"] = r.graph_direct;
  j["scorer_bytes"] = r.bytes;
  j["bytes_read"] = r.bytes;     // the name of earlier runs
  j["copy_gbps"] = copy_gbps;
  j["score_gbps"] = r.score_gbps;
  j["total_gbps"] = r.total_gbps;
  j["score_copy_fraction"] = copy_gbps > 0 ? r.score_gbps / copy_gbps : 0;
  j["total_copy_fraction"] = copy_gbps > 0 ? r.total_gbps / copy_gbps : 0;
  j["select_share"] = r.total_us > 0 ? r.select_us / r.total_us : 0;
  j["scratch_bytes"] = r.scratch_bytes;
  j["input_sets"] = r.input_sets;
  j["host_decided"] = r.host_decided;
  if (!r.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (size_t i = 0; i < r.stages.size(); ++i) {
      stages.push_back({{"i", i}, {"kind", r.stages[i].kind}, {"name", r.stages[i].name},
                        {"us", r.stages[i].us}});
    }
    j["stages"] = std::move(stages);
  }
  j["error"] = r.error;
  j["note"] = r.note;
  return j;
}

bool WriteResults(const std::string& dir, const RunInfo& info, const std::vector<Row>& rows) {
  nlohmann::json doc;
  doc["device"] = info.device;
  doc["copy_gbps"] = info.copy_gbps;
  doc["copy_mib"] = info.copy_mib;
  doc["reps"] = info.reps;
  doc["warmup"] = info.warmup;
  doc["keep_fraction"] = info.keep_fraction;
  doc["stages"] = info.stages;
  doc["stage_reps"] = info.stage_reps;
  doc["complete"] = info.complete;
  doc["rows"] = nlohmann::json::array();
  for (const Row& r : rows) doc["rows"].push_back(RowJson(r, info.copy_gbps));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // Write to a temporary name, then rename: a reader never sees half a file.
  const std::string json_path = dir + "/gpu_bench.json";
  {
    std::ofstream out(json_path + ".tmp");
    out << doc.dump(2) << "\n";
    if (!out) return false;
  }
  std::filesystem::rename(json_path + ".tmp", json_path, ec);
  if (ec) return false;
  std::ofstream csv(dir + "/gpu_bench.csv");
  csv << "policy,scorer,n,w,dtype,numerics,numerics_planned,scorer_bytes,score_us,selection_us,"
         "total_us,direct_us,score_gbps,total_gbps,copy_gbps,select_share,scratch_bytes,error,"
         "note\n";
  for (const Row& r : rows) {
    csv << r.policy << "," << r.scorer << "," << r.n << "," << r.w << "," << DTypeName(r.dtype)
        << "," << (r.numerics ? NumericsName(*r.numerics) : "") << ","
        << (r.planned ? NumericsName(*r.planned) : "") << "," << r.bytes << "," << r.score_us
        << "," << r.select_us << "," << r.total_us << "," << r.direct_us << "," << r.score_gbps
        << "," << r.total_gbps
        << "," << info.copy_gbps << "," << (r.total_us > 0 ? r.select_us / r.total_us : 0) << ","
        << r.scratch_bytes << ",\"" << r.error << "\",\"" << r.note << "\"\n";
  }
  return static_cast<bool>(csv);
}

}  // namespace kvtrim::gpu::bench

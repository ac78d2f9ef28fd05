// kvtrim_answer_bench: what the kept lists of one layer cost between the backend's decision
// and the worker reading them, for the two answer encodings (settings.answer_encoding):
//   encode  EncodeLayerResult (service/response_codec.h) + SerializeToString, as kvtrimd does
//   decode  ParseFromString + KeptLists::Of (client/kept_lists.h) + every index copied into a
//           buffer of the caller's (KeptLists::CopyIndices)
// on H_kv = 8 heads keeping a fifth of n tokens each (DropKV at 20 %), n in {4K, 32K, 128K}.
// Host-only; times are medians (and minima) over --reps repetitions on this machine.
// Writes DIR/answer_bench.json and DIR/answer_bench.md (the Markdown table, also printed).
//
// Usage: kvtrim_answer_bench [--out=DIR] [--reps=200]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "client/kept_lists.h"
#include "kernels/layer.h"
#include "nlohmann/json.hpp"
#include "service/response_codec.h"

namespace {

using Clock = std::chrono::steady_clock;

/// A decision of `heads` sorted lists keeping `keep` of `n` tokens each (distinct, random).
kvtrim::LayerDecision MakeDecision(int64_t n, int heads, int64_t keep, uint64_t seed) {
  kvtrim::LayerDecision d;
  d.num_tokens = n;
  d.output_shape = kvtrim::OutputShape::kPerHead;
  d.offsets.push_back(0);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int h = 0; h < heads; ++h) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> list(all.begin(), all.begin() + keep);
    std::sort(list.begin(), list.end());
    d.indices.insert(d.indices.end(), list.begin(), list.end());
    d.offsets.push_back(static_cast<int64_t>(d.indices.size()));
    d.kept_per_head.push_back(static_cast<int32_t>(keep));
    d.perturbation.push_back(0.5);
  }
  return d;
}

/// Median and minimum of `us`.
std::pair<double, double> MedianMin(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front()};
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = "out";
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--out=")) {
      out_dir = arg.substr(6);
    } else if (absl::StartsWith(arg, "--reps=") && absl::SimpleAtoi(arg.substr(7), &reps) &&
               reps >= 5) {
    } else {
      std::cerr << "kvtrim_answer_bench: bad flag '" << arg << "' (--out=DIR --reps>=5)\n";
      return 2;
    }
  }
  constexpr int kHeads = 8;
  nlohmann::json rows = nlohmann::json::array();
  std::string md =
      "| n | encoding | kept indices | wire bytes | encode µs (median / min) | decode + copy µs "
      "(median / min) |\n|---|---|---|---|---|---|\n";
  for (int64_t n : {int64_t{4096}, int64_t{32768}, int64_t{131072}}) {
    const kvtrim::LayerDecision decision = MakeDecision(n, kHeads, n / 5, 7 + n);
    for (bool packed : {false, true}) {
      std::vector<double> encode_us, decode_us;
      std::string wire;
      std::vector<int32_t> indices;
      int64_t checksum = 0;
      for (int rep = 0; rep < reps; ++rep) {
        const auto t0 = Clock::now();
        kvtrim::v1::LayerResult result;
        kvtrim::service::EncodeLayerResult(decision, &result, packed);
        wire.clear();
        result.SerializeToString(&wire);
        const auto t1 = Clock::now();
        kvtrim::v1::LayerResult parsed;
        if (!parsed.ParseFromString(wire)) {
          std::cerr << "kvtrim_answer_bench: the answer does not parse\n";
          return 1;
        }
        absl::StatusOr<kvtrim::KeptLists> lists = kvtrim::KeptLists::Of(parsed);
        if (!lists.ok()) {
          std::cerr << "kvtrim_answer_bench: " << lists.status() << "\n";
          return 1;
        }
        // The worker's use: every list copied into its own buffer.
        indices.resize(static_cast<size_t>(lists->num_indices()));
        lists->CopyIndices(0, lists->num_indices(), indices.data());
        int64_t sum = indices.empty() ? 0 : indices.back();
        const auto t2 = Clock::now();
        checksum += sum;
        encode_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        decode_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
      const auto [encode, encode_min] = MedianMin(encode_us);
      const auto [decode, decode_min] = MedianMin(decode_us);
      const char* name = packed ? "packed" : "repeated";
      rows.push_back({{"n", n}, {"heads", kHeads}, {"encoding", name},
                      {"kept_indices", decision.indices.size()}, {"wire_bytes", wire.size()},
                      {"encode_us", encode}, {"encode_min_us", encode_min},
                      {"decode_us", decode}, {"decode_min_us", decode_min},
                      {"reps", reps}, {"checksum", checksum}});
      md += absl::StrFormat("| %dK | %s | %d | %d | %.1f / %.1f | %.1f / %.1f |\n", n / 1024, name,
                            decision.indices.size(), wire.size(), encode, encode_min, decode,
                            decode_min);
    }
  }
  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir + "/answer_bench.json")
      << nlohmann::json{{"rows", rows}, {"heads", kHeads}, {"keep_fraction", 0.2}}.dump(1) << "\n";
  std::ofstream(out_dir + "/answer_bench.md") << md;
  std::cout << md;
  return 0;
}

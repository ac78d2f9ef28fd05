#include "kernels/model.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/client_text.h"
#include "nlohmann/json.hpp"

namespace kvtrim {

namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

/// Checks that a raw tensor has the expected shape and the bytes it needs.
absl::Status CheckRawShape(const RawTensor& t, const std::vector<int64_t>& shape,
                           const std::string& field) {
  if (t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: expected ", ShapeText(shape),
                                                   ", got ", ShapeText(t.shape)));
  }
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  if (static_cast<int64_t>(t.bytes.size()) != count * static_cast<int64_t>(DTypeSize(t.dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: holds ", t.bytes.size(), " bytes, the shape ", ShapeText(shape), " in ",
        DTypeName(t.dtype), " needs ", count * static_cast<int64_t>(DTypeSize(t.dtype))));
  }
  return absl::OkStatus();
}

/// Converts a raw tensor of the expected shape to fp32, refusing NaN/Inf.
absl::StatusOr<std::vector<float>> ToF32(const RawTensor& t, const std::vector<int64_t>& shape,
                                         const std::string& field) {
  KVTRIM_RETURN_IF_ERROR(CheckRawShape(t, shape, field));
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<float> out(static_cast<size_t>(count));
  ConvertToF32(t.dtype, t.bytes.data(), out.size(), out.data());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".data: element ", i, " is not finite"));
    }
  }
  return out;
}

/// Gram of rows: out[i][j] = sum_e a[e][i] * a[e][j] of a [rows, d] matrix (double
/// accumulation in ascending e, fp32 result [d, d]). Row by row into a [d, d] accumulator
/// (the upper triangle; the lower one is its mirror, products commute), so each row is read
/// once and the inner loop runs over contiguous columns: the sums, and so the result, are the
/// same as summing each entry over e on its own, at a fraction of the time for D = 4096.
void AddGram(const std::vector<double>& w /*[rows, d]*/, int64_t rows, int64_t d, float* out) {
  std::vector<double> acc(static_cast<size_t>(d * d), 0.0);
  int64_t e = 0;
  // Four rows per sweep of the accumulator: each entry still adds its products in
  // ascending e, one at a time (so the sums are unchanged), with a quarter of the
  // accumulator's loads and stores.
  for (; e + 4 <= rows; e += 4) {
    const double* r0 = w.data() + e * d;
    const double* r1 = r0 + d;
    const double* r2 = r1 + d;
    const double* r3 = r2 + d;
    for (int64_t i = 0; i < d; ++i) {
      const double a0 = r0[i], a1 = r1[i], a2 = r2[i], a3 = r3[i];
      double* a = acc.data() + i * d;
      for (int64_t j = i; j < d; ++j) {
        double sum = a[j];
        sum += a0 * r0[j];
        sum += a1 * r1[j];
        sum += a2 * r2[j];
        sum += a3 * r3[j];
        a[j] = sum;
      }
    }
  }
  for (; e < rows; ++e) {
    const double* row = w.data() + e * d;
    for (int64_t i = 0; i < d; ++i) {
      const double ri = row[i];
      double* a = acc.data() + i * d;
      for (int64_t j = i; j < d; ++j) a[j] += ri * row[j];
    }
  }
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      out[i * d + j] = static_cast<float>(i <= j ? acc[i * d + j] : acc[j * d + i]);
    }
  }
}

}  // namespace

std::vector<double> RopeConfig::InverseFrequencies(int64_t head_dim) const {
  const int64_t half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  }
  if (scaling_type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (scaling_type == "llama3") {
    // Hugging Face _compute_llama3_parameters.
    const double low_wavelen = original_max_position / low_freq_factor;
    const double high_wavelen = original_max_position / high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * 3.14159265358979323846 / f;
      if (wavelen > low_wavelen) {
        f = f / factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (original_max_position / wavelen - low_freq_factor) /
                              (high_freq_factor - low_freq_factor);
        f = (1.0 - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

absl::StatusOr<RopeConfig> ParseRopeScaling(double theta, const std::string& json,
                                            const std::string& field) {
  RopeConfig rope;
  if (!(theta > 0) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".rope_theta: must be finite and > 0, got ", ExactNumber(theta)));
  }
  rope.theta = theta;
  if (json.empty() || json == "null") return rope;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& error) {
    // e.g. "number overflow" for 1e999: the parser's own reason, bounded like the text.
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".rope_scaling_json: not valid JSON (", ClientTextInField(error.what(), 160),
        "): ", QuoteClientText(json)));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".rope_scaling_json: not a JSON object: ", QuoteClientText(json)));
  }
  std::string type;
  if (j.contains("rope_type") && j["rope_type"].is_string()) {
    type = j["rope_type"].get<std::string>();
  } else if (j.contains("type") && j["type"].is_string()) {
    type = j["type"].get<std::string>();
  }
  auto number = [&](const char* key, double def) -> double {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : def;
  };
  if (type == "default" || type.empty()) return rope;
  if (type != "linear" && type != "llama3") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".rope_scaling_json: rope_type ", QuoteClientText(type),
        " is not supported (supported: default, linear, llama3)"));
  }
  rope.scaling_type = type;
  rope.factor = number("factor", 1.0);
  rope.low_freq_factor = number("low_freq_factor", 1.0);
  rope.high_freq_factor = number("high_freq_factor", 4.0);
  rope.original_max_position = number("original_max_position_embeddings", 8192);
  if (!(rope.factor > 0) ||
      (type == "llama3" && !(rope.high_freq_factor > rope.low_freq_factor &&
                             rope.low_freq_factor > 0 && rope.original_max_position > 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".rope_scaling_json: factor must be > 0 and (llama3) high_freq_factor > "
               "low_freq_factor > 0, original_max_position_embeddings > 0: ",
        json));
  }
  return rope;
}

const LukvProfile* RegisteredModel::FindProfile(const std::string& name) const {
  auto it = profiles.find(name);
  return it == profiles.end() ? nullptr : &it->second;
}

absl::StatusOr<std::shared_ptr<RegisteredModel>> BuildModelFrom(const ModelInput& input) {
  const ModelLayout& m = input.layout;
  auto positive = [](const char* name, int64_t v, int64_t hi) -> absl::Status {
    if (v < 1 || v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.", name, ": must be in [1, ", hi, "], got ", v));
    }
    return absl::OkStatus();
  };
  for (auto st : {positive("num_layers", m.num_layers, 4096),
                  positive("num_query_heads", m.num_query_heads, 1024),
                  positive("num_kv_heads", m.num_kv_heads, 1024),
                  positive("head_dim", m.head_dim, 1024),
                  positive("hidden_size", m.hidden_size, 1 << 17)}) {
    if (!st.ok()) return st;
  }
  if (m.num_query_heads % m.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.num_query_heads: ", m.num_query_heads, " is not a multiple of num_kv_heads=",
        m.num_kv_heads));
  }
  if (m.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.head_dim: must be even (RoPE pairs), got ", m.head_dim));
  }
  auto model = std::make_shared<RegisteredModel>();
  model->layout = m;
  auto rope = ParseRopeScaling(input.rope_theta, input.rope_scaling_json, "header");
  if (!rope.ok()) return rope.status();
  model->rope = *rope;
  if (input.rope_layout == "interleaved") {
    model->rope.interleaved = true;
  } else if (!input.rope_layout.empty() && input.rope_layout != "rotate_half") {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.rope_layout: ", QuoteClientText(input.rope_layout),
        " is not rotate_half or interleaved"));
  }
  model->rope_scaling_json = input.rope_scaling_json;

  const int64_t L = m.num_layers, hq = m.num_query_heads, hkv = m.num_kv_heads;
  const int64_t d = m.head_dim, D = m.hidden_size, G = m.group_size();
  // Unknown tensor names are refused (typos would otherwise be silently ignored).
  for (const auto& [name, tensor] : input.tensors) {
    bool known = false;
    for (int64_t l = 0; l < L && !known; ++l) {
      for (const char* suffix : {".w_o", ".query_mean", ".query_cov"}) {
        if (name == absl::StrCat("layers.", l, suffix)) known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights[", ClientTextInField(name), "].name: unknown weight; expected layers.{l}.w_o, "
          "layers.{l}.query_mean, layers.{l}.query_cov with l < ", L, ", or profile.{name}"));
    }
  }
  model->w_o.resize(L);
  model->head_gram.resize(L);
  model->group_gram.resize(L);
  // Structure first, layer by layer (every W_O present with its shape, query statistics in
  // pairs), stopping at the first fault; the fp32 conversions (which refuse NaN / Inf) and the
  // Gram matrices then run over the host's cores. A fault reports as a layer-by-layer walk
  // would: the lowest layer's, and within a layer W_O's shape, then its values, then the pair.
  int64_t stats_layers = 0;
  absl::Status structure;           // the first structural fault, if any
  int64_t fault_layer = L;          // its layer
  bool fault_after_values = false;  // a missing query statistic (checked after W_O's values)
  for (int64_t l = 0; l < L; ++l) {
    const std::string name = absl::StrCat("layers.", l, ".w_o");
    auto it = input.tensors.find(name);
    if (it == input.tensors.end()) {
      structure = absl::InvalidArgumentError(absl::StrCat(
          "weights[", name, "]: missing; every layer needs its output projection [D=", D,
          ", H_q*d=", hq * d, "]"));
    } else {
      structure = CheckRawShape(it->second, {D, hq * d}, absl::StrCat("weights[", name, "]"));
    }
    if (!structure.ok()) {
      fault_layer = l;
      break;
    }
    const bool has_mean = input.tensors.count(absl::StrCat("layers.", l, ".query_mean")) != 0;
    const bool has_cov = input.tensors.count(absl::StrCat("layers.", l, ".query_cov")) != 0;
    if (has_mean != has_cov) {
      structure = absl::InvalidArgumentError(absl::StrCat(
          "weights[layers.", l, ".query_", has_mean ? "cov" : "mean",
          "]: missing; query statistics need both query_mean [H_q, d] and query_cov "
          "[H_q, d, d]"));
      fault_layer = l;
      fault_after_values = true;
      break;
    }
    if (has_mean) ++stats_layers;
  }
  // The layers whose values decide the answer: all, or those before the fault (and the
  // fault's own layer when its W_O's values come first).
  const int64_t converted = structure.ok() ? L : fault_layer + (fault_after_values ? 1 : 0);
  std::vector<absl::Status> values(static_cast<size_t>(converted));
  // W_O in fp32 and the per-head and per-group Gram matrices, the layers spread over the
  // host's cores (each layer's matrices depend on its W_O alone: the same result in any
  // order); no Gram matrices when a fault will be reported anyway.
  const int64_t workers = std::max<int64_t>(
      1, std::min<int64_t>(converted, static_cast<int64_t>(std::thread::hardware_concurrency())));
  auto gram_layers = [&](int64_t first) {
    std::vector<double> slice(static_cast<size_t>(D * d));
    std::vector<double> group(static_cast<size_t>(D * d));
    for (int64_t l = first; l < converted; l += workers) {
      const std::string name = absl::StrCat("layers.", l, ".w_o");
      auto w = ToF32(input.tensors.at(name), {D, hq * d}, absl::StrCat("weights[", name, "]"));
      if (!w.ok()) {
        values[l] = w.status();
        continue;
      }
      model->w_o[l] = *std::move(w);
      if (!structure.ok()) continue;
      model->head_gram[l].assign(static_cast<size_t>(hq * d * d), 0.0f);
      model->group_gram[l].assign(static_cast<size_t>(hkv * d * d), 0.0f);
      for (int64_t g = 0; g < hkv; ++g) {
        std::fill(group.begin(), group.end(), 0.0);
        for (int64_t h = g * G; h < (g + 1) * G; ++h) {
          for (int64_t e = 0; e < D; ++e) {
            for (int64_t i = 0; i < d; ++i) {
              slice[e * d + i] = model->w_o[l][e * hq * d + h * d + i];
              group[e * d + i] += slice[e * d + i];
            }
          }
          AddGram(slice, D, d, model->head_gram[l].data() + h * d * d);
        }
        AddGram(group, D, d, model->group_gram[l].data() + g * d * d);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t t = 1; t < workers; ++t) threads.emplace_back(gram_layers, t);
  gram_layers(0);
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& st : values) {
    if (!st.ok()) return st;  // the lowest layer's, before any later fault
  }
  if (!structure.ok()) return structure;
  if (stats_layers != 0 && stats_layers != L) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights[layers.*.query_mean]: query statistics were sent for ", stats_layers, " of ",
        L, " layers; send them for every layer or none"));
  }
  if (stats_layers == L) {
    model->query_mean.resize(L);
    model->query_cov.resize(L);
    for (int64_t l = 0; l < L; ++l) {
      const std::string mean_name = absl::StrCat("layers.", l, ".query_mean");
      const std::string cov_name = absl::StrCat("layers.", l, ".query_cov");
      auto mean = ToF32(input.tensors.at(mean_name), {hq, d}, absl::StrCat("weights[", mean_name, "]"));
      if (!mean.ok()) return mean.status();
      auto cov = ToF32(input.tensors.at(cov_name), {hq, d, d}, absl::StrCat("weights[", cov_name, "]"));
      if (!cov.ok()) return cov.status();
      model->query_mean[l] = *std::move(mean);
      model->query_cov[l] = *std::move(cov);
    }
  }
  for (const auto& [name, profile] : input.profiles) {
    const std::string field = absl::StrCat("weights[profile.", name, "]");
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: profile name is empty"));
    }
    auto ratios = ToF32(profile.ratios, {kLukvProfileRows, L, hkv}, field);
    if (!ratios.ok()) return ratios.status();
    for (size_t i = 0; i < ratios->size(); ++i) {
      if ((*ratios)[i] < 0.0f || (*ratios)[i] > 1.0f) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".data: prune ratio ", (*ratios)[i], " at flat index ", i,
            " is outside [0, 1]"));
      }
    }
    if (profile.sink < 0 || profile.window < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".manifest_json: sink and window must be >= 0"));
    }
    LukvProfile p;
    p.name = name;
    p.metric = profile.metric.empty() ? name : profile.metric;
    p.sink = profile.sink;
    p.window = profile.window;
    p.prune_ratios = *std::move(ratios);
    model->profiles.emplace(name, std::move(p));
  }
  return model;
}

absl::StatusOr<std::shared_ptr<RegisteredModel>> BuildModel(ModelInput input) {
  absl::StatusOr<std::shared_ptr<RegisteredModel>> model = BuildModelFrom(input);
  if (model.ok()) (*model)->input = std::move(input);
  return model;
}

}  // namespace kvtrim

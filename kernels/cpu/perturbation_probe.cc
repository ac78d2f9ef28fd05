#include "kernels/cpu/perturbation_probe.h"

#include "kernels/cpu/fast/fast_perturbation.h"
#include "kernels/cpu/perturbation.h"

namespace kvtrim {

CpuPerturbationProbe::CpuPerturbationProbe(const CpuLayer& layer, bool fast,
                                           int64_t rows_per_head, const float* full_outputs,
                                           ThreadPool& pool)
    : layer_(layer),
      fast_(fast),
      rows_per_head_(rows_per_head),
      full_outputs_(full_outputs),
      pool_(pool) {}

absl::Status CpuPerturbationProbe::Evaluate(const std::vector<int64_t>& offsets,
                                            const std::vector<int32_t>& indices,
                                            std::vector<double>* out) {
  out->assign(static_cast<size_t>(layer_.shape.num_kv_heads), 0.0);
  if (fast_) {
    FastOutputPerturbation(layer_, offsets, indices, rows_per_head_, pool_, out->data(),
                           full_outputs_);
  } else {
    OutputPerturbation(layer_, offsets, indices, pool_, out->data());
  }
  return absl::OkStatus();
}

}  // namespace kvtrim

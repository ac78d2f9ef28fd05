#include "fuzz/fuzz_service.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "fuzz/sample_model.h"

namespace kvtrim::fuzz {

namespace {

/// The service cannot be set up (or the CPU backend failed): report and abort.
[[noreturn]] void Die(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "kvtrim fuzz: %s: %s\n", what, status.ToString().c_str());
  std::abort();
}

}  // namespace

FuzzService& FuzzService::Get() {
  static FuzzService* const service = new FuzzService();
  return *service;
}

FuzzService::FuzzService() {
  RegisterBuiltinPolicies(&registry_);
  backend_ = std::make_unique<CpuBackend>(1);
  engine_ = std::make_unique<PolicyEngine>(registry_, *backend_);
  std::vector<std::string> presets;
  for (const auto& preset : registry_.presets()) presets.push_back(preset.name);
  metrics_ = std::make_unique<service::Metrics>("fuzz", backend_->name(), presets);
  service::ModelStoreOptions store_options;  // in memory: nothing is written
  store_options.max_model_bytes = kFuzzMaxModelBytes;
  models_ = std::make_unique<service::ModelStore>(store_options, std::cerr);
  service::ServiceOptions options;
  options.max_inflight = 1;
  core_ = std::make_unique<service::ServiceCore>(*engine_, *backend_, *metrics_, *models_,
                                                 options, &std::cerr);
  core_->SetBackendFailureHook([](const absl::Status& status) {
    Die("INTERNAL failure of the CPU backend", status);
  });
  service::TransportOptions transport;
  transport.max_layer_bytes = kFuzzMaxLayerBytes;
  transport.host_buffer_pool_bytes = 0;  // heap buffers, freed with each input
  core_->SetTransports(nullptr, transport);
  // The requests of the corpus name it by its digest (fuzz/make_corpus.cc).
  absl::StatusOr<std::string> digest = RegisterBundle(SampleModelPath(), models_.get());
  if (!digest.ok()) Die("registering the sample model", digest.status());
}

service::DecodeContext FuzzService::MakeDecodeContext() const {
  service::DecodeContext context;
  context.client_id = "fuzz";
  context.max_host_read_bytes = kFuzzMaxLayerBytes;
  return context;
}

}  // namespace kvtrim::fuzz

// The kvtrim CLI's flags, defined in flags.cc:
// the connection flags, --json, health's --wait and compress's flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(double, timeout_s);
ABSL_DECLARE_FLAG(int32_t, max_message_bytes);
ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, client_id);
ABSL_DECLARE_FLAG(double, wait);
ABSL_DECLARE_FLAG(std::string, policy);
ABSL_DECLARE_FLAG(std::optional<double>, keep_fraction);
ABSL_DECLARE_FLAG(std::optional<int64_t>, keep_tokens);
ABSL_DECLARE_FLAG(std::optional<double>, max_perturbation);
ABSL_DECLARE_FLAG(std::optional<double>, max_keep);
ABSL_DECLARE_FLAG(std::string, param);
ABSL_DECLARE_FLAG(bool, session);
ABSL_DECLARE_FLAG(std::optional<int32_t>, sink_tokens);
ABSL_DECLARE_FLAG(std::optional<int32_t>, recent_tokens);
ABSL_DECLARE_FLAG(std::string, output_shape);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::optional<int32_t>, num_layers);
ABSL_DECLARE_FLAG(std::string, request_id);
ABSL_DECLARE_FLAG(std::string, input);
ABSL_DECLARE_FLAG(bool, show_indices);
ABSL_DECLARE_FLAG(std::string, numerics);
ABSL_DECLARE_FLAG(bool, perturbation);
ABSL_DECLARE_FLAG(bool, packed_answer);
ABSL_DECLARE_FLAG(bool, summary);
ABSL_DECLARE_FLAG(bool, summary_header);
// --model: a model bundle .safetensors (client/model_bundle.h), for register-model and compress.
ABSL_DECLARE_FLAG(std::string, model);

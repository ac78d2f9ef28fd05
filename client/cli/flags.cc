// The kvtrim CLI's flags (declared in flags.h). In a library of their own, apart from
// kvtrim_cli_lib, which the load generator links with flags of the same names.
#include "client/cli/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, target, "", "Server address, e.g. 127.0.0.1:50051 (required)");
ABSL_FLAG(double, timeout_s, 30.0,
          "Deadline in seconds of each unary call, and of a whole --session stream");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "Largest gRPC message sent or received, in bytes");
ABSL_FLAG(bool, tls, false,
          "Connect with TLS (implied by --tls_ca / --tls_cert); without --tls_ca the system "
          "roots verify kvtrimd");
ABSL_FLAG(std::string, tls_ca, "", "PEM file of the CA(s) that kvtrimd's certificate chains to");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate (mutual TLS; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name kvtrimd's certificate must carry, when it differs from --target's host (e.g. "
          "a probe inside the pod dialing 127.0.0.1); implies --tls");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding this tenant's bearer token (kvtrimd --auth_tokens_file), sent with "
          "every call; a file rather than a flag value keeps it out of the process list");
ABSL_FLAG(bool, json, false,
          "Print each command's answer as one JSON object on stdout, and an error as one "
          "JSON object on stderr ({\"error\": {\"kind\", \"code\", \"message\"}})");
ABSL_FLAG(std::string, client_id, "",
          "regions: a Regions lease's id (RegionLease.client_id, what a worker sends as "
          "kvtrim-client-id) whose regions to list one by one");
ABSL_FLAG(double, wait, 0,
          "health: wait up to this many seconds for kvtrimd to be SERVING, checking every "
          "100 ms while it is unreachable, warming up or NOT_SERVING (0: check once)");
ABSL_FLAG(std::string, policy, "", "compress: policy preset or SCORER+ALLOCATOR");
ABSL_FLAG(std::optional<double>, keep_fraction, std::nullopt,
          "compress: fraction of the n tokens kept per head, in (0, 1]; sink and recent "
          "tokens count inside it");
ABSL_FLAG(std::optional<int64_t>, keep_tokens, std::nullopt,
          "compress: tokens kept per head (>= 1, clamped to n); instead of --keep_fraction");
ABSL_FLAG(std::optional<double>, max_perturbation, std::nullopt,
          "compress: error target epsilon >= 0 instead of a count: each head keeps the fewest "
          "tokens of its ranking whose output perturbation is <= epsilon (needs values and "
          "queries in --input)");
ABSL_FLAG(std::optional<double>, max_keep, std::nullopt,
          "compress: with --max_perturbation, the cap as a fraction in (0, 1] (default 1)");
ABSL_FLAG(std::string, param, "", "compress: parameter overrides, name=value,name=value");
ABSL_FLAG(bool, session, false, "compress: stream the layers over one CompressSession");
ABSL_FLAG(std::optional<int32_t>, sink_tokens, std::nullopt,
          "compress: protected first tokens (default: the policy's)");
ABSL_FLAG(std::optional<int32_t>, recent_tokens, std::nullopt,
          "compress: protected last tokens (default: the policy's)");
ABSL_FLAG(std::string, output_shape, "per_head", "compress: per_head or shared");
ABSL_FLAG(uint64_t, seed, 0, "compress: RNG seed of the random policy");
ABSL_FLAG(std::optional<int32_t>, num_layers, std::nullopt,
          "compress: layers in the model (PyramidKV); default: max layer id in --input + 1");
ABSL_FLAG(std::string, request_id, "", "compress: free-form id echoed into server logs");
ABSL_FLAG(std::string, input, "",
          "compress: safetensors file with layer.{i}.keys [H_kv,n,d] and optional "
          "layer.{i}.values [H_kv,n,d], layer.{i}.queries [H_q,w,d]");
ABSL_FLAG(bool, show_indices, false, "compress: also print the kept token indices");
ABSL_FLAG(std::string, numerics, "",
          "compress: fast | exact; empty leaves it to the server (kvtrimd --numerics). Each "
          "layer prints the mode that computed it (exact where the policy has no fast path)");
ABSL_FLAG(bool, perturbation, true,
          "compress: compute the output perturbation statistic when values and queries are "
          "sent (--noperturbation skips it: about one attention pass per layer less)");
ABSL_FLAG(bool, packed_answer, true,
          "compress: ask for the kept lists as packed little-endian bytes (answer_encoding "
          "PACKED, read in place by client/kept_lists.h); --nopacked_answer asks for the "
          "repeated offsets / indices fields");
ABSL_FLAG(bool, summary, false,
          "compress: print one table row instead of the per-layer report: policy, keep, kept / "
          "cached tokens over layers and KV heads, mean perturbation over heads and layers, "
          "server compute ms summed over layers");
ABSL_FLAG(bool, summary_header, false,
          "compress: with --summary, print the table's column header before the row");
ABSL_FLAG(std::string, model, "",
          "model bundle .safetensors (client/model_bundle.h): register-model and compress "
          "register it");

// kvtrim-lukv-profile: LU-KV offline profiling (lukv.md §5.2), a program of its own so that the
// kvtrim CLI does not link the kernels. Runs locally (no server): reads a model bundle's W_O
// and calibration dumps, ranks each head's context with the sidecar's own CPU scorer, solves
// the per-dump allocation and writes the averaged profile Φ [99, L, H_kv] as PROFILE.npy plus
// PROFILE.npy.json.
//
//   kvtrim-lukv-profile --model BUNDLE.safetensors --metric snapkv
//       --dumps a.safetensors,b.safetensors --out PROFILE.npy
//       [--sink 4] [--window 32] [--param name=value,...] [--k_max 128] [--gqa_agg mean]
//       [--threads 1]
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/npy.h"
#include "kernels/lukv/profile_builder.h"

namespace kvtrim::lukv_profile {

/// What kvtrim-lukv-profile was asked to do.
struct ProfileCommandOptions {
  std::string model;               // model bundle (.safetensors)
  std::string metric;              // scorer name, e.g. "snapkv"
  std::vector<std::string> dumps;  // calibration dumps (.safetensors), one per question
  std::string out;                 // PROFILE.npy; the manifest goes to PROFILE.npy.json
  std::string params;              // scorer parameter overrides "name=value,..."
  int64_t sink = 4;                // protected first tokens
  int64_t window = 32;             // protected last tokens (and the scorer's window)
  int64_t k_max = 128;             // decode steps of the oracle
  std::string gqa_agg = "mean";    // mean | sum | max
  int32_t threads = 1;             // CPU threads
};

/// The options as set by the program's flags (defined in profile_command.cc).
ProfileCommandOptions ProfileOptionsFromFlags();

/// The program's help: what it does, the supported metrics and its flags.
std::string ProfileHelp();

/// Builds the profile in process without writing anything: Φ [99, L, H_kv] and the builder
/// (for the manifest). `progress` (may be null) receives a one-line progress bar updated
/// per (dump, layer). INVALID_ARGUMENT / NOT_FOUND for bad options or inputs.
absl::StatusOr<NpyArray> BuildProfile(const ProfileCommandOptions& options,
                                            std::unique_ptr<lukv::ProfileBuilder>* builder,
                                            std::ostream* progress);

/// The program: BuildProfile with the progress bar on `err`, then writes the .npy and
/// its manifest and prints a summary on `out`. Returns kExitOk, kExitUsage for bad options
/// or inputs, kExitRpcError (1) when the output cannot be written.
int RunProfile(const ProfileCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace kvtrim::lukv_profile

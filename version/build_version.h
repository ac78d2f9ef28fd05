// What a kvtrim binary was built from: the release version and the git commit.
#pragma once

#include <string>

namespace kvtrim {

/// The release version, CMake's project VERSION (e.g. "0.1.0").
const char* ReleaseVersion();

/// The git commit of the source tree at build time, 12 hex digits with "-dirty" when the
/// tree had uncommitted changes; the CMake cache's KVTRIM_GIT_COMMIT outside a git checkout,
/// else "unknown".
const char* GitCommit();

/// "<release> (git <commit>)", the line `--version` prints after the program's name.
std::string VersionLine();

}  // namespace kvtrim

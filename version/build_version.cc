#include "version/build_version.h"

#include "kvtrim_git_commit.h"  // generated: KVTRIM_GIT_COMMIT

#ifndef KVTRIM_RELEASE_VERSION
#define KVTRIM_RELEASE_VERSION "0.0.0"
#endif

namespace kvtrim {

const char* ReleaseVersion() { return KVTRIM_RELEASE_VERSION; }

const char* GitCommit() { return KVTRIM_GIT_COMMIT; }

std::string VersionLine() {
  return std::string(ReleaseVersion()) + " (git " + GitCommit() + ")";
}

}  // namespace kvtrim

// A directory of this process's own under $TMPDIR (else /tmp), for targets that check a
// production writer by reading its file back; removed with its contents at exit.
#pragma once

#include <string>

namespace kvtrim::fuzz {

/// The directory's path, created on first use (aborts the process when it cannot be).
const std::string& ProcessTempDir();

}  // namespace kvtrim::fuzz

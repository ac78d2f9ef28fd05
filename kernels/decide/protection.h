// Protection on the host: the protected tokens' scores set to +inf, so that every selector
// keeps them first (specs README rule 3). The GPU's own is LaunchApplyProtection
// (kernels/gpu/kernels/protection.cu), which must set the same tokens.
#pragma once

#include <cstdint>

#include "kernels/budget.h"

namespace kvtrim {

/// Sets the scores [num_heads, n] fp32 row-major of the protected tokens (the first p.sink
/// and the last p.recent of each head) to +inf.
void ApplyProtection(const Protection& p, int64_t num_heads, int64_t n, float* scores);

}  // namespace kvtrim

// The built-in window-attention scorers' traits as their GPU files register them, for the GPU
// tests that launch the shared window-attention kernels directly (LaunchScore).
#pragma once

#include <string>

#include "kernels/gpu/kernels/window_attention_traits.h"

namespace kvtrim::gpu::testing {

/// GpuScorer::window_attention of the table scorer `name` ("snapkv", "h2o", "tova",
/// "dropkv"); a test failure and default traits when `name` is not one.
const WindowAttentionTraits& WindowTraitsOf(const std::string& name);

}  // namespace kvtrim::gpu::testing

// A counter-based hash for the Random scorer: a uniform float in [0, 1) from
// (seed, layer, head, token), with no state, so every token's value can be computed
// independently on the CPU or on the GPU and both backends produce the same bits.
// Header-only; no std:: containers so that CUDA device code can include it.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVTRIM_COUNTER_HASH_HD __host__ __device__
#else
#define KVTRIM_COUNTER_HASH_HD
#endif

namespace kvtrim {

/// The splitmix64 finaliser (Steele, Lea & Flood 2014) of x + golden gamma: a bijective
/// 64-bit mixer whose outputs pass BigCrush for consecutive inputs.
KVTRIM_COUNTER_HASH_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// 64 well-mixed bits from (seed, layer, head, token): the four values are folded in one
/// after another, each through a full splitmix64 round, so changing any one of them
/// changes the output as if it were a fresh random draw. `layer` is taken as its 32-bit
/// pattern; `head` and `token` as their 64-bit patterns.
KVTRIM_COUNTER_HASH_HD inline uint64_t CounterHash64(uint64_t seed, int32_t layer, int64_t head,
                                                     int64_t token) {
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(layer)));
  h = SplitMix64(h ^ static_cast<uint64_t>(head));
  h = SplitMix64(h ^ static_cast<uint64_t>(token));
  return h;
}

/// Uniform float in [0, 1): the top 24 bits of CounterHash64 times 2^-24. Every value is
/// exactly representable in fp32, so the CPU and GPU results are bit-identical; the
/// largest value is 1 - 2^-24.
KVTRIM_COUNTER_HASH_HD inline float CounterUniform(uint64_t seed, int32_t layer, int64_t head,
                                                   int64_t token) {
  const uint32_t top24 = static_cast<uint32_t>(CounterHash64(seed, layer, head, token) >> 40);
  return static_cast<float>(top24) * (1.0f / 16777216.0f);
}

}  // namespace kvtrim

#undef KVTRIM_COUNTER_HASH_HD

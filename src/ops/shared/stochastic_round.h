// bfloat16 stochastic rounding for 16-bit master weights and optimizer state (optim/adam.h's
// AdamOptions::optimizer_state): x rounds up to the next bfloat16 with probability equal to its distance from the
// one below, in ulps, so E[round(x)] = x and a stream of updates far below half an ulp still moves the weight on
// average (round to nearest drops every one of them). The 16 random bits come from splitmix64's finalizer over
// (seed, step, index), like dropout's masks (dropout_keep.h): counter-based, so any thread or device draws any
// element's rounding by itself, a run is reproducible, and a resumed run draws what the uninterrupted one would.
#pragma once

#include <cstdint>

#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// The Weyl sequence's start for one (seed, step): counter_hash adds the index's multiple to it.
MIXTRAIN_HOST_DEVICE inline uint64_t counter_base(uint64_t seed, uint64_t step) {
  return seed + 0xD1B54A32D192ED03ull * (step + 1);
}
// splitmix64's finalizer.
MIXTRAIN_HOST_DEVICE inline uint64_t counter_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kCounterIndexStride = 0x9E3779B97F4A7C15ull;

// 64 well-mixed bits of (seed, step, index): splitmix64's finalizer over a Weyl sequence per step.
MIXTRAIN_HOST_DEVICE inline uint64_t counter_hash(uint64_t seed, uint64_t step, uint64_t index) {
  return counter_mix(counter_base(seed, step) + kCounterIndexStride * (index + 1));
}

// The 16 random bits of one rounding of an element, from the element's one hash: stream 0 (the master weight) takes
// bits 63..48, stream 1 (Adam's bfloat16 m, AdamOptions::optimizer_state) bits 47..32, stream 2 (v) bits 31..16,
// so one hash serves all three and each draws independent bits.
MIXTRAIN_HOST_DEVICE inline uint32_t rounding_bits(uint64_t hash, int stream) {
  return static_cast<uint32_t>(hash >> (48 - 16 * stream)) & 0xFFFFu;
}

// x rounded to a bfloat16 bit pattern stochastically with the 16 random bits r: the float32's low 16 bits plus r,
// truncated, rounds up exactly when r >= 2^16 - low, so with r uniform the chance is low / 2^16. Infinities, NaN,
// and a finite value that would round up past bfloat16's largest finite number take round to nearest (which
// keeps them, or saturates no worse than it).
MIXTRAIN_HOST_DEVICE inline uint16_t float_to_bfloat16_stochastic(float x, uint32_t r) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7F800000u) == 0x7F800000u) return float_to_bfloat16(x);  // inf, NaN
  const uint32_t up = bits + (r & 0xFFFFu);
  if ((up & 0x7F800000u) == 0x7F800000u) return float_to_bfloat16(x);  // would overflow to infinity
  return static_cast<uint16_t>(up >> 16);
}

// The stochastic rounding of element `index` at update `step` under `seed`, in stream `stream` (rounding_bits).
MIXTRAIN_HOST_DEVICE inline uint16_t float_to_bfloat16_sr(float x, uint64_t seed, uint64_t step, uint64_t index,
                                                          int stream = 0) {
  return float_to_bfloat16_stochastic(x, rounding_bits(counter_hash(seed, step, index), stream));
}

}  // namespace mixtrain::ops::shared

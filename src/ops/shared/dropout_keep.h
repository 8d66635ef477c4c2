// Which elements dropout keeps, for host and device: a 24-bit uniform from splitmix64's finalizer over
// (seed, index), kept when >= rate (the product with 2^-24 is exact). Counter-based, so any device draws any
// element's decision by itself, in any order, with the same result: ops::dropout_mask and attention's dropout
// (ops::attention_dropout_keep) both draw from it.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

MIXTRAIN_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, float rate) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-24f >= rate;
}

}  // namespace mixtrain::ops::shared

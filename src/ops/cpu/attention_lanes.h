// The float32 lane vectors of the attention kernels' row loops (attention.cpp, flash_attention.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "exp_poly.h"

namespace mixtrain::ops::cpu::attention_lanes {

// Independent partial sums (and maxima) per row: wide enough for the vector units, and a fixed order,
// so a row's result does not depend on anything but its values.
constexpr int kLanes = 8;

// kLanes floats as one GCC/Clang vector: the row loops below are written on it, because the compiler will
// not vectorize a float comparison or select in a plain loop under the default trapping-math rules. Each
// MIXTRAIN_CPU_VARIANTS function gets it as wide as its instruction-set variant allows.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
using LaneBits = uint32_t __attribute__((vector_size(kLanes * sizeof(float))));

// x[0, n) (n <= kLanes) into v, the missing lanes set to fill.
inline void load_lanes(const float* x, int64_t n, float fill, Lanes& v) {
  if (n == kLanes) {
    std::memcpy(&v, x, sizeof v);
    return;
  }
  v = Lanes{} + fill;
  for (int64_t l = 0; l < n; ++l) v[l] = x[l];
}
inline void store_lanes(const Lanes& v, int64_t n, float* x) {
  if (n == kLanes)
    std::memcpy(x, &v, sizeof v);
  else
    for (int64_t l = 0; l < n; ++l) x[l] = v[l];
}

// e^x for the softmax rows: expf_poly::exp (exp_poly.h, shared with GELU), within 1e-7 relative of e^x over
// [-87, 88], 0 below -87; NaN stays NaN, so an overflowed row still poisons its softmax as it must.
inline void exp_lanes(const Lanes& x, Lanes& out) { expf_poly::exp<Lanes, LaneBits>(x, out); }

}  // namespace mixtrain::ops::cpu::attention_lanes

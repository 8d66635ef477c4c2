// The summation order of the CPU's reductions (sum_rows in cpu/elementwise.cpp, reduce_sum in cpu/reduce.cpp),
// for host and device: float32, from +0, one term after another in index order, each partial sum rounded. A GPU
// kernel that gives each output element one thread running this loop gives the CPU's bits and does not depend
// on the launch geometry.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// term(0) + term(1) + ... + term(n - 1), in that order; term(j) returns float32.
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float ordered_sum(int64_t n, const Term& term) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s = add_rn(s, term(j));
  return s;
}

}  // namespace mixtrain::ops::shared

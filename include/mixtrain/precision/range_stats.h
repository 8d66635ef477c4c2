// How well a tensor's values fit a 16-bit floating dtype: the statistics behind `mixtrain inspect` and the
// recovery guard. Values are read in float32, so a float32 tensor tells what a float16 copy would lose.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"

namespace mixtrain {

struct RangeStats {
  int64_t count = 0;
  double max_abs = 0;          // over finite values
  int64_t overflow = 0;        // finite values beyond the target's largest finite value (they become inf)
  int64_t underflow = 0;       // non-zero values below the target's smallest normal (subnormal or zero there)
  int64_t nan = 0;
  int64_t inf = 0;
  double overflow_fraction() const { return count ? static_cast<double>(overflow) / static_cast<double>(count) : 0; }
  double underflow_fraction() const { return count ? static_cast<double>(underflow) / static_cast<double>(count) : 0; }
  // True when the values cannot be held in the target dtype without producing inf or NaN.
  bool breaks() const { return overflow > 0 || nan > 0 || inf > 0; }
  void merge(const RangeStats& o);
};

// Statistics of x's values against target (float16: max 65504, min normal 2^-14; bfloat16: float32's
// exponent range; float32: only NaN and inf count).
RangeStats range_stats(const Tensor& x, DType target);

}  // namespace mixtrain

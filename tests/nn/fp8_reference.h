// The FP8 layer tests' reference quantization: a tensor's codes by the format's definition
// (tests/core/float8_reference.h, no code of the converter) with current scaling's scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/float8_reference.h"

namespace mixtrain::fp8_test {

namespace ref = float8_reference;

// A quantized operand by the definition: the values of the codes and the scale (current scaling: format max / amax,
// in float32 as the recipe computes it); both formats saturate, as the layers cast.
struct RefOperand {
  std::vector<double> q;
  double scale;
};
inline RefOperand quantize_ref(const std::vector<float>& x, const ref::Format& f, float format_max) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float scale = format_max / amax;
  RefOperand r{{}, scale};
  for (float v : x) r.q.push_back(ref::value(f, *ref::encode(f, static_cast<float>(v * scale), /*saturate=*/true)));
  return r;
}

}  // namespace mixtrain::fp8_test

// Helpers shared by the op tests: random inputs and the rounding unit of each dtype.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::ops::testing {

// The bits of a float32 value, for comparisons that tell -0 from +0 and NaN payloads apart.
inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A host tensor's bytes in row-major order, for bit-for-bit comparisons of whole tensors.
inline std::vector<unsigned char> bits_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw());
  return std::vector<unsigned char>(p, p + c.nbytes());
}

inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v, dtype);
}

// Relative rounding unit of each dtype's one final rounding: float32 2^-24, float16 2^-11, bfloat16 2^-8.
// Ops compute in float32 and round once, so results lie within a few units of the float64 value.
inline double unit(DType d) { return d == DType::kFloat16 ? 0x1p-11 : d == DType::kBFloat16 ? 0x1p-8 : 0x1p-24; }

// Spacing of each dtype's subnormals: the absolute rounding error of results below the normal range
// (float16's normal range ends at 6.1e-5, so small gradients land there).
inline double subnormal_step(DType d) {
  return d == DType::kFloat16 ? 0x1p-24 : d == DType::kBFloat16 ? 0x1p-133 : 0x1p-149;
}

inline std::vector<double> to_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_floats();
  return std::vector<double>(f.begin(), f.end());
}

inline const DType kFloatDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
// Odd lengths that miss every vector width and block size.
inline const int64_t kOddSizes[] = {1, 7, 17, 31, 129};

}  // namespace mixtrain::ops::testing

// MXFP8 block quantization by its definition, for the tests: a block's scale is the smallest power of two 2^k
// (k >= -127) with amax <= format max * 2^k, searched in float64; each element is the code of x / 2^k by the
// format's definition (tests/core/float8_reference.h, no code of the converter), read back as value * 2^k in
// float64. A block holding NaN or infinity reads NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/float8_reference.h"
#include "mixtrain/core/random.h"

namespace mixtrain::mx_test {

namespace ref = float8_reference;

inline int block_exponent(double amax, double format_max) {
  int k = -127;
  while (amax > std::ldexp(format_max, k)) ++k;
  return k;
}

// x (rows, cols) row-major, blocks of 32 along each row, or down each column when `down`: the dequantized values.
inline std::vector<double> mx_dequantized(const std::vector<float>& x, int64_t rows, int64_t cols,
                                          const ref::Format& f, double format_max, bool down) {
  std::vector<double> out(x.size());
  const int64_t outer = down ? cols : rows, inner = down ? rows : cols;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b0 = 0; b0 < inner; b0 += 32) {
      const int64_t b1 = std::min(inner, b0 + 32);
      auto at = [&](int64_t i) { return down ? i * cols + o : o * cols + i; };
      double amax = 0.0;
      bool finite = true;
      for (int64_t i = b0; i < b1; ++i) {
        finite = finite && std::isfinite(x[at(i)]);
        amax = std::max(amax, std::fabs(static_cast<double>(x[at(i)])));
      }
      const int k = finite ? block_exponent(amax, format_max) : 0;
      for (int64_t i = b0; i < b1; ++i)
        out[at(i)] = finite ? std::ldexp(ref::value(f, *ref::encode(f, std::ldexp(x[at(i)], -k), true)), k) : NAN;
    }
  return out;
}

// Values of a (rows, cols) matrix over float32's whole range, for the MXFP8 tests: magnitudes 2^-150 to 2^127 (block
// scales from 2^-127 up), a NaN and an infinity placed past 40 elements, a run of zeros past 100 (zero blocks), and,
// with subnormal_amaxes, every 37th element from the 5th a float32 subnormal.
inline std::vector<float> every_range_values(int64_t rows, int64_t cols, bool subnormal_amaxes) {
  Rng r(static_cast<uint64_t>(rows * 1000 + cols));
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (float& x : v) x = std::ldexp(r.uniform(-1.0f, 1.0f), static_cast<int>(r.uniform(-150.0f, 128.0f)));
  if (v.size() > 40) v[3] = NAN, v[v.size() / 2] = -INFINITY;
  if (v.size() > 100) std::fill(v.begin() + 64, v.begin() + 100, 0.0f);
  if (subnormal_amaxes)
    for (size_t i = 5; i < v.size(); i += 37) v[i] = std::ldexp(r.uniform(-1.0f, 1.0f), -140);
  return v;
}

}  // namespace mixtrain::mx_test

// The pieces of the library's polynomial e^x (Cody and Waite reduction, Cephes' expf polynomial) as one float32
// at a time, for host and device: its constants, which the CPU's vector form (cpu/exp_poly.h) also reads, and
// the scalar steps GELU needs (gelu_math.h). Every product and sum is rounded on its own (no fused
// multiply-add), the CPU's order, so both devices give the same bits.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared::expf_poly {

inline constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;     // 9 significant bits: n * kLn2Hi is exact for |n| < 2^15
inline constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
// e^r = 1 + r + r^2 p(r), p's coefficients from degree 5 down.
inline constexpr float kP5 = 1.9875691500e-4f;
inline constexpr float kP4 = 1.3981999507e-3f;
inline constexpr float kP3 = 8.3334519073e-3f;
inline constexpr float kP2 = 4.1665795894e-2f;
inline constexpr float kP1 = 1.6666665459e-1f;
inline constexpr float kP0 = 5.0000001201e-1f;

// e^r for |r| <= ln2 / 2 (a little more is harmless), within 1e-7 relative.
MIXTRAIN_HOST_DEVICE inline float exp_reduced(float r) {
  float p = kP5;
  p = add_rn(mul_rn(p, r), kP4);
  p = add_rn(mul_rn(p, r), kP3);
  p = add_rn(mul_rn(p, r), kP2);
  p = add_rn(mul_rn(p, r), kP1);
  p = add_rn(mul_rn(p, r), kP0);
  return add_rn(add_rn(mul_rn(mul_rn(p, r), r), r), 1.0f);
}

// 2^(n + bias) from t = n + kRound (n an integer with n + bias + 127 in [1, 254]), through its bits.
MIXTRAIN_HOST_DEVICE inline float pow2_of_rounded(float t, uint32_t bias) {
  return float_of(((bits_of(t) - bits_of(kRound)) + (127u + bias)) << 23);  // two's complement n + bias
}

// e^x within 1e-7 relative over [-87, 88]; 0 below -87, e^88 above 88; NaN stays NaN: the CPU's vector form
// (cpu/exp_poly.h, the exponential of attention's softmax rows) one float at a time, in its order.
MIXTRAIN_HOST_DEVICE inline float exp(float x) {
  const float xc = x > 88.0f ? 88.0f : x;
  const float t = add_rn(mul_rn(xc, kLog2e), kRound);
  const float n = sub_rn(t, kRound);
  float r = sub_rn(xc, mul_rn(n, kLn2Hi));
  r = sub_rn(r, mul_rn(n, kLn2Lo));
  return x < -87.0f ? 0.0f : mul_rn(exp_reduced(r), pow2_of_rounded(t, 0));
}

}  // namespace mixtrain::ops::shared::expf_poly

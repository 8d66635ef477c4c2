// e^x in float32 without library calls, so that a loop over it vectorizes: the one exponential of the CPU
// kernels that need speed (attention's softmax rows, GELU). Written once for any V that is float or a GCC
// vector of floats, B the unsigned integer of V's width (uint32_t or a vector of them); vectors go by
// reference, since a by-value vector argument has an ABI that differs between instruction sets.
//
// x = n ln2 + r with |r| <= ln2 / 2: n rounded with the 1.5 * 2^23 trick, r reduced in two steps (Cody and
// Waite) of which the first is exact, e^r by Cephes' expf polynomial, 2^n built in the exponent bits.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "../shared/exp_poly.h"

namespace mixtrain::ops::cpu::expf_poly {

// The constants are shared with the scalar host-and-device form (ops/shared/exp_poly.h), which the GPU uses.
using shared::expf_poly::kLn2Hi;
using shared::expf_poly::kLn2Lo;
using shared::expf_poly::kLog2e;
using shared::expf_poly::kRound;

// e^r for |r| <= ln2 / 2 (a little more is harmless): 1 + r + r^2 p(r), within 1e-7 relative.
template <typename V>
inline void exp_reduced(const V& r, V& out) {
  namespace sp = shared::expf_poly;
  V p = V{} + sp::kP5;
  p = p * r + sp::kP4;
  p = p * r + sp::kP3;
  p = p * r + sp::kP2;
  p = p * r + sp::kP1;
  p = p * r + sp::kP0;
  out = p * r * r + r + 1.0f;
}

// 2^(n + bias) from t = n + kRound (n an integer with n + bias + 127 in [1, 254]), through its bits.
template <typename V, typename B>
inline void pow2_of_rounded(const V& t, uint32_t bias, V& out) {
  static_assert(sizeof(B) == sizeof(V));
  B bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = ((bits - std::bit_cast<uint32_t>(kRound)) + (127u + bias)) << 23;  // two's complement n + bias
  std::memcpy(&out, &bits, sizeof out);
}

// e^x within 1e-7 relative over [-87, 88]; 0 below -87 (e^-87 is at float32's normal limit), e^88 above 88;
// NaN stays NaN (the comparisons are false for it).
template <typename V, typename B>
inline void exp(const V& x, V& out) {
  const V zero{};
  const V hi = zero + 88.0f, lo = zero - 87.0f;
  const V xc = x > hi ? hi : x;
  const V t = xc * kLog2e + kRound;
  const V n = t - kRound;
  V r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  V e, scale;
  exp_reduced(r, e);
  pow2_of_rounded<V, B>(t, 0, scale);
  out = x < lo ? zero : e * scale;
}

}  // namespace mixtrain::ops::cpu::expf_poly

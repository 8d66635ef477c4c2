// GELU in its exact (erf) form, Keras' default, and its derivative, on one float32 value with no library
// call, so that a plain loop over float arrays vectorizes (GCC).
//
// Written through t = |x| and E = e^(-t^2/2), with Phi the standard normal CDF and phi its density:
//   x < 0:   gelu(x) = -E F(t),      gelu'(x) = E D(t)
//   x >= 0:  gelu(x) = x - E F(t),   gelu'(x) = 1 - E D(t)
// where F(t) = t Phi(-t) / E and D(t) = (Phi(-t) - t phi(t)) / E are smooth and bounded. This keeps full
// relative accuracy where 1 + erf(x / sqrt2) would cancel (x < 0: gelu(-10) is 7.6e-23, and the result
// reaches float32's denormals near x = -13.2), and it needs one polynomial and one exponential per value.
// D has a root at t0 = 0.7518 (the minimum of gelu); it is computed as (t0 - t) times a polynomial, t0 in
// two parts, so that gelu' keeps its relative accuracy there too.
//
// F(t) = 8 t w PF(u) and D(t) = (t0 - t) PD(u), with w = 1 / (t + 4) and u = y - yc, y = (t - 4) / (t + 4)
// in [-1, 0.58] for t in [0, 15] and yc its middle. PF (= F / (8 t w) = erfcx(t / sqrt2) (t + 4) / 16) and
// PD (= D / (t0 - t)) are polynomials of degree 9, fitted to the exact functions (40-digit arithmetic) by
// Lawson's iteration toward the minimax relative error, their coefficients then rounded to float32 one at a
// time from degree 0 up with the rest refitted: within 1.3e-8 relative. With float32 rounding, over every
// seventh float32 in [-16, 16]: gelu within 4.9 float32 units of the exact value (mean 0.1), gelu' within
// 3.8 (tests/ops/elementwise_test.cpp checks a dense sweep). Past t = 15, E F and E D are below float32's
// smallest denormal, so t is clamped there: gelu(-inf) = 0, gelu(inf) = inf, gelu'(-inf) = 0,
// gelu'(inf) = 1, and NaN propagates.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "exp_poly.h"

namespace mixtrain::ops::cpu::gelu_math {

inline constexpr float kTMax = 15.0f;
inline constexpr float kC = 7.894737124e-01f;  // 1 + yc
inline constexpr float kT0Hi = 7.517915368e-01f;  // t0 = kT0Hi + kT0Lo
inline constexpr float kT0Lo = -1.211444989e-08f;
// PF and PD, highest degree first.
inline constexpr float kPF[] = {-1.653871004e-05f, 5.353293091e-05f, 1.321656309e-04f, -6.873367820e-04f, -2.191644162e-04f, 8.188526146e-03f, -2.999586239e-02f, 6.519873440e-02f, -9.975264966e-02f, 1.127854511e-01f};
inline constexpr float kPD[] = {-1.580759636e-05f, 1.621080810e-05f, 1.813775743e-04f, -4.319394648e-04f, -1.414769096e-03f, 1.122141164e-02f, -3.683835268e-02f, 8.088823408e-02f, -1.329298615e-01f, 4.869337082e-01f};

// e^(-t^2/2) * 2^64 for t in [0, kTMax]: the scale keeps E normal down to t = kTMax, so that a product
// E * F is rounded once, wherever it lands (denormals included), when the 2^-64 is taken out at the end.
// t^2 is taken exactly (t = th + tl, th with 12 significant bits, th^2 exact): its float32 rounding alone
// would cost e^(-t^2/2) 80 float32 units near t = 13.
inline float exp_neg_half_square_2p64(float t) {
  namespace ep = expf_poly;
  const float th = std::bit_cast<float>(std::bit_cast<uint32_t>(t) & 0xFFFFF000u);
  const float tl = t - th;
  const float a_hi = -0.5f * (th * th);        // exact
  const float a_lo = -0.5f * (tl * (t + th));  // tiny; its rounding is far below a float32 unit of E
  const float k = a_hi * ep::kLog2e + ep::kRound;  // n + kRound, n in [-163, 0]
  const float n = k - ep::kRound;
  float r = a_hi - n * ep::kLn2Hi;  // exact: both are multiples of a_hi's unit and |r| < 1/2
  r = r - n * ep::kLn2Lo;
  r = r + a_lo;
  float e, scale;
  ep::exp_reduced(r, e);
  ep::pow2_of_rounded<float, uint32_t>(k, 64, scale);
  return e * scale;
}

template <size_t N>
inline float horner(float u, const float (&c)[N]) {
  float p = c[0];
  for (size_t i = 1; i < N; ++i) p = p * u + c[i];
  return p;
}

// t = min(|x|, kTMax) (and kTMax for NaN, which the callers put back at the end); w = 1 / (t + 4), and
// u = 2 t w - kC = y - yc. u is formed from s = t w, which has t's relative precision, rather than as
// 1 - 8 w - yc, whose rounding near y = -1 would move t by 2e-7 and cost several float32 units of gelu at
// small |x|.
//
// The selects below are written so that GCC if-converts them and vectorizes the caller's loop: the clamp
// is an integer minimum of the bits (a float comparison with a constant arm lets GCC fold the clamped
// path into a constant and branch to it), the sign tests are integer, and no arm of a select holds
// arithmetic (a float operation under a condition may trap, so GCC would keep the branch).
struct Reduced {
  float t, w, u;
};
inline Reduced reduce(float x) {
  const uint32_t a = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  const uint32_t m = std::bit_cast<uint32_t>(kTMax);
  const float t = std::bit_cast<float>(a < m ? a : m);
  const float h = t + 4.0f;
  const float l = t - (h - 4.0f);  // h's rounding error, exactly (h - 4 is exact for t <= 15)
  const float w0 = 1.0f / h;
  const float w = w0 - (w0 * w0) * l;  // 1 / (h + l): h's rounding would cost gelu a float32 unit
  return {t, w, 2.0f * (t * w) - kC};
}

inline float gelu(float x) {
  const Reduced r = reduce(x);
  // E F = E t 8 w PF(u): E's 2^64 goes first, so that a denormal t is not rounded before the last product.
  const float ef = (((exp_neg_half_square_2p64(r.t) * r.t) * r.w) * horner(r.u, kPF)) * 0x1p-61f;
  const float g = (std::bit_cast<int32_t>(x) > 0 ? x : 0.0f) - ef;  // x > 0, NaN aside
  return std::isnan(x) ? x : g;
}

inline float gelu_derivative(float x) {
  const Reduced r = reduce(x);
  const float d = ((kT0Hi - r.t) + kT0Lo) * horner(r.u, kPD);  // kT0Hi - t is exact near the root (Sterbenz)
  const float ed = (exp_neg_half_square_2p64(r.t) * d) * 0x1p-64f;
  const bool pos = std::bit_cast<int32_t>(x) > 0;
  const float g = (pos ? 1.0f : 0.0f) + (pos ? -1.0f : 1.0f) * ed;  // 1 - E D or E D, exactly
  return std::isnan(x) ? x : g;
}

}  // namespace mixtrain::ops::cpu::gelu_math

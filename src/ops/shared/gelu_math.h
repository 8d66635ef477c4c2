// GELU in its exact (erf) form, Keras' default, and its derivative, on one float32 value with no library
// call, so that a plain loop over float arrays vectorizes (GCC), written once for the CPU kernel (through
// cpu/gelu_math.h) and the GPU's: every product and sum is rounded on its own (host_device.h), so the GPU
// gives the CPU's bits.
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

#include <cstdint>

#include "exp_poly.h"
#include "host_device.h"

namespace mixtrain::ops::shared::gelu_math {

inline constexpr float kTMax = 15.0f;
inline constexpr float kC = 7.894737124e-01f;     // 1 + yc
inline constexpr float kT0Hi = 7.517915368e-01f;  // t0 = kT0Hi + kT0Lo
inline constexpr float kT0Lo = -1.211444989e-08f;

// p * u + c, rounded twice.
MIXTRAIN_HOST_DEVICE inline float horner_step(float p, float u, float c) { return add_rn(mul_rn(p, u), c); }

// PF and PD by Horner's rule. Written out rather than looped over a coefficient array: device code cannot read
// a host array.
MIXTRAIN_HOST_DEVICE inline float poly_f(float u) {
  float p = -1.653871004e-05f;
  p = horner_step(p, u, 5.353293091e-05f);
  p = horner_step(p, u, 1.321656309e-04f);
  p = horner_step(p, u, -6.873367820e-04f);
  p = horner_step(p, u, -2.191644162e-04f);
  p = horner_step(p, u, 8.188526146e-03f);
  p = horner_step(p, u, -2.999586239e-02f);
  p = horner_step(p, u, 6.519873440e-02f);
  p = horner_step(p, u, -9.975264966e-02f);
  return horner_step(p, u, 1.127854511e-01f);
}
MIXTRAIN_HOST_DEVICE inline float poly_d(float u) {
  float p = -1.580759636e-05f;
  p = horner_step(p, u, 1.621080810e-05f);
  p = horner_step(p, u, 1.813775743e-04f);
  p = horner_step(p, u, -4.319394648e-04f);
  p = horner_step(p, u, -1.414769096e-03f);
  p = horner_step(p, u, 1.122141164e-02f);
  p = horner_step(p, u, -3.683835268e-02f);
  p = horner_step(p, u, 8.088823408e-02f);
  p = horner_step(p, u, -1.329298615e-01f);
  return horner_step(p, u, 4.869337082e-01f);
}

// e^(-t^2/2) * 2^64 for t in [0, kTMax]: the scale keeps E normal down to t = kTMax, so that a product
// E * F is rounded once, wherever it lands (denormals included), when the 2^-64 is taken out at the end.
// t^2 is taken exactly (t = th + tl, th with 12 significant bits, th^2 exact): its float32 rounding alone
// would cost e^(-t^2/2) 80 float32 units near t = 13.
MIXTRAIN_HOST_DEVICE inline float exp_neg_half_square_2p64(float t) {
  namespace ep = expf_poly;
  const float th = float_of(bits_of(t) & 0xFFFFF000u);
  const float tl = sub_rn(t, th);
  const float a_hi = mul_rn(-0.5f, mul_rn(th, th));  // exact
  // a_lo is tiny: its rounding is far below a float32 unit of E.
  const float a_lo = mul_rn(-0.5f, mul_rn(tl, add_rn(t, th)));
  const float k = add_rn(mul_rn(a_hi, ep::kLog2e), ep::kRound);  // n + kRound, n in [-163, 0]
  const float n = sub_rn(k, ep::kRound);
  float r = sub_rn(a_hi, mul_rn(n, ep::kLn2Hi));  // exact: both are multiples of a_hi's unit and |r| < 1/2
  r = sub_rn(r, mul_rn(n, ep::kLn2Lo));
  r = add_rn(r, a_lo);
  return mul_rn(ep::exp_reduced(r), ep::pow2_of_rounded(k, 64));
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
MIXTRAIN_HOST_DEVICE inline Reduced reduce(float x) {
  const uint32_t a = bits_of(x) & 0x7FFFFFFFu;
  const uint32_t m = bits_of(kTMax);
  const float t = float_of(a < m ? a : m);
  const float h = add_rn(t, 4.0f);
  const float l = sub_rn(t, sub_rn(h, 4.0f));  // h's rounding error, exactly (h - 4 is exact for t <= 15)
  const float w0 = div_rn(1.0f, h);
  const float w = sub_rn(w0, mul_rn(mul_rn(w0, w0), l));  // 1 / (h + l): h's rounding would cost gelu a float32 unit
  return {t, w, sub_rn(mul_rn(2.0f, mul_rn(t, w)), kC)};
}

// x > 0 as an integer test of the bits (NaN with a clear sign bit counts, and is put back by the callers).
MIXTRAIN_HOST_DEVICE inline bool positive(float x) { return static_cast<int32_t>(bits_of(x)) > 0; }

MIXTRAIN_HOST_DEVICE inline float gelu(float x) {
  const Reduced r = reduce(x);
  // E F = E t 8 w PF(u): E's 2^64 goes first, so that a denormal t is not rounded before the last product.
  const float ef = mul_rn(mul_rn(mul_rn(mul_rn(exp_neg_half_square_2p64(r.t), r.t), r.w), poly_f(r.u)), 0x1p-61f);
  const float g = sub_rn(positive(x) ? x : 0.0f, ef);
  return is_nan_f32(x) ? x : g;
}

MIXTRAIN_HOST_DEVICE inline float gelu_derivative(float x) {
  const Reduced r = reduce(x);
  // kT0Hi - t is exact near the root (Sterbenz).
  const float d = mul_rn(add_rn(sub_rn(kT0Hi, r.t), kT0Lo), poly_d(r.u));
  const float ed = mul_rn(mul_rn(exp_neg_half_square_2p64(r.t), d), 0x1p-64f);
  const bool pos = positive(x);
  const float g = add_rn(pos ? 1.0f : 0.0f, mul_rn(pos ? -1.0f : 1.0f, ed));  // 1 - E D or E D, exactly
  return is_nan_f32(x) ? x : g;
}

}  // namespace mixtrain::ops::shared::gelu_math

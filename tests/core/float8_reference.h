// The float8 formats computed from their definitions (sign, exponent, mantissa), in double, for the tests: no code of
// core/float8.h is used here, so a test that compares the two checks the conversions against the formats themselves.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace mixtrain::float8_reference {

struct Format {
  const char* name;
  int exp_bits, mant_bits, bias;
  bool ieee_specials;  // E5M2: exponent all ones is infinity / NaN; E4M3FN: only S.1111.111 is NaN
};
constexpr Format kE4M3{"float8_e4m3fn", 4, 3, 7, false};
constexpr Format kE5M2{"float8_e5m2", 5, 2, 15, true};

// The value of a code by the format's formula; NaN for the NaN codes, +-infinity for E5M2's.
inline double value(const Format& f, uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int e = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = code & ((1 << f.mant_bits) - 1);
  const int e_all_ones = (1 << f.exp_bits) - 1;
  if (f.ieee_specials && e == e_all_ones) return m == 0 ? sign * INFINITY : NAN;
  if (!f.ieee_specials && e == e_all_ones && m == (1 << f.mant_bits) - 1) return NAN;
  const double mantissa = static_cast<double>(m) / (1 << f.mant_bits);
  if (e == 0) return sign * std::ldexp(mantissa, 1 - f.bias);  // subnormal
  return sign * std::ldexp(1.0 + mantissa, e - f.bias);
}

// The largest finite positive code and the code that overflow gives when not saturating.
inline uint8_t max_code(const Format& f) { return f.ieee_specials ? 0x7B : 0x7E; }
inline uint8_t overflow_code(const Format& f) { return f.ieee_specials ? 0x7C : 0x7F; }

// The code x (finite, infinite or NaN) encodes to, by the definition of rounding to nearest, ties to even: the
// nearest code, as if the exponent range went on above the largest finite value (so the next value past it is
// max + ulp(max)); a tie goes to the code with an even mantissa; past the largest finite value is overflow, which
// saturates to it or gives the overflow code. NaN gives nullopt (any NaN code of the input's sign is right).
inline std::optional<uint8_t> encode(const Format& f, double x, bool saturate) {
  if (std::isnan(x)) return std::nullopt;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  const uint8_t top = max_code(f);
  const double max = value(f, top), next = max + std::ldexp(1.0, std::ilogb(max) - f.mant_bits);
  const bool beyond = std::isinf(a) || a > (max + next) / 2 || (a == (max + next) / 2 && (top & 1));
  if (beyond) return static_cast<uint8_t>(sign | (saturate ? top : overflow_code(f)));
  uint8_t best = 0;
  for (uint8_t c = 1; c <= top; ++c) {  // codes increase with value
    const double d = std::fabs(value(f, c) - a), best_d = std::fabs(value(f, best) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace mixtrain::float8_reference

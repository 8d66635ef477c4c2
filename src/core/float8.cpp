// The float8 array conversions: the scalar code of float8.h in loops, or the AVX-512 F paths, chosen by the shared
// instruction-set level (the avx2 level has no path of its own and runs the scalar one).
#include "mixtrain/core/float8.h"

#include <algorithm>
#include <cmath>

#include "mixtrain/core/isa_level.h"

namespace mixtrain {

namespace detail {
void float8_from_float_avx512(const float* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow);
void float8_from_bfloat16_avx512(const bfloat16* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow);
void float8_to_float_avx512(const uint8_t* src, float* dst, int64_t n, bool e5m2);
void float8_to_bfloat16_avx512(const uint8_t* src, bfloat16* dst, int64_t n, bool e5m2);
uint32_t float8_scale_encode_widen_avx512(const float* x, int64_t n, float scale, bool e5m2, Float8Overflow overflow,
                                          bfloat16* values);
uint32_t float8_scale_encode_widen_avx512(const bfloat16* x, int64_t n, float scale, bool e5m2,
                                          Float8Overflow overflow, bfloat16* values);
}  // namespace detail

namespace {
uint8_t encode(float x, bool e5m2, Float8Overflow overflow) {
  return e5m2 ? float_to_e5m2_bits(x, overflow) : float_to_e4m3_bits(x, overflow);
}
float decode(uint8_t b, bool e5m2) { return e5m2 ? e5m2_bits_to_float(b) : e4m3_bits_to_float(b); }

void from_float_scalar(const float* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow) {
  for (int64_t i = 0; i < n; ++i) dst[i] = encode(src[i], e5m2, overflow);
}
void from_bfloat16_scalar(const bfloat16* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow) {
  for (int64_t i = 0; i < n; ++i) dst[i] = encode(bf16_bits_to_float(src[i].bits), e5m2, overflow);
}
void to_float_scalar(const uint8_t* src, float* dst, int64_t n, bool e5m2) {
  for (int64_t i = 0; i < n; ++i) dst[i] = decode(src[i], e5m2);
}
// Exact: every E4M3 / E5M2 value has at most 3 significant bits and an exponent bfloat16 holds.
bfloat16 widen(uint8_t code, bool e5m2) { return bfloat16{static_cast<uint16_t>(float_bits(decode(code, e5m2)) >> 16)}; }
void to_bfloat16_scalar(const uint8_t* src, bfloat16* dst, int64_t n, bool e5m2) {
  for (int64_t i = 0; i < n; ++i) dst[i] = widen(src[i], e5m2);
}
template <typename T>
uint32_t scale_encode_widen_scalar(const T* x, int64_t n, float scale, bool e5m2, Float8Overflow overflow,
                                   bfloat16* values) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(x[i]);  // half.h
    amax = std::max(amax, float_bits(v) & 0x7FFFFFFFu);
    values[i] = widen(encode(v * scale, e5m2, overflow), e5m2);
  }
  return amax;
}
}  // namespace

uint8_t float_to_e8m0_bits(float f) {
  if (std::isnan(f) || std::isinf(f) || f < 0.0f) return 0xFF;
  if (f == 0.0f) return 0x00;
  int exp = 0;
  const double frac = std::frexp(static_cast<double>(f), &exp);  // f = frac * 2^exp, frac in [0.5, 1)
  int e = exp - 1;                                                // f = (2 frac) * 2^e, 2 frac in [1, 2)
  if (2.0 * frac >= 1.5) ++e;                                     // nearer 2^(e+1), or halfway
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return static_cast<uint8_t>(e + 127);
}

void float8_from_float(const float* src, uint8_t* dst, int64_t n, bool format_e5m2, Float8Overflow overflow) {
  for_isa_level(&from_float_scalar, &from_float_scalar, &detail::float8_from_float_avx512)(src, dst, n, format_e5m2,
                                                                                           overflow);
}

void float8_from_bfloat16(const bfloat16* src, uint8_t* dst, int64_t n, bool format_e5m2, Float8Overflow overflow) {
  for_isa_level(&from_bfloat16_scalar, &from_bfloat16_scalar, &detail::float8_from_bfloat16_avx512)(
      src, dst, n, format_e5m2, overflow);
}

void float8_to_float(const uint8_t* src, float* dst, int64_t n, bool format_e5m2) {
  for_isa_level(&to_float_scalar, &to_float_scalar, &detail::float8_to_float_avx512)(src, dst, n, format_e5m2);
}

void float8_to_bfloat16(const uint8_t* src, bfloat16* dst, int64_t n, bool format_e5m2) {
  for_isa_level(&to_bfloat16_scalar, &to_bfloat16_scalar, &detail::float8_to_bfloat16_avx512)(src, dst, n,
                                                                                              format_e5m2);
}

uint32_t float8_scale_encode_widen(const float* x, int64_t n, float scale, bool format_e5m2, Float8Overflow overflow,
                                   bfloat16* values) {
  if (isa_level() == IsaLevel::kAvx512)
    return detail::float8_scale_encode_widen_avx512(x, n, scale, format_e5m2, overflow, values);
  return scale_encode_widen_scalar(x, n, scale, format_e5m2, overflow, values);
}

uint32_t float8_scale_encode_widen(const bfloat16* x, int64_t n, float scale, bool format_e5m2,
                                   Float8Overflow overflow, bfloat16* values) {
  if (isa_level() == IsaLevel::kAvx512)
    return detail::float8_scale_encode_widen_avx512(x, n, scale, format_e5m2, overflow, values);
  return scale_encode_widen_scalar(x, n, scale, format_e5m2, overflow, values);
}

}  // namespace mixtrain

// The 8-bit floating formats of FP8 training and their exact conversions to and from float32 (and bfloat16):
//   float8_e4m3fn   1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448; no infinity; one NaN per sign
//                   (S.1111.111); signed zeros and subnormals (smallest 2^-9).
//   float8_e5m2     1 sign, 5 exponent (bias 15), 2 mantissa bits: IEEE-style (the top byte of a float16); largest
//                   finite 57344; infinities and NaNs as IEEE; subnormals (smallest 2^-16).
//   float8_e8m0fnu  the OCP MX block scale: 8-bit biased exponent, no sign, no mantissa: 2^(e - 127), 0xFF NaN.
// Encoding rounds to nearest, ties to even (one rounding, from float32 or from bfloat16, which widens exactly).
// Overflow either saturates to the largest finite value (infinity included; NaN stays NaN) or does not: then a value
// that rounds past the largest finite one is NaN in E4M3 (it has no infinity) and infinity in E5M2. Every E4M3 and
// E5M2 value is exactly a bfloat16 value, so decoding to bfloat16 is exact too. Inline and MIXTRAIN_HOST_DEVICE, as
// half.h, so a device kernel can call the same rule; the array conversions below pick a vector path by
// instruction-set level (core/isa_level.h) that gives the same bits.
#pragma once

#include <cstdint>

#include "mixtrain/core/half.h"
#include "mixtrain/core/host_device.h"

namespace mixtrain {

struct float8_e4m3fn {
  uint8_t bits;
};
struct float8_e5m2 {
  uint8_t bits;
};
struct float8_e8m0fnu {
  uint8_t bits;
};

// What a value beyond the largest finite one becomes (see above).
enum class Float8Overflow : uint8_t { kSaturate, kNonSaturating };

constexpr float kFloat8E4M3Max = 448.0f;
constexpr float kFloat8E5M2Max = 57344.0f;

MIXTRAIN_HOST_DEVICE inline float e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t mag = b & 0x7Fu;
  if (mag == 0x7Fu) return bits_float(sign | 0x7FC00000u);
  if (mag >= 0x08u) return bits_float(sign | ((mag << 20) + (120u << 23)));  // rebias 7 -> 127
  // Subnormal m * 2^-9: exact in float32 (m < 8).
  const float v = static_cast<float>(mag) * 0.001953125f;
  return bits_float(sign | float_bits(v));
}

MIXTRAIN_HOST_DEVICE inline float e5m2_bits_to_float(uint8_t b) {
  return half_bits_to_float(static_cast<uint16_t>(b) << 8);  // E5M2 is float16's top byte
}

MIXTRAIN_HOST_DEVICE inline float e8m0_bits_to_float(uint8_t b) {
  if (b == 0xFFu) return bits_float(0x7FC00000u);
  if (b == 0u) return bits_float(0x00400000u);  // 2^-127: a float32 subnormal
  return bits_float(static_cast<uint32_t>(b) << 23);
}

namespace detail {
// |f|'s bits (not NaN, not infinity) rounded to nearest even into a format with `mant` mantissa bits and exponent bias
// `bias`, as its code without sign; may exceed the largest finite code (the caller decides what overflow gives).
MIXTRAIN_HOST_DEVICE inline uint32_t round_to_small_float(uint32_t absu, int mant, int bias) {
  const uint32_t min_normal = static_cast<uint32_t>(128 - bias) << 23;
  const int drop = 23 - mant;
  if (absu >= min_normal) {
    const uint32_t rounded = absu + ((1u << (drop - 1)) - 1u) + ((absu >> drop) & 1u);
    return (rounded - (static_cast<uint32_t>(127 - bias) << 23)) >> drop;
  }
  // Subnormal result: the full significand shifted so that one unit is 2^(1 - bias - mant).
  const uint32_t exp = absu >> 23;
  const uint32_t sig = (absu & 0x7FFFFFu) | (exp != 0 ? 0x800000u : 0u);
  const uint32_t shift = static_cast<uint32_t>(150 - bias - mant + 1) - (exp != 0 ? exp : 1u);
  if (shift > 25u) return 0u;  // below half the smallest subnormal
  const uint32_t result = sig >> shift, rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return result + ((rem > half || (rem == half && (result & 1u))) ? 1u : 0u);
}
}  // namespace detail

MIXTRAIN_HOST_DEVICE inline uint8_t float_to_e4m3_bits(float f, Float8Overflow overflow = Float8Overflow::kSaturate) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u, absu = u & 0x7FFFFFFFu;
  if (absu > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);
  const uint32_t code = absu == 0x7F800000u ? 0x80u : detail::round_to_small_float(absu, 3, 7);
  if (code > 0x7Eu) return static_cast<uint8_t>(sign | (overflow == Float8Overflow::kSaturate ? 0x7Eu : 0x7Fu));
  return static_cast<uint8_t>(sign | code);
}

MIXTRAIN_HOST_DEVICE inline uint8_t float_to_e5m2_bits(float f,
                                                       Float8Overflow overflow = Float8Overflow::kNonSaturating) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u, absu = u & 0x7FFFFFFFu;
  if (absu > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Eu | ((absu >> 21) & 0x3u));  // quiet NaN
  const uint32_t code = absu == 0x7F800000u ? 0x7Cu : detail::round_to_small_float(absu, 2, 15);
  if (code > 0x7Bu) return static_cast<uint8_t>(sign | (overflow == Float8Overflow::kSaturate ? 0x7Bu : 0x7Cu));
  return static_cast<uint8_t>(sign | code);
}

// float32 to the E8M0 scale: the nearest power of two (1.5 * 2^e, halfway, goes up), clamped to [2^-127, 2^127];
// zero gives 2^-127; NaN, infinities and negative values (the format has no sign and no infinity) give NaN.
uint8_t float_to_e8m0_bits(float f);

inline float to_float(float8_e4m3fn x) { return e4m3_bits_to_float(x.bits); }
inline float to_float(float8_e5m2 x) { return e5m2_bits_to_float(x.bits); }
inline float to_float(float8_e8m0fnu x) { return e8m0_bits_to_float(x.bits); }

// from_float rounds with each format's default overflow: E4M3 saturates (as NVIDIA Transformer Engine casts), E5M2
// keeps infinity (the gradients' format, where an overflow must stay visible to the loss scaler's finite check).
template <>
inline float8_e4m3fn from_float<float8_e4m3fn>(float x) {
  return float8_e4m3fn{float_to_e4m3_bits(x)};
}
template <>
inline float8_e5m2 from_float<float8_e5m2>(float x) {
  return float8_e5m2{float_to_e5m2_bits(x)};
}
template <>
inline float8_e8m0fnu from_float<float8_e8m0fnu>(float x) {
  return float8_e8m0fnu{float_to_e8m0_bits(x)};
}

// Array conversions for E4M3 (format_e5m2 false) and E5M2 (true), at the instruction-set level in force (AVX-512 F
// where it runs, else the scalar code above: the same bits). bfloat16 in and out are exact widenings / narrowings
// around the float32 ones, one rounding in all.
void float8_from_float(const float* src, uint8_t* dst, int64_t n, bool format_e5m2, Float8Overflow overflow);
void float8_from_bfloat16(const bfloat16* src, uint8_t* dst, int64_t n, bool format_e5m2, Float8Overflow overflow);
void float8_to_float(const uint8_t* src, float* dst, int64_t n, bool format_e5m2);
void float8_to_bfloat16(const uint8_t* src, bfloat16* dst, int64_t n, bool format_e5m2);

// The FP8 GEMMs' cast of n elements (ops::fp8_quantize's block): each x[i] * scale (one float32 rounding) encoded as
// float8_from_float does (nearest even, `overflow`) and widened back into values[i] (every code is a bfloat16
// value); returns the largest |x[i]| as float32 bits (a NaN's bits lie above infinity's, so a NaN wins). One pass at
// the AVX-512 level; elsewhere the scalar code, element by element: the same bits.
uint32_t float8_scale_encode_widen(const float* x, int64_t n, float scale, bool format_e5m2, Float8Overflow overflow,
                                   bfloat16* values);
uint32_t float8_scale_encode_widen(const bfloat16* x, int64_t n, float scale, bool format_e5m2,
                                   Float8Overflow overflow, bfloat16* values);

}  // namespace mixtrain

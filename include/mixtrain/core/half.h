// IEEE float16 and bfloat16 storage types and their exact conversions to and from float32.
// float -> 16-bit rounds to nearest, ties to even; subnormals, infinities and NaN are preserved
// (NaN stays NaN, quiet). Inline so kernels can call them in inner loops; the CUDA backend's kernels call the same
// conversions (MIXTRAIN_HOST_DEVICE), so a cast gives the same bits on either device.
#pragma once

#include <cstdint>
#include <cstring>

#include "mixtrain/core/host_device.h"

namespace mixtrain {

struct float16 {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};

MIXTRAIN_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
MIXTRAIN_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MIXTRAIN_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  // Subnormal half: normalise into a float32 normal.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  mant &= 0x3FFu;
  return bits_float(sign | static_cast<uint32_t>(112 - e) << 23 | (mant << 13));
}

MIXTRAIN_HOST_DEVICE inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7FFFFFFFu;
  if (absu >= 0x7F800000u) {  // inf or NaN
    return absu == 0x7F800000u ? static_cast<uint16_t>(sign | 0x7C00u)
                               : static_cast<uint16_t>(sign | 0x7E00u | ((absu >> 13) & 0x3FFu));
  }
  if (absu >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: overflow
  if (absu >= 0x38800000u) {                                              // normal half range
    const uint32_t rounded = absu + 0x0FFFu + ((absu >> 13) & 1u);        // round to nearest even on bit 13
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (absu < 0x33000000u) return sign;  // below half of the smallest subnormal: rounds to zero
  // Subnormal result: shift the full significand, rounding to nearest even.
  const uint32_t exp = absu >> 23;
  const uint32_t mant = (absu & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t result = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

MIXTRAIN_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

MIXTRAIN_HOST_DEVICE inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

inline float to_float(float x) { return x; }
inline float to_float(float16 x) { return half_bits_to_float(x.bits); }
inline float to_float(bfloat16 x) { return bf16_bits_to_float(x.bits); }

// from_float<T>(x): rounds a float32 into storage type T.
template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline float16 from_float<float16>(float x) {
  return float16{float_to_half_bits(x)};
}
template <>
inline bfloat16 from_float<bfloat16>(float x) {
  return bfloat16{float_to_bf16_bits(x)};
}

// Largest finite float16 value; anything above overflows to infinity.
constexpr float kFloat16Max = 65504.0f;
// Smallest positive normal float16; below it values are subnormal (lose precision) or flush to zero.
constexpr float kFloat16MinNormal = 6.103515625e-05f;

}  // namespace mixtrain

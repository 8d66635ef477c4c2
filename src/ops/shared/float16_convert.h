// float32 <-> float16 / bfloat16 as bit patterns, for the GPU's casts: the rule of core/half.h (round to nearest,
// ties to even; subnormals kept; infinities kept; NaN stays a quiet NaN with its payload's top bits), written as
// host-and-device code. The hardware conversions (cvt.rn.f16.f32) agree on numbers but not on NaN payloads, so
// the GPU uses these and a tensor cast on either device has the same bits (checked on every 16-bit pattern and
// every rounding boundary in tests/ops/cuda_shared_math_test.cpp).
#pragma once

#include <cstdint>

#include "host_device.h"
#include "mixtrain/core/dtype.h"

namespace mixtrain::ops::shared {

MIXTRAIN_HOST_DEVICE inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp != 0) return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  // A subnormal half is a float32 normal: shift its leading one into the implicit bit.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  mant &= 0x3FFu;
  return float_of(sign | static_cast<uint32_t>(112 - e) << 23 | (mant << 13));
}

MIXTRAIN_HOST_DEVICE inline uint16_t float_to_half(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7FFFFFFFu;
  if (absu >= 0x7F800000u) {  // inf or NaN
    return absu == 0x7F800000u ? static_cast<uint16_t>(sign | 0x7C00u)
                               : static_cast<uint16_t>(sign | 0x7E00u | ((absu >> 13) & 0x3FFu));
  }
  if (absu >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to 65520 or more: infinity
  if (absu >= 0x38800000u) {                                              // a normal half
    const uint32_t rounded = absu + 0x0FFFu + ((absu >> 13) & 1u);        // ties to even on bit 13
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (absu < 0x33000000u) return sign;  // at most half the smallest subnormal: zero
  // A subnormal half: shift the whole significand, ties to even.
  const uint32_t exp = absu >> 23;
  const uint32_t mant = (absu & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t result = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

// bfloat16 is float32's top half: widening is exact.
MIXTRAIN_HOST_DEVICE inline float bfloat16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

MIXTRAIN_HOST_DEVICE inline uint16_t float_to_bfloat16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays quiet
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);  // ties to even on bit 16; overflow carries to inf
  return static_cast<uint16_t>(rounded >> 16);
}

// The storage dtypes the GPU kernels convert between, as a plain kernel argument (device code reads no traits
// table). Host code gets one from float_code().
enum FloatCode : int { kCodeFloat32 = 0, kCodeFloat16 = 1, kCodeBFloat16 = 2 };

// Host only: the code of a floating dtype (callers have checked is_float).
inline int float_code(DType dt) {
  return dt == DType::kFloat16 ? kCodeFloat16 : dt == DType::kBFloat16 ? kCodeBFloat16 : kCodeFloat32;
}

// Element i of a float32 / float16 / bfloat16 array, widened to float32 (exact).
MIXTRAIN_HOST_DEVICE inline float load_as_float(const void* p, int code, int64_t i) {
  if (code == kCodeFloat16) return half_to_float(static_cast<const uint16_t*>(p)[i]);
  if (code == kCodeBFloat16) return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Rounds v once into element i of a float32 / float16 / bfloat16 array.
MIXTRAIN_HOST_DEVICE inline void store_from_float(void* p, int code, int64_t i, float v) {
  if (code == kCodeFloat16)
    static_cast<uint16_t*>(p)[i] = float_to_half(v);
  else if (code == kCodeBFloat16)
    static_cast<uint16_t*>(p)[i] = float_to_bfloat16(v);
  else
    static_cast<float*>(p)[i] = v;
}

}  // namespace mixtrain::ops::shared
